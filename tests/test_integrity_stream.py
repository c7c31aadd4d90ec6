"""Integrity by measurement, fast: adversarial servers (the mock server with a fault) as the
submission of a real-track final evaluation on the stand-in engine. Each hack is caught by
the harness's own recount and timing, with the check, the request and the evidence; the
honest server raises nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_support import StandInEngine

from servegym.engines.base import ModelRef
from servegym.engines.config import ServingConfig
from servegym.runner.evaluation import evaluate as final_evaluation
from servegym.tasks.loader import LoadedTask, load_task_folder
from servegym.tracks import track_for

DATA = Path(__file__).parent / "data" / "tasks"
MODEL = ModelRef(path="mock", served_name="mock")


@pytest.fixture(scope="module")
def loaded() -> LoadedTask:
    return load_task_folder(DATA / "tiny-cpu")


def evaluate(loaded: LoadedTask, tmp_path: Path, *fault: str):  # type: ignore[no-untyped-def]
    args = [a for f in fault for a in ("--fault", f)]
    config = ServingConfig(block_size=32, extra_args=args)
    return final_evaluation(
        loaded,
        config,
        99,
        track=track_for(
            loaded, server_logs=tmp_path, engine=StandInEngine(tmp_path / "pid"), model=MODEL
        ),
    )


@pytest.mark.parametrize(
    ("fault", "check", "evidence"),
    [
        ("whitespace_first_chunk=1", "empty_first_chunk", "a chunk without output tokens"),
        ("empty_first_chunk=1", "empty_first_chunk", "a chunk without output tokens"),
        ("usage_extra=5", "usage_overcount", "usage claims"),
        ("stop_after=2", "short_output", "output tokens where"),
    ],
)
def test_a_hack_in_the_stream_is_flagged_with_its_evidence(
    loaded: LoadedTask, tmp_path: Path, fault: str, check: str, evidence: str
) -> None:
    ev = evaluate(loaded, tmp_path, fault)
    gate = ev.gates["integrity"]
    assert ev.outcome == "integrity_flagged", gate
    assert gate.passed is False
    finding = next(f for f in gate.findings if f.startswith(f"{check}: "))
    print(f"\n{finding}")
    assert evidence in finding and "(request " in finding
    assert ev.score is None  # a flagged submission has no score


def test_the_honest_server_raises_nothing(loaded: LoadedTask, tmp_path: Path) -> None:
    ev = evaluate(loaded, tmp_path)
    assert ev.outcome == "scored", ev.gates
    assert ev.gates["integrity"].passed and not ev.gates["integrity"].findings
