"""Sweeps: the grid, the lock that makes a re-run resume and refuses another sweep, the
local and Ray executors giving the same trials, and a SIGKILLed sweep resumed with nothing
finished run again."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from servegym.cli.sweep import run_sweep_command
from servegym.errors import UserError
from servegym.runner.executors import LocalExecutor, TrialOutcome, make_executor
from servegym.runner.sweep import LOCK_FILE, build_config, claim_run_dir, is_finished

DATA = Path(__file__).parent / "data" / "tasks"


def trials(out: Path) -> dict[str, dict[str, object]]:
    """Every trial.json under ``out``, without its timestamps."""
    found = {}
    for path in sorted(out.glob("*/trial.json")):
        data = json.loads(path.read_text())
        for k in ("started_at", "finished_at", "timing"):
            data.pop(k)
        found[path.parent.name] = data
    return found


def test_the_grid_and_its_checks() -> None:
    config, tracks = build_config(
        ["tiny-*"], ["default", "random"], 2, track="sim", tasks_root=DATA
    )
    assert "tiny-cpu" not in config.tasks and "tiny-throughput" in config.tasks
    grid = config.grid(tracks)
    assert len(grid) == len(config.tasks) * 2 * 2 and len({g.key for g in grid}) == len(grid)
    cpu, cpu_tracks = build_config(["tiny-cpu"], ["default"], 1, tasks_root=DATA)
    assert cpu.grid(cpu_tracks)[0].track == "cpu"
    with pytest.raises(UserError, match="'nothing-\\*' matches no task"):
        build_config(["nothing-*"], ["default"], 1, tasks_root=DATA)
    with pytest.raises(UserError, match="--agents: unknown agent 'nope'"):
        build_config(["tiny-latency"], ["nope"], 1, tasks_root=DATA)
    with pytest.raises(UserError, match="named twice"):
        build_config(["tiny-latency"], ["default", "default"], 1, tasks_root=DATA)
    with pytest.raises(UserError, match="--seeds"):
        build_config(["tiny-latency"], ["default"], 0, tasks_root=DATA)
    with pytest.raises(UserError, match="--executor: unknown executor 'slurm'"):
        make_executor("slurm")


def test_a_different_sweep_is_refused_with_what_differs(tmp_path: Path) -> None:
    a, _ = build_config(["tiny-latency"], ["default"], 2, tasks_root=DATA)
    b, _ = build_config(["tiny-latency", "tiny-cost"], ["random"], 3, tasks_root=DATA)
    assert claim_run_dir(tmp_path, a) is False
    assert claim_run_dir(tmp_path, a) is True  # the same sweep resumes
    with pytest.raises(UserError) as e:
        claim_run_dir(tmp_path, b)
    msg = e.value.message
    assert "tasks (adds tiny-cost)" in msg and "agents (adds random; drops default)" in msg
    assert "seeds (adds 2)" in msg and "\n" not in msg
    (tmp_path / LOCK_FILE).write_text("{")
    with pytest.raises(UserError, match="unreadable"):
        claim_run_dir(tmp_path, a)


def test_a_local_sweep_runs_each_trial_once_and_resumes(tmp_path: Path) -> None:
    console = Console(record=True, width=120)
    args = ("tiny-latency,tiny-throughput", "default,random", 2, tmp_path / "run")
    code = run_sweep_command(*args, console, max_concurrent=2, tasks_root=DATA)
    assert code == 0
    first = trials(tmp_path / "run")
    assert len(first) == 8 and all(t["outcome"] == "scored" for t in first.values())
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").glob("*/trial.json")}
    again = Console(record=True, width=120)
    assert run_sweep_command(*args, again, max_concurrent=2, tasks_root=DATA) == 0
    assert "0 trials run, 8 finished trials skipped" in again.export_text()
    assert mtimes == {p: p.stat().st_mtime_ns for p in mtimes}
    # a partial trial (no trial.json) is restarted
    victim = next(iter(mtimes))
    victim.unlink()
    third = Console(record=True, width=120)
    assert run_sweep_command(*args, third, max_concurrent=2, tasks_root=DATA) == 0
    assert "1 trials run, 7 finished trials skipped" in third.export_text()
    assert trials(tmp_path / "run") == first  # the same seed, the same trial


def test_cpu_track_trials_never_run_together(tmp_path: Path) -> None:
    """The local executor holds one cpu-track slot: with a stand-in worker that records
    when each trial runs, no two cpu-track trials overlap, while sim trials do."""
    config, tracks = build_config(
        ["tiny-cpu", "tiny-latency"], ["default", "random"], 2, tasks_root=DATA
    )
    specs = config.grid(tracks)
    log = tmp_path / "spans.jsonl"

    class Events:
        def started(self, spec: object) -> None: ...

        def finished(self, spec: object, outcome: TrialOutcome) -> None: ...

    os.environ["SERVEGYM_TEST_SPANS"] = str(log)  # spawned workers inherit it
    try:
        executor = LocalExecutor(max_concurrent=2, gpus=0, worker=_recording_worker)
        outcomes = executor.run(specs, tmp_path, config, Events())
    finally:
        os.environ.pop("SERVEGYM_TEST_SPANS", None)
    assert len(outcomes) == len(specs)
    spans = [json.loads(x) for x in log.read_text().splitlines()]
    cpu = sorted((s["t0"], s["t1"]) for s in spans if s["track"] == "cpu")
    assert len(cpu) == 4
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(cpu))
    sim = sorted((s["t0"], s["t1"]) for s in spans if s["track"] == "sim")
    # the other slot was not idle meanwhile: sim trials ran beside the cpu-track ones
    assert any(s0 < c1 and c0 < s1 for s0, s1 in sim for c0, c1 in cpu)


def _recording_worker(spec, out, agent_options, tasks_root, gpu=None):  # type: ignore[no-untyped-def]
    t0 = time.time()
    time.sleep(0.3)
    with open(os.environ["SERVEGYM_TEST_SPANS"], "a") as f:
        f.write(json.dumps({"track": spec["track"], "t0": t0, "t1": time.time()}) + "\n")
    return {**spec, "outcome": "scored"}


@pytest.mark.slow
def test_ray_runs_the_same_trials_as_local(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    args = ("tiny-latency,tiny-cost", "default,random", 2)
    local = Console(record=True)
    assert run_sweep_command(*args, tmp_path / "local", local, tasks_root=DATA) == 0
    ray = Console(record=True)
    code = run_sweep_command(
        *args, tmp_path / "ray", ray, executor="ray", max_concurrent=2, tasks_root=DATA
    )
    assert code == 0, ray.export_text()
    a, b = trials(tmp_path / "local"), trials(tmp_path / "ray")
    assert len(a) == 8 and a == b


STREAMING = "*stream*"
"""Four quick sim tasks (12 trials at 3 seeds): every shipped sim task took 440 s."""


@pytest.mark.slow
def test_a_killed_sweep_resumes_without_rerunning_a_finished_trial(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "servegym", "sweep", "--tasks", STREAMING, "--track", "sim",
        "--agents", "default", "--seeds", "3", "--max-concurrent", "1", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list(out.glob("*/trial.json"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)  # a worker's PR_SET_PDEATHSIG lands; nothing may finish after this
    finished = {p: p.stat().st_mtime_ns for p in out.glob("*/trial.json")}
    assert 4 <= len(finished) < 40
    time.sleep(1.0)
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/trial.json")} == finished  # no orphan
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming, {len(finished)} finished already" in done.stdout
    rerun = [p for p, t in finished.items() if p.stat().st_mtime_ns != t]
    assert rerun == []  # re-run finished trials: 0
    config, tracks = build_config([STREAMING], ["default"], 3, track="sim")
    assert len(config.grid(tracks)) == 12
    assert all(is_finished(out, s) for s in config.grid(tracks))
