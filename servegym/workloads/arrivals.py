"""Open-loop arrival schedules: send offsets in seconds from the start of a run.

Every open-loop schedule starts with its first request at ``t = 0`` and draws ``n - 1``
gaps after it (as ``vllm bench serve`` does: it sends, then sleeps a gap). So a run's
duration is not padded by an initial random wait, and ``constant`` at rate ``r`` sends at
exactly ``0, 1/r, 2/r, ...``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from servegym.workloads.spec import ArrivalSpec

FloatArray = npt.NDArray[np.float64]


def _from_gaps(gaps: FloatArray) -> FloatArray:
    offsets = np.zeros(len(gaps) + 1, dtype=np.float64)
    np.cumsum(gaps, out=offsets[1:])
    return offsets


def arrival_offsets(spec: ArrivalSpec, n: int, rng: np.random.Generator) -> FloatArray | None:
    """Send offsets (seconds, non-decreasing, the first 0) of ``n`` requests or sessions.

    - ``offline``: all 0.
    - ``poisson``: exponential gaps of mean ``1/rate``.
    - ``constant``: gaps of exactly ``1/rate``.
    - ``gamma``: gamma gaps with shape ``burstiness`` and scale ``1/(rate*burstiness)`` (mean
      ``1/rate``; coefficient of variation ``1/sqrt(burstiness)``), as ``vllm bench serve``.
    - ``concurrency``, ``single_stream``: ``None``; a closed loop sends when a slot frees,
      which the load generator decides.
    - ``trace``: not handled here (the trace's timestamps give the offsets); raises.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    kind = spec.kind
    if spec.closed_loop:
        return None
    if kind == "offline":
        return np.zeros(n, dtype=np.float64)
    if kind == "trace":
        raise ValueError("trace arrivals come from the trace file (servegym.workloads.trace)")
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    assert spec.rate is not None
    gaps_n = n - 1
    if kind == "constant":
        return np.arange(n, dtype=np.float64) / spec.rate
    if kind == "poisson":
        return _from_gaps(rng.exponential(1.0 / spec.rate, size=gaps_n))
    if kind == "gamma":
        shape = spec.burstiness
        return _from_gaps(rng.gamma(shape, 1.0 / (spec.rate * shape), size=gaps_n))
    raise AssertionError(f"unhandled arrival kind {kind!r}")
