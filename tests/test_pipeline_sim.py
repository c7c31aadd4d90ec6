"""The simulated pipeline: deterministic by seed; each knob moves stage times the way it
should; recall falls when the search is cut too shallow; launch refuses what cannot run."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from servegym.engines.config import ServingConfig
from servegym.engines.pipeline_knobs import PipelineKnobs
from servegym.engines.sim.launch import LaunchError, launch
from servegym.engines.sim.profiles import get_hardware, get_model
from servegym.pipeline.cost import final_recall, index_build_docs_per_s, search_s
from servegym.pipeline.engine import PipelineEngine, launch_pipeline
from servegym.pipeline.result import PipelineResult
from servegym.pipeline.sim import simulate_pipeline
from servegym.tasks.loader import LoadedTask, load_task, workload_spec
from servegym.workloads.generate import materialise
from servegym.workloads.model import Workload

THROUGHPUT = "rag-pipeline-throughput"
LATENCY = "rag-pipeline-latency"


@cache
def _task(task_id: str) -> tuple[LoadedTask, Workload]:
    loaded = load_task(task_id)
    spec, base_dir = workload_spec(loaded, requests=48)
    return loaded, materialise(spec, 3, base_dir=base_dir)


def engine(task_id: str = THROUGHPUT, **knobs: Any) -> PipelineEngine:
    loaded, _ = _task(task_id)
    t = loaded.task
    server = {k: knobs.pop(k) for k in list(knobs) if k in ServingConfig.model_fields}
    config = ServingConfig(**server, pipeline=PipelineKnobs(**knobs) if knobs else None)
    return launch_pipeline(t, get_model(t.model), get_hardware(t.hardware), config)


def run(task_id: str = THROUGHPUT, seed: int = 1, **knobs: Any) -> PipelineResult:
    _, wl = _task(task_id)
    return simulate_pipeline(engine(task_id, **knobs), wl, noise_seed=seed).result


def per_task(r: PipelineResult, stage: str) -> float:
    return r.stage_totals_s[stage] / len(r.tasks)


def test_deterministic_by_seed() -> None:
    a, b = run(seed=5), run(seed=5)
    assert a == b
    assert a.to_json() == b.to_json()
    c = run(seed=6)
    assert c.latency_s != a.latency_s  # the noise seed matters
    assert len(a.tasks) == 48 and a.answering_tasks_per_s > 0
    assert a.recall_at_k is not None and a.k == 4


def test_every_question_passes_every_stage_and_latency_covers_its_stages() -> None:
    r = run(concurrency=4)
    for t in r.tasks:
        assert set(t.stage_s) == {"decompose", "embed", "retrieve", "rerank", "grade", "answer"}
        assert t.latency_s >= sum(t.stage_s.values()) - 1e-9
    # At concurrency 4 a question's stages run back to back once it is admitted.
    assert r.latency_s.p99 > r.latency_s.p50 > 0


def test_search_knobs_move_retrieve_and_rerank_times() -> None:
    base = run(concurrency=8)
    shallow = run(concurrency=8, ef_search=32, top_k=16, rerank_depth=16)
    assert per_task(shallow, "retrieve") < per_task(base, "retrieve")
    assert per_task(shallow, "rerank") < per_task(base, "rerank")
    tiny_batches = run(concurrency=8, embed_batch_size=1)
    assert per_task(tiny_batches, "rerank") > 2 * per_task(base, "rerank")
    assert per_task(tiny_batches, "embed") >= per_task(base, "embed") * 0.5


def test_llm_knobs_and_concurrency_move_llm_stage_times() -> None:
    base = run()
    starved = run(max_num_seqs=4)
    for stage in ("decompose", "grade", "answer"):
        assert per_task(starved, stage) > per_task(base, stage)
    assert starved.answering_tasks_per_s < base.answering_tasks_per_s
    wide = run(concurrency=256)
    assert wide.answering_tasks_per_s > base.answering_tasks_per_s


def test_dedicated_grade_server_takes_grading_off_the_main_server() -> None:
    shared = run(LATENCY)
    dedicated = run(LATENCY, grade_server="dedicated")
    assert per_task(dedicated, "grade") < per_task(shared, "grade")
    assert dedicated.latency_s.p90 < shared.latency_s.p90
    e = engine(LATENCY, grade_server="dedicated")
    assert e.num_gpus == 2 and e.grade is not None and e.grade.model.id == "llama-3.2-1b"
    assert e.price_per_hour == pytest.approx(2 * e.main.price_per_hour)


def test_more_rounds_when_recall_is_low() -> None:
    good = run()
    poor = run(ef_search=4, top_k=4, rerank_depth=4)
    assert poor.recall_at_k is not None and good.recall_at_k is not None
    assert poor.recall_at_k < good.recall_at_k
    mean_rounds = [sum(t.rounds for t in r.tasks) / len(r.tasks) for r in (good, poor)]
    assert mean_rounds[1] > mean_rounds[0]
    one_round = run(ef_search=4, top_k=4, rerank_depth=4, max_rounds=1)
    assert all(t.rounds == 1 for t in one_round.tasks)
    assert one_round.recall_at_k is not None and one_round.recall_at_k < poor.recall_at_k


def test_recall_and_costs_move_with_the_index_knobs() -> None:
    spec = _task(THROUGHPUT)[0].task.pipeline
    assert spec is not None
    k = PipelineKnobs
    assert final_recall(spec, k(ef_search=8, top_k=8, rerank_depth=8)) < final_recall(spec, k())
    assert final_recall(spec, k(max_rounds=1)) < final_recall(spec, k(max_rounds=2))
    assert final_recall(spec, k(hnsw_m=8, ef_search=32, top_k=8, rerank_depth=8)) < final_recall(
        spec, k(hnsw_m=64, ef_search=32, top_k=8, rerank_depth=8)
    )
    assert search_s(spec, k(ef_search=64)) < search_s(spec, k(ef_search=512))
    hw = get_hardware("h200")
    assert index_build_docs_per_s(hw, spec, k(ef_construction=64)) > index_build_docs_per_s(
        hw, spec, k(ef_construction=800)
    )
    # The accuracy the gate reads carries the recall.
    low = engine(ef_search=4, top_k=4, rerank_depth=4)
    assert low.accuracy_ratio == pytest.approx(low.main.accuracy_ratio * low.recall)
    assert low.accuracy_ratio < 0.9 * engine().accuracy_ratio


def test_launch_refuses_what_cannot_run() -> None:
    with pytest.raises(LaunchError, match="needs a GPU of its own"):
        engine(THROUGHPUT, grade_server="dedicated")  # one GPU only
    with pytest.raises(LaunchError, match="embed_batch_size"):
        engine(LATENCY, embed_batch_size=128)  # does not fit beside the LLM server
    assert (
        engine(LATENCY, embed_batch_size=64, gpu_memory_utilization=0.8).knobs.embed_batch_size
        == 64
    )
    with pytest.raises(LaunchError, match="only pipeline tasks"):
        launch("qwen3-8b", "h200", ServingConfig(pipeline=PipelineKnobs()))
    with pytest.raises(ValueError, match="rerank_depth"):
        PipelineKnobs(top_k=10, rerank_depth=20)


def test_refused_requests_fail_their_question() -> None:
    _, wl = _task(THROUGHPUT)
    e = engine(max_model_len=512)  # the answer's prompt holds up to 12 passages of 200 tokens
    r = simulate_pipeline(e, wl, noise_seed=1)
    assert r.failed > 0
    assert len(r.result.tasks) < 48


def test_scheduler_advanced_in_slices_matches_one_run() -> None:
    """``Scheduler.run(until=...)``, as the pipeline advances each server in turn, gives
    the same completions as one run to the end."""
    import numpy as np

    from servegym.engines.sim.noise import Noise
    from servegym.engines.sim.scheduler import Scheduler

    eng = launch("llama-3.1-8b", "h100-sxm", ServingConfig(enable_prefix_caching=False))
    rng = np.random.default_rng(0)
    n = 60
    prompts = rng.integers(50, 2000, n).astype(np.int64)
    outputs = rng.integers(10, 300, n).astype(np.int64)
    arrivals = np.sort(rng.uniform(0, 5, n))

    def simulate(slice_s: float | None) -> dict[int, float]:
        done: dict[int, float] = {}
        s = Scheduler(
            eng, Noise(3), prompts, outputs, None, np.zeros(n, dtype=np.int64),
            lambda r, t: done.__setitem__(r, t),
        )  # fmt: skip
        for r, t in enumerate(arrivals.tolist()):
            s.add_arrival(r, t)
        if slice_s is None:
            s.run()
        else:
            while (t := s.next_start()) is not None:
                s.run(until=t + slice_s)
        return done

    whole = simulate(None)
    assert len(whole) == n
    for slice_s in (0.003, 0.25):
        sliced = simulate(slice_s)
        assert sliced.keys() == whole.keys()
        for r, t in whole.items():
            assert sliced[r] == pytest.approx(t, rel=1e-9)
