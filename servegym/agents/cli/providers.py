"""The providers a CLI agent's proxy fronts: their key variables, upstreams and credentials
(no network code here, so that the agent registry stays cheap to import)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlsplit

from servegym.errors import UserError

Provider = Literal["anthropic", "openai", "gemini"]
PROVIDERS: tuple[Provider, ...] = ("anthropic", "openai", "gemini")

KEY_ENV: dict[Provider, str] = {
    "anthropic": "ANTHROPIC_API_KEY",
    "openai": "OPENAI_API_KEY",
    "gemini": "GEMINI_API_KEY",
}
UPSTREAM: dict[Provider, str] = {
    "anthropic": "https://api.anthropic.com",
    "openai": "https://api.openai.com",
    "gemini": "https://generativelanguage.googleapis.com",
}
PLACEHOLDER_KEY = "servegym-proxy"
"""The credential a sandbox is given when the proxy checks none: not a key of anything."""


def read_api_key(
    provider: Provider, api_key_env: str | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """The provider's key from the harness environment; a :class:`UserError` naming the
    variable when it is missing or blank."""
    env = os.environ if environ is None else environ
    var = api_key_env or KEY_ENV[provider]
    key = env.get(var, "").strip()
    if not key:
        hint = "" if api_key_env else " (or name another variable with --api-key-env)"
        raise UserError(
            f"no API key for {provider}: set the environment variable {var} in the harness's "
            f"environment{hint}; the proxy adds it, the sandbox never sees it"
        )
    return key


def normalise_upstream(provider: Provider, url: str) -> str:
    """``url`` as the API root: no trailing slash, no trailing ``/v1`` (``/v1beta``)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"--base-url: '{url}' is not an http(s) URL")
    root = url.strip().rstrip("/")
    suffix = "/v1beta" if provider == "gemini" else "/v1"
    if root.endswith(suffix):
        root = root[: -len(suffix)]
    return root
