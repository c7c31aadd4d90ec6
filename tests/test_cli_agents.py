"""CLI agents (Claude Code, Codex CLI, Gemini CLI, OpenCode), without Docker or network:
each adapter's command line, environment and container; the control server driven by the
real ``servegym-agent`` script; the key-adding proxy in front of the local API fakes, through
the real SDK clients; and the session loop with a stand-in for Docker. A real run needs
Docker, an image with the CLIs, a key and the network: it skips here with the reason."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import docker.errors as docker_errors
import openai
import pytest
from aiohttp import web
from test_sandbox_docker import binds

from servegym.agents.base import (
    BudgetExhausted,
    BudgetState,
    ExperimentResult,
    TaskDescription,
    make_agent,
)
from servegym.agents.cli import servegym_agent
from servegym.agents.cli.adapters import (
    ADAPTERS,
    CONTAINER_BIN,
    CONTAINER_HOME,
    ENTRYPOINT,
    WORKSPACE,
    ClaudeCodeAdapter,
    CodexAdapter,
    GeminiCliAdapter,
    OpenCodeAdapter,
    SessionSetup,
    budget_left_text,
    continuation_prompt,
    first_prompt,
    opencode_provider,
)
from servegym.agents.cli.agent import (
    CliAgent,
    DockerSessions,
    SessionResult,
    bridge_gateway,
    make_cli_agent,
)
from servegym.agents.cli.background import BackgroundLoop
from servegym.agents.cli.control import LOG_TAIL_CHARS, ControlServer
from servegym.agents.cli.proxy import KeyProxy, read_api_key
from servegym.errors import UserError
from servegym.providers.fakes import FakeAnthropic, FakeOpenAI, final_text
from servegym.sandbox import docker_runner
from servegym.sandbox.workspace import WorkspaceError

SCRIPT = Path(servegym_agent.__file__)
REAL_KEY = "sk-REAL-harness-key-0123456789"
SECRETS = {
    "ANTHROPIC_API_KEY": "sk-ant-SECRET-do-not-leak-1",
    "OPENAI_API_KEY": "sk-openai-SECRET-do-not-leak-2",
    "GEMINI_API_KEY": "gemini-SECRET-do-not-leak-3",
}


# --------------------------------------------------------------------------- a fake task


def describe(track: str = "cpu") -> TaskDescription:
    return TaskDescription(
        task_id="tiny-cpu",
        title="tiny",
        instruction="Make the server faster.",
        track=track,
        model="servegym-tiny",
        hardware="cpu",
        price_per_gpu_hour=0.0,
        engines=["vllm-cpu"],
        baseline={},
        knobs=[],
        workload={},
        objective="output_throughput",
        higher_is_better=True,
        sla=None,
        accuracy_min_ratio=0.9,
        budget=BudgetState(),
        tuning="config" if track == "sim" else "workspace",
    )


class FakeWorkspace:
    def __init__(self, root: Path) -> None:
        self.root = root


class FakeWorkspaceEnv:
    """A real-track environment in miniature: ``benchmarks`` benchmarks of 60 s each."""

    def __init__(self, root: Path, benchmarks: int = 2, track: str = "cpu") -> None:
        self.workspace = FakeWorkspace(root)
        self.track = track
        self.limit = benchmarks
        self.run = 0
        self.submitted: list[str] = []
        self.gate: threading.Event | None = None  # when set, a benchmark waits for it
        self.started = threading.Event()
        self.extra_seconds = 0.0
        self.active = 0
        self.most_active = 0  # benchmarks that ever ran at once

    def describe(self) -> TaskDescription:
        return describe(self.track)

    def workspace_environment(self) -> FakeWorkspaceEnv | None:
        return None if self.track == "sim" else self

    def budget_left(self) -> BudgetState:
        return BudgetState(
            experiments_run=self.run,
            experiments_left=self.limit - self.run,
            wall_seconds_used=60.0 * self.run + self.extra_seconds,
            wall_seconds_left=60.0 * (self.limit - self.run) + 30.0 - self.extra_seconds,
        )

    def run_experiment(self, config: Any, quick: bool = False) -> ExperimentResult:
        raise NotImplementedError

    def submit(self, config: Any) -> None:
        raise NotImplementedError

    def run_benchmark(self, quick: bool = False) -> ExperimentResult:
        if self.run >= self.limit:
            raise BudgetExhausted(f"{self.limit} benchmarks run")
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        self.started.set()
        try:
            if self.gate is not None:
                assert self.gate.wait(10)
        finally:
            self.active -= 1
        self.run += 1
        return ExperimentResult(
            index=self.run - 1,
            config={},
            quick=quick,
            ok=True,
            objective_value=123.0,
            improvement=1.25,
            accuracy_ratio=1.0,
            log_tail="x" * 5000 + "END",
            budget=self.budget_left(),
        )

    def charge_wall_seconds(self, seconds: float) -> None:
        self.extra_seconds += seconds

    def submit_workspace(self) -> str:
        if not (self.workspace.root / "start_server.sh").is_file():
            raise WorkspaceError("the workspace has no start_server.sh: write it, then submit")
        self.submitted.append("ok")
        return "submitted the workspace: 1 files"


def launcher_env(tmp_path: Path, benchmarks: int, script: str = "#!/bin/sh\n") -> FakeWorkspaceEnv:
    """A workspace task under ``tmp_path/ws`` whose folder holds a ``start_server.sh``."""
    env = FakeWorkspaceEnv(tmp_path / "ws", benchmarks=benchmarks)
    env.workspace.root.mkdir()
    (env.workspace.root / "start_server.sh").write_text(script)
    return env


def setup_for(tmp_path: Path, **kw: Any) -> SessionSetup:
    for name in ("ws", "bin", "home"):
        (tmp_path / name).mkdir(exist_ok=True)
    values: dict[str, Any] = {
        "image": "servegym/cli-agents",
        "workspace_dir": tmp_path / "ws",
        "bin_dir": tmp_path / "bin",
        "home_dir": tmp_path / "home",
        "proxy_url": "http://172.17.0.1:41000",
        "proxy_credential": "servegym-proxy-TOKEN",
        "control_url": "http://172.17.0.1:42000",
        "control_token": "CONTROL-TOKEN",
        "user": "1000:1000",
        "name": "servegym-cli-test-0",
    }
    values.update(kw)
    return SessionSetup(**values)


# --------------------------------------------------------------------------- adapters


def test_claude_code_command_and_env(tmp_path: Path) -> None:
    a = ClaudeCodeAdapter("claude-sonnet-4-5")
    assert a.command("PROMPT") == [
        "claude", "-p", "PROMPT", "--output-format", "stream-json", "--verbose",
        "--model", "claude-sonnet-4-5", "--dangerously-skip-permissions",
    ]  # fmt: skip
    env = a.environment(setup_for(tmp_path))
    assert env["ANTHROPIC_BASE_URL"] == "http://172.17.0.1:41000"
    assert env["ANTHROPIC_API_KEY"] == "servegym-proxy-TOKEN"
    assert env["IS_SANDBOX"] == "1"
    # a real-track benchmark outlasts the Bash tool's 2-minute default: it must not go to
    # the background (the real CLI's cpu trial in test_cli_agents_docker.py found it)
    assert int(env["BASH_DEFAULT_TIMEOUT_MS"]) >= 30 * 60 * 1000
    assert env["BASH_MAX_TIMEOUT_MS"] == env["BASH_DEFAULT_TIMEOUT_MS"]
    assert env["SERVEGYM_CONTROL_URL"] == "http://172.17.0.1:42000"
    assert env["SERVEGYM_CONTROL_TOKEN"] == "CONTROL-TOKEN"
    assert env["HOME"] == CONTAINER_HOME
    assert ClaudeCodeAdapter().command("P") == [
        "claude", "-p", "P", "--output-format", "stream-json", "--verbose",
        "--dangerously-skip-permissions",
    ]  # fmt: skip


def test_codex_command_and_env(tmp_path: Path) -> None:
    a = CodexAdapter("gpt-5-codex")
    assert a.command("PROMPT") == [
        "codex", "exec", "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check",
        "--json", "--model", "gpt-5-codex", "PROMPT",
    ]  # fmt: skip
    env = a.environment(setup_for(tmp_path))
    assert env["OPENAI_BASE_URL"] == "http://172.17.0.1:41000/v1"
    assert env["OPENAI_API_KEY"] == env["CODEX_API_KEY"] == "servegym-proxy-TOKEN"


def test_gemini_cli_command_env_and_settings(tmp_path: Path) -> None:
    a = GeminiCliAdapter("gemini-2.5-pro")
    assert a.command("PROMPT") == [
        "gemini", "-p", "PROMPT", "--output-format", "stream-json", "--model", "gemini-2.5-pro",
        "--approval-mode", "yolo", "--skip-trust",
    ]  # fmt: skip
    assert "--model" not in GeminiCliAdapter().command("P")
    env = a.environment(setup_for(tmp_path))
    assert env["GOOGLE_GEMINI_BASE_URL"] == "http://172.17.0.1:41000"
    assert env["GEMINI_API_KEY"] == "servegym-proxy-TOKEN"
    # A base URL alone makes Gemini CLI 0.61 pick the "gateway" auth, which its headless
    # mode refuses; the home's settings pick the API key (tests/test_cli_agents_docker.py).
    (path, text), *others = a.home_files().items()
    assert path == ".gemini/settings.json" and not others
    settings = json.loads(text)
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["tools"]["shell"]["inactivityTimeout"] >= 30 * 60
    assert "servegym-proxy" not in text
    assert ClaudeCodeAdapter().home_files() == {}


def test_opencode_command_and_config(tmp_path: Path) -> None:
    a = OpenCodeAdapter("anthropic/claude-sonnet-4-5")
    assert a.provider == "anthropic"
    assert a.command("PROMPT") == [
        "opencode", "run", "--format", "json", "--model", "anthropic/claude-sonnet-4-5", "PROMPT",
    ]  # fmt: skip
    env = a.environment(setup_for(tmp_path))
    assert int(env["OPENCODE_EXPERIMENTAL_BASH_DEFAULT_TIMEOUT_MS"]) >= 30 * 60 * 1000
    assert env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    assert config["provider"] == {
        "anthropic": {
            "options": {"baseURL": "http://172.17.0.1:41000/v1", "apiKey": "servegym-proxy-TOKEN"}
        }
    }
    assert config["permission"]["bash"] == "allow"
    assert opencode_provider("gpt-5") == ("openai", "gpt-5")
    assert opencode_provider("gemini-2.5-pro") == ("google", "gemini-2.5-pro")
    google = OpenCodeAdapter("google/gemini-2.5-pro")
    assert google.provider == "gemini"
    google_config = google.config("http://h:1", "c")["provider"]["google"]["options"]
    assert google_config["baseURL"] == "http://h:1/v1beta"
    with pytest.raises(UserError, match="PROVIDER/MODEL"):
        opencode_provider("llama-3")
    with pytest.raises(UserError, match="not proxied"):
        opencode_provider("mistral/large")


@pytest.mark.parametrize(
    "name,model",
    [
        ("claude-code", "claude-sonnet-4-5"),
        ("codex", "gpt-5-codex"),
        ("gemini-cli", "gemini-2.5-pro"),
        ("opencode", "openai/gpt-5"),
    ],
)
def test_container_holds_no_api_key(
    name: str, model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in SECRETS.items():
        monkeypatch.setenv(var, value)
    agent = make_agent(f"{name}:{model}")
    assert isinstance(agent, CliAgent) and agent.name == f"{name}:{model}"
    assert all(v not in repr(agent) for v in SECRETS.values())
    setup = setup_for(tmp_path)
    prompt = first_prompt("Make it fast.", BudgetState(wall_seconds_left=900))
    spec = agent.adapter.container_spec(setup, prompt)
    kwargs = agent.adapter.container_kwargs(setup, prompt)
    dumped = json.dumps(kwargs, default=str) + spec.model_dump_json()
    for value in SECRETS.values():
        assert value not in dumped
    assert kwargs["network_mode"] == "bridge"
    assert kwargs["user"] == "1000:1000" and kwargs["working_dir"] == WORKSPACE
    assert kwargs["entrypoint"] == ENTRYPOINT and CONTAINER_BIN in ENTRYPOINT[2]
    assert kwargs["command"] == agent.adapter.command(prompt, setup.proxy_url)
    # The workspace read-write, the command read-only, a fresh home: nothing else.
    assert binds(kwargs) == {
        str(tmp_path / "ws"): {"bind": WORKSPACE, "mode": "rw"},
        str(tmp_path / "bin"): {"bind": CONTAINER_BIN, "mode": "ro"},
        str(tmp_path / "home"): {"bind": CONTAINER_HOME, "mode": "rw"},
    }
    assert WORKSPACE == docker_runner.WORKSPACE
    env = kwargs["environment"]
    assert isinstance(env, dict) and "servegym-proxy-TOKEN" in json.dumps(env)  # placeholder
    assert "PATH" not in env  # the image's own PATH stays; the entrypoint prepends the bin


def test_registry_names_and_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in SECRETS.items():
        monkeypatch.setenv(var, value)
    agent = make_agent("codex:gpt-5", image="my/image", max_sessions=3)
    assert isinstance(agent, CliAgent)
    assert agent.settings.image == "my/image" and agent.settings.max_sessions == 3
    with pytest.raises(UserError, match="unknown setting 'max_turns'"):
        make_agent("claude-code:claude-sonnet-4-5", max_turns=3)
    with pytest.raises(UserError, match="opencode only"):
        make_agent("codex:gpt-5", provider="openai")
    with pytest.raises(UserError, match="claude-code:MODEL"):
        make_agent("claude-code")
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(UserError, match="ANTHROPIC_API_KEY"):
        make_agent("claude-code:claude-sonnet-4-5")
    with pytest.raises(UserError, match="MY_KEY"):
        read_api_key("openai", "MY_KEY", environ={})


def test_prompts_say_the_minutes_left() -> None:
    assert budget_left_text(BudgetState(wall_seconds_left=725.0)) == "12 minutes of budget left"
    assert budget_left_text(BudgetState(wall_seconds_left=60.0)) == "1 minute of budget left"
    assert budget_left_text(BudgetState(wall_seconds_left=20.0)).startswith("less than a minute")
    assert budget_left_text(BudgetState(experiments_left=3)) == "3 benchmarks of budget left"
    text = continuation_prompt("Make the server faster.", BudgetState(wall_seconds_left=725.0))
    assert text.startswith(
        "You have 12 minutes of budget left. Continue: improve start_server.sh, run "
        "`servegym-agent benchmark`, and `servegym-agent submit` your best."
    )
    assert "Make the server faster." in text and "servegym-agent budget" in text
    first = first_prompt("Make the server faster.", BudgetState(wall_seconds_left=1800.0))
    assert first.startswith("Make the server faster.") and "30 minutes of budget left" in first
    # a task tuned through configs (a pipeline task): the workspace's serving.toml
    config = continuation_prompt("Tune it.", BudgetState(wall_seconds_left=725.0), "config")
    assert "Continue: improve serving.toml, run" in config and "start_server.sh" not in config


# --------------------------------------------------------------------------- control server


def test_servegym_agent_uses_the_standard_library_only() -> None:
    tree = ast.parse(SCRIPT.read_text("utf-8"))
    modules = {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0
    } | {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules.discard("__future__")
    assert modules and modules <= set(sys.stdlib_module_names), modules


@pytest.fixture
def control(tmp_path: Path) -> Iterator[tuple[ControlServer, FakeWorkspaceEnv, list[Any]]]:
    env = FakeWorkspaceEnv(tmp_path / "ws")
    env.workspace.root.mkdir()
    calls: list[dict[str, Any]] = []
    with BackgroundLoop() as loop:
        server = ControlServer(env, on_call=calls.append)  # type: ignore[arg-type]
        loop.run(server.start())
        try:
            yield server, env, calls
        finally:
            loop.run(server.close())


def agent_cmd(
    tmp_path: Path, server: ControlServer, *args: str, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the script as the sandbox does: a copy of the file, outside the package."""
    copy = tmp_path / "bin" / "servegym_agent.py"
    if not copy.exists():
        copy.parent.mkdir(exist_ok=True)
        shutil.copy(SCRIPT, copy)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "SERVEGYM_CONTROL_URL": server.url,
        "SERVEGYM_CONTROL_TOKEN": token if token is not None else server.token,
    }
    return subprocess.run(
        [sys.executable, "-I", str(copy), *args],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_control_server_through_the_real_command(
    control: tuple[ControlServer, FakeWorkspaceEnv, list[Any]], tmp_path: Path
) -> None:
    server, env, calls = control
    assert len(server.token) >= 40  # secrets.token_urlsafe(32)
    done = agent_cmd(tmp_path, server, "benchmark", "--quick")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ok"] and out["quick"] and out["experiment"] == 0
    assert out["objective_value"] == 123.0 and out["improvement"] == 1.25
    assert len(out["log_tail"]) == LOG_TAIL_CHARS and out["log_tail"].endswith("END")
    assert out["budget"].startswith("budget: 1 benchmark run, 1 left, 1.5 minutes")

    budget = agent_cmd(tmp_path, server, "budget")
    assert budget.returncode == 0
    assert json.loads(budget.stdout)["budget"]["experiments_left"] == 1

    refused = agent_cmd(tmp_path, server, "submit")  # no start_server.sh yet
    assert refused.returncode == 1 and "no start_server.sh" in refused.stderr
    (env.workspace.root / "start_server.sh").write_text("#!/bin/sh\n")
    submitted = agent_cmd(tmp_path, server, "submit")
    assert submitted.returncode == 0 and env.submitted == ["ok"]
    assert "submitted the workspace" in json.loads(submitted.stdout)["submitted"]

    assert agent_cmd(tmp_path, server, "benchmark").returncode == 0
    spent = agent_cmd(tmp_path, server, "benchmark")
    assert spent.returncode == 1 and "budget is spent" in spent.stderr

    wrong = agent_cmd(tmp_path, server, "budget", token="not-the-token")
    assert wrong.returncode == 2 and "refused SERVEGYM_CONTROL_TOKEN" in wrong.stderr
    assert agent_cmd(tmp_path, server, "frobnicate").returncode == 2  # usage

    names = [(c["name"], c["status"]) for c in calls]
    assert names == [
        ("benchmark", 200),
        ("budget", 200),
        ("submit", 400),
        ("submit", 200),
        ("benchmark", 200),
        ("benchmark", 409),
    ]  # fmt: skip  (the refused token never reaches a handler; the last: the budget is spent)
    assert all(c["kind"] == "tool" for c in calls) and calls[0]["arguments"] == {"quick": True}


async def test_control_server_refuses_without_the_token(
    control: tuple[ControlServer, FakeWorkspaceEnv, list[Any]],
) -> None:
    server, env, _ = control
    async with aiohttp.ClientSession() as s:
        async with s.get(server.url + "/budget") as r:
            assert r.status == 401
        async with s.post(server.url + "/benchmark", json={"quick": True}) as r:
            assert r.status == 401
        auth = {"Authorization": f"Bearer {server.token}"}
        async with s.post(server.url + "/benchmark", json={"quick": "yes"}, headers=auth) as r:
            assert r.status == 400
    assert env.run == 0


def _agent_popen(tmp_path: Path, server: ControlServer, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-I", str(tmp_path / "bin" / "servegym_agent.py"), *args],
        env={"SERVEGYM_CONTROL_URL": server.url, "SERVEGYM_CONTROL_TOKEN": server.token},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_second_benchmark_waits_for_the_running_one(
    control: tuple[ControlServer, FakeWorkspaceEnv, list[Any]], tmp_path: Path
) -> None:
    """A CLI that backgrounds a long benchmark (Codex's exec_command) and benchmarks again
    gets both results in order; a third while one waits is refused, and none overlap."""
    server, env, calls = control
    env.gate = threading.Event()
    agent_cmd(tmp_path, server, "budget")  # copies the script
    first = _agent_popen(tmp_path, server, "benchmark")
    second: subprocess.Popen[str] | None = None
    try:
        assert env.started.wait(10)
        second = _agent_popen(tmp_path, server, "benchmark", "--quick")
        assert _until(lambda: server._waiting == 1)
        third = agent_cmd(tmp_path, server, "benchmark")
        assert third.returncode == 1 and "another is waiting" in third.stderr
        assert env.run == 0 and server.busy
    finally:
        env.gate.set()
        _, err = first.communicate(timeout=20)
        waited_out, waited_err = second.communicate(timeout=20) if second else ("", "")
    assert first.returncode == 0, err
    assert second is not None and second.returncode == 0, waited_err
    assert json.loads(waited_out)["experiment"] == 1
    assert env.run == 2 and env.most_active == 1
    assert [(c["name"], c["status"]) for c in calls if c["name"] == "benchmark"] == [
        ("benchmark", 409),
        ("benchmark", 200),
        ("benchmark", 200),
    ]


def test_a_waiting_benchmark_whose_caller_went_away_is_dropped_unrun(
    control: tuple[ControlServer, FakeWorkspaceEnv, list[Any]], tmp_path: Path
) -> None:
    server, env, calls = control
    env.gate = threading.Event()
    agent_cmd(tmp_path, server, "budget")
    first = _agent_popen(tmp_path, server, "benchmark")
    try:
        assert env.started.wait(10)
        second = _agent_popen(tmp_path, server, "benchmark")
        assert _until(lambda: server._waiting == 1)
        second.kill()
        second.communicate(timeout=10)
        assert _until(lambda: server._waiting == 0)
    finally:
        env.gate.set()
        first.communicate(timeout=20)
    assert first.returncode == 0
    assert _until(lambda: not server.busy)
    assert env.run == 1  # the dropped one ran nothing and charged nothing
    dropped = [c for c in calls if c["status"] == 409]
    assert len(dropped) == 1 and "went away" in dropped[0]["result"]["error"]


def test_servegym_agent_connection_errors(tmp_path: Path) -> None:
    code = servegym_agent.main(["budget"], environ={})
    assert code == 2
    env = {"SERVEGYM_CONTROL_URL": "http://127.0.0.1:9", "SERVEGYM_CONTROL_TOKEN": "t"}
    done = subprocess.run(
        [sys.executable, "-m", "servegym.agents.cli.servegym_agent", "budget"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and "cannot reach the control server" in done.stderr


# --------------------------------------------------------------------------- proxy


async def test_proxy_adds_the_anthropic_key() -> None:
    async with (
        FakeAnthropic([final_text("hello from upstream")], api_key=REAL_KEY) as fake,
        KeyProxy("anthropic", REAL_KEY, upstream=fake.url) as proxy,
    ):
        client = anthropic.AsyncAnthropic(api_key="servegym-proxy", base_url=proxy.url)
        reply = await client.messages.create(
            model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
        await client.close()
    assert reply.content[0].text == "hello from upstream"  # type: ignore[union-attr]
    (request,) = fake.requests
    assert request.status == 200 and request.api_key == REAL_KEY
    assert "servegym-proxy" not in json.dumps(request.headers)
    assert request.body["messages"] == [{"role": "user", "content": "hi"}]
    assert REAL_KEY not in repr(proxy)


async def test_proxy_adds_the_openai_key_and_checks_the_sandbox_credential() -> None:
    async with (
        FakeOpenAI([final_text("hi there")], api_key=REAL_KEY) as fake,
        KeyProxy("openai", REAL_KEY, upstream=fake.base_url, client_token="trial-tok") as proxy,
    ):
        client = openai.AsyncOpenAI(api_key="trial-tok", base_url=proxy.url + "/v1")
        models = await client.models.list()
        reply = await client.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "hi"}]
        )
        intruder = openai.AsyncOpenAI(
            api_key="some-other-container", base_url=proxy.url + "/v1", max_retries=0
        )
        with pytest.raises(openai.AuthenticationError):
            await intruder.chat.completions.create(
                model="gpt-x", messages=[{"role": "user", "content": "hi"}]
            )
        await client.close()
        await intruder.close()
    assert [m.id for m in models.data] == ["fake"]
    assert reply.choices[0].message.content == "hi there"
    assert [r.path for r in fake.requests] == ["/v1/models", "/v1/chat/completions"]
    assert all(r.api_key == REAL_KEY for r in fake.requests)
    assert not any("trial-tok" in json.dumps(r.headers) for r in fake.requests)
    assert proxy.refused == 1  # the intruder never reached upstream


@pytest.fixture
async def sse_upstream() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """An upstream that streams chat-completion chunks; the second waits for ``release``."""
    state: dict[str, Any] = {"release": asyncio.Event(), "headers": None, "query": None}

    def chunk(content: str | None, finish: str | None = None) -> bytes:
        delta = {} if content is None else {"content": content}
        body = {
            "id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }  # fmt: skip
        return f"data: {json.dumps(body)}\n\n".encode()

    async def handle(request: web.Request) -> web.StreamResponse:
        state["headers"] = dict(request.headers)
        state["query"] = dict(request.query)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk("first"))
        await asyncio.wait_for(state["release"].wait(), 5)  # the client saw "first" by now
        await response.write(chunk(" second"))
        await response.write(chunk(None, "stop"))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", state
    await runner.cleanup()


async def test_proxy_streams_sse_chunk_by_chunk(sse_upstream: tuple[str, dict[str, Any]]) -> None:
    url, state = sse_upstream
    async with KeyProxy("openai", REAL_KEY, upstream=url) as proxy:
        client = openai.AsyncOpenAI(api_key="servegym-proxy", base_url=proxy.url + "/v1")
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        parts: list[str] = []
        async for event in stream:
            if event.choices and event.choices[0].delta.content:
                parts.append(event.choices[0].delta.content)
                state["release"].set()  # upstream sends the rest only once we saw this
        await client.close()
    assert parts == ["first", " second"]
    assert state["headers"]["Authorization"] == f"Bearer {REAL_KEY}"


async def test_proxy_gemini_key_header_and_query(sse_upstream: tuple[str, dict[str, Any]]) -> None:
    url, state = sse_upstream
    state["release"].set()
    async with (
        KeyProxy("gemini", REAL_KEY, upstream=url + "/v1beta") as proxy,
        aiohttp.ClientSession() as s,
        s.post(
            proxy.url + "/v1beta/models/g:streamGenerateContent?alt=sse&key=servegym-proxy",
            json={},
            headers={"x-goog-api-key": "servegym-proxy"},
        ) as r,
    ):
        assert r.status == 200
        await r.read()
    assert state["headers"]["x-goog-api-key"] == REAL_KEY
    assert state["query"] == {"alt": "sse"}  # the client's key parameter is gone


async def test_proxy_upstream_down_is_a_502() -> None:
    async with (
        KeyProxy("anthropic", REAL_KEY, upstream="http://127.0.0.1:9") as proxy,
        aiohttp.ClientSession() as s,
        s.post(proxy.url + "/v1/messages") as r,
    ):
        assert r.status == 502
        assert REAL_KEY not in await r.text()


# --------------------------------------------------------------------------- the agent


class ProcessSessions:
    """Sessions as local processes instead of containers: each "CLI session" runs the real
    ``servegym-agent`` from the mounted bin folder with the container's environment."""

    def __init__(self, script: Callable[[int], list[list[str]]]) -> None:
        self.script = script
        self.index = 0
        self.kwargs: list[dict[str, Any]] = []

    def available(self) -> str | None:
        return None

    def ensure_image(self, image: str) -> None:
        pass

    def addresses(self) -> tuple[str, str]:
        return "127.0.0.1", "127.0.0.1"

    def run(
        self, kwargs: dict[str, Any], timeout_s: float, log_path: Path, stop: Callable[[], bool]
    ) -> SessionResult:
        self.kwargs.append(kwargs)
        bin_dir = next(h for h, m in binds(kwargs).items() if m["bind"] == CONTAINER_BIN)
        env = {**kwargs["environment"], "PATH": os.environ.get("PATH", "")}
        output = []
        for args in self.script(self.index):
            done = subprocess.run(
                [sys.executable, "-I", str(Path(bin_dir) / "servegym_agent.py"), *args],
                env=env, capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            output.append(done.stdout + done.stderr)
        self.index += 1
        log_path.write_text("\n".join(output))
        return SessionResult(exit_code=0, seconds=0.1, output_tail="\n".join(output)[-4000:])


def test_sessions_until_the_budget_is_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in SECRETS.items():
        monkeypatch.setenv(var, value)
    env = launcher_env(tmp_path, 3)
    sessions = ProcessSessions(
        lambda i: [["benchmark", "--quick"], ["submit"]] if i == 0 else [["benchmark"]] * 2
    )
    agent = make_cli_agent("claude-code", "claude-sonnet-4-5", sessions=sessions)
    agent.trajectory_path = tmp_path / "trial" / "trajectory.jsonl"
    agent.run(env, seed=0)
    assert agent.outcome == "budget_spent" and agent.sessions_run == 2
    assert env.run == 3 and env.submitted == ["ok"]
    prompts = [k["command"][2] for k in sessions.kwargs]
    assert prompts[0].startswith("Make the server faster.")
    assert prompts[1].startswith("You have 2 minutes of budget left. Continue:")
    text = agent.trajectory_path.read_text()
    assert all(v not in text for v in SECRETS.values())
    lines = [json.loads(x) for x in text.splitlines()]
    kinds = [x["kind"] for x in lines]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("session") == 2
    tools = [(x["name"], x["status"]) for x in lines if x["kind"] == "tool"]
    assert tools == [("benchmark", 200), ("submit", 200), ("benchmark", 200), ("benchmark", 200)]
    session = next(x for x in lines if x["kind"] == "session")
    assert session["exit_code"] == 0 and session["control_calls"] == 2
    assert "improvement" in session["output_tail"]
    assert (tmp_path / "trial" / "cli-agent" / "session-1.log").exists()


def test_the_home_holds_the_adapters_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemini CLI's settings are in the mounted home when its session starts."""
    monkeypatch.setenv("GEMINI_API_KEY", REAL_KEY)
    env = launcher_env(tmp_path, 1)
    seen: dict[str, str] = {}

    class Sessions(ProcessSessions):
        def run(
            self, kwargs: dict[str, Any], timeout_s: float, log_path: Path, stop: Callable[[], bool]
        ) -> SessionResult:
            home = next(h for h, m in binds(kwargs).items() if m["bind"] == CONTAINER_HOME)
            seen["settings"] = (Path(home) / ".gemini" / "settings.json").read_text()
            return super().run(kwargs, timeout_s, log_path, stop)

    agent = make_cli_agent("gemini-cli", "gemini-2.5-pro", sessions=Sessions(lambda i: []))
    agent.trajectory_path = tmp_path / "trial" / "trajectory.jsonl"
    agent.run(env, seed=0)
    assert json.loads(seen["settings"])["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert REAL_KEY not in seen["settings"]


def test_cli_agent_needs_a_workspace_or_a_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    agent = make_agent("codex:gpt-5")
    env = FakeWorkspaceEnv(tmp_path, track="cpu")
    env.workspace_environment = lambda: None  # type: ignore[method-assign]
    with pytest.raises(UserError, match="neither a workspace nor a config"):
        agent.run(env, seed=0)
    assert getattr(agent, "outcome", None) == "wrong_track"


class EditingSessions(ProcessSessions):
    """Each session first rewrites the mounted workspace's serving.toml (as the CLI would
    with its edit tool), then runs its ``servegym-agent`` commands."""

    def __init__(self, edits: list[str], script: Callable[[int], list[list[str]]]) -> None:
        super().__init__(script)
        self.edits = edits

    def run(
        self, kwargs: dict[str, Any], timeout_s: float, log_path: Path, stop: Callable[[], bool]
    ) -> SessionResult:
        ws = next(h for h, m in binds(kwargs).items() if m["bind"] == "/workspace")
        config = Path(ws) / "serving.toml"
        self.first_text = getattr(self, "first_text", config.read_text())
        if self.index < len(self.edits):
            config.write_text(self.edits[self.index])
        return super().run(kwargs, timeout_s, log_path, stop)


def test_cli_agent_on_a_sim_task_tunes_its_serving_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sim task has no workspace: the CLI gets the task's serving.toml in a folder of its
    trial, and its benchmarks and submission are the simulator's experiments and submission."""
    from servegym.runner.trial import run_trial
    from servegym.tasks.loader import load_task_folder

    monkeypatch.setenv("ANTHROPIC_API_KEY", REAL_KEY)
    sessions = EditingSessions(
        ["max_num_seqs = 64\n", "max_num_seqs = 2\n"],
        lambda i: [["benchmark", "--quick"], ["submit"]] if i == 0 else [["benchmark"]],
    )
    loaded = load_task_folder(Path(__file__).parent / "data" / "tasks" / "tiny-throughput")
    result = run_trial(
        loaded,
        "claude-code:claude-sonnet-4-5",
        0,
        tmp_path / "runs",
        agent_options={"sessions": sessions, "max_sessions": 2},
    )
    assert "max_num_seqs = 8" in sessions.first_text  # the baseline, then the knob list
    assert "# Knobs" in sessions.first_text
    assert result.outcome == "scored" and result.score is not None and result.score > 1.0
    assert result.agent_outcome == "max_sessions"
    folder = tmp_path / "runs" / "tiny-throughput__claude-code:claude-sonnet-4-5__s0"
    experiments = [json.loads(x) for x in (folder / "experiments.jsonl").read_text().splitlines()]
    assert [(e["config"], e["quick"]) for e in experiments] == [
        ({"max_num_seqs": 64}, True),
        ({"max_num_seqs": 2}, False),
    ]
    assert result.agent_cost is not None and result.agent_cost["calls"] == 0
    tools = [json.loads(x) for x in (folder / "trajectory.jsonl").read_text().splitlines()]
    assert [x["name"] for x in tools if x["kind"] == "tool"] == ["benchmark", "submit", "benchmark"]
    assert not any(
        REAL_KEY in f.read_text(errors="replace") for f in folder.rglob("*") if f.is_file()
    )


def test_cli_agent_without_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "k")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    agent = make_agent("gemini-cli:gemini-2.5-pro")
    with pytest.raises(UserError, match="CLI agents run in Docker: no Docker engine answers"):
        agent.run(FakeWorkspaceEnv(tmp_path), seed=0)
    assert getattr(agent, "outcome", None) == "docker_unavailable"


class FakeContainer:
    """Just enough of a Docker SDK container for :class:`DockerSessions`."""

    def __init__(self, runs_for: int | None) -> None:
        self.id = self.name = "c0ffee"
        self.runs_for = runs_for  # reloads before it exits (None: never)
        self.attrs: dict[str, Any] = {"State": {"Status": "running"}}
        self.events: list[str] = []

    def start(self) -> None:
        self.events.append("start")

    def reload(self) -> None:
        if self.runs_for is not None:
            self.runs_for -= 1
            if self.runs_for <= 0:
                self.attrs["State"] = {"Status": "exited", "ExitCode": 0}

    def logs(self, **kw: Any) -> Any:
        return iter([b"session output\n", b"done\n"]) if kw.get("stream") else b"done\n"

    def stop(self, timeout: int) -> None:
        self.events.append("stop")
        self.attrs["State"] = {"Status": "exited", "ExitCode": 137}

    def remove(self, **kw: Any) -> None:
        self.events.append("remove")


class FakeDockerRunner:
    def __init__(self, container: FakeContainer, gateway: str = "127.0.0.1") -> None:
        self.container = container
        self.created: list[dict[str, Any]] = []
        outer = self

        class Containers:
            def create(self, **kw: Any) -> FakeContainer:
                outer.created.append(kw)
                return container

        class Images:
            def get(self, image: str) -> None:
                if image != "servegym/cli-agents":
                    raise docker_errors.ImageNotFound(image)

        class Networks:
            def get(self, name: str) -> Any:
                return type("N", (), {"attrs": {"IPAM": {"Config": [{"Gateway": gateway}]}}})()

        self._client = type(
            "C", (), {"containers": Containers(), "images": Images(), "networks": Networks()}
        )()

    def available(self) -> str | None:
        return None

    def client(self) -> Any:
        return self._client


@pytest.mark.parametrize("runs_for,timed_out", [(2, False), (None, True)])
def test_docker_sessions_run_a_container_to_its_end(
    runs_for: int | None, timed_out: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    container = FakeContainer(runs_for)
    sessions = DockerSessions(FakeDockerRunner(container), poll_s=0.01)
    monkeypatch.setattr(sessions, "_log_api", lambda: None)  # the container's own log stream
    result = sessions.run(
        {"image": "servegym/cli-agents", "command": ["claude"]},
        0.3,
        tmp_path / "session-0.log",
        stop=lambda: False,
    )
    assert result.timed_out is timed_out
    assert result.exit_code == (None if timed_out else 0)
    assert "session output" in result.output_tail
    assert container.events[0] == "start" and container.events[-1] == "remove"


def test_docker_sessions_image_and_addresses() -> None:
    sessions = DockerSessions(FakeDockerRunner(FakeContainer(1)))
    sessions.ensure_image("servegym/cli-agents")
    with pytest.raises(UserError, match="servegym setup images cli-agents"):
        sessions.ensure_image("nope/missing")
    assert sessions.addresses() == ("127.0.0.1", "127.0.0.1")  # the gateway is ours
    far = DockerSessions(FakeDockerRunner(FakeContainer(1), gateway="203.0.113.7"))
    assert far.addresses() == ("127.0.0.1", "host.docker.internal")  # Docker Desktop


def test_bridge_gateway_named_or_the_subnets_first_address() -> None:
    """Debian's docker.io names no gateway for the default bridge: it is the subnet's first
    address (without this, a CLI was pointed at host.docker.internal, which Linux lacks)."""
    assert bridge_gateway([{"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.1"}]) == "172.17.0.1"
    assert bridge_gateway([{"Subnet": "172.17.0.0/16"}]) == "172.17.0.1"
    assert bridge_gateway([{"Subnet": "fd00::/64"}, {"Subnet": "10.9.0.0/24"}]) == "10.9.0.1"
    assert bridge_gateway([{"Subnet": "nonsense"}]) is None
    assert bridge_gateway([]) is None


def _docker_reachable() -> bool:
    try:
        return docker_runner.DockerRunner(timeout_s=5).available() is None
    except Exception:
        return False


@pytest.mark.docker
@pytest.mark.skipif(
    not (_docker_reachable() and os.environ.get("ANTHROPIC_API_KEY")),
    reason="needs Docker and network to run a CLI agent",
)
def test_real_claude_code_session(tmp_path: Path) -> None:
    """One real Claude Code session in the servegym/cli-agents image against the real API,
    on a fake task: it should at least ask for the budget or a benchmark."""
    env = launcher_env(tmp_path, 1, "#!/bin/sh\nexec sleep 1\n")
    model = os.environ.get("SERVEGYM_TEST_CLAUDE_MODEL", "claude-sonnet-4-5")
    agent = make_cli_agent("claude-code", model, max_sessions=1, session_timeout_s=600)
    agent.trajectory_path = tmp_path / "trajectory.jsonl"
    agent.run(env, seed=0)
    assert agent.sessions_run == 1 and agent.control_calls >= 1


def test_every_cli_is_registered() -> None:
    assert set(ADAPTERS) == {"claude-code", "codex", "gemini-cli", "opencode"}


def test_a_session_s_own_time_is_charged_and_benchmarks_are_not_charged_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servegym.agents.cli import agent as cli_agent

    clock = [1000.0]
    monkeypatch.setattr(cli_agent.time, "monotonic", lambda: clock[0])
    env = FakeWorkspaceEnv(tmp_path, benchmarks=3)
    busy = [False]
    meter = cli_agent.SessionMeter(env, lambda: busy[0])
    clock[0] += 5.0
    meter.tick()
    assert env.extra_seconds == pytest.approx(5.0)  # the CLI's own 5 s
    busy[0] = True  # a benchmark starts: nothing is charged while it runs
    clock[0] += 50.0
    meter.tick()
    assert env.extra_seconds == pytest.approx(5.0)
    env.run += 1  # it ends and charges its own 60 s
    busy[0] = False
    clock[0] += 12.0
    meter.tick()  # 62 s of wall time since the last tick, 60 of them the benchmark's
    assert env.extra_seconds == pytest.approx(7.0)
    clock[0] += 3.0
    meter.tick(final=True)
    assert env.extra_seconds == pytest.approx(10.0)


def test_an_environment_dump_keeps_no_key_or_token_in_the_trial_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CLI's session may print the container's environment (an agent runs `env`): the
    per-trial proxy token and control token it holds, like the real key, are redacted from
    the session's log and the trajectory before they are kept."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", REAL_KEY)
    env = launcher_env(tmp_path, 1)
    held: dict[str, str] = {}

    class DumpingSessions(ProcessSessions):
        def run(
            self, kwargs: dict[str, Any], timeout_s: float, log_path: Path, stop: Callable[[], bool]
        ) -> SessionResult:
            held.update(kwargs["environment"])
            dump = "\n".join(f"{k}={v}" for k, v in sorted(kwargs["environment"].items()))
            log_path.write_text(dump + f"\nand the key itself: {REAL_KEY}\n")
            return SessionResult(exit_code=0, seconds=0.1, output_tail=dump[-4000:])

    agent = make_cli_agent(
        "claude-code", "claude-sonnet-4-5", sessions=DumpingSessions(lambda i: [])
    )
    agent.trajectory_path = tmp_path / "trial" / "trajectory.jsonl"
    agent.run(env, seed=0)
    token = held["ANTHROPIC_API_KEY"]
    assert token.startswith("servegym-proxy-") and token != REAL_KEY
    secrets_held = [token, REAL_KEY] + [v for k, v in held.items() if "TOKEN" in k]
    assert len(secrets_held) >= 3  # the proxy token, the control token, the key
    files = [p for p in (tmp_path / "trial").rglob("*") if p.is_file()]
    assert any(p.name == "session-0.log" for p in files)
    for path in files:
        text = path.read_text(errors="replace")
        assert not [s for s in secrets_held if s in text], path.name
    log = (tmp_path / "trial" / "cli-agent" / "session-0.log").read_text()
    assert "ANTHROPIC_API_KEY=[redacted]" in log
