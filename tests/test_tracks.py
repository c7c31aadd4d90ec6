"""A new track is one module: a stand-in Track, evaluated by the one evaluate().

The stand-in knows nothing of engines, servers or the simulator; it only implements the
protocol of :mod:`servegym.tracks.base`. evaluate() does the rest: gates, pairs, crash
handling, accuracy, integrity findings, the conclusion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servegym.engines.config import ServingConfig
from servegym.errors import HarnessError
from servegym.runner.evaluation import evaluate
from servegym.scoring.integrity import Finding
from servegym.scoring.objectives import UNITS, IntegrityCounts, ObjectiveMeasurement
from servegym.tasks.loader import LoadedTask, load_task
from servegym.tracks import track_for
from servegym.tracks.base import (
    EvaluationSession,
    Role,
    SampleInfo,
    SideCrashed,
    StartedSide,
    Track,
    pair_seed,
)
from servegym.tracks.sim import SimTrack

TASKS = Path(__file__).parent / "data" / "tasks"


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

    def evaluation(self, loaded: LoadedTask, scoring_seed: int) -> EvaluationSession:
        return StandInSession(self, loaded)


@pytest.fixture
def loaded() -> LoadedTask:
    return load_task("tiny-throughput", TASKS)


def test_a_stand_in_track_is_evaluated_in_alternating_pairs(loaded: LoadedTask) -> None:
    track = StandInTrack()
    ev = evaluate(loaded, ServingConfig(), 11, track=track)
    repeats = loaded.task.evaluation.repeats
    pairs = [c for i in range(repeats) for c in (f"baseline {i}", f"submission {i}")]
    assert track.calls == ["start baseline", "start submission", *pairs, "close"]
    assert ev.outcome == "scored"
    assert ev.score == pytest.approx(1.5)
    assert ev.info.workload == "stand-in" and ev.info.requests == 7
    assert ev.submission is not None and ev.submission.num_gpus == 2
    assert ev.submission.price_per_hour == 4.0 and ev.baseline.startup_s == 1.0
    assert "; stand-in checked" in ev.gates["integrity"].detail


def test_a_crash_ends_the_pairs(loaded: LoadedTask) -> None:
    track = StandInTrack(crash_at=1)
    ev = evaluate(loaded, ServingConfig(), 11, track=track)
    assert ev.outcome == "crashed" and ev.error == "the stand-in died"
    assert track.calls[-3:] == ["baseline 1", "submission 1", "close"]
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


def test_the_track_is_chosen_once_from_the_task(loaded: LoadedTask) -> None:
    assert isinstance(track_for(loaded), SimTrack)
    assert loaded.task.traits.simulated
    assert pair_seed(5, 0) == 5 and pair_seed(5, 1) != 5
