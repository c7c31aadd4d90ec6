"""Metrics of one run: latency distributions, throughputs, goodput, cost, self-checks.

Definitions follow vLLM's ``bench serve`` (``vllm/benchmarks/serve.py``, ``calculate_metrics``)
except where ``docs/metrics.md`` says otherwise; that file is the reference for every
number here. In short, over the measured (non-warm-up) requests that completed:

- TTFT = first token-carrying chunk - send; E2E = last token (``done_ns``) - send;
- TPOT = (E2E - TTFT) / (output tokens - 1), for requests with more than one output token;
- ITL = gaps between consecutive token-carrying chunks, pooled over all requests;
- output tokens are the harness count (``RequestRecord.output_tokens``), never the
  server-reported usage;
- throughputs, goodput and cost are over ``RunResult.duration_s``.

Everything is computed with numpy over flat arrays, so 10^5 records with 10^6 chunks take
well under a second. No input yields NaN or infinity: empty distributions are zeros and
undefined ratios are ``None`` (``null`` in JSON), as documented per field.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from servegym.loadgen.records import LoadgenStats, RequestRecord, RunResult
from servegym.scoring.server_figures import ServerFigures, server_figures
from servegym.scoring.sla import SLA, Price

__all__ = [
    "PERCENTILES",
    "SLA",
    "Metrics",
    "Percentiles",
    "Price",
    "RequestLatencies",
    "SessionMetrics",
    "compute_metrics",
    "percentiles",
    "request_latencies",
]

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)
"""The percentiles every distribution reports (``p50`` ... ``p99_9``)."""

_NS_PER_MS = 1e6
_NS_PER_S = 1e9
_MAX_ERROR_KINDS = 20
_ERROR_KEY_CHARS = 160

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class Percentiles(BaseModel):
    """Summary of one distribution: its mean and percentiles (numpy's linear interpolation).

    The unit is the one in the field name that holds it (``ttft_ms`` -> milliseconds,
    ``session_makespan_s`` -> seconds). An empty distribution is all zeros, as in vLLM.
    """

    model_config = ConfigDict(extra="forbid")

    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    p99_9: float = 0.0


class SessionMetrics(BaseModel):
    """Per-session figures of a multi-turn (agentic) run.

    A turn is one request; its latency is its E2E (send to last token). Turn latencies are
    over completed turns. A session is complete when every measured turn of it completed;
    its makespan (first send to last token of the session, think time included) is over
    complete sessions only.
    """

    model_config = ConfigDict(extra="forbid")

    count: int = Field(description="sessions with at least one measured turn")
    completed: int = Field(description="sessions whose every measured turn completed")
    turns: int = Field(description="completed turns")
    turns_per_session_mean: float = Field(description="measured turns per session")
    turn_latency_ms_mean: float = Field(
        description="mean E2E of a completed turn, ms (the MLPerf Edge Agentic headline)"
    )
    turn_latency_ms: Percentiles
    session_makespan_s: Percentiles


class Metrics(BaseModel):
    """The metrics of one run, as written to ``metrics.json``.

    The key names are a contract other tools rely on; see ``docs/metrics.md``.
    """

    model_config = ConfigDict(extra="forbid")

    ttft_ms: Percentiles
    tpot_ms: Percentiles
    itl_ms: Percentiles
    e2e_ms: Percentiles
    request_throughput: float = Field(description="completed requests per second")
    output_throughput: float = Field(description="output tokens (harness count) per second")
    total_token_throughput: float = Field(description="prompt + output tokens per second")
    goodput: float | None = Field(
        description="completed requests meeting every SLO, per second; null without an SLA"
    )
    sla_attainment: float | None = Field(
        description="fraction of measured requests meeting every SLO (failed ones miss); "
        "null without an SLA"
    )
    cost_per_mtok: float | None = Field(
        description="dollars per million output tokens; null without a price or output"
    )
    completed: int
    failed: int
    duration_s: float
    loadgen: LoadgenStats
    sessions: SessionMetrics | None = None
    warmup_requests: int = Field(default=0, description="warm-up requests, excluded")
    total_input_tokens: int = Field(default=0, description="prompt tokens of completed requests")
    total_output_tokens: int = Field(
        default=0, description="output tokens (harness count) of completed requests"
    )
    mean_output_tokens: float = 0.0
    usage_output_tokens: int | None = Field(
        default=None,
        description="server-reported completion tokens of completed requests (for comparison "
        "only; null when the server reported none)",
    )
    recount_mismatches: int = Field(
        default=0,
        description="completed requests whose server-reported completion tokens differ from "
        "the harness count",
    )
    recount_sources: dict[str, int] = Field(
        default_factory=dict,
        description="completed requests by how the harness counted their output tokens "
        "(RequestRecord.recount_source)",
    )
    empty_first_chunks: int = Field(
        default=0, description="measured requests whose first streamed chunk carried no token"
    )
    errors: dict[str, int] = Field(
        default_factory=dict, description="failed requests by error message"
    )
    stopped_early: str | None = None
    server_metrics_delta: dict[str, float] = Field(default_factory=dict)
    server: ServerFigures | None = Field(
        default=None, description="the server's own figures, from its /metrics"
    )
    sla: SLA | None = None
    price: Price | None = None


def percentiles(values: npt.ArrayLike) -> Percentiles:
    """Mean and percentiles of ``values`` (all zeros when empty), non-finite values dropped."""
    arr = np.asarray(values, dtype=np.float64).ravel()
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return Percentiles()
    p = np.percentile(arr, PERCENTILES)  # method="linear", numpy's default, as vLLM
    return Percentiles(
        mean=float(arr.mean()),
        p50=float(p[0]),
        p90=float(p[1]),
        p95=float(p[2]),
        p99=float(p[3]),
        p99_9=float(p[4]),
    )


def _split(
    records: Iterable[RequestRecord],
) -> tuple[list[RequestRecord], list[RequestRecord], list[RequestRecord]]:
    """(measured, completed, failed) records, in one pass.

    Completed is ``RequestRecord.ok`` plus a send time (a record that finished but was never
    stamped as sent cannot be timed, so it counts as failed); spelled out inline because
    this loop runs over every record of a large run.
    """
    measured: list[RequestRecord] = []
    done: list[RequestRecord] = []
    failed: list[RequestRecord] = []
    for r in records:
        if r.warmup:
            continue
        measured.append(r)
        if r.error is None and r.done_ns is not None and r.sent_ns is not None:
            done.append(r)
        else:
            failed.append(r)
    return measured, done, failed


def _first_token_ns(r: RequestRecord) -> int:
    """First token-carrying chunk's time, or -1 when the request produced no token."""
    if r.first_token_ns is not None:
        return r.first_token_ns
    if r.chunk_ns:
        return r.chunk_ns[0]
    return -1


def _ints(values: Iterable[int], count: int) -> IntArray:
    return np.fromiter(values, dtype=np.int64, count=count)


def _ratio(num: float, den: float) -> float:
    """num / den, or 0.0 when den is not a positive finite number."""
    if not math.isfinite(den) or den <= 0:
        return 0.0
    out = num / den
    return out if math.isfinite(out) else 0.0


def _itl_ns(done: Sequence[RequestRecord]) -> IntArray:
    """Gaps between consecutive token-carrying chunks of each request, all requests pooled."""
    counts = _ints((len(r.chunk_ns) for r in done), len(done))
    total = int(counts.sum())
    if total < 2:
        return np.empty(0, dtype=np.int64)
    flat = _ints(itertools.chain.from_iterable(r.chunk_ns for r in done), total)
    owner = np.repeat(np.arange(len(done), dtype=np.int64), counts)
    same_request = owner[1:] == owner[:-1]
    gaps: IntArray = np.diff(flat)[same_request]
    return gaps


def _empty_first_chunks(measured: Sequence[RequestRecord]) -> int:
    n = 0
    for r in measured:
        if r.empty_chunk_ns:
            first = _first_token_ns(r)
            if first < 0 or min(r.empty_chunk_ns) < first:
                n += 1
    return n


def _error_counts(failed: Sequence[RequestRecord]) -> dict[str, int]:
    """Failed requests grouped by message; the rarest kinds beyond 20 are folded into 'other'."""
    counts = Counter((r.error or "not completed")[:_ERROR_KEY_CHARS] for r in failed).most_common()
    out = dict(counts[:_MAX_ERROR_KINDS])
    rest = sum(c for _, c in counts[_MAX_ERROR_KINDS:])
    if rest:
        out["other"] = out.get("other", 0) + rest
    return out


def _session_metrics(
    measured: Sequence[RequestRecord],
    done: Sequence[RequestRecord],
    failed: Sequence[RequestRecord],
    sent: IntArray,
    done_ns: IntArray,
    e2e_ms: FloatArray,
) -> SessionMetrics | None:
    """Per-session figures, or None when no measured request is a later turn of a session.

    Multi-turn is judged by ``turn_index`` alone, so a single-turn run reports no sessions
    however its session ids were assigned.
    """
    if not any(r.turn_index > 0 for r in measured):
        return None
    all_sid = _ints((r.session_id for r in measured), len(measured))
    sids, turns_per = np.unique(all_sid, return_counts=True)
    failed_sid = _ints((r.session_id for r in failed), len(failed))
    complete = ~np.isin(sids, failed_sid)
    # First send and last token per session, over its completed turns.
    first = np.full(sids.size, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(sids.size, np.iinfo(np.int64).min, dtype=np.int64)
    if done:
        idx = np.searchsorted(sids, _ints((r.session_id for r in done), len(done)))
        np.minimum.at(first, idx, sent)
        np.maximum.at(last, idx, done_ns)
    makespan_s = (last[complete] - first[complete]) / _NS_PER_S
    turn_latency = percentiles(e2e_ms)
    return SessionMetrics(
        count=int(sids.size),
        completed=int(complete.sum()),
        turns=len(done),
        turns_per_session_mean=float(turns_per.mean()),
        turn_latency_ms_mean=turn_latency.mean,
        turn_latency_ms=turn_latency,
        session_makespan_s=percentiles(makespan_s),
    )


def compute_metrics(
    result: RunResult, *, sla: SLA | None = None, price: Price | None = None
) -> Metrics:
    """Compute a run's metrics from its records (see ``docs/metrics.md`` for definitions).

    Warm-up records are left out of everything but ``warmup_requests``. A measured record
    is *completed* when it has no error, a send time and a done time; every other measured
    record is *failed*: counted, and a miss for SLA attainment, but in no latency or token
    figure. ``sla`` with no objective set counts as no SLA.
    """
    if sla is not None and sla.is_empty:
        sla = None
    measured, done, failed = _split(result.records)
    n = len(done)
    duration_s = max(result.duration_s, 0.0) if math.isfinite(result.duration_s) else 0.0

    sent = _ints((r.sent_ns or 0 for r in done), n)
    done_ns = _ints((r.done_ns or 0 for r in done), n)
    first = _ints((_first_token_ns(r) for r in done), n)
    out_tok = _ints((r.output_tokens for r in done), n)
    in_tok = _ints((r.prompt_tokens for r in done), n)

    has_token = first >= 0
    e2e_ns = done_ns - sent
    ttft_ns = first - sent
    decode_ns = done_ns - first
    multi = has_token & (out_tok > 1)
    tpot_ms = decode_ns[multi] / np.maximum(out_tok[multi] - 1, 1) / _NS_PER_MS
    e2e_ms = e2e_ns / _NS_PER_MS

    total_in = int(in_tok.sum())
    total_out = int(out_tok.sum())

    goodput: float | None = None
    attainment: float | None = None
    if sla is not None:
        good = np.ones(n, dtype=bool)
        if sla.ttft_ms is not None:
            good &= has_token & (ttft_ns <= sla.ttft_ms * _NS_PER_MS)
        if sla.tpot_ms is not None:
            # One-token requests have no TPOT; vLLM counts them as TPOT 0, i.e. met.
            req_tpot_ms = np.zeros(n, dtype=np.float64)
            req_tpot_ms[multi] = tpot_ms
            good &= (has_token | (out_tok <= 1)) & (req_tpot_ms <= sla.tpot_ms)
        if sla.e2e_ms is not None:
            good &= e2e_ns <= sla.e2e_ms * _NS_PER_MS
        n_good = int(good.sum())
        goodput = _ratio(n_good, duration_s)
        attainment = _ratio(n_good, len(measured))

    cost: float | None = None
    if price is not None and total_out > 0:
        dollars = price.price_per_hour * price.gpus * duration_s / 3600.0
        cost = dollars / total_out * 1e6

    usage = [r.usage_completion_tokens for r in done if r.usage_completion_tokens is not None]
    mismatches = sum(
        1
        for r in done
        if r.usage_completion_tokens is not None and r.usage_completion_tokens != r.output_tokens
    )

    return Metrics(
        ttft_ms=percentiles(ttft_ns[has_token] / _NS_PER_MS),
        tpot_ms=percentiles(tpot_ms),
        itl_ms=percentiles(_itl_ns(done) / _NS_PER_MS),
        e2e_ms=percentiles(e2e_ms),
        request_throughput=_ratio(n, duration_s),
        output_throughput=_ratio(total_out, duration_s),
        total_token_throughput=_ratio(total_in + total_out, duration_s),
        goodput=goodput,
        sla_attainment=attainment,
        cost_per_mtok=cost,
        completed=n,
        failed=len(failed),
        duration_s=duration_s,
        loadgen=result.loadgen,
        sessions=_session_metrics(measured, done, failed, sent, done_ns, e2e_ms),
        warmup_requests=len(result.records) - len(measured),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        mean_output_tokens=_ratio(total_out, n),
        usage_output_tokens=sum(usage) if usage else None,
        recount_mismatches=mismatches,
        recount_sources=dict(Counter(r.recount_source for r in done)),
        empty_first_chunks=_empty_first_chunks(measured),
        errors=_error_counts(failed),
        stopped_early=result.stopped_early,
        server_metrics_delta={
            k: v for k, v in result.server_metrics_delta.items() if math.isfinite(v)
        },
        server=server_figures(
            result.server_metrics_delta,
            result.server_gauges_max,
            float(np.mean(ttft_ns[has_token])) / _NS_PER_MS if has_token.any() else None,
            int(has_token.sum()),
        ),
        sla=sla,
        price=price,
    )


@dataclass(frozen=True, slots=True)
class RequestLatencies:
    """Per-request latencies of one run, in ms, in record order: the values whose summaries
    :func:`compute_metrics` reports as ``ttft_ms``, ``tpot_ms`` and ``e2e_ms`` (completed
    measured requests; TTFT of those that produced a token, TPOT of those with more than one
    output token)."""

    ttft_ms: tuple[float, ...]
    tpot_ms: tuple[float, ...]
    e2e_ms: tuple[float, ...]


def request_latencies(records: Iterable[RequestRecord]) -> RequestLatencies:
    """The per-request TTFT, TPOT and E2E (ms) of a run's records, by the definitions of
    :func:`compute_metrics`."""
    _, done, _ = _split(records)
    n = len(done)
    sent = _ints((r.sent_ns or 0 for r in done), n)
    done_ns = _ints((r.done_ns or 0 for r in done), n)
    first = _ints((_first_token_ns(r) for r in done), n)
    out_tok = _ints((r.output_tokens for r in done), n)
    has_token = first >= 0
    multi = has_token & (out_tok > 1)
    ttft = (first - sent)[has_token] / _NS_PER_MS
    tpot = (done_ns - first)[multi] / np.maximum(out_tok[multi] - 1, 1) / _NS_PER_MS
    e2e = (done_ns - sent) / _NS_PER_MS
    return RequestLatencies(
        ttft_ms=tuple(ttft.tolist()), tpot_ms=tuple(tpot.tolist()), e2e_ms=tuple(e2e.tolist())
    )
