"""The final evaluation of a sim-track submission: fresh launch, hidden workload, paired runs.

:func:`evaluate` measures the task's baseline config and the submission on the *scoring*
workload: the task's workload spec materialised with the hidden scoring seed
(:func:`servegym.runner.secrets.scoring_seed`), which no agent ever sees. The harness
launches both configs itself (nothing of the agent phase carries over) and measures them in
pairs, alternating ``B, S, B, S, ...`` for ``task.evaluation.repeats`` repeats; every run
has its own noise seed (derived from the scoring seed, the side and the repeat), so the
pairs vary as repeated runs on a real GPU do. Rate searches start, for both sides, at the
rate the first baseline run found.

Pair ``i`` gives the improvement ratio ``r_i`` of the objective
(:func:`servegym.scoring.objectives.measurement_improvement`); the score is the geometric
mean of the ``r_i`` with an (expanded) percentile-bootstrap 95% interval over pairs
(:mod:`servegym.scoring.score`). Every other metric (TTFT/TPOT/E2E p90 and p99, output
throughput, cost per million output tokens, goodput and SLA attainment under the task's
SLA, turn latency) is compared the same way, from each measurement's own run (for a rate
objective, the run at the rate that side reached, so latencies there are at different loads).

Gates, in the order they decide the outcome (:mod:`servegym.scoring.gates`): the config's
integrity (``integrity_flagged``), the launch (``launch_failed``), the outputs' integrity
(``integrity_flagged``), accuracy (``accuracy_failed``); all passed: ``scored``. A
submission that launched is measured even when a gate fails, so ``raw_score`` says what it
would have scored. A baseline that does not launch is a broken task: :class:`HarnessError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servegym.engines.config import ServingConfig
from servegym.engines.launcher import ExternalServer, LauncherSubmission
from servegym.engines.sim.launch import LaunchedEngine, LaunchError
from servegym.engines.sim.profiles import get_hardware, get_model
from servegym.pipeline.engine import launch_task
from servegym.runner.environment import HarnessError
from servegym.runner.results import (
    EvaluationInfo,
    MetricComparison,
    ObjectiveSummary,
    Outcome,
    SideLatencies,
    SideResult,
    side_latencies,
)
from servegym.runner.secrets import stable_seed
from servegym.scoring import gates
from servegym.scoring.gates import GateResult
from servegym.scoring.metrics import Metrics
from servegym.scoring.objectives import (
    UNITS,
    IntegrityCounts,
    ObjectiveMeasurement,
    geometric_mean,
    measure_objective,
    measurement_improvement,
    ratio,
    task_price,
)
from servegym.scoring.score import PairedScore, paired_score
from servegym.tasks.loader import LoadedTask, workload_spec
from servegym.tasks.spec import Task
from servegym.workloads.generate import materialise
from servegym.workloads.model import Workload

ProgressFn = Callable[[str, int, int], None]
"""``progress(stage, done, total)`` during the evaluation."""


@dataclass(frozen=True, slots=True)
class MetricDef:
    unit: str
    higher_is_better: bool
    read: Callable[[Metrics], float | None]


def _sessions_mean(m: Metrics) -> float | None:
    return m.sessions.turn_latency_ms_mean if m.sessions is not None else None


REPORT_METRICS: dict[str, MetricDef] = {
    "ttft_p90": MetricDef("ms", False, lambda m: m.ttft_ms.p90 if m.completed else None),
    "ttft_p99": MetricDef("ms", False, lambda m: m.ttft_ms.p99 if m.completed else None),
    "tpot_p90": MetricDef("ms", False, lambda m: m.tpot_ms.p90 if m.completed else None),
    "tpot_p99": MetricDef("ms", False, lambda m: m.tpot_ms.p99 if m.completed else None),
    "e2e_p90": MetricDef("ms", False, lambda m: m.e2e_ms.p90 if m.completed else None),
    "e2e_p99": MetricDef("ms", False, lambda m: m.e2e_ms.p99 if m.completed else None),
    "turn_latency_mean": MetricDef("ms", False, _sessions_mean),
    "output_throughput": MetricDef("tok/s", True, lambda m: m.output_throughput),
    "cost_per_mtok": MetricDef("$/Mtok", False, lambda m: m.cost_per_mtok),
    "goodput": MetricDef("req/s", True, lambda m: m.goodput),
    "sla_attainment": MetricDef("fraction", True, lambda m: m.sla_attainment),
}
"""The metrics every evaluation compares (a metric no run has, e.g. goodput without an
SLA, is left out)."""


@dataclass
class Evaluation:
    """What :func:`evaluate` found (the trial folds it into ``trial.json``)."""

    outcome: Outcome
    gates: dict[str, GateResult]
    baseline: SideResult
    submission: SideResult | None
    objective: ObjectiveSummary
    improvement: dict[str, MetricComparison]
    info: EvaluationInfo
    paired: PairedScore | None = None
    error: str | None = None
    measurements: list[tuple[ObjectiveMeasurement, ObjectiveMeasurement | None]] = field(
        default_factory=list
    )
    latencies: dict[str, SideLatencies] = field(default_factory=dict)
    """The first pair's per-request latencies, ``baseline`` and ``submission`` (where
    measured), sorted and capped: what the trial writes to ``latencies.json``."""

    @property
    def score(self) -> float | None:
        return self.paired.score if self.paired is not None and self.outcome == "scored" else None


def changed_config(config: Any) -> dict[str, Any]:
    if isinstance(config, LauncherSubmission | ExternalServer):
        return config.record()
    if isinstance(config, ServingConfig):
        try:
            data: dict[str, Any] = config.model_dump(mode="json", exclude_defaults=True)
            return data
        except Exception:
            return {"value": repr(config)}
    return {"value": repr(config)}


def _mean(values: list[float | None]) -> float | None:
    real = [v for v in values if v is not None and math.isfinite(v)]
    return sum(real) / len(real) if real else None


def _side(
    config: Any,
    engine: LaunchedEngine | None,
    error: str | None,
    measurements: list[ObjectiveMeasurement],
    price_per_hour: float | None,
) -> SideResult:
    integrity = IntegrityCounts()
    for m in measurements:
        integrity = integrity.add(m.integrity)
    return SideResult(
        config=changed_config(config),
        launched=engine is not None,
        launch_error=error,
        accuracy_ratio=engine.accuracy_ratio if engine is not None else None,
        num_gpus=engine.num_gpus if engine is not None else None,
        startup_s=engine.startup_s if engine is not None else None,
        price_per_hour=price_per_hour,
        objective_values=[m.value for m in measurements],
        rates=[m.rate for m in measurements],
        metrics=measurements[0].metrics if measurements else None,
        integrity=integrity,
    )


def compare_metrics(
    pairs: list[tuple[ObjectiveMeasurement, ObjectiveMeasurement | None]],
) -> dict[str, MetricComparison]:
    """Every :data:`REPORT_METRICS` entry over the pairs (submission values where measured)."""
    out: dict[str, MetricComparison] = {}
    for name, d in REPORT_METRICS.items():
        b_vals: list[float | None] = []
        s_vals: list[float | None] = []
        ratios: list[float] = []
        for b, s in pairs:
            bv = d.read(b.metrics) if b.metrics is not None else None
            b_vals.append(bv)
            if s is None:
                continue
            sv = d.read(s.metrics) if s.metrics is not None else None
            s_vals.append(sv)
            if bv is not None or sv is not None:
                ratios.append(ratio(d.higher_is_better, bv, sv))
        if all(v is None for v in b_vals) and all(v is None for v in s_vals):
            continue
        out[name] = MetricComparison(
            unit=d.unit,
            higher_is_better=d.higher_is_better,
            baseline=_mean(b_vals),
            submission=_mean(s_vals) if s_vals else None,
            improvement=geometric_mean(ratios) if ratios else None,
        )
    return out


def compare_components(
    pairs: list[tuple[ObjectiveMeasurement, ObjectiveMeasurement | None]],
) -> dict[str, MetricComparison]:
    """A composite objective's components, each over the pairs (empty for a plain one)."""
    if not pairs or not pairs[0][0].components:
        return {}
    out: dict[str, MetricComparison] = {}
    for k, first in enumerate(pairs[0][0].components):
        b_vals = [b.components[k].value for b, _ in pairs]
        subs = [s.components[k] for _, s in pairs if s is not None]
        s_vals = [c.value for c in subs]
        ratios = [
            ratio(first.higher_is_better, b.components[k].value, s.components[k].value)
            for b, s in pairs
            if s is not None
        ]
        out[first.objective] = MetricComparison(
            unit=first.unit,
            higher_is_better=first.higher_is_better,
            baseline=_mean(b_vals),
            submission=_mean(s_vals) if s_vals else None,
            improvement=geometric_mean(ratios) if ratios else None,
        )
    return out


def _rate_of(m: ObjectiveMeasurement) -> float | None:
    if m.kind in ("max_rate_at_sla", "cost_at_sla"):
        return m.rate
    for c in m.components:
        r = _rate_of(c)
        if r is not None:
            return r
    return None


def evaluate(
    loaded: LoadedTask,
    submission: Any,
    scoring_seed: int,
    *,
    progress: ProgressFn | None = None,
) -> Evaluation:
    """Score ``submission`` (a ServingConfig, or whatever the agent left) against the task's
    baseline on the scoring workload. Raises :class:`HarnessError` when the baseline itself
    does not launch; any other exception is the harness's own (the trial records it)."""
    task = loaded.task
    repeats = task.evaluation.repeats
    model = get_model(task.model, "model")
    hardware = get_hardware(task.hardware, "hardware")
    spec, base_dir = workload_spec(loaded)
    workload: Workload = materialise(spec, scoring_seed, base_dir=base_dir)
    info, summary = evaluation_header(task, workload)

    def start(config: ServingConfig) -> LaunchedEngine:
        return launch_task(task, model, hardware, config, workload_family=spec.kind)

    try:
        base_engine = start(task.baseline)
    except LaunchError as e:
        raise HarnessError(f"the task's baseline config does not launch: {e.message}") from None
    base_price = task_price(task, base_engine)

    gate = gates.opening_gates(submission, task.engines)
    sub_engine: LaunchedEngine | None = None
    sub_error: str | None = None
    if gate["integrity"].passed:
        assert isinstance(submission, ServingConfig)
        try:
            sub_engine = start(ServingConfig.model_validate(submission.model_dump()))
        except LaunchError as e:
            sub_error = e.message
        gate["launch"] = gates.check_launch(sub_error)
    if sub_engine is not None:
        gate["accuracy"] = gates.check_accuracy(
            sub_engine.accuracy_ratio, base_engine.accuracy_ratio, task.accuracy.min_ratio
        )
    elif gate["integrity"].passed:
        gate["accuracy"] = gates.not_reached("the submission did not launch")
    elif submission is not None:
        gate["accuracy"] = gates.not_reached("integrity check failed first")

    # Paired, alternating runs: B0, S0, B1, S1, ...  (baseline alone, once, when the
    # submission cannot be measured).
    n_pairs = repeats if sub_engine is not None else 1
    total = n_pairs * (2 if sub_engine is not None else 1)
    done = 0
    hint: float | None = None
    pairs: list[tuple[ObjectiveMeasurement, ObjectiveMeasurement | None]] = []

    def measure(engine: LaunchedEngine, role: str, i: int) -> ObjectiveMeasurement:
        """One run of the objective on the scoring workload, with its own noise seed."""
        nonlocal done
        m = measure_objective(
            task,
            engine,
            spec,
            scoring_seed,
            stable_seed(role, task.id, scoring_seed, i),
            base_dir=base_dir,
            workload=workload,
            rate_hint=hint,
        )
        done += 1
        if progress is not None:
            progress("evaluation", done, total)
        return m

    for i in range(n_pairs):
        b = measure(base_engine, "score-baseline", i)
        if i == 0:
            hint = _rate_of(b)
        s = measure(sub_engine, "score-submission", i) if sub_engine is not None else None
        pairs.append((b, s))

    summary.components = compare_components(pairs)
    info.sim_seconds = sum(b.sim_seconds + (s.sim_seconds if s else 0.0) for b, s in pairs)
    subs = [s for _, s in pairs if s is not None]
    base_cost = base_price.price_per_hour * base_price.gpus
    baseline_side = _side(task.baseline, base_engine, None, [b for b, _ in pairs], base_cost)
    submission_side: SideResult | None = None
    if submission is not None:
        price: float | None = None
        if sub_engine is not None:
            p = task_price(task, sub_engine)
            price = p.price_per_hour * p.gpus
        submission_side = _side(submission, sub_engine, sub_error, subs, price)

    return conclude(
        loaded,
        submission,
        scoring_seed,
        gate=gate,
        summary=summary,
        info=info,
        pairs=pairs,
        baseline_side=baseline_side,
        submission_side=submission_side,
    )


def evaluation_header(task: Task, workload: Workload) -> tuple[EvaluationInfo, ObjectiveSummary]:
    """What an evaluation records before it measures: the scoring workload (the first
    pair's, on real tracks) and the objective."""
    objective = task.objective
    info = EvaluationInfo(
        repeats=task.evaluation.repeats,
        workload=workload.spec.name,
        requests=workload.spec.num_requests,
        workload_hash=workload.content_hash(),
        bootstrap_samples=task.evaluation.bootstrap_samples,
    )
    summary = ObjectiveSummary(
        label=objective.label(),
        kind=objective.kind,
        unit=UNITS[objective.kind],
        higher_is_better=objective.higher_is_better,
    )
    return info, summary


def conclude(
    loaded: LoadedTask,
    submission: Any,
    scoring_seed: int,
    *,
    gate: dict[str, GateResult],
    summary: ObjectiveSummary,
    info: EvaluationInfo,
    pairs: list[tuple[ObjectiveMeasurement, ObjectiveMeasurement | None]],
    baseline_side: SideResult,
    submission_side: SideResult | None,
    crashed: str | None = None,
) -> Evaluation:
    """Score the pairs, finish the integrity gate with the outputs' check, and decide the
    outcome (gates in order; ``crashed``: the submission's server died mid-evaluation).
    The same for every track."""
    task = loaded.task
    subs = [s for _, s in pairs if s is not None]
    paired: PairedScore | None = None
    if subs and submission_side is not None and crashed is None:
        ratios = [measurement_improvement(task.objective, b, s) for b, s in pairs if s is not None]
        summary.pairs = ratios
        paired = paired_score(
            ratios,
            samples=task.evaluation.bootstrap_samples,
            seed=stable_seed("bootstrap", task.id, scoring_seed),
        )
        outputs = gates.check_outputs(submission_side.integrity, baseline_side.integrity)
        gate["integrity"] = gates.merge(gate["integrity"], outputs)

    outcome: Outcome
    if submission is None:
        outcome = "no_submission"
    elif gate["integrity"].passed is False:
        outcome = "integrity_flagged"
    elif gate["launch"].passed is False:
        outcome = "launch_failed"
    elif crashed is not None:
        outcome = "crashed"
    elif gate["accuracy"].passed is False:
        outcome = "accuracy_failed"
    else:
        outcome = "scored"
    latencies: dict[str, SideLatencies] = {}
    if pairs:
        for side, m in (("baseline", pairs[0][0]), ("submission", pairs[0][1])):
            lat = side_latencies(m.latencies) if m is not None else None
            if lat is not None:
                latencies[side] = lat
    return Evaluation(
        outcome=outcome,
        gates=gate,
        baseline=baseline_side,
        submission=submission_side,
        objective=summary,
        improvement=compare_metrics(pairs),
        info=info,
        paired=paired,
        error=crashed,
        measurements=pairs,
        latencies=latencies,
    )
