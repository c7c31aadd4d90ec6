"""A provider from a model spec: ``anthropic:MODEL``, ``openai:MODEL`` or
``openai-compatible:MODEL`` (with a base URL).

The LLM agents and the judge build their clients here, the same way: the model and the API
key are checked when the spec is chosen (so a missing key fails before a trial starts), the
client is made later, when it is needed (:meth:`ProviderChoice.make`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servegym.errors import UserError
from servegym.providers.clients import (
    AnthropicProvider,
    OpenAIProvider,
    Provider,
    RetryPolicy,
    resolve_api_key,
)

PROVIDER_KINDS = ("anthropic", "openai", "openai-compatible")
"""The spec kinds (``<kind>:<model>``) a provider is made from."""


@dataclass(frozen=True)
class ProviderChoice:
    """A checked spec, with its API key: everything needed to make the client."""

    kind: str
    model: str
    api_key: str = field(repr=False)
    base_url: str | None = None
    api_key_env: str | None = None

    def make(self, retry: RetryPolicy | None = None, *, timeout_s: float = 600.0) -> Provider:
        """The client (it opens its HTTP connections; :meth:`Provider.aclose` them);
        ``timeout_s``: one request's timeout."""
        if self.kind == "anthropic":
            return AnthropicProvider(
                self.model,
                self.api_key,
                base_url=self.base_url,
                api_key_env=self.api_key_env,
                retry=retry,
                timeout_s=timeout_s,
            )
        if self.kind == "openai":
            return OpenAIProvider(
                self.model,
                self.api_key,
                base_url=self.base_url,
                api_key_env=self.api_key_env,
                retry=retry,
                timeout_s=timeout_s,
            )
        return OpenAIProvider(
            self.model,
            self.api_key,
            base_url=self.base_url,
            api_key_env=self.api_key_env,
            name="openai-compatible",
            max_tokens_field="max_tokens",
            retry=retry,
            timeout_s=timeout_s,
        )


def choose_provider(
    kind: str,
    model: str | None,
    base_url: str | None = None,
    api_key_env: str | None = None,
) -> ProviderChoice:
    """Check ``kind:model`` (a model is named; an OpenAI-compatible server has a base URL)
    and read its API key from the environment. Errors name the ``--agent`` flag, the one a
    model spec is given with."""
    if kind not in PROVIDER_KINDS:
        raise ValueError(f"not a provider kind: {kind!r}")
    if not model:
        raise UserError(f"--agent {kind}: name the model, e.g. --agent {kind}:MODEL")
    if kind == "openai-compatible" and not base_url:
        raise UserError("--agent openai-compatible: needs --base-url (the server's /v1 URL)")
    key = resolve_api_key(kind, api_key_env, allow_placeholder=kind == "openai-compatible")
    return ProviderChoice(kind, model, key, base_url=base_url, api_key_env=api_key_env)
