"""CLI agents: Claude Code, Codex CLI, Gemini CLI and OpenCode, each in a Docker sandbox.

- :mod:`~servegym.agents.cli.agent`: :class:`CliAgent`, registered as ``claude-code``,
  ``codex``, ``gemini-cli`` and ``opencode`` (``--agent claude-code:MODEL``);
- :mod:`~servegym.agents.cli.adapters`: each CLI's command line, environment and container;
- :mod:`~servegym.agents.cli.control`: the control server behind ``servegym-agent``;
- :mod:`~servegym.agents.cli.servegym_agent`: ``servegym-agent`` itself (standard library
  only: it runs inside the sandbox);
- :mod:`~servegym.agents.cli.proxy`: the reverse proxy that adds the API key on the harness
  side, so that no key ever enters the sandbox.
"""
