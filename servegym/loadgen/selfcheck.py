"""The load generator measuring itself: send lag, event-loop lag, CPU, and no GC pauses."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator, Sequence
from time import perf_counter_ns
from typing import Any

import numpy as np

from servegym.loadgen.records import LoadgenStats, RequestRecord

LOOP_PROBE_INTERVAL_S = 0.005


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic garbage collection inside the block (a run).

    A full collection walks every tracked object (the workload, the results so far) and was
    measured stopping the loop for 50 ms at 4,000 requests, far past any send-lag budget. A
    run makes almost no cyclic garbage (about 0.1 object per request, measured), so
    collection waits for the end of the run.
    """
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class SelfCheck:
    """Measures, between ``start`` and ``stop``, the event-loop lag and the CPU fraction.

    The loop-lag probe sleeps ``LOOP_PROBE_INTERVAL_S`` again and again and records how
    late it wakes. On uvloop, timers are whole milliseconds, so up to about 1 ms of that is
    timer granularity, not a stall.
    """

    def __init__(self) -> None:
        self.loop_lags_ns: list[int] = []
        self.cpu_fraction = 0.0
        self._task: asyncio.Task[None] | None = None
        self._cpu0 = self._wall0 = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._probe())
        self._cpu0, self._wall0 = time.process_time_ns(), perf_counter_ns()

    def stop(self) -> None:
        wall = perf_counter_ns() - self._wall0
        self.cpu_fraction = (time.process_time_ns() - self._cpu0) / wall if wall > 0 else 0.0
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _probe(self) -> None:
        interval_ns = round(LOOP_PROBE_INTERVAL_S * 1e9)
        out = self.loop_lags_ns
        while True:
            target = perf_counter_ns() + interval_ns
            await asyncio.sleep(LOOP_PROBE_INTERVAL_S)
            out.append(perf_counter_ns() - target)

    def stats(self, measured: Sequence[RequestRecord], max_send_lag_ms: float) -> LoadgenStats:
        """The run's :class:`LoadgenStats`.

        Send lag is judged on paced requests only. Requests that share their scheduled instant
        with another (an offline burst, the opening of a closed loop) cannot all leave at that
        instant: their lag measures how fast a burst is sent, reported as ``burst_*``, and
        does not make a run client-bound. ``client_bound`` is p99 paced send lag over
        ``max_send_lag_ms``.
        """
        pairs = [(r.scheduled_ns, r.sent_ns) for r in measured if r.sent_ns is not None]
        sched = np.array([p[0] for p in pairs], dtype=np.int64)
        sent_ns = np.array([p[1] for p in pairs], dtype=np.int64)
        lags = np.maximum((sent_ns - sched).astype(np.float64), 0.0)
        _, inverse, counts = np.unique(sched, return_inverse=True, return_counts=True)
        in_burst = counts[inverse] > 1 if len(sched) else np.zeros(0, dtype=bool)
        lags_ms = lags[~in_burst] / 1e6
        burst_ms = lags[in_burst] / 1e6
        loop_ms = np.asarray(self.loop_lags_ns, dtype=np.float64) / 1e6
        p99 = percentile(lags_ms, 99)
        bound = p99 > max_send_lag_ms
        reason = None
        if bound:
            reason = (
                f"p99 send lag {p99:.2f} ms > {max_send_lag_ms:g} ms: the load generator "
                f"could not keep the schedule (CPU {self.cpu_fraction:.0%}, "
                f"event-loop lag p99 {percentile(loop_ms, 99):.2f} ms)"
            )
        return LoadgenStats(
            send_lag_ms_mean=float(lags_ms.mean()) if len(lags_ms) else 0.0,
            send_lag_ms_p50=percentile(lags_ms, 50),
            send_lag_ms_p99=p99,
            send_lag_ms_max=float(lags_ms.max()) if len(lags_ms) else 0.0,
            loop_lag_ms_p99=percentile(loop_ms, 99),
            loop_lag_ms_max=float(loop_ms.max()) if len(loop_ms) else 0.0,
            loop_probe_interval_ms=LOOP_PROBE_INTERVAL_S * 1000,
            cpu_fraction=self.cpu_fraction,
            max_send_lag_ms=max_send_lag_ms,
            client_bound=bound,
            reason=reason,
            burst_requests=int(in_burst.sum()),
            burst_send_ms_max=float(burst_ms.max()) if len(burst_ms) else 0.0,
        )


def percentile(values: Sequence[float] | np.ndarray[Any, Any], q: float) -> float:
    if len(values) == 0:
        return 0.0
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))
