"""Pipeline tasks through the ordinary paths: the task format, ``task validate``'s nop and
oracle checks, the final evaluation's recall gate, the search baselines' space and a whole
trial (``pipeline.json`` beside ``trial.json``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from servegym.agents.search_space import IllegalConfig, load_search_space
from servegym.engines.config import ServingConfig
from servegym.engines.pipeline_knobs import PipelineKnobs
from servegym.pipeline.files import PIPELINE_BASELINE_FILE, PIPELINE_FILE
from servegym.pipeline.result import PipelineResult
from servegym.runner.environment import TrackEnvironment
from servegym.runner.evaluation import evaluate
from servegym.runner.trial import run_trial
from servegym.runner.validate import check_nop, check_oracle
from servegym.tasks.loader import load_task
from servegym.tasks.spec import Task

TASKS = ["rag-pipeline-throughput", "rag-pipeline-latency"]


@pytest.mark.parametrize("task_id", TASKS)
def test_nop_scores_one_and_oracle_beats_baseline(task_id: str) -> None:
    loaded = load_task(task_id)
    assert loaded.task.pipeline is not None and loaded.oracle is not None
    assert loaded.oracle.pipeline is not None
    nop = check_nop(loaded)
    assert nop.passed, nop.detail
    oracle = check_oracle(loaded)
    assert oracle.passed, oracle.detail


def test_recall_gate_fails_a_shallow_search() -> None:
    loaded = load_task("rag-pipeline-throughput")
    shallow = ServingConfig(pipeline=PipelineKnobs(ef_search=4, top_k=4, rerank_depth=4))
    ev = evaluate(loaded, shallow, 12345)
    assert ev.outcome == "accuracy_failed"
    assert ev.gates["accuracy"].passed is False
    assert ev.score is None
    base, sub = ev.measurements[0]
    assert base.pipeline is not None and sub is not None and sub.pipeline is not None
    assert sub.pipeline.recall_at_k is not None and base.pipeline.recall_at_k is not None
    assert sub.pipeline.recall_at_k < base.pipeline.recall_at_k


def test_task_format_checks() -> None:
    raw = load_task("rag-pipeline-latency").task.model_dump()
    ok = Task.model_validate(raw)
    assert ok.objective.label() == "pipeline_latency p90"
    assert not ok.objective.higher_is_better
    no_table = {**raw, "pipeline": None}
    with pytest.raises(ValidationError, match="needs a \\[pipeline\\] table"):
        Task.model_validate(no_table)
    wrong_objective = {**raw, "objective": {"kind": "output_throughput"}}
    with pytest.raises(ValidationError, match="pipeline_rate or pipeline_latency"):
        Task.model_validate(wrong_objective)
    plain = load_task("voice-stream-h100").task.model_dump()
    plain["baseline"]["pipeline"] = {"ef_search": 10}
    with pytest.raises(ValidationError, match="pipeline tasks only"):
        Task.model_validate(plain)


def test_agents_see_and_search_the_pipeline_knobs(tmp_path: Path) -> None:
    loaded = load_task("rag-pipeline-throughput")
    env = TrackEnvironment(loaded, log_path=tmp_path / "experiments.jsonl")
    desc = env.describe()
    names = {k.name for k in desc.knobs}
    assert {"pipeline.ef_search", "pipeline.embed_batch_size", "pipeline.grade_server"} <= names
    assert desc.workload["pipeline"]["corpus_docs"] == 2_000_000
    result = env.run_experiment(
        ServingConfig(pipeline=PipelineKnobs(ef_search=4, top_k=4, rerank_depth=4)), quick=True
    )
    assert result.ok and result.pipeline is not None
    assert result.accuracy_ratio is not None and result.accuracy_ratio < 0.98
    assert set(result.pipeline["stage_shares"]) >= {"answer", "retrieve"}
    env.close()
    # Plain sim tasks neither list nor accept the table.
    plain = TrackEnvironment(load_task("voice-stream-h100")).describe()
    assert not any(k.name.startswith("pipeline") for k in plain.knobs)

    space = load_search_space("sim-pipeline", model="qwen3-8b", num_gpus=1)
    assert "pipeline.ef_search" in space.names
    params, config = space.sample_config(np.random.default_rng(0), loaded.task.baseline)
    assert config.pipeline is not None
    assert config.pipeline.ef_search == params["pipeline.ef_search"]
    with pytest.raises(IllegalConfig, match="reranker"):
        space.to_config({"pipeline.top_k": 8, "pipeline.rerank_depth": 16}, ServingConfig())


def test_trial_writes_pipeline_results(tmp_path: Path) -> None:
    result = run_trial("rag-pipeline-latency", "default", 0, tmp_path)
    assert result.outcome == "scored"
    assert result.score == pytest.approx(1.0, abs=0.1)
    folder = tmp_path / "rag-pipeline-latency__default__s0"
    sub = PipelineResult.load(folder / PIPELINE_FILE)
    base = PipelineResult.load(folder / PIPELINE_BASELINE_FILE)
    assert sub.task == base.task == "rag-pipeline-latency"
    assert len(base.tasks) == 160
