"""Whether a steady run kept up with its arrivals (a pure function of its records).

A rate objective credits a rate only when the SLA holds in steady state. A queue can hide
in a window: a server that admits every request into its running batch keeps TTFT low while
the batch, and with it TPOT, grows by the excess arrivals; the SLA breaks only later. So
besides the SLA attainment of its window, a probe of the rate search must show that its
backlog did not grow: :func:`backlog_growth` compares the mean number of requests in the
system (arrived, not yet finished) over the window's second half with its first half, per
arrival of the second half. A server that keeps up has a stationary backlog (growth about
0); one that serves a fraction ``f`` of its arrivals grows by about ``1 - f``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from servegym.loadgen.records import RequestRecord

SAMPLE_POINTS = 256
"""Points of each half-window at which the backlog is sampled for its mean."""


def backlog_growth(records: Sequence[RequestRecord], start_ns: int) -> tuple[float, float]:
    """The backlog's growth over the window from ``start_ns`` to the last scheduled send:
    (mean backlog of the second half - that of the first half) / arrivals in the second
    half, and the noise allowance of that figure (two standard deviations of a Poisson
    backlog of the first half's size, in the same unit). Every record counts (warm-up ones
    too: the backlog at the window's start is what they left); a request leaves the
    backlog when it completes or fails. ``(0.0, 0.0)`` when the window is empty."""
    arrivals = np.sort(np.array([r.scheduled_ns for r in records], dtype=np.int64))
    if len(arrivals) == 0:
        return 0.0, 0.0
    end_ns = int(arrivals[-1])
    if end_ns <= start_ns:
        return 0.0, 0.0
    leaves = np.sort(
        np.array(
            [
                e
                for r in records
                if (e := r.done_ns if r.error is None and r.done_ns is not None else r.end_ns)
                is not None
            ],
            dtype=np.int64,
        )
    )
    mid_ns = (start_ns + end_ns) // 2

    def mean_backlog(a: int, b: int) -> float:
        t = np.linspace(a, b, SAMPLE_POINTS)
        arrived = np.searchsorted(arrivals, t, side="right")
        left = np.searchsorted(leaves, t, side="right")
        return float(np.mean(arrived - left))

    first, second = mean_backlog(start_ns, mid_ns), mean_backlog(mid_ns, end_ns)
    n = int(np.searchsorted(arrivals, end_ns, side="right") - np.searchsorted(arrivals, mid_ns))
    if n == 0:
        return 0.0, 0.0
    return (second - first) / n, math.sqrt(max(first, 1.0)) / n


def served_rate(records: Sequence[RequestRecord]) -> float:
    """Requests completed per second over the second half of a steady run's arrival span
    (from the middle arrival to the last). The first half lets the system fill: a
    continuous-batching server's batch, and with it each request's time in the system, grows
    for tens of seconds before it levels off, so counting from early on undercounts a
    server that keeps up. 0.0 when the span is empty."""
    arrivals = sorted(r.scheduled_ns for r in records)
    if len(arrivals) < 2:
        return 0.0
    start, end = arrivals[len(arrivals) // 2], arrivals[-1]
    if end <= start:
        return 0.0
    done = sum(1 for r in records if r.ok and r.done_ns is not None and start <= r.done_ns <= end)
    return done / ((end - start) / 1e9)
