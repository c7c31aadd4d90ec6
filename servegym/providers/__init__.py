"""Model providers, neutral: the clients the LLM agents and the LLM judge both use.

- :mod:`~servegym.providers.types`: the provider-neutral conversation (messages, tool
  specs and calls, usage, a model turn) and the provider errors;
- :mod:`~servegym.providers.clients`: :class:`~servegym.providers.clients.Provider` and its
  Anthropic (Messages API) and OpenAI (Chat Completions, also any OpenAI-compatible server)
  implementations, with retries and API-key resolution;
- :mod:`~servegym.providers.choose`: a provider from a model spec (``anthropic:MODEL``,
  ``openai:MODEL``, ``openai-compatible:MODEL``), built one way for agents and the judge;
- :mod:`~servegym.providers.vendors`: the vendors' key variables and API roots;
- :mod:`~servegym.providers.cost`: dollars per call from the price table ``pricing.toml``;
- :mod:`~servegym.providers.fakes`: local HTTP servers speaking both APIs that replay a
  script of tool calls, with fault injection, for tests and for replaying runs without keys.

Nothing here imports agents, tasks or the runner: only :mod:`servegym.errors` and
:mod:`servegym.aio_serve`.
"""
