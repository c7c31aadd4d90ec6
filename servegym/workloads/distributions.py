"""Sampling of :class:`~servegym.workloads.spec.LengthDistribution` values, vectorised."""

from __future__ import annotations

import math
from typing import Literal, overload

import numpy as np
import numpy.typing as npt

from servegym.workloads.spec import MAX_LENGTH, LengthDistribution

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _pareto(x_m: float, alpha: float, n: int, rng: np.random.Generator) -> FloatArray:
    """Classical Pareto(x_m, alpha): numpy's ``pareto`` is the Lomax (shifted by x_m)."""
    return x_m * (1.0 + rng.pareto(alpha, n))


def _body(dist: LengthDistribution, n: int, rng: np.random.Generator, integer: bool) -> FloatArray:
    kind = dist.dist
    if kind == "fixed":
        assert dist.value is not None
        return np.full(n, float(dist.value))
    if kind == "uniform":
        assert dist.low is not None and dist.high is not None
        if integer:
            # Inclusive integer range: every integer in [ceil(low), floor(high)] equally
            # likely (rounding a continuous uniform would halve the end points' weight).
            lo, hi = math.ceil(dist.low), math.floor(dist.high)
            if hi < lo:  # no integer inside, e.g. [2.2, 2.8]
                return np.full(n, float(round((dist.low + dist.high) / 2)))
            return rng.integers(lo, hi + 1, size=n).astype(np.float64)
        return rng.uniform(dist.low, dist.high, size=n)
    if kind == "normal":
        assert dist.mean is not None and dist.std is not None
        return rng.normal(dist.mean, dist.std, size=n)
    if kind == "lognormal":
        assert dist.median is not None and dist.sigma is not None
        return dist.median * np.exp(dist.sigma * rng.standard_normal(n))
    assert dist.scale is not None and dist.alpha is not None
    return _pareto(dist.scale, dist.alpha, n, rng)


@overload
def sample_lengths(
    dist: LengthDistribution, n: int, rng: np.random.Generator, *, integer: Literal[True] = ...
) -> IntArray: ...


@overload
def sample_lengths(
    dist: LengthDistribution, n: int, rng: np.random.Generator, *, integer: Literal[False]
) -> FloatArray: ...


@overload
def sample_lengths(
    dist: LengthDistribution, n: int, rng: np.random.Generator, *, integer: bool
) -> FloatArray | IntArray: ...


def sample_lengths(
    dist: LengthDistribution, n: int, rng: np.random.Generator, *, integer: bool = True
) -> FloatArray | IntArray:
    """Draw ``n`` values of ``dist``.

    The body is drawn first, then (when ``tail_fraction > 0``) each value is replaced with
    probability ``tail_fraction`` by a Pareto draw from ``tail_start`` with index
    ``tail_alpha``; then every value is clamped to ``[min, max]``. With ``integer`` the values
    are rounded half up to int64 and are at least 1 (token counts); without it they are
    float64 (think times in seconds) and only the clamps apply.

    The number of values drawn from ``rng`` depends on ``n`` only, never on the values, so
    the first ``k`` values of a draw of ``n`` equal a draw of ``k`` from the same state.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    values = _body(dist, n, rng, integer)
    if dist.tail_fraction > 0:
        assert dist.tail_start is not None and dist.tail_alpha is not None
        in_tail = rng.random(n) < dist.tail_fraction
        tail = _pareto(dist.tail_start, dist.tail_alpha, n, rng)
        values = np.where(in_tail, tail, values)
    if dist.min is not None or dist.max is not None:
        values = np.clip(values, dist.min, dist.max)
    values = np.minimum(values, MAX_LENGTH)  # a heavy tail may draw past any int64
    if not integer:
        return values.astype(np.float64, copy=False)
    counts: IntArray = np.maximum(np.floor(values + 0.5), 1).astype(np.int64)
    return counts


def scale_lengths(lengths: IntArray, scale: float) -> IntArray:
    """Multiply token lengths by ``scale``, rounding half up, each at least 1."""
    if scale == 1.0:
        return lengths
    scaled: IntArray = np.clip(np.floor(lengths * scale + 0.5), 1, MAX_LENGTH).astype(np.int64)
    return scaled


def scale_length(length: int, scale: float) -> int:
    """:func:`scale_lengths` for one length that may be 0 (0 stays 0: "none")."""
    if length == 0:
        return 0
    return min(MAX_LENGTH, max(1, math.floor(length * scale + 0.5)))


def sample_token_lengths(
    dist: LengthDistribution, n: int, rng: np.random.Generator, scale: float = 1.0
) -> IntArray:
    """Integer token lengths: :func:`sample_lengths`, then ``scale`` applied."""
    return scale_lengths(sample_lengths(dist, n, rng, integer=True), scale)
