"""The final evaluation of a submission, on any track: fresh start, hidden workload, pairs.

:func:`evaluate` measures the task's baseline config and the submission on the *scoring*
workload: the task's workload spec materialised with the hidden scoring seed
(:func:`servegym.tasks.secrets.scoring_seed`), which no agent ever sees. The harness
starts both sides itself (nothing of the agent phase carries over) and measures them in
pairs, ``B, S`` then ``S, B`` (:func:`pair_order`), for ``task.evaluation.repeats`` repeats.
The order (gates, baseline and submission started together, warm-up, pairs, checks of both
live sides after the pairs, crash handling, accuracy, integrity, conclusion) is this module's;
how a side starts and is measured is the track's (:mod:`servegym.tracks`). On every track each
pair runs its own sample of the scoring workload (:func:`servegym.tracks.base.pair_seed`), so
a trial's interval covers the workload's sample-to-sample variation as well as run noise.

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
would have scored. A baseline that does not start is a broken task:
:class:`~servegym.errors.BrokenTask` (a trial refuses the task in one line, exit code 2, and
records nothing). A submission whose server dies mid-evaluation is
``crashed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from servegym.engines.config import ServingConfig
from servegym.engines.launcher import ExternalServer, LauncherSubmission
from servegym.runner.results import (
    EvaluationInfo,
    MetricComparison,
    ObjectiveSummary,
    Outcome,
    SideLatencies,
    SideResult,
    side_latencies,
)
from servegym.scoring import gates
from servegym.scoring.gates import GateResult
from servegym.scoring.integrity import Finding
from servegym.scoring.metrics import Metrics
from servegym.scoring.objectives import (
    UNITS,
    IntegrityCounts,
    ObjectiveMeasurement,
    geometric_mean,
    measurement_improvement,
    ratio,
)
from servegym.scoring.score import PairedScore, paired_score
from servegym.scoring.stopping import PairPlan, relative_half_width
from servegym.tasks.loader import LoadedTask
from servegym.tasks.secrets import stable_seed
from servegym.tasks.spec import Task
from servegym.tracks import track_for
from servegym.tracks.base import (
    EvaluationSession,
    Role,
    SampleInfo,
    SideCrashed,
    StartedSide,
    Track,
)

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
    started: StartedSide | None,
    measurements: list[ObjectiveMeasurement],
    accuracy: float | None,
) -> SideResult:
    """What the trial records of one side (``started``: None when it was never tried)."""
    integrity = IntegrityCounts()
    for m in measurements:
        integrity = integrity.add(m.integrity)
    up = started is not None and started.up
    return SideResult(
        config=changed_config(config),
        launched=up,
        launch_error=started.error if started is not None else None,
        accuracy_ratio=accuracy,
        num_gpus=started.num_gpus if started is not None and up else None,
        startup_s=started.startup_s if started is not None and up else None,
        price_per_hour=started.price_per_hour if started is not None and up else None,
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


def evaluate(
    loaded: LoadedTask,
    submission: Any,
    scoring_seed: int,
    *,
    track: Track | None = None,
    progress: ProgressFn | None = None,
    ran_in_workspace: Sequence[str] = (),
) -> Evaluation:
    """Score ``submission`` (a ServingConfig, a workspace, a running server, or whatever the
    agent left) against the task's baseline on the scoring workload, on ``track`` (default:
    the task's; a real track needs one built with its server logs). Raises
    :class:`~servegym.errors.BrokenTask` when the baseline itself does not start,
    :class:`~servegym.errors.HarnessError` when it fails later; any other exception is the
    harness's own (the trial records it).
    ``ran_in_workspace``: the workspace digests whose launcher served a benchmark during the
    agent phase (see :func:`_outside_state`)."""
    chosen = track if track is not None else track_for(loaded)
    evaluation = asyncio.run(_evaluate(loaded, submission, scoring_seed, chosen, progress))
    if isinstance(submission, LauncherSubmission):
        _outside_state(evaluation, submission, ran_in_workspace)
    return evaluation


async def _evaluate(
    loaded: LoadedTask,
    submission: Any,
    scoring_seed: int,
    track: Track,
    progress: ProgressFn | None,
) -> Evaluation:
    """Gates, baseline and submission (started together), warm-up, pairs ``B, S, S, B, B,
    S, ...``, checks of both live sides (``after_pairs``), crash handling, accuracy,
    integrity, conclusion: the order every track follows."""
    task = loaded.task
    session = track.evaluation(loaded, scoring_seed)
    info, summary = evaluation_header(task, session.sample)
    gate = gates.opening_gates(submission, task.engines)
    base: StartedSide | None = None
    sub: StartedSide | None = None
    crashed: str | None = None
    pairs: list[tuple[ObjectiveMeasurement, ObjectiveMeasurement | None]] = []
    try:
        if gate["integrity"].passed:
            base, sub = await _start_both(session, submission)
            gate["launch"] = gates.check_launch(sub.error)
        else:
            base = await session.start_baseline()
        up = sub is not None and sub.up
        n_pairs = task.evaluation.pair_limit if up else 1
        total = (task.evaluation.repeats if up else 1) * (2 if up else 1)
        crashed = await session.warm_up(base, sub)
        if crashed is not None:
            n_pairs = 1
        done = 0
        plan = pair_plan(task, scoring_seed)
        started = time.monotonic()
        for i in range(n_pairs):
            total = max(total, (i + 1) * (2 if up else 1))
            both = sub is not None and sub.up and crashed is None
            s: ObjectiveMeasurement | None = None
            b: ObjectiveMeasurement | None = None
            for role in pair_order(i) if both else ("baseline",):
                if role == "baseline":
                    b = await session.measure(base, "baseline", i)
                else:
                    assert sub is not None
                    try:
                        s = await session.measure(sub, "submission", i)
                    except SideCrashed as e:
                        crashed = e.reason
                        continue  # the pair's baseline is still measured, then they end
                done += 1
                if progress is not None:
                    progress("evaluation", done, total)
            assert b is not None
            pairs.append((b, s))
            if crashed is not None:
                break
            if s is not None:
                ratios = [measurement_improvement(task.objective, b, s) for b, s in _both(pairs)]
                stop = plan.decide(ratios, time.monotonic() - started)
                if stop is not None:
                    info.pairs_stopped = stop
                    break
        if sub is not None and sub.up and crashed is None:
            await session.after_pairs(base, sub)
    finally:
        await session.close()
    finished = sub is not None and sub.up and crashed is None
    try:
        await session.prepare_checks()
        base_acc = session.accuracy(base, "baseline")
        sub_acc = session.accuracy(sub, "submission")
        if finished:
            gate["accuracy"] = session.accuracy_gate(sub_acc, base_acc)
        elif gate["integrity"].passed and not up:
            gate["accuracy"] = gates.not_reached("the submission did not launch")
        elif submission is not None and not gate["integrity"].passed:
            gate["accuracy"] = gates.not_reached("integrity check failed first")
        found, note = await session.integrity_findings(bool(gate["integrity"].passed))
    finally:
        await session.finish_checks()
    _integrity_findings(gate, found, note)

    summary.components = compare_components(pairs)
    info.pair_workload_hashes = list(session.sample.pair_hashes[: len(pairs)])
    info.sim_seconds = sum(b.sim_seconds + (s.sim_seconds if s else 0.0) for b, s in pairs)
    if session.quiet is not None:
        info.quiet_wait_s = round(session.quiet.waited_s, 3)
        info.paused_runs = session.quiet.paused_runs
    subs = [s for _, s in pairs if s is not None]
    baseline_side = _side(task.baseline, base, [b for b, _ in pairs], base_acc)
    submission_side: SideResult | None = None
    if submission is not None:
        submission_side = _side(submission, sub, subs, sub_acc)
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
        crashed=crashed,
    )


async def _start_both(
    session: EvaluationSession, submission: Any
) -> tuple[StartedSide, StartedSide]:
    """Start the baseline and the submission at once: nothing is measured while servers
    start, and on the cpu track a start is mostly single-threaded imports and compiles
    (35-140 s each), so the two overlap on the cores instead of queueing. Each side's
    ``startup_s`` is then its start beside the other's. A baseline that does not start ends
    the submission's start too (its server, if launched, is stopped by the session's
    ``close``)."""
    sub_start = asyncio.ensure_future(session.start_submission(submission))
    try:
        base = await session.start_baseline()
    except BaseException:
        sub_start.cancel()
        with contextlib.suppress(BaseException):
            await sub_start
        raise
    return base, await sub_start


def pair_order(i: int) -> tuple[Role, Role]:
    """Which side pair ``i`` measures first: ``B, S`` then ``S, B``, and so on (an ABBA
    design). On a real machine a pair's second run meets a machine that has drifted since
    its first (its speed comes and goes, caches and clocks change): always measuring the
    submission second would carry that drift into every ratio the same way, and its mean
    into the score. Alternating the order lets it cancel over the pairs; on the simulator a
    run's noise comes from its seed alone, so the order changes nothing there."""
    return ("baseline", "submission") if i % 2 == 0 else ("submission", "baseline")


def _both(
    pairs: list[tuple[ObjectiveMeasurement, ObjectiveMeasurement | None]],
) -> list[tuple[ObjectiveMeasurement, ObjectiveMeasurement]]:
    return [(b, s) for b, s in pairs if s is not None]


def pair_plan(task: Task, scoring_seed: int) -> PairPlan:
    """The task's rule for how many pairs to run (:mod:`servegym.scoring.stopping`), its
    interval computed as the final score's is (same bootstrap seed)."""
    ev = task.evaluation
    return PairPlan(
        minimum=ev.repeats,
        maximum=ev.pair_limit,
        target_half_width=ev.target_half_width,
        time_s=ev.pairs_time_s,
        bootstrap_samples=ev.bootstrap_samples,
        seed=stable_seed("bootstrap", task.id, scoring_seed),
    )


def _integrity_findings(gate: dict[str, GateResult], found: list[Finding], note: str) -> None:
    """Fail the integrity gate on the track's findings, or add the track's note to it."""
    if found and gate["integrity"].passed:
        texts = [f.text() for f in found]
        gate["integrity"] = GateResult(passed=False, detail=texts[0], findings=texts)
    elif note and gate["integrity"].passed:
        detail = gate["integrity"].detail + note
        gate["integrity"] = gate["integrity"].model_copy(update={"detail": detail})


def _outside_state(
    evaluation: Evaluation, submission: LauncherSubmission, ran: Sequence[str]
) -> None:
    """Name the cause when a launcher that ran in the agent's workspace fails from the
    submitted files alone: it needs something a fresh sandbox does not have (a file outside
    the workspace or under an excluded cache folder, a process it expected running)."""
    launch = evaluation.gates.get("launch")
    failed = evaluation.outcome == "crashed" or (launch is not None and launch.passed is False)
    if not failed or launch is None or submission.digest[:16] not in {d[:16] for d in ran}:
        return
    why = launch.detail if launch.passed is False else "its server died during the evaluation"
    finding = Finding(
        check="state_outside_submission",
        requests=1,
        of=1,
        request_id=submission.script,
        subject="launcher",
        evidence=(
            f"the same files (digest {submission.digest[:16]}) served a benchmark in the "
            f"agent's workspace, but not from the submitted files alone in a fresh sandbox: "
            f"{why}"
        ),
    )
    evaluation.gates["launch"] = launch.model_copy(
        update={"findings": [*launch.findings, finding.text()]}
    )


def evaluation_header(task: Task, sample: SampleInfo) -> tuple[EvaluationInfo, ObjectiveSummary]:
    """What an evaluation records before it measures: the scoring workload (the first
    pair's, where each pair has its own sample) and the objective."""
    objective = task.objective
    info = EvaluationInfo(
        repeats=task.evaluation.repeats,
        workload=sample.name,
        requests=sample.requests,
        workload_hash=sample.workload_hash,
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
        info.half_width = relative_half_width(paired)
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
