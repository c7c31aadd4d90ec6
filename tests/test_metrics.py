"""Metric definitions on hand-built records; every expected number is worked out by hand."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pytest

from servegym.loadgen.records import LoadgenStats, RequestRecord, RunResult
from servegym.scoring.metrics import SLA, Metrics, Price, compute_metrics, percentiles

MS = 1_000_000  # ns per ms


def rec(
    rid: str,
    *,
    sent: float | None,
    chunks: Sequence[tuple[float, int]] = (),
    done: float | None = None,
    empty: Sequence[float] = (),
    error: str | None = None,
    warmup: bool = False,
    prompt: int = 100,
    session: int = 0,
    turn: int = 0,
    usage: int | None = None,
    set_first: bool = True,
) -> RequestRecord:
    """A record from times in ms; ``chunks`` are (arrival ms, tokens) of token chunks."""
    chunk_ns = [round(t * MS) for t, _ in chunks]
    tokens = [k for _, k in chunks]
    return RequestRecord(
        request_id=rid,
        session_id=session,
        turn_index=turn,
        warmup=warmup,
        prompt_tokens=prompt,
        expected_output_tokens=sum(tokens),
        scheduled_ns=round(sent * MS) if sent is not None else 0,
        sent_ns=round(sent * MS) if sent is not None else None,
        first_token_ns=chunk_ns[0] if (chunk_ns and set_first) else None,
        done_ns=round(done * MS) if done is not None else None,
        chunk_ns=chunk_ns,
        chunk_tokens=tokens,
        empty_chunk_ns=[round(t * MS) for t in empty],
        usage_completion_tokens=usage,
        output_tokens=sum(tokens),
        recount_source="token_ids",
        error=error,
    )


def run(records: list[RequestRecord], duration_s: float = 0.5, **kw: Any) -> RunResult:
    return RunResult(
        target="test",
        model="m",
        workload="w",
        workload_hash="h",
        seed=0,
        started_at="2025-01-01T00:00:00Z",
        duration_s=duration_s,
        records=records,
        **kw,
    )


def three_plus_failed() -> list[RequestRecord]:
    """A: 6 tokens in chunks of 1, 2, 3.  B: empty first chunk, 3 tokens.  C: one token.
    D: failed.  W: warm-up.

    A: TTFT 20, E2E 45, TPOT (45-20)/5 = 5, ITL 10, 15
    B: TTFT 10 (the empty chunk at 105 is ignored), E2E 30, TPOT (30-10)/2 = 10, ITL 2, 18
    C: TTFT 50, E2E 50, no TPOT, no ITL
    """
    return [
        rec("A", sent=0, chunks=[(20, 1), (30, 2), (45, 3)], done=45, usage=6, session=1),
        rec("B", sent=100, empty=[105], chunks=[(110, 1), (112, 1), (130, 1)], done=130, session=2),
        rec("C", sent=200, chunks=[(250, 1)], done=250, usage=2, session=3),
        rec("D", sent=300, chunks=[(310, 1)], error="HTTP 500: boom", session=4),
        rec("W", sent=0, chunks=[(1000, 5)], done=2000, warmup=True, prompt=9999, session=0),
    ]


def test_percentiles_known_array() -> None:
    # 1..10: linear interpolation at rank q/100 * 9 from the first element.
    p = percentiles([float(x) for x in range(10, 0, -1)])
    assert p.mean == pytest.approx(5.5)
    assert p.p50 == pytest.approx(5.5)
    assert p.p90 == pytest.approx(9.1)
    assert p.p95 == pytest.approx(9.55)
    assert p.p99 == pytest.approx(9.91)
    assert p.p99_9 == pytest.approx(9.991)


def test_percentiles_empty_and_single() -> None:
    assert percentiles([]).model_dump() == dict.fromkeys(
        ("mean", "p50", "p90", "p95", "p99", "p99_9"), 0.0
    )
    assert percentiles([7.0]).p99_9 == 7.0


def test_ttft_percentiles_from_records() -> None:
    records = [
        rec(f"r{i}", sent=1000 * i, chunks=[(1000 * i + i, 1)], done=1000 * i + i)
        for i in range(1, 11)
    ]
    m = compute_metrics(run(records, duration_s=10.0))
    assert m.ttft_ms.p50 == pytest.approx(5.5)
    assert m.ttft_ms.p90 == pytest.approx(9.1)
    assert m.ttft_ms.p99_9 == pytest.approx(9.991)


def test_latencies() -> None:
    m = compute_metrics(run(three_plus_failed()))
    # TTFT [20, 10, 50]
    assert m.ttft_ms.mean == pytest.approx(80 / 3)
    assert m.ttft_ms.p50 == pytest.approx(20.0)
    assert m.ttft_ms.p90 == pytest.approx(44.0)  # sorted 10, 20, 50: rank 1.8 -> 20 + 0.8*30
    # TPOT [5, 10]; C (one token) excluded
    assert m.tpot_ms.mean == pytest.approx(7.5)
    assert m.tpot_ms.p50 == pytest.approx(7.5)
    assert m.tpot_ms.p90 == pytest.approx(9.5)
    # ITL [10, 15, 2, 18]: one gap per chunk, however many tokens the chunk holds
    assert m.itl_ms.mean == pytest.approx(11.25)
    assert m.itl_ms.p50 == pytest.approx(12.5)
    assert m.itl_ms.p90 == pytest.approx(17.1)  # sorted 2, 10, 15, 18: rank 2.7
    # E2E [45, 30, 50]
    assert m.e2e_ms.mean == pytest.approx(125 / 3)
    assert m.e2e_ms.p50 == pytest.approx(45.0)


def test_counts_and_throughputs() -> None:
    m = compute_metrics(run(three_plus_failed(), duration_s=0.5))
    assert (m.completed, m.failed, m.warmup_requests) == (3, 1, 1)
    assert m.duration_s == 0.5
    assert m.total_input_tokens == 300  # completed only; warm-up's 9999 left out
    assert m.total_output_tokens == 10  # 6 + 3 + 1
    assert m.mean_output_tokens == pytest.approx(10 / 3)
    assert m.request_throughput == pytest.approx(6.0)
    assert m.output_throughput == pytest.approx(20.0)
    assert m.total_token_throughput == pytest.approx(620.0)
    assert m.errors == {"HTTP 500: boom": 1}
    assert m.empty_first_chunks == 1
    assert m.sessions is None


def test_output_tokens_are_harness_count_not_usage() -> None:
    records = three_plus_failed()
    records[0].usage_completion_tokens = 600  # a server inflating its usage report
    m = compute_metrics(run(records))
    assert m.total_output_tokens == 10
    assert m.output_throughput == pytest.approx(20.0)
    assert m.recount_mismatches == 2  # A (600 vs 6) and C (2 vs 1); B reported none
    assert m.usage_output_tokens == 602
    assert m.recount_sources == {"token_ids": 3}


def test_several_tokens_per_chunk() -> None:
    # 25 chunks of 4 tokens, every 40 ms from TTFT 50 ms: ITL is per chunk (40 ms), TPOT per
    # token: (50 + 24*40 - 50) / (100 - 1) = 960 / 99 ms.
    chunks = [(50 + 40 * i, 4) for i in range(25)]
    m = compute_metrics(run([rec("x", sent=0, chunks=chunks, done=1010)], duration_s=1.01))
    assert m.itl_ms.model_dump() == dict.fromkeys(PCT_KEYS, pytest.approx(40.0))
    assert m.tpot_ms.mean == pytest.approx(960 / 99)
    assert m.ttft_ms.p50 == pytest.approx(50.0)
    assert m.total_output_tokens == 100
    assert m.output_throughput == pytest.approx(100 / 1.01)


def test_ttft_falls_back_to_first_token_chunk() -> None:
    r = rec("x", sent=0, empty=[1, 2], chunks=[(7, 2), (9, 1)], done=9, set_first=False)
    m = compute_metrics(run([r], duration_s=1.0))
    assert m.ttft_ms.mean == pytest.approx(7.0)
    assert m.tpot_ms.mean == pytest.approx(1.0)  # (9 - 7) / (3 - 1)
    assert m.empty_first_chunks == 1


def test_completed_without_tokens() -> None:
    # Completed but never produced a token: counted, in E2E, not in TTFT; misses a TTFT SLO.
    r = rec("x", sent=0, done=5)
    m = compute_metrics(run([r], duration_s=1.0), sla=SLA(ttft_ms=100))
    assert m.completed == 1
    assert m.ttft_ms.mean == 0.0
    assert m.e2e_ms.mean == pytest.approx(5.0)
    assert m.goodput == 0.0
    assert m.sla_attainment == 0.0


@pytest.mark.parametrize(
    ("sla", "good"),
    [
        (SLA(ttft_ms=20), 2),  # A at exactly 20 meets it, B 10 meets, C 50 misses
        (SLA(tpot_ms=10), 3),  # A 5, B 10 (at the limit); C has one token: TPOT counts as 0
        (SLA(tpot_ms=9), 2),  # B 10 misses
        (SLA(e2e_ms=40), 1),  # only B (30)
        (SLA(ttft_ms=20, tpot_ms=10, e2e_ms=46), 2),  # A and B
        (SLA(ttft_ms=20, tpot_ms=6), 1),  # A only: B misses TPOT, C misses TTFT
        (SLA(ttft_ms=1), 0),
    ],
)
def test_goodput_and_attainment(sla: SLA, good: int) -> None:
    m = compute_metrics(run(three_plus_failed(), duration_s=0.5), sla=sla)
    assert m.goodput == pytest.approx(good / 0.5)
    assert m.sla_attainment == pytest.approx(good / 4)  # the failed request D is a miss
    assert m.sla == sla


def test_no_sla_gives_null_goodput() -> None:
    m = compute_metrics(run(three_plus_failed()))
    assert m.goodput is None and m.sla_attainment is None and m.sla is None
    m = compute_metrics(run(three_plus_failed()), sla=SLA())
    assert m.goodput is None and m.sla_attainment is None


def test_cost() -> None:
    # $2/GPU-hour x 4 GPUs x 0.5 s = $1/900, over 10 output tokens -> $111.11 per million
    m = compute_metrics(
        run(three_plus_failed(), duration_s=0.5), price=Price(price_per_hour=2.0, gpus=4)
    )
    assert m.cost_per_mtok == pytest.approx(1000 / 9)
    assert m.price == Price(price_per_hour=2.0, gpus=4)
    assert compute_metrics(run(three_plus_failed())).cost_per_mtok is None


def sessions_run() -> RunResult:
    """Session 0: 3 turns, session 1: 2 turns, session 2: 2 turns of which the second failed.

    Turn E2Es 100, 100, 200 | 60, 850 | 40 -> mean 1350/6 = 225, p50 100.
    Makespans: s0 0..500 ms, s1 50..1050 ms; s2 incomplete -> [0.5, 1.0] s.
    """
    return run(
        [
            rec("s0t0", sent=0, chunks=[(10, 5)], done=100, session=0, turn=0),
            rec("s0t1", sent=150, chunks=[(160, 5)], done=250, session=0, turn=1),
            rec("s0t2", sent=300, chunks=[(310, 5)], done=500, session=0, turn=2),
            rec("s1t0", sent=50, chunks=[(60, 5)], done=110, session=1, turn=0),
            rec("s1t1", sent=200, chunks=[(210, 5)], done=1050, session=1, turn=1),
            rec("s2t0", sent=0, chunks=[(5, 5)], done=40, session=2, turn=0),
            rec("s2t1", sent=90, error="timeout", session=2, turn=1),
            rec("wt0", sent=0, chunks=[(5, 5)], done=9000, session=3, turn=0, warmup=True),
            rec("wt1", sent=0, chunks=[(5, 5)], done=9000, session=3, turn=1, warmup=True),
        ],
        duration_s=1.05,
    )


def test_session_metrics() -> None:
    m = compute_metrics(sessions_run())
    s = m.sessions
    assert s is not None
    assert (s.count, s.completed, s.turns) == (3, 2, 6)
    assert s.turns_per_session_mean == pytest.approx(7 / 3)
    assert s.turn_latency_ms_mean == pytest.approx(225.0)
    assert s.turn_latency_ms.p50 == pytest.approx(100.0)
    assert s.session_makespan_s.mean == pytest.approx(0.75)
    assert s.session_makespan_s.p50 == pytest.approx(0.75)
    assert s.session_makespan_s.p90 == pytest.approx(0.95)
    assert (m.completed, m.failed, m.warmup_requests) == (6, 1, 2)


def test_empty_run() -> None:
    m = compute_metrics(
        run([], duration_s=0.0), sla=SLA(ttft_ms=1), price=Price(price_per_hour=1.0)
    )
    assert (m.completed, m.failed, m.duration_s) == (0, 0, 0.0)
    assert m.ttft_ms.model_dump() == dict.fromkeys(
        ("mean", "p50", "p90", "p95", "p99", "p99_9"), 0.0
    )
    assert m.request_throughput == m.output_throughput == m.total_token_throughput == 0.0
    assert m.goodput == 0.0 and m.sla_attainment == 0.0
    assert m.cost_per_mtok is None
    assert m.sessions is None
    assert m.mean_output_tokens == 0.0
    _strict_json(m)


def test_all_failed_run() -> None:
    records = [rec("a", sent=0, error="HTTP 503"), rec("b", sent=None, error="connect refused")]
    m = compute_metrics(run(records, duration_s=float("nan")), sla=SLA(e2e_ms=5))
    assert (m.completed, m.failed) == (0, 2)
    assert m.duration_s == 0.0
    assert m.goodput == 0.0 and m.sla_attainment == 0.0
    assert m.errors == {"HTTP 503": 1, "connect refused": 1}
    _strict_json(m)


def _strict_json(m: Metrics) -> dict[str, Any]:
    def no_constants(name: str) -> None:
        raise AssertionError(f"non-finite {name} in metrics JSON")

    out: dict[str, Any] = json.loads(m.model_dump_json(), parse_constant=no_constants)
    return out


TOP_KEYS = {
    "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "request_throughput", "output_throughput",
    "total_token_throughput", "goodput", "sla_attainment", "cost_per_mtok", "completed",
    "failed", "duration_s", "loadgen", "sessions", "warmup_requests", "total_input_tokens",
    "total_output_tokens", "mean_output_tokens", "usage_output_tokens", "recount_mismatches",
    "recount_sources", "empty_first_chunks", "errors", "stopped_early", "server_metrics_delta",
    "server", "sla", "price",
}  # fmt: skip
PCT_KEYS = {"mean", "p50", "p90", "p95", "p99", "p99_9"}


def test_json_key_layout() -> None:
    result = sessions_run()
    result.loadgen = LoadgenStats(send_lag_ms_p99=0.25, client_bound=True, reason="lag")
    result.server_metrics_delta = {"vllm:prompt_tokens_total": 600.0, "bad": math.nan}
    m = compute_metrics(result, sla=SLA.parse("ttft_ms=200"), price=Price(price_per_hour=3))
    d = _strict_json(m)
    assert set(d) == TOP_KEYS
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(d[key]) == PCT_KEYS
    assert d["loadgen"]["send_lag_ms_p99"] == 0.25 and d["loadgen"]["client_bound"] is True
    assert set(d["sessions"]) == {
        "count", "completed", "turns", "turns_per_session_mean", "turn_latency_ms_mean",
        "turn_latency_ms", "session_makespan_s",
    }  # fmt: skip
    assert set(d["sessions"]["turn_latency_ms"]) == PCT_KEYS
    assert d["sla"] == {"ttft_ms": 200.0, "tpot_ms": None, "e2e_ms": None}
    assert d["price"] == {"price_per_hour": 3.0, "gpus": 1}
    assert d["server_metrics_delta"] == {"vllm:prompt_tokens_total": 600.0}
    assert Metrics.model_validate_json(m.model_dump_json()) == m
