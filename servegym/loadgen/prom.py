"""Scraping a server's Prometheus ``/metrics`` and taking before/after deltas.

Only cumulative samples are kept: counters (``*_total``, or a counter's bare name) and the
``_sum`` and ``_count`` of histograms and summaries. Their after-minus-before difference is
what the server did during a run (tokens processed, requests finished, summed latencies).
Gauges and buckets are left out. A sample's key is its name with its labels, sorted, as
Prometheus writes them: ``vllm:prompt_tokens_total{model_name="m"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

_CUMULATIVE_SUFFIXES = {
    "counter": ("_total", ""),
    "histogram": ("_sum", "_count"),
    "gaugehistogram": ("_gsum", "_gcount"),
    "summary": ("_sum", "_count"),
}


def sample_key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))
    return f"{name}{{{inner}}}"


def parse_cumulative(text: str) -> dict[str, float]:
    """The cumulative samples (see the module docstring) of a Prometheus text exposition.

    Raises ``ValueError`` when the text is not valid Prometheus text.
    """
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        suffixes = _CUMULATIVE_SUFFIXES.get(family.type)
        if suffixes is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            if any(sample.name.endswith(s) for s in suffixes):
                out[sample_key(sample.name, sample.labels)] = float(sample.value)
    return out


def parse_gauges(text: str, contains: tuple[str, ...] = ()) -> dict[str, float]:
    """The gauge samples of a Prometheus text exposition whose name contains one of
    ``contains`` (all gauges when empty)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "gauge":
            continue
        if contains and not any(c in family.name for c in contains):
            continue
        for sample in family.samples:
            out[sample_key(sample.name, sample.labels)] = float(sample.value)
    return out


SAMPLED_GAUGES = ("kv_cache_usage", "num_requests_running", "num_requests_waiting")
"""Gauges worth their peak over a run: KV-cache use and the running and waiting queues, as
vLLM names them; the default for a server of no known engine. A known engine's own names
(:meth:`~servegym.engines.base.EngineMetrics.gauges`) are passed in by whoever started it."""


class GaugeSampler:
    """Samples a few gauges of ``/metrics`` every ``interval_s`` during a run and keeps each
    one's maximum. One small GET a second: far from the send path's precision budget.
    ``gauges``: the gauges kept, by (part of) their names."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        interval_s: float = 1.0,
        gauges: Sequence[str] = SAMPLED_GAUGES,
    ) -> None:
        self.session = session
        self.gauges = tuple(gauges)
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval_s = interval_s
        self.peaks: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def _sample_once(self) -> bool:
        try:
            async with asyncio.timeout(5.0), self.session.get(self.url) as resp:
                if resp.status != 200:
                    return False
                text = await resp.text(errors="replace")
            # Keep the few wanted lines before parsing: the full exposition is large, and
            # this runs on the loop that timestamps tokens.
            wanted = "\n".join(
                line for line in text.splitlines() if any(g in line for g in self.gauges)
            )
            gauges = parse_gauges(wanted + "\n", self.gauges)
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError):
            return False
        for k, v in gauges.items():
            self.peaks[k] = max(v, self.peaks.get(k, v))
        return True

    async def _loop(self) -> None:
        if not await self._sample_once():
            return  # no /metrics here: stop asking
        while True:
            await asyncio.sleep(self.interval_s)
            await self._sample_once()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> dict[str, float]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return dict(sorted(self.peaks.items()))


def delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """``after - before`` for every sample in ``after`` (a new sample counts from 0).

    Empty when either scrape is missing.
    """
    if before is None or after is None:
        return {}
    return {k: v - before.get(k, 0.0) for k, v in sorted(after.items())}


async def scrape(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float = 5.0
) -> dict[str, float] | None:
    """Fetch and parse ``<base_url>/metrics``; ``None`` when absent or unreadable."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        async with asyncio.timeout(timeout_s), session.get(url) as resp:
            if resp.status != 200:
                return None
            text = await resp.text(errors="replace")
        return parse_cumulative(text)
    except (aiohttp.ClientError, TimeoutError, ValueError, OSError):
        return None
