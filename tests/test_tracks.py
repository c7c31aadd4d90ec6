"""A new track is one module: a stand-in Track, worked by the one task environment and
evaluated by the one evaluate().

The stand-in knows nothing of engines, servers or the simulator; it only implements the
protocols of :mod:`servegym.tracks.base` and :mod:`servegym.tracks.dev`. The environment
does the rest of the agent phase (validation, the baseline, ratios, the budget, the log);
evaluate() the rest of the evaluation: gates, pairs, crash handling, accuracy, integrity
findings, the conclusion.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from servegym.agents.base import BudgetExhausted
from servegym.engines.config import ServingConfig
from servegym.engines.knob_info import KnobInfo
from servegym.errors import BrokenTask, HarnessError
from servegym.runner.environment import TrackEnvironment
from servegym.runner.evaluation import evaluate, pair_order
from servegym.scoring.integrity import Finding
from servegym.scoring.objectives import UNITS, IntegrityCounts, ObjectiveMeasurement
from servegym.tasks.loader import LoadedTask, load_task
from servegym.tracks import TRACKS, track_for
from servegym.tracks.base import (
    DevBaseline,
    EvaluationSession,
    Role,
    SampleInfo,
    SideCrashed,
    StartedSide,
    Track,
    TrackSetup,
    pair_seed,
)
from servegym.tracks.cpu_pipeline import CpuPipelineTrack
from servegym.tracks.dev import DevRun, DevSession, DevWorkloads, WallSecondsBudget
from servegym.tracks.real import RealServerTrack
from servegym.tracks.sim import SimPipelineTrack, SimTrack

TASKS = Path(__file__).parent / "data" / "tasks"


def measurement(loaded: LoadedTask, value: float) -> ObjectiveMeasurement:
    objective = loaded.task.objective
    return ObjectiveMeasurement(
        objective=objective.label(),
        kind=objective.kind,
        unit=UNITS[objective.kind],
        higher_is_better=objective.higher_is_better,
        value=value,
        feasible=True,
        runs=1,
        integrity=IntegrityCounts(requests=7),
    )


class StandInDev(DevSession):
    """The stand-in's agent phase: every experiment costs 10 wall seconds."""

    def __init__(self, track: StandInTrack, loaded: LoadedTask) -> None:
        self.track = track
        self.loaded = loaded
        self.workloads = DevWorkloads(loaded)
        self.budget = WallSecondsBudget(loaded.task.budget.model_copy(update={"wall_seconds": 20}))

    def knobs(self) -> list[KnobInfo]:
        return [KnobInfo(name="max_num_seqs", default="8", help="batch size")]

    def baseline(self, quick: bool) -> DevBaseline:
        self.track.calls.append(f"dev baseline quick={quick}")
        return DevBaseline(measurement(self.loaded, 100.0), 0.8)

    def run(self, config: ServingConfig, quick: bool, index: int, baseline: DevBaseline) -> DevRun:
        self.track.calls.append(f"experiment {index}")
        if config.max_num_seqs == 1:
            return DevRun(cost=10.0, error="the stand-in refuses one sequence", tail="log")
        m = measurement(self.loaded, self.track.speedup * 100.0)
        return DevRun(cost=10.0, measurement=m, accuracy=0.4)


class StandInSession(EvaluationSession):
    def __init__(self, track: StandInTrack, loaded: LoadedTask) -> None:
        self.track = track
        self.loaded = loaded
        self.sample = SampleInfo("stand-in", 7, "0" * 16)
        self.min_accuracy = loaded.task.accuracy.min_ratio

    async def start_baseline(self) -> StartedSide:
        if self.track.broken_baseline:
            raise HarnessError("the stand-in baseline does not start")
        self.track.calls.append("start baseline")
        return StartedSide(up=True, startup_s=1.0, num_gpus=1, price_per_hour=2.0)

    async def start_submission(self, submission: Any) -> StartedSide:
        self.track.calls.append("start submission")
        if self.track.refuse:
            return StartedSide(up=False, error="the stand-in refuses it")
        return StartedSide(up=True, startup_s=3.0, num_gpus=2, price_per_hour=4.0)

    async def measure(self, side: StartedSide, role: Role, i: int) -> ObjectiveMeasurement:
        self.track.calls.append(f"{role} {i}")
        if role == "submission" and i == self.track.crash_at:
            raise SideCrashed("the stand-in died")
        objective = self.loaded.task.objective
        value = 100.0 if role == "baseline" else self.track.speedup * 100.0
        return ObjectiveMeasurement(
            objective=objective.label(),
            kind=objective.kind,
            unit=UNITS[objective.kind],
            higher_is_better=objective.higher_is_better,
            value=value,
            feasible=True,
            runs=1,
            integrity=IntegrityCounts(requests=7),
        )

    def accuracy(self, side: StartedSide | None, role: Role) -> float | None:
        return None if side is None or not side.up else self.track.accuracy[role]

    async def integrity_findings(self, passed: bool) -> tuple[list[Finding], str]:
        if self.track.finding:
            finding = Finding(check="stand_in", requests=1, of=7, request_id="r1", evidence="odd")
            return [finding], ""
        return [], "; stand-in checked"

    async def close(self) -> None:
        self.track.calls.append("close")


class StandInTrack(Track):
    name = "stand-in"

    def __init__(self, **kw: Any) -> None:
        self.calls: list[str] = []
        self.speedup = kw.get("speedup", 1.5)
        self.crash_at: int | None = kw.get("crash_at")
        self.refuse = kw.get("refuse", False)
        self.broken_baseline = kw.get("broken_baseline", False)
        self.finding = kw.get("finding", False)
        self.accuracy: dict[str, float] = kw.get("accuracy", {"baseline": 1.0, "submission": 1.0})

    def dev_session(self, loaded: LoadedTask, trial_seed: int) -> DevSession:
        return StandInDev(self, loaded)

    def evaluation(self, loaded: LoadedTask, scoring_seed: int) -> EvaluationSession:
        return StandInSession(self, loaded)


@pytest.fixture
def loaded() -> LoadedTask:
    return load_task("tiny-throughput", TASKS)


def test_a_stand_in_track_is_evaluated_in_pairs_of_alternating_order(loaded: LoadedTask) -> None:
    track = StandInTrack()
    ev = evaluate(loaded, ServingConfig(), 11, track=track)
    repeats = loaded.task.evaluation.repeats
    assert repeats >= 3
    # B, S then S, B: drift between a pair's two runs cancels over the pairs
    pairs = [f"{role} {i}" for i in range(repeats) for role in pair_order(i)]
    assert pairs[:6] == [
        *("baseline 0", "submission 0"),
        *("submission 1", "baseline 1"),
        *("baseline 2", "submission 2"),
    ]
    assert track.calls == ["start baseline", "start submission", *pairs, "close"]
    assert ev.outcome == "scored"
    assert ev.score == pytest.approx(1.5)
    assert ev.info.workload == "stand-in" and ev.info.requests == 7
    assert ev.submission is not None and ev.submission.num_gpus == 2
    assert ev.submission.price_per_hour == 4.0 and ev.baseline.startup_s == 1.0
    assert "; stand-in checked" in ev.gates["integrity"].detail


def test_a_crash_ends_the_pairs(loaded: LoadedTask) -> None:
    for crash_at, last in (
        (1, ["submission 1", "baseline 1"]),
        (2, ["baseline 2", "submission 2"]),
    ):
        track = StandInTrack(crash_at=crash_at)
        ev = evaluate(loaded, ServingConfig(), 11, track=track)
        assert ev.outcome == "crashed" and ev.error == "the stand-in died"
        # the crashed pair's baseline is measured whichever side went first; then they end
        assert track.calls[-3:] == [*last, "close"]
        assert ev.score is None


def test_gates_come_from_the_track(loaded: LoadedTask) -> None:
    refused = evaluate(loaded, ServingConfig(), 11, track=StandInTrack(refuse=True))
    assert refused.outcome == "launch_failed"
    assert refused.submission is not None and refused.submission.launch_error == (
        "the stand-in refuses it"
    )
    worse = StandInTrack(accuracy={"baseline": 1.0, "submission": 0.5})
    assert evaluate(loaded, ServingConfig(), 11, track=worse).outcome == "accuracy_failed"
    flagged = evaluate(loaded, ServingConfig(), 11, track=StandInTrack(finding=True))
    assert flagged.outcome == "integrity_flagged"
    none = evaluate(loaded, None, 11, track=StandInTrack())
    assert none.outcome == "no_submission"


def test_a_baseline_that_does_not_start_is_the_harness_s_error(loaded: LoadedTask) -> None:
    track = StandInTrack(broken_baseline=True)
    with pytest.raises(HarnessError, match="stand-in baseline"):
        evaluate(loaded, ServingConfig(), 11, track=track)


def test_the_track_is_chosen_once_from_the_task(
    loaded: LoadedTask, tmp_path: Path, stub_tiny_model: Path
) -> None:
    track = track_for(loaded)
    assert type(track) is SimTrack and loaded.task.traits.simulated
    assert type(track_for(load_task("rag-pipeline-throughput"))) is SimPipelineTrack
    cpu = load_task("tiny-cpu", TASKS)
    assert type(track_for(cpu, server_logs=tmp_path)) is RealServerTrack
    assert TRACKS.get("cpu") is RealServerTrack and TRACKS.get("gpu") is RealServerTrack
    with pytest.raises(ValueError, match="needs server_logs"):
        track_for(cpu)
    assert pair_seed(5, 0) == 5 and pair_seed(5, 1) != 5


def test_a_cpu_pipeline_task_gets_the_pipeline_plug_in_around_real_servers(
    tmp_path: Path, stub_tiny_model: Path
) -> None:
    from test_pipeline_cpu_eval import make_task

    track = RealServerTrack.for_task(make_task(tmp_path), TrackSetup(server_logs=tmp_path))
    assert isinstance(track, CpuPipelineTrack) and isinstance(track.servers, RealServerTrack)


def test_the_one_environment_works_a_stand_in_track(loaded: LoadedTask, tmp_path: Path) -> None:
    track = StandInTrack(speedup=1.25)
    env = TrackEnvironment(loaded, track, log_path=tmp_path / "experiments.jsonl")
    desc = env.describe()
    assert desc.tuning == "config" and [k.name for k in desc.knobs] == ["max_num_seqs"]
    assert env.workspace_environment() is None and env.workspace_commands() is None
    invalid = env.run_experiment({"max_num_seqs": "many"})  # type: ignore[arg-type]
    assert not invalid.ok and invalid.launch_error is not None
    assert invalid.launch_error.startswith("error: argument max_num_seqs")
    assert invalid.cost_wall_seconds == 0.0  # refused before anything started
    ok = env.run_experiment(ServingConfig(max_num_seqs=4))
    assert ok.ok and ok.improvement == pytest.approx(1.25) and ok.accuracy_ratio == 0.5
    assert ok.config == {"max_num_seqs": 4} and ok.cost_wall_seconds == 10.0
    refused = env.run_experiment(ServingConfig(max_num_seqs=1))
    assert not refused.ok and refused.launch_error == "the stand-in refuses one sequence"
    assert track.calls == ["dev baseline quick=False", "experiment 1", "experiment 2"]
    assert env.budget_used == 20.0 and refused.budget.exhausted
    with pytest.raises(BudgetExhausted, match=r"3 experiments \(20 wall seconds\)"):
        env.run_experiment(ServingConfig())
    env.close()
    lines = (tmp_path / "experiments.jsonl").read_text().splitlines()
    assert len(lines) == 3 and env.measured_baseline() is not None


class _TimedStarts:
    """A session whose two starts each take 0.2 s of waiting, recording when they ran."""

    def __init__(self, baseline_fails: bool = False) -> None:
        self.spans: dict[str, tuple[float, float]] = {}
        self.baseline_fails = baseline_fails
        self.submission_cancelled = False

    async def _start(self, role: str) -> StartedSide:
        t0 = time.monotonic()
        if role == "baseline" and self.baseline_fails:
            await asyncio.sleep(0.01)
            raise BrokenTask("the baseline does not start")
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            self.submission_cancelled = role == "submission"
            raise
        self.spans[role] = (t0, time.monotonic())
        return StartedSide(up=True, startup_s=0.2)

    async def start_baseline(self) -> StartedSide:
        return await self._start("baseline")

    async def start_submission(self, submission: Any) -> StartedSide:
        return await self._start("submission")


def test_the_two_sides_start_at_once() -> None:
    """Nothing is measured while servers start: the baseline's and the submission's starts
    overlap instead of queueing (on the cpu track each is 35-140 s)."""
    from servegym.runner.evaluation import _start_both

    session = _TimedStarts()
    t0 = time.monotonic()
    base, sub = asyncio.run(_start_both(session, object()))  # type: ignore[arg-type]
    assert base.up and sub.up
    assert time.monotonic() - t0 < 0.35, "the starts ran one after the other"
    (b0, b1), (s0, s1) = session.spans["baseline"], session.spans["submission"]
    assert s0 < b1 and b0 < s1


def test_a_baseline_that_does_not_start_ends_the_submission_s_start() -> None:
    from servegym.runner.evaluation import _start_both

    session = _TimedStarts(baseline_fails=True)
    with pytest.raises(BrokenTask):
        asyncio.run(_start_both(session, object()))  # type: ignore[arg-type]
    # the submission's start, still under way, was cancelled and awaited before the raise
    assert session.submission_cancelled and "submission" not in session.spans
