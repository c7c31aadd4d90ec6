"""The ``http`` target: any OpenAI-compatible streaming server.

A run: check the server answers, run the warm-up phase, scrape ``/metrics``, run the
measured phase under the self-check (loop-lag probe, CPU), scrape again, then build the
records and the :class:`~servegym.loadgen.records.RunResult`. Garbage collection is paused
for all of it (see :func:`~servegym.loadgen.selfcheck.gc_paused`).

The streamed requests go over :class:`~servegym.loadgen.http1.HttpPool`; the few untimed
ones (reachability, ``/metrics``) over an aiohttp session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from time import perf_counter_ns
from typing import Any

import aiohttp

from servegym.errors import UserError
from servegym.loadgen import prom
from servegym.loadgen.http1 import HttpPool
from servegym.loadgen.records import RunResult
from servegym.loadgen.runner import Run, measured_duration_s
from servegym.loadgen.selfcheck import SelfCheck, gc_paused
from servegym.loadgen.target import ProgressFn, RunOptions, register_target
from servegym.workloads.model import Workload

KEEPALIVE_TIMEOUT_S = 4.0
"""Idle connections are dropped before this: below uvicorn's 5 s keep-alive, so a pooled
connection is almost never one the server is closing."""


@register_target("http")
class HttpTarget:
    """Drives a workload against the server at ``base_url`` (``http://host:port``, with or
    without a trailing ``/v1``).

    ``api_key`` is sent as ``Authorization: Bearer``; ``headers`` are added to every request
    and ``extra_body`` merged into every request body (server-specific sampling fields, or
    the mock server's per-request options in tests).
    """

    name = "http"

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        on_failure: Callable[[int | None], Awaitable[str | None]] | None = None,
        gauges: Sequence[str] = prom.SAMPLED_GAUGES,
    ) -> None:
        self.gauges = tuple(gauges)
        base_url = base_url.rstrip("/")
        self.base_url = base_url[:-3] if base_url.endswith("/v1") else base_url
        self.headers = dict(headers or {})
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.extra_body = dict(extra_body) if extra_body else None
        self.on_failure = on_failure
        """Asked after each failed request with its HTTP status (``None``: no HTTP answer);
        a reason it returns aborts the run (a dead server: without it a closed loop would
        fire its whole workload at a closed port)."""
        self._current: Run | None = None
        self._abort_reason: str | None = None

    def abort(self, reason: str) -> None:
        """Stop sending new requests in the run going on (or the next one to start); the
        run then returns with what it recorded and ``stopped_early`` saying why."""
        self._abort_reason = reason
        if self._current is not None:
            self._current.abort(reason)

    async def run(
        self, workload: Workload, options: RunOptions, progress: ProgressFn | None = None
    ) -> RunResult:
        """Run ``workload``; raises :class:`UserError` when the server cannot be reached
        before the run starts. Failed requests are recorded in their records, never raised.
        """
        try:
            pool = HttpPool(self.base_url, self.headers, keepalive_s=KEEPALIVE_TIMEOUT_S)
        except ValueError as e:
            raise UserError(f"bad base URL: {e}") from None
        async with make_http_session(self.headers) as http:
            await check_reachable(http, self.base_url)
            with gc_paused():
                try:
                    return await self._run(http, pool, workload, options, progress)
                finally:
                    await pool.close()

    async def _run(
        self,
        http: aiohttp.ClientSession,
        pool: HttpPool,
        workload: Workload,
        options: RunOptions,
        progress: ProgressFn | None,
    ) -> RunResult:
        run = Run(pool, workload, options, progress, self.extra_body)
        self._current = run
        run.on_failure = self.on_failure
        if self._abort_reason is not None:
            run.abort(self._abort_reason)
        warm = workload.sessions[: workload.warmup_sessions]
        measured = workload.sessions[workload.warmup_sessions :]
        started_at = datetime.now(UTC).isoformat(timespec="milliseconds")
        run.origin_ns = perf_counter_ns()
        check = SelfCheck()
        scrape = options.scrape_metrics
        try:
            if warm:
                await run.phase(warm, warmup=True)
            before = await prom.scrape(http, self.base_url) if scrape else None
            sampler = prom.GaugeSampler(http, self.base_url, gauges=self.gauges) if scrape else None
            if sampler is not None:
                sampler.start()
            check.start()
            try:
                await run.phase(measured, warmup=False)
            finally:
                check.stop()
                peaks = await sampler.stop() if sampler is not None else {}
            after = await prom.scrape(http, self.base_url) if scrape else None
        finally:
            await run.scheduler.close()
        run.final_progress()
        records = run.records()
        meas = [r for r in records if not r.warmup]
        return RunResult(
            target=self.base_url,
            model=options.model,
            workload=workload.spec.name,
            workload_hash=workload.content_hash(),
            seed=workload.seed,
            started_at=started_at,
            clock_origin_ns=run.origin_ns,
            duration_s=measured_duration_s(meas),
            records=records,
            loadgen=check.stats(meas, options.max_send_lag_ms),
            server_metrics_delta=prom.delta(before, after),
            server_gauges_max=peaks,
            stopped_early=run.stopped_early(measured, len(meas)),
        )


def make_http_session(headers: Mapping[str, str] | None = None) -> aiohttp.ClientSession:
    """An aiohttp session for a run's untimed requests (reachability, ``/metrics``)."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_TIMEOUT_S)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),
        headers=dict(headers or {}),
    )


async def check_reachable(
    http: aiohttp.ClientSession, base_url: str, timeout_s: float = 10.0
) -> None:
    """Raise :class:`UserError` unless ``base_url`` answers HTTP (``/v1/models``, ``/health``).

    Any answer but a server error or a refused API key will do: the requests themselves
    say what else is wrong.
    """
    reasons: list[str] = []
    for path in ("/v1/models", "/health"):
        try:
            async with asyncio.timeout(timeout_s), http.get(base_url + path) as resp:
                await resp.read()
                status = resp.status
        except TimeoutError:
            raise UserError(f"cannot reach {base_url}: no answer within {timeout_s:g} s") from None
        except aiohttp.ClientConnectorError as e:
            why = e.os_error.strerror if e.os_error and e.os_error.strerror else str(e)
            raise UserError(f"cannot reach {base_url}: {why}") from None
        except (aiohttp.ClientError, OSError) as e:
            raise UserError(f"cannot reach {base_url}: {type(e).__name__}: {e}") from None
        if status in (401, 403):
            raise UserError(f"{base_url} refused the request (HTTP {status}): check the API key")
        if status < 400:
            return
        reasons.append(f"GET {path} answered HTTP {status}")
    if any("HTTP 5" in r for r in reasons):
        raise UserError(f"cannot reach {base_url}: {'; '.join(reasons)}")
