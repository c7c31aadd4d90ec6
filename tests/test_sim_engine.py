"""Simulating workloads end to end: arrivals, sessions, determinism, records, the target."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from sim_support import engine, metrics, run, simple_workload, workload

from servegym.engines.sim.engine import simulate
from servegym.engines.sim.target import SimTarget
from servegym.loadgen.target import RunOptions
from servegym.scoring.metrics import compute_metrics


def test_same_seed_identical_records_other_noise_seed_differs() -> None:
    eng = engine()
    wl = workload("balanced", requests=40)
    a, b = run(eng, wl), run(eng, wl)
    assert [r.model_dump() for r in a.records] == [r.model_dump() for r in b.records]
    c = run(eng, wl, noise_seed=123)
    assert [r.chunk_ns for r in a.records] != [r.chunk_ns for r in c.records]
    assert [r.output_tokens for r in a.records] == [r.output_tokens for r in c.records]
    quiet = run(eng, wl, noise=False)
    assert quiet.stats.noise_seed is None
    # Noise is a few percent: the run's duration moves by less than 10%.
    assert a.duration_s == pytest.approx(quiet.duration_s, rel=0.1)


def test_noise_off_is_exactly_the_cost_model() -> None:
    eng = engine()
    wl = simple_workload([100], [50])
    sim = run(eng, wl, noise=False)
    r = sim.records[0]
    gaps = np.diff(r.chunk_ns) / 1e9
    # Decode steps at batch 1 differ only by the growing context.
    assert gaps[0] == pytest.approx(eng.cost.batch1_decode_s(101), rel=1e-6)


def test_open_loop_arrivals_are_respected() -> None:
    wl = simple_workload([100] * 5, [20] * 5, arrivals=[0.0, 1.0, 2.0, 3.0, 4.0])
    sim = run(engine(), wl)
    sent = sorted(r.sent_ns for r in sim.records)
    assert sent == [0, 1_000_000_000, 2_000_000_000, 3_000_000_000, 4_000_000_000]
    # An idle engine starts a request the moment it arrives.
    r = sim.records[1]
    assert r.first_token_ns - r.sent_ns < 50_000_000


def test_closed_loop_keeps_concurrency_sessions_in_flight() -> None:
    wl = simple_workload([200] * 30, [40 + i for i in range(30)], concurrency=4)
    sim = run(engine(), wl)
    events = sorted([(r.sent_ns, 1) for r in sim.records] + [(r.done_ns, -1) for r in sim.records])
    live = np.cumsum([d for _, d in sorted(events, key=lambda e: (e[0], e[1]))])
    assert live.max() == 4
    # A new request is sent the moment one finishes.
    done = sorted(r.done_ns for r in sim.records)
    starts = sorted(r.sent_ns for r in sim.records)[4:]
    assert starts == done[: len(starts)]


def test_agentic_think_time_separates_turns() -> None:
    wl = workload("agentic", requests=2)
    sim = run(engine(family="agentic"), wl)
    by = {(r.session_id, r.turn_index): r for r in sim.records}
    for s in wl.sessions:
        for k in range(1, len(s.turns)):
            prev, cur = by[(s.id, k - 1)], by[(s.id, k)]
            assert cur.sent_ns - prev.done_ns == pytest.approx(s.turns[k].think_s * 1e9, abs=2)
    m = metrics(engine(family="agentic"), wl, sim)
    assert m.sessions is not None and m.sessions.completed == m.sessions.count


def test_warmup_runs_first_and_is_flagged() -> None:
    wl = workload("balanced", requests=10)
    assert wl.warmup_sessions == 4
    sim = run(engine(), wl)
    warm = [r for r in sim.records if r.warmup]
    meas = [r for r in sim.records if not r.warmup]
    assert len(warm) == 4 and len(meas) == 10
    assert max(r.done_ns for r in warm) <= min(r.sent_ns for r in meas)
    assert sim.records[:4] == warm
    first = min(r.sent_ns for r in meas)
    last = max(r.done_ns for r in meas)
    assert sim.duration_s == pytest.approx((last - first) / 1e9)


def test_too_long_requests_are_refused_like_http_400() -> None:
    eng = engine(max_model_len=2048)
    wl = simple_workload([1000, 2000, 500], [100, 100, 100])
    sim = run(eng, wl)
    bad = [r for r in sim.records if r.error]
    assert len(bad) == 1 and bad[0].http_status == 400
    assert "maximum context length is 2048 tokens" in bad[0].error
    assert "2100 tokens" in bad[0].error
    assert sim.stats.rejected_requests == 1
    m = metrics(eng, wl, sim)
    assert m.failed == 1 and m.completed == 2


def test_duration_stops_new_sends() -> None:
    wl = workload(
        "balanced", "arrival.kind=constant", "arrival.rate=10", "duration_s=2", requests=100
    )
    sim = run(engine(), wl)
    meas = [r for r in sim.records if not r.warmup]
    assert len(meas) == 20
    assert sim.stopped_early is not None and "20 of 100" in sim.stopped_early


def test_stats_report_engine_side_figures() -> None:
    eng = engine()
    sim = run(eng, workload("balanced", requests=50))
    st = sim.stats
    assert st.kv_capacity_tokens == eng.kv_capacity_tokens
    assert st.steps > 0 and st.mean_batch_size > 1 and st.mean_tokens_per_step > 1
    assert 0 < st.peak_kv_usage <= 1
    assert st.busy_s <= st.virtual_s
    assert st.generated_tokens == sum(r.output_tokens for r in sim.records)
    assert st.config["max_num_seqs"] == 1024
    assert st.startup_s == pytest.approx(eng.startup_s, rel=0.1)
    assert sim.server_metrics_delta["vllm:generation_tokens_total"] > 0


def test_sim_target_runs_a_workload_like_any_target() -> None:
    target = SimTarget("llama-3.1-8b", "h100-sxm")
    assert target.name == "sim:llama-3.1-8b@h100-sxm"
    wl = workload("balanced", requests=20)
    seen: list[tuple[int, int]] = []
    result = asyncio.run(target.run(wl, RunOptions(model="m"), lambda d, t: seen.append((d, t))))
    assert result.target == "sim:llama-3.1-8b@h100-sxm"
    assert result.workload == "balanced" and result.workload_hash == wl.content_hash()
    assert seen[-1] == (24, 24)
    m = compute_metrics(result)
    assert m.completed == 20 and m.failed == 0 and m.warmup_requests == 4
    assert m.output_throughput > 0 and m.ttft_ms.p50 > 0
    assert target.last_run is not None
    again = asyncio.run(target.run(wl, RunOptions(model="m")))
    assert compute_metrics(again).model_dump() == m.model_dump()


def test_sim_target_is_registered() -> None:
    from servegym.loadgen.target import make_target

    t = make_target("sim", model="llama-3.1-8b", hardware="h100-sxm", noise=False)
    assert isinstance(t, SimTarget)


def test_simulate_is_fast_enough_for_a_small_run() -> None:
    import time

    eng = engine()
    wl = workload("balanced", requests=200)
    t = time.perf_counter()
    simulate(eng, wl)
    assert time.perf_counter() - t < 2.0
