"""The simulated scheduler: vLLM v1's invariants, preemption, prefix caching, event skipping."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sim_support import engine as _engine
from sim_support import no_api_engine, run, simple_workload, workload

from servegym.engines.config import SpeculativeConfig
from servegym.engines.sim.cost_model import GIB
from servegym.engines.sim.engine import SimRun, simulate
from servegym.engines.sim.launch import LaunchedEngine
from servegym.workloads.model import Session, TokenArray, Turn, Workload
from servegym.workloads.spec import ArrivalSpec, WorkloadSpec


def engine(*args: Any, **kw: Any) -> LaunchedEngine:
    """Launch with the shipped vLLM profile minus its API server: these tests check the
    scheduler's own order, which the API server's pacing of simultaneous arrivals would
    blur (tests/test_sim_engine_profiles.py checks the API server)."""
    return _engine(*args, engine_profile=no_api_engine(), **kw)


def _observe(
    eng: LaunchedEngine, wl: Workload, **kw: object
) -> tuple[SimRun, list[tuple[int, int, int, int]]]:
    seen: list[tuple[int, int, int, int]] = []
    sim = simulate(eng, wl, observer=lambda *a: seen.append(a), **kw)  # type: ignore[arg-type]
    return sim, seen


def _check_records(sim: SimRun, wl: Workload) -> None:
    """Every request completes with exactly its forced length, in time order."""
    expected = {(s.id, k): t.output_len for s in wl.sessions for k, t in enumerate(s.turns)}
    assert len(sim.records) == len(expected)
    for r in sim.records:
        assert r.error is None and r.ok
        assert r.output_tokens == expected[(r.session_id, r.turn_index)]
        assert sum(r.chunk_tokens) == r.output_tokens
        assert len(r.chunk_ns) == len(r.chunk_tokens)
        assert all(c > 0 for c in r.chunk_tokens)
        assert r.sent_ns == r.scheduled_ns
        assert r.sent_ns < r.first_token_ns == r.chunk_ns[0]
        assert r.done_ns == r.chunk_ns[-1] == r.end_ns
        assert np.all(np.diff(r.chunk_ns) > 0)
        assert r.usage_completion_tokens == r.output_tokens
        assert r.recount_source == "token_ids"


def test_never_over_max_num_seqs_or_the_token_budget() -> None:
    eng = engine(max_num_seqs=32, max_num_batched_tokens=512)
    wl = simple_workload(
        [300 + 37 * i % 500 for i in range(100)], [50 + 13 * i % 200 for i in range(100)]
    )
    sim, seen = _observe(eng, wl)
    assert max(s[1] for s in seen) <= 32
    assert max(s[2] for s in seen) <= 32
    assert max(s[3] for s in seen) <= 512
    assert max(s[1] for s in seen) == 32  # the cap was reached
    _check_records(sim, wl)


def test_chunked_prefill_splits_long_prompts() -> None:
    eng = engine(max_num_batched_tokens=2048, max_num_seqs=64)
    wl = simple_workload([10000], [10])
    sim, seen = _observe(eng, wl)
    # 10,000 prompt tokens need 5 steps of at most 2,048 tokens; the last one samples.
    assert sum(1 for s in seen if s[3] > 1) == 5
    _check_records(sim, wl)


def test_chunked_prefill_off_needs_whole_prompts() -> None:
    eng = engine(enable_chunked_prefill=False, max_model_len=16384, max_num_seqs=64)
    assert eng.config.max_num_batched_tokens == 16384
    wl = simple_workload([9000, 9000, 200], [20, 20, 20])
    sim, seen = _observe(eng, wl)
    assert max(s[3] for s in seen) <= 16384
    # The second 9,000-token prompt does not fit beside the first: the short one skips ahead.
    first = {r.session_id: r.first_token_ns for r in sim.records}
    assert first[2] < first[1]
    _check_records(sim, wl)


def test_preemption_when_kv_is_tiny_and_everything_still_completes() -> None:
    eng = engine(kv_cache_memory_bytes=int(0.3 * GIB), max_model_len=2048, max_num_seqs=64)
    assert eng.kv_capacity_tokens < 3000
    wl = simple_workload([400] * 20, [600] * 20)
    sim = run(eng, wl)
    assert sim.stats.preemptions > 0
    assert sim.stats.peak_kv_usage == pytest.approx(1.0, abs=0.02)
    _check_records(sim, wl)


def test_preempted_requests_reuse_their_cached_blocks() -> None:
    """After a preemption the request's blocks stay cached until evicted, so recomputing
    costs less than the tokens it had."""
    eng = engine(kv_cache_memory_bytes=int(0.3 * GIB), max_model_len=2048, max_num_seqs=64)
    wl = simple_workload([400] * 20, [600] * 20)
    sim = run(eng, wl)
    total_prompt = 400 * 20
    # Every recompute redoes prompt + output so far; hits keep the extra work small.
    assert sim.stats.prompt_tokens_computed < total_prompt + 600 * sim.stats.preemptions


def test_prefix_cache_hits_a_shared_prefix_and_not_unique_prompts() -> None:
    shared = simple_workload([2000] * 30, [20] * 30, shared_prefix=1600)
    sim = run(engine(), shared)
    assert sim.stats.prefix_cache_hit_rate == pytest.approx(29 * 1600 / (30 * 2000), rel=0.05)
    unique = simple_workload([2000] * 30, [20] * 30)
    assert run(engine(), unique).stats.prefix_cache_hits == 0
    off = run(engine(enable_prefix_caching=False), shared)
    assert off.stats.prefix_cache_queries == 0
    assert off.stats.prompt_tokens_computed == 30 * 2000


def test_agentic_turns_hit_their_own_previous_context() -> None:
    wl = workload("agentic", requests=2)
    sim = run(engine(family="agentic"), wl)
    assert sim.stats.prefix_cache_hit_rate is not None and sim.stats.prefix_cache_hit_rate > 0.85
    _check_records(sim, wl)


def test_event_skipping_matches_step_by_step() -> None:
    """The fast path (many decode steps at once) gives the same records as simulating every
    step on the general path."""
    eng = engine(kv_cache_memory_bytes=int(0.5 * GIB), max_model_len=4096, max_num_seqs=48)
    wl = simple_workload(
        [200 + (97 * i) % 900 for i in range(60)],
        [100 + (61 * i) % 400 for i in range(60)],
        arrivals=[0.05 * i for i in range(60)],
        shared_prefix=128,
    )
    fast = run(eng, wl)
    slow = run(eng, wl, event_skipping=False)
    assert fast.stats.preemptions == slow.stats.preemptions > 0
    assert fast.stats.steps == slow.stats.steps
    for a, b in zip(fast.records, slow.records, strict=True):
        assert a.request_id == b.request_id
        assert a.chunk_tokens == b.chunk_tokens
        np.testing.assert_allclose(a.chunk_ns, b.chunk_ns, rtol=0, atol=2)


@pytest.mark.parametrize("method", ["ngram", "draft_model", "eagle3"])
def test_speculative_decoding_emits_several_tokens_per_chunk(method: str) -> None:
    draft = {"ngram": None, "draft_model": "llama-3.2-1b", "eagle3": "eagle3-head"}[method]
    eng = engine(
        family="agentic",
        speculative=SpeculativeConfig(method=method, num_speculative_tokens=4, draft_model=draft),  # type: ignore[arg-type]
    )
    wl = simple_workload([500] * 8, [300] * 8, concurrency=4)
    sim = run(eng, wl)
    _check_records(sim, wl)
    r = sim.records[0]
    assert max(r.chunk_tokens) > 1
    mean = (sum(r.chunk_tokens) - 1) / (len(r.chunk_tokens) - 1)
    assert eng.spec is not None
    assert mean == pytest.approx(eng.spec.tokens_per_step, rel=0.05)


def test_event_skipping_matches_step_by_step_with_speculation() -> None:
    eng = engine(
        family="agentic",
        speculative=SpeculativeConfig(method="eagle3", num_speculative_tokens=3, draft_model="h"),
    )
    wl = simple_workload([300] * 12, [123 + i for i in range(12)], concurrency=5)
    fast, slow = run(eng, wl), run(eng, wl, event_skipping=False)
    for a, b in zip(fast.records, slow.records, strict=True):
        assert a.chunk_tokens == b.chunk_tokens
        np.testing.assert_allclose(a.chunk_ns, b.chunk_ns, rtol=0, atol=2)


def _agent_among_fresh_requests() -> Workload:
    """A saturated engine's queue: one agent session of three short turns (each next turn sent
    as soon as the previous one ends) and eight long single-turn requests, all sent at 0."""
    rng = np.random.default_rng(0)

    def tokens(n: int) -> TokenArray:
        return rng.integers(1000, 30000, size=n, dtype=np.int32)

    agent = Session(
        id=0,
        tokens=tokens(300),
        turns=[Turn(100, 10, arrival_s=0.0), Turn(200, 10), Turn(300, 10)],
    )
    fresh = [
        Session(id=i, tokens=tokens(100), turns=[Turn(100, 200, arrival_s=0.0)])
        for i in range(1, 9)
    ]
    spec = WorkloadSpec(name="test", num_requests=9, arrival=ArrivalSpec(kind="offline"))
    return Workload(spec=spec, seed=0, sessions=[agent, *fresh])


def _later_turns_and_queued_fresh(policy: str) -> tuple[list[int], list[int]]:
    """First-token times of the agent's later turns, and of the fresh requests that had to
    queue (not admitted with the agent's first turn), with ``max_num_seqs=2``."""
    wl = _agent_among_fresh_requests()
    sim = run(engine(scheduling_policy=policy, max_num_seqs=2), wl)
    _check_records(sim, wl)
    first: dict[tuple[int, int], int] = {}
    for r in sim.records:
        assert r.first_token_ns is not None
        first[(r.session_id, r.turn_index)] = r.first_token_ns
    later = [first[(0, k)] for k in (1, 2)]
    queued = [t for (s, _), t in first.items() if s != 0 and t > first[(0, 0)]]
    assert len(queued) == 7  # one fresh request started beside the agent's first turn
    return later, queued


def test_priority_policy_runs_later_turns_first() -> None:
    """Under ``priority`` the agent's later turns jump the queue of fresh requests that
    arrived before them."""
    later, queued = _later_turns_and_queued_fresh("priority")
    assert max(later) < min(queued)


def test_fcfs_policy_runs_later_turns_after_the_queue() -> None:
    """Under ``fcfs`` the same later turns wait behind every fresh request that arrived
    before them: the opposite order, so the priority test above measures the policy."""
    later, queued = _later_turns_and_queued_fresh("fcfs")
    assert min(later) > max(queued)


def test_priority_policy_completes_an_agentic_workload() -> None:
    """On a shipped multi-turn workload the priority policy still completes every turn."""
    wl = workload("agentic", requests=3)
    eng = engine(scheduling_policy="priority", family="agentic", max_num_seqs=2)
    sim = run(eng, wl)
    _check_records(sim, wl)


def test_budget_smaller_than_running_decodes_still_completes() -> None:
    """With speculation each decode takes 1 + k budget tokens: when the running decodes need
    more than the budget, the later ones skip a step (and stream no chunk in it)."""
    eng = engine(
        max_num_seqs=32,
        max_num_batched_tokens=64,
        family="agentic",
        speculative=SpeculativeConfig(method="eagle3", num_speculative_tokens=4, draft_model="h"),
    )
    wl = simple_workload([3] * 40, [60] * 40)
    sim, seen = _observe(eng, wl)
    assert max(s[3] for s in seen) <= 64
    assert max(s[1] for s in seen) > 64 // 5  # more running than one step can decode
    _check_records(sim, wl)


def test_block_accounting_matches_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode set's closed-form block count (no per-request bookkeeping) always equals
    what the pool has handed out, and every request holds the blocks its tokens need."""
    from servegym.engines.sim import scheduler as sched_mod

    checks = {"n": 0}

    def check(s: sched_mod.Scheduler) -> None:
        pool = s.pool
        held = s.S_nb + sum(s.nblk[r] for r in s.pf)
        assert pool.num_blocks - pool.num_free == held
        assert int((pool.ref > 0).sum()) == held
        if len(s.dec):
            idx = np.arange(len(s.dec))
            nb = s._nb_of(idx)
            c = s.d_a + s.G
            assert int(nb.sum()) == s.S_nb
            assert (nb * s.B >= c).all()
        checks["n"] += 1

    for name in ("_step", "_segment"):
        orig = getattr(sched_mod.Scheduler, name)

        def wrapped(self: sched_mod.Scheduler, _orig=orig) -> bool:  # type: ignore[no-untyped-def]
            out: bool = _orig(self)
            check(self)
            return out

        monkeypatch.setattr(sched_mod.Scheduler, name, wrapped)
    eng = engine(kv_cache_memory_bytes=int(0.3 * GIB), max_model_len=2048, max_num_seqs=64)
    wl = simple_workload(
        [100 + (53 * i) % 900 for i in range(40)],
        [50 + (31 * i) % 500 for i in range(40)],
        arrivals=[0.03 * i for i in range(40)],
    )
    sim = run(eng, wl)
    assert sim.stats.preemptions > 0 and checks["n"] > 100
    _check_records(sim, wl)
