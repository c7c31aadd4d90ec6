"""LLM agents' plumbing: provider clients, costs, and fake provider servers for tests.

- :mod:`~servegym.agents.llm.types`: the provider-neutral conversation (messages, tool
  specs and calls, usage, a model turn) and the provider errors;
- :mod:`~servegym.agents.llm.providers`: :class:`Provider` and its Anthropic (Messages API)
  and OpenAI (Chat Completions, also any OpenAI-compatible server) implementations, with
  retries and API-key resolution;
- :mod:`~servegym.agents.llm.cost`: dollars per call from the price table ``pricing.toml``;
- :mod:`~servegym.agents.llm.fakes`: local HTTP servers speaking both APIs that replay a
  script of tool calls, with fault injection, for tests and for replaying runs without keys.

The agent loop (tools, budget, trajectories) builds on these.
"""
