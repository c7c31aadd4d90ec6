"""A task's objective as measured, and comparing two measurements (pure functions).

An :class:`ObjectiveMeasurement` is the objective's value in its own unit, the metrics of the
run the value came from, and what it cost (virtual seconds, runs) and saw (integrity counts);
a track takes it (the simulator's: :mod:`servegym.tracks.sim_measure`; a real server's:
:mod:`servegym.tracks.real_measure`).
:func:`improvement` turns a baseline and a submission value into one ratio, always "higher is
better": ``submission / baseline`` for throughput-like objectives, ``baseline / submission``
for latency and cost.

What each objective measures (``ObjectiveSpec.kind``):

- ``output_throughput``: output tokens/s of the workload as specified (higher is better).
- ``ttft`` / ``tpot`` / ``itl`` / ``e2e``: that latency's ``statistic`` (mean, p50 ... p99),
  ms (lower is better).
- ``turn_latency``: the agentic turn latency (a turn's E2E) at ``statistic``, ms; on a
  single-turn workload every request is one turn, so it is E2E.
- ``goodput``: requests/s meeting every SLO of the task's SLA, at the workload's own arrival.
- ``max_rate_at_sla``: the highest Poisson arrival rate (requests, or sessions for an
  agentic workload, per second) in ``[rate_min, rate_max]`` whose SLA attainment is at
  least ``attainment_target`` (:func:`search_max_rate`: geometric bracketing by factors of
  2 from a starting rate, then geometric bisection until the bracket is narrower than
  ``rate_tolerance``; the answer is the bracket's lower, passing end).
- ``cost_at_sla``: dollars per million output tokens when serving at that rate:
  ``price_per_hour x GPUs / 3600 / (output tokens/s at the rate) x 1e6`` (lower is better).
- ``composite``: each component is measured (components that only read the plain run share
  one run); its improvement is the geometric mean of the components' improvements.

**Infeasible and failed measurements.** A measurement is *infeasible* when its value cannot
be had: a latency objective with no completed request, a rate search where even
``rate_min`` misses the SLA (value ``0`` req/s), a cost whose rate search found no rate
(value ``None``). A throughput or goodput of ``0`` is a real value. :func:`ratio` then
reads a missing, zero or non-finite value as "no result": a submission without one gets
:data:`RATIO_FLOOR`, a baseline without one (a broken task) lets any real submission value
score :data:`RATIO_CAP`, both without one score ``1.0``. Every ratio is clamped to
``[RATIO_FLOOR, RATIO_CAP]``, so one pathological pair cannot dominate a geometric mean.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from servegym.loadgen.records import RequestRecord
from servegym.scoring.metrics import Metrics, Percentiles, RequestLatencies

if TYPE_CHECKING:
    from servegym.pipeline.result import PipelineResult
    from servegym.tasks.spec import ObjectiveSpec, Statistic

RATIO_FLOOR = 0.01
"""The improvement of a submission with no result (and the lowest any ratio goes)."""
RATIO_CAP = 100.0
"""The highest any improvement ratio goes."""
RATE_BRACKET_FACTOR = 2.0
"""Each bracketing step of the rate search multiplies or divides the rate by this."""
MAX_RATE_PROBES = 60
"""A safety stop for the rate search (a normal search takes well under 20 probes)."""

UNITS: dict[str, str] = {
    "output_throughput": "tok/s",
    "ttft": "ms",
    "tpot": "ms",
    "itl": "ms",
    "e2e": "ms",
    "turn_latency": "ms",
    "goodput": "req/s",
    "max_rate_at_sla": "req/s",
    "cost_at_sla": "$/Mtok",
    "composite": "x",
    "pipeline_rate": "tasks/s",
    "pipeline_latency": "s",
}

PLAIN_KINDS = frozenset(
    {"output_throughput", "ttft", "tpot", "itl", "e2e", "turn_latency", "goodput"}
)
RATE_KIND_SET = frozenset({"max_rate_at_sla", "cost_at_sla"})


class IntegrityCounts(BaseModel):
    """What the harness saw of every measured request across a measurement's runs."""

    model_config = ConfigDict(extra="forbid")

    requests: int = Field(default=0, description="measured requests sent")
    failed: int = Field(default=0, description="of those, not completed")
    length_mismatches: int = Field(
        default=0,
        description="completed requests whose harness-counted output length differs from the "
        "forced length",
    )
    unit: Literal["requests", "questions"] = Field(
        default="requests",
        description="what was counted: LLM requests with a forced output length, or (a "
        "cpu-track pipeline) questions answered end to end, whose lengths are not forced",
    )

    def add(self, other: IntegrityCounts) -> IntegrityCounts:
        return IntegrityCounts(
            requests=self.requests + other.requests,
            failed=self.failed + other.failed,
            length_mismatches=self.length_mismatches + other.length_mismatches,
            unit=other.unit if self.requests == 0 else self.unit,
        )

    @property
    def clean(self) -> bool:
        return self.failed == 0 and self.length_mismatches == 0


class RateProbe(BaseModel):
    """One arrival rate the rate search tried."""

    model_config = ConfigDict(extra="forbid")

    rate: float
    attainment: float
    passed: bool
    kept_up: bool | None = Field(
        default=None,
        description="the run's backlog did not grow (None: not checked); a rate passes "
        "only when its attainment meets the target and it kept up",
    )


class ObjectiveMeasurement(BaseModel):
    """One measurement of a task's objective.

    ``value`` is in ``unit`` (``None``: infeasible, or a composite, whose value lives in its
    ``components``). ``metrics`` are the run the value came from (for a rate search, the
    run at the rate found, or at ``rate_min`` when none passed). ``sim_seconds`` is the
    virtual time of every simulation the measurement ran (warm-up included).
    """

    model_config = ConfigDict(extra="forbid")

    objective: str
    kind: str
    unit: str
    higher_is_better: bool
    value: float | None
    feasible: bool
    rate: float | None = Field(default=None, description="arrival rate of the metrics' run")
    rate_probes: list[RateProbe] = Field(default_factory=list)
    search_truncated: bool = Field(
        default=False, description="the rate search stopped early (simulation-time cap)"
    )
    components: list[ObjectiveMeasurement] = Field(default_factory=list)
    metrics: Metrics | None = None
    runs: int = 0
    sim_seconds: float = 0.0
    integrity: IntegrityCounts = Field(default_factory=IntegrityCounts)
    _latencies: RequestLatencies | None = PrivateAttr(default=None)
    _pipeline: PipelineResult | None = PrivateAttr(default=None)

    @property
    def pipeline(self) -> PipelineResult | None:
        """A pipeline task's run: per-question records and stage times (kept in memory for
        the trial's ``pipeline.json``, never serialised here; None for other tasks)."""
        return self._pipeline

    def with_pipeline(self, result: PipelineResult | None) -> ObjectiveMeasurement:
        """This measurement, holding ``result`` (returns ``self``)."""
        self._pipeline = result
        return self

    @property
    def latencies(self) -> RequestLatencies | None:
        """Per-request latencies of the run ``metrics`` came from (kept in memory for the
        final evaluation's ``latencies.json``, never serialised; None when not known)."""
        return self._latencies

    def with_latencies(self, latencies: RequestLatencies | None) -> ObjectiveMeasurement:
        """This measurement, holding ``latencies`` (returns ``self``)."""
        self._latencies = latencies
        return self

    def ratio_value(self) -> float | list[float | None] | None:
        """What :func:`improvement` compares: the value, or the components' values."""
        if self.kind == "composite":
            return [c.value for c in self.components]
        return self.value


# --------------------------------------------------------------------------- ratios


def _usable(v: float | None) -> bool:
    return v is not None and math.isfinite(v) and v > 0


def ratio(higher_is_better: bool, baseline: float | None, submission: float | None) -> float:
    """Improvement of ``submission`` over ``baseline`` (> 1: better), clamped.

    See the module docstring for values that are missing, zero or not finite.
    """
    b_ok, s_ok = _usable(baseline), _usable(submission)
    if not b_ok and not s_ok:
        return 1.0
    if not s_ok:
        return RATIO_FLOOR
    if not b_ok:
        return RATIO_CAP
    assert baseline is not None and submission is not None
    r = submission / baseline if higher_is_better else baseline / submission
    return min(max(r, RATIO_FLOOR), RATIO_CAP)


def geometric_mean(values: Sequence[float]) -> float:
    """Geometric mean of positive values (1.0 for none)."""
    if not values:
        return 1.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def improvement(
    objective: ObjectiveSpec,
    baseline_value: float | Sequence[float | None] | None,
    submission_value: float | Sequence[float | None] | None,
) -> float:
    """The improvement ratio of a submission over the baseline (> 1: better).

    Plain objectives take one value each (``None``: infeasible); a composite takes one
    value per component, in order, and scores the geometric mean of their ratios.
    """
    if objective.kind == "composite":
        if not isinstance(baseline_value, Sequence) or not isinstance(submission_value, Sequence):
            raise TypeError("a composite objective compares one value per component")
        if not (len(baseline_value) == len(submission_value) == len(objective.components)):
            raise ValueError("a composite objective needs one value per component")
        return geometric_mean(
            [
                improvement(c, b, s)
                for c, b, s in zip(
                    objective.components, baseline_value, submission_value, strict=True
                )
            ]
        )
    if isinstance(baseline_value, Sequence) or isinstance(submission_value, Sequence):
        raise TypeError(f"objective '{objective.kind}' compares single values")
    return ratio(objective.higher_is_better, baseline_value, submission_value)


def measurement_improvement(
    objective: ObjectiveSpec, baseline: ObjectiveMeasurement, submission: ObjectiveMeasurement
) -> float:
    """:func:`improvement` of two measurements (composites of composites included)."""
    if objective.kind == "composite":
        return geometric_mean(
            [
                measurement_improvement(c, b, s)
                for c, b, s in zip(
                    objective.components, baseline.components, submission.components, strict=True
                )
            ]
        )
    return ratio(objective.higher_is_better, baseline.value, submission.value)


# --------------------------------------------------------------------------- rate search


@dataclass(frozen=True, slots=True)
class RateSearch:
    """The result of :func:`search_max_rate`: the rate found (``None``: even the lowest
    rate failed) and every probe, in the order tried."""

    rate: float | None
    probes: list[RateProbe]
    truncated: bool = False
    """True when ``should_stop`` ended the search before it converged."""


def search_max_rate(
    attainment_at: Callable[[float], float],
    *,
    rate_min: float,
    rate_max: float,
    target: float,
    tolerance: float,
    start: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    bracket_factor: float = RATE_BRACKET_FACTOR,
    kept_up: Callable[[float], bool] | None = None,
) -> RateSearch:
    """The highest rate in ``[rate_min, rate_max]`` whose attainment is >= ``target``.

    Starts at ``start`` (default: the geometric middle of the range), brackets by factors
    of ``bracket_factor`` (default :data:`RATE_BRACKET_FACTOR`; a small factor when
    ``start`` is known to be close, e.g. the same side's rate on another sample) up (while
    passing) or down (while failing), then
    bisects geometrically until ``hi / lo <= 1 + tolerance`` and returns ``lo``. Exact for
    a monotone attainment; with noise it returns a passing rate next to a failing one.
    ``rate_max`` passing returns ``rate_max``; ``rate_min`` failing returns ``None``.

    ``kept_up``, when given, is asked right after ``attainment_at`` for the same rate: a
    rate passes only when it also says yes (the run served its arrivals in steady state).

    ``should_stop`` is asked before every probe after the first; when it says yes the search
    ends at once with the bracket's lower end so far (the highest passing rate below every
    failing one; ``None`` when none passed) and ``truncated`` set (the environment stops
    a search when the budget runs out).
    """
    if not 0 < rate_min < rate_max:
        raise ValueError("need 0 < rate_min < rate_max")
    if bracket_factor <= 1.0:
        raise ValueError("need bracket_factor > 1")
    probes: list[RateProbe] = []
    seen: dict[float, bool] = {}

    class _Stop(Exception):
        pass

    def passes(rate: float) -> bool:
        if rate not in seen:
            if probes and should_stop is not None and should_stop():
                raise _Stop
            if len(probes) >= MAX_RATE_PROBES:
                raise RuntimeError("rate search did not converge")
            a = attainment_at(rate)
            up = kept_up(rate) if kept_up is not None else None
            ok = a >= target and up is not False
            probes.append(RateProbe(rate=rate, attainment=a, passed=ok, kept_up=up))
            seen[rate] = ok
        return seen[rate]

    try:
        return _search(passes, rate_min, rate_max, tolerance, start, probes, bracket_factor)
    except _Stop:
        # The bracket's lower end so far: the highest passing rate below every failing one.
        lowest_fail = min((p.rate for p in probes if not p.passed), default=math.inf)
        best = max((p.rate for p in probes if p.passed and p.rate < lowest_fail), default=None)
        return RateSearch(best, probes, truncated=True)


def _search(
    passes: Callable[[float], bool],
    rate_min: float,
    rate_max: float,
    tolerance: float,
    start: float | None,
    probes: list[RateProbe],
    factor: float,
) -> RateSearch:
    r = math.sqrt(rate_min * rate_max) if start is None else start
    r = min(max(r, rate_min), rate_max)
    lo: float
    hi: float
    if passes(r):
        lo = r
        while True:
            if lo >= rate_max:
                return RateSearch(rate_max, probes)
            nxt = min(lo * factor, rate_max)
            if passes(nxt):
                lo = nxt
            else:
                hi = nxt
                break
    else:
        hi = r
        while True:
            if hi <= rate_min:
                return RateSearch(None, probes)
            nxt = max(hi / factor, rate_min)
            if passes(nxt):
                lo = nxt
                break
            hi = nxt
    while hi / lo > 1.0 + tolerance:
        mid = math.sqrt(lo * hi)
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return RateSearch(lo, probes)


# --------------------------------------------------------------------------- values


def integrity_counts(records: Sequence[RequestRecord]) -> IntegrityCounts:
    """Measured requests, failures, and completed ones whose harness-counted output length
    is not the forced one."""
    requests = failed = mismatched = 0
    for r in records:
        if r.warmup:
            continue
        requests += 1
        if not r.ok:
            failed += 1
        elif r.output_tokens != r.expected_output_tokens:
            mismatched += 1
    return IntegrityCounts(requests=requests, failed=failed, length_mismatches=mismatched)


def _statistic(p: Percentiles, statistic: Statistic) -> float:
    value: float = getattr(p, statistic)
    return value


def plain_value(objective: ObjectiveSpec, metrics: Metrics) -> float | None:
    """The value of a plain (one-run) objective from a run's metrics; ``None``: infeasible."""
    kind = objective.kind
    if kind == "output_throughput":
        return metrics.output_throughput
    if kind == "goodput":
        return metrics.goodput if metrics.goodput is not None else 0.0
    if metrics.completed == 0:
        return None  # an empty latency distribution reads 0 ms; that is no result
    stat = objective.statistic
    if kind == "ttft":
        return _statistic(metrics.ttft_ms, stat)
    if kind == "tpot":
        return _statistic(metrics.tpot_ms, stat)
    if kind == "itl":
        return _statistic(metrics.itl_ms, stat)
    if kind == "e2e":
        return _statistic(metrics.e2e_ms, stat)
    if kind == "turn_latency":
        if metrics.sessions is None:
            return _statistic(metrics.e2e_ms, stat)
        return _statistic(metrics.sessions.turn_latency_ms, stat)
    raise ValueError(f"objective '{kind}' is not a one-run objective")


def sum_integrity(parts: Sequence[ObjectiveMeasurement]) -> IntegrityCounts:
    total = IntegrityCounts()
    for p in parts:
        total = total.add(p.integrity)
    return total
