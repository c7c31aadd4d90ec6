"""What the server says it did during a run, from its ``/metrics`` deltas, and a cross-check
of its time-to-first-token against the harness's own.

The harness never scores on these figures (it measures at the client); they explain a
result (prefix-cache hits, preemptions, queueing, KV-cache pressure) and check it: a client
that sees first tokens sooner than the server produced them is being sent something that
is not the model's output (a whitespace chunk sent ahead, say).

Which samples hold which figure is each engine's to say
(:attr:`~servegym.engines.base.Engine.metrics`): the engine whose prefix the delta's names
carry is the one read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pydantic import BaseModel, Field

from servegym.engines.base import EngineMetrics, engine_metric_names

TTFT_SLACK = 0.9
TTFT_SLACK_MS = 5.0
"""The client's mean TTFT may be below the server's by 10% + 5 ms (clock and histogram
noise) before the two are called inconsistent."""


class TtftCheck(BaseModel):
    client_mean_ms: float
    server_mean_ms: float
    client_count: int
    server_count: int
    consistent: bool
    note: str = ""


class ServerFigures(BaseModel):
    """A run's server-side figures (``None``: the server does not report it)."""

    engine: str = Field(description="the metric prefix found: vllm or sglang")
    requests: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_hit_rate: float | None = None
    preemptions: float | None = None
    queue_time_mean_ms: float | None = None
    ttft_mean_ms: float | None = None
    kv_cache_usage_peak: float | None = Field(default=None, description="0-1, sampled peak")
    running_peak: float | None = None
    waiting_peak: float | None = None
    ttft_check: TtftCheck | None = None


def _total(values: Mapping[str, float], name: str) -> float | None:
    """Sum over every label set of the sample ``name``."""
    found = [v for k, v in values.items() if k == name or k.startswith(name + "{")]
    return sum(found) if found else None


def _peak(values: Mapping[str, float], name: str) -> float | None:
    found = [v for k, v in values.items() if k == name or k.startswith(name + "{")]
    return max(found) if found else None


def _mean_ms(delta: Mapping[str, float], base: str) -> tuple[float | None, int]:
    total = _total(delta, base + "_sum")
    count = _total(delta, base + "_count")
    if total is None or not count:
        return None, int(count or 0)
    return total / count * 1000.0, int(count)


def _named(
    read: Callable[[Mapping[str, float], str], float | None],
    values: Mapping[str, float],
    name: str | None,
) -> float | None:
    return None if name is None else read(values, name)


def _engine_names(delta: Mapping[str, float]) -> EngineMetrics | None:
    """The metric names of the engine whose prefix the delta's samples carry."""
    if not delta:
        return None
    return next(
        (m for m in engine_metric_names() if any(k.startswith(m.prefix) for k in delta)), None
    )


def server_figures(
    delta: Mapping[str, float],
    gauges_max: Mapping[str, float],
    client_ttft_mean_ms: float | None,
    client_count: int,
    names: EngineMetrics | None = None,
) -> ServerFigures | None:
    """The figures in a run's ``/metrics`` delta, read by ``names`` (default: those of the
    engine whose prefix the delta carries); ``None`` when it has no engine metrics."""
    m = names if names is not None else _engine_names(delta)
    if m is None or not any(k.startswith(m.prefix) for k in delta):
        return None
    queries = _named(_total, delta, m.prefix_cache_queries)
    hits = _named(_total, delta, m.prefix_cache_hits)
    queue_ms, _ = _mean_ms(delta, m.queue_time) if m.queue_time else (None, 0)
    ttft_ms, ttft_count = _mean_ms(delta, m.ttft) if m.ttft else (None, 0)
    check = None
    if ttft_ms is not None and client_ttft_mean_ms is not None and client_count:
        floor = ttft_ms * TTFT_SLACK - TTFT_SLACK_MS
        consistent = client_ttft_mean_ms >= floor
        notes = []
        if not consistent:
            notes.append(
                f"clients saw first tokens {ttft_ms - client_ttft_mean_ms:.1f} ms sooner on "
                "average than the server produced them"
            )
        if ttft_count != client_count:
            notes.append(f"server counted {ttft_count} first tokens, clients {client_count}")
        check = TtftCheck(
            client_mean_ms=client_ttft_mean_ms,
            server_mean_ms=ttft_ms,
            client_count=client_count,
            server_count=ttft_count,
            consistent=consistent,
            note="; ".join(notes),
        )
    return ServerFigures(
        engine=m.prefix.rstrip(":"),
        requests=_named(_total, delta, m.requests),
        prompt_tokens=_named(_total, delta, m.prompt_tokens),
        generation_tokens=_named(_total, delta, m.generation_tokens),
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=hits / queries if hits is not None and queries else None,
        preemptions=_named(_total, delta, m.preemptions),
        queue_time_mean_ms=queue_ms,
        ttft_mean_ms=ttft_ms,
        kv_cache_usage_peak=_named(_peak, gauges_max, m.kv_cache_usage),
        running_peak=_named(_peak, gauges_max, m.running),
        waiting_peak=_named(_peak, gauges_max, m.waiting),
        ttft_check=check,
    )
