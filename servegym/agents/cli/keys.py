"""The credentials a CLI agent's proxy uses: the real key, read in the harness, and the
placeholder the sandbox is given (no network code here, so that the agent registry stays
cheap to import). The vendors' key variables and upstreams are
:mod:`servegym.providers.vendors`."""

from __future__ import annotations

import os
from collections.abc import Mapping

from servegym.errors import UserError
from servegym.providers.vendors import KEY_ENV, Vendor

PLACEHOLDER_KEY = "servegym-proxy"
"""The credential a sandbox is given when the proxy checks none: not a key of anything."""


def read_api_key(
    provider: Vendor, api_key_env: str | None = None, environ: Mapping[str, str] | None = None
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
