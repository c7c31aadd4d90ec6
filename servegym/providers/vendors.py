"""The model vendors ServeGym reaches, as data: each one's API-key variable and API root.

The model agents' clients (:mod:`servegym.providers.clients`) and the CLI agents' key proxy
(:mod:`servegym.agents.cli.proxy`) read their defaults here (no network code here, so that
it stays cheap to import).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from servegym.errors import UserError

Vendor = Literal["anthropic", "openai", "gemini"]
VENDORS: tuple[Vendor, ...] = ("anthropic", "openai", "gemini")

KEY_ENV: dict[Vendor, str] = {
    "anthropic": "ANTHROPIC_API_KEY",
    "openai": "OPENAI_API_KEY",
    "gemini": "GEMINI_API_KEY",
}
"""The environment variable each vendor's key is read from unless another is named."""

UPSTREAM: dict[Vendor, str] = {
    "anthropic": "https://api.anthropic.com",
    "openai": "https://api.openai.com",
    "gemini": "https://generativelanguage.googleapis.com",
}
"""Each vendor's API root."""


def normalise_upstream(vendor: Vendor, url: str) -> str:
    """``url`` as the API root: no trailing slash, no trailing ``/v1`` (``/v1beta``)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"--base-url: '{url}' is not an http(s) URL")
    root = url.strip().rstrip("/")
    suffix = "/v1beta" if vendor == "gemini" else "/v1"
    if root.endswith(suffix):
        root = root[: -len(suffix)]
    return root
