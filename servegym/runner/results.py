"""What a trial records: :class:`TrialResult`, written as ``trial.json``.

Layout (``trial.json``, schema ``servegym.trial/1``)::

    schema, task, task_title, track, agent, seed
    outcome            scored | accuracy_failed | integrity_flagged | launch_failed |
                       crashed | no_submission | provider_unavailable | harness_error
                       (provider_unavailable: a model agent's provider stayed down, or
                       answered garbage, through every retry before anything was submitted)
    score              the paired improvement (geometric mean of paired ratios) when scored,
                       else null
    score_ci           [low, high] 95% bootstrap interval of score (null when not scored)
    leaderboard_score  score when scored, else 1.0 (a non-scored outcome counts 1.0x; a
                       scored regression keeps its real ratio below 1.0)
    raw_score, raw_score_ci
                       the measured improvement whatever the gates said (null when the
                       submission was never measured: no submission, launch failure, ...)
    objective          label, kind, unit, direction, paired ratios, per-repeat values
    improvement        per metric: baseline, submission (means over repeats), improvement
                       (geometric mean of paired ratios, > 1 better), unit, direction
    gates              launch, accuracy, integrity: passed (null: not reached), detail, ...
    baseline, submission
                       config (knobs set), launched, launch_error, accuracy_ratio, GPUs,
                       start-up, objective values per repeat, metrics (first repeat),
                       integrity counts
    best_seen          the best dev experiment of the agent phase (an experiments.jsonl
                       line), null when none ran
    process            experiments, quick experiments, distinct configs, launch failures,
                       submissions, dev baseline value, time to best (experiment index and
                       budget fraction)
    budget             unit, used, limit, experiments, max_experiments, exhausted
    evaluation         repeats, workload name, request count, hash, bootstrap samples,
                       harness sim seconds
    scoring_seed       the hidden seed of the scoring workload (revealed after the trial)
    agent_error        the exception the agent raised, if it did
    error              what went wrong in the harness (harness_error), else null
    versions           servegym, python, numpy, pydantic
    started_at, finished_at, timing
                       wall-clock values: the only keys that differ between two runs of
                       the same seed (:data:`VOLATILE_KEYS`)

Beside it, ``latencies.json`` (schema ``servegym.latencies/1``, :class:`TrialLatencies`,
written atomically just before ``trial.json`` when the final evaluation measured something):
the per-request TTFT, TPOT and E2E (ms) of the first evaluation pair's baseline and
submission runs (the runs ``metrics`` in ``baseline`` and ``submission`` summarise), each list
sorted and cut to :data:`LATENCY_CAP` values (:func:`capped_sorted`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from servegym.agents.base import ExperimentResult
from servegym.run_folder import TRIAL_FILE, write_atomic
from servegym.scoring.gates import GateResult
from servegym.scoring.metrics import Metrics, RequestLatencies
from servegym.scoring.objectives import IntegrityCounts

SCHEMA = "servegym.trial/1"
EXPERIMENTS_FILE = "experiments.jsonl"
LATENCIES_FILE = "latencies.json"
LATENCIES_SCHEMA = "servegym.latencies/1"
LATENCY_CAP = 2000
"""The most values ``latencies.json`` keeps of one distribution."""
VOLATILE_KEYS: tuple[str, ...] = ("started_at", "finished_at", "timing")
"""Top-level keys of ``trial.json`` that hold wall-clock values."""

Outcome = Literal[
    "scored",
    "accuracy_failed",
    "integrity_flagged",
    "launch_failed",
    "crashed",
    "no_submission",
    "provider_unavailable",
    "harness_error",
]
OUTCOMES: tuple[str, ...] = (
    "scored",
    "accuracy_failed",
    "integrity_flagged",
    "launch_failed",
    "crashed",
    "no_submission",
    "provider_unavailable",
    "harness_error",
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SideResult(_Model):
    """The baseline's or the submission's part of the final evaluation."""

    config: dict[str, Any] = Field(description="the knobs set (defaults left out)")
    launched: bool
    launch_error: str | None = None
    accuracy_ratio: float | None = None
    num_gpus: int | None = None
    startup_s: float | None = None
    price_per_hour: float | None = Field(default=None, description="$ per hour, all GPUs")
    objective_values: list[float | None] = Field(
        default_factory=list, description="the objective per repeat (null: infeasible)"
    )
    rates: list[float | None] = Field(
        default_factory=list, description="rate of each repeat's run (rate objectives)"
    )
    metrics: Metrics | None = Field(default=None, description="the first repeat's run")
    integrity: IntegrityCounts = Field(default_factory=IntegrityCounts)


class MetricComparison(_Model):
    """One metric, baseline against submission."""

    unit: str
    higher_is_better: bool
    baseline: float | None
    submission: float | None
    improvement: float | None = Field(description="geometric mean of paired ratios (> 1 better)")


class ObjectiveSummary(_Model):
    label: str
    kind: str
    unit: str
    higher_is_better: bool
    pairs: list[float] = Field(default_factory=list, description="paired improvement ratios")
    method: str = "geometric mean of paired ratios; expanded percentile bootstrap over pairs"
    components: dict[str, MetricComparison] = Field(
        default_factory=dict, description="a composite's components, each compared alone"
    )


class TimeToBest(_Model):
    experiment: int | None = Field(description="index of the best dev experiment")
    budget_fraction: float | None = Field(
        description="budget used when it finished, over the limit"
    )
    sim_gpu_seconds: float | None = None
    wall_seconds: float | None = Field(default=None, description="real tracks' budget unit")


class ProcessStats(_Model):
    experiments: int = 0
    quick_experiments: int = 0
    distinct_configs: int = 0
    launch_failures: int = 0
    submissions: int = 0
    dev_baseline_value: float | None = None
    time_to_best: TimeToBest = Field(
        default_factory=lambda: TimeToBest(experiment=None, budget_fraction=None)
    )
    shipped_best: bool | None = Field(
        default=None,
        description="whether the submission is the best config measured in the agent phase "
        "(null: no submission or no successful experiment)",
    )
    commands: int | None = Field(
        default=None, description="real tracks: commands the agent ran in its workspace"
    )


class BudgetSummary(_Model):
    unit: str = "sim_gpu_seconds"
    used: float = 0.0
    limit: float | None = None
    experiments: int = 0
    max_experiments: int | None = None
    exhausted: bool = False


class EvaluationInfo(_Model):
    repeats: int = 0
    workload: str | None = None
    requests: int | None = None
    workload_hash: str | None = None
    pair_workload_hashes: list[str] = Field(
        default_factory=list,
        description="the workload sample of each pair measured, in pair order (the first is "
        "workload_hash): every pair draws its own sample of the scoring workload",
    )
    bootstrap_samples: int | None = None
    pairs_stopped: str | None = Field(
        default=None,
        description="why the evaluation ran the pairs it ran: fixed (exactly `repeats`), "
        "narrow (the interval reached the task's target half-width), max_repeats, or "
        "time_budget (one more pair would have overrun the pairs' wall seconds)",
    )
    half_width: float | None = Field(
        default=None, description="the score interval's half-width, sqrt(high / low) - 1"
    )
    sim_seconds: float = Field(default=0.0, description="virtual seconds the harness simulated")
    quiet_wait_s: float = Field(
        default=0.0,
        description="real tracks: seconds the runs waited, in all, for the other side's "
        "servers to go quiet before they started (servegym.sandbox.quiet)",
    )
    paused_runs: int = Field(
        default=0,
        description="real tracks: runs during which the other side's servers, still busy "
        "after the wait, were paused",
    )


class Timing(_Model):
    wall_s: float = 0.0
    agent_wall_s: float = 0.0
    evaluation_wall_s: float = 0.0


class TrialResult(_Model):
    """One trial (``trial.json``); see the module docstring for the layout."""

    schema_: str = Field(default=SCHEMA, alias="schema")
    task: str
    task_title: str = ""
    track: str = "sim"
    agent: str
    seed: int
    outcome: Outcome
    score: float | None = None
    score_ci: tuple[float, float] | None = None
    leaderboard_score: float = 1.0
    raw_score: float | None = None
    raw_score_ci: tuple[float, float] | None = None
    objective: ObjectiveSummary | None = None
    improvement: dict[str, MetricComparison] = Field(default_factory=dict)
    gates: dict[str, GateResult] = Field(default_factory=dict)
    baseline: SideResult | None = None
    submission: SideResult | None = None
    best_seen: ExperimentResult | None = None
    process: ProcessStats = Field(default_factory=ProcessStats)
    budget: BudgetSummary = Field(default_factory=BudgetSummary)
    evaluation: EvaluationInfo = Field(default_factory=EvaluationInfo)
    scoring_seed: int | None = None
    agent_error: str | None = None
    agent_outcome: str | None = Field(
        default=None,
        description="how a model agent's phase ended: finished, max_turns, provider_unavailable",
    )
    agent_cost: dict[str, Any] | None = Field(
        default=None, description="a model agent's calls, tokens and dollars"
    )
    error: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    started_at: str = ""
    finished_at: str = ""
    timing: Timing = Field(default_factory=Timing)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    _skipped: bool = PrivateAttr(default=False)

    @property
    def skipped(self) -> bool:
        """True when :func:`~servegym.runner.trial.run_trial` found this trial finished and
        did not run it again."""
        return self._skipped

    def mark_skipped(self) -> None:
        self._skipped = True

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, by_alias=True) + "\n"


def trial_dir_name(task: str, agent: str, seed: int) -> str:
    """``<task>__<agent>__s<seed>``; characters a folder name cannot hold (a model id's
    ``/``) become ``_``."""
    safe = re.sub(r"[^A-Za-z0-9._:+-]", "_", agent)
    return f"{task}__{safe}__s{seed}"


def flag_trial(result: TrialResult, findings: Sequence[str]) -> None:
    """Add ``findings`` to the integrity gate (never removing one); they flag the trial:
    ``integrity_flagged``, no score, 1.0 on a leaderboard. A harness error stays one."""
    gate = result.gates.get("integrity")
    old = list(gate.findings) if gate is not None and gate.passed is False else []
    new = [t for t in findings if t not in old]
    if not new:
        return
    merged = [*old, *new]
    result.gates["integrity"] = GateResult(passed=False, detail=merged[0], findings=merged)
    if result.outcome != "harness_error":
        result.outcome = "integrity_flagged"
        result.score = result.score_ci = None
        result.leaderboard_score = 1.0


def write_trial(result: TrialResult, folder: Path) -> Path:
    path = folder / TRIAL_FILE
    write_atomic(path, result.to_json())
    return path


def read_trial(path: Path) -> TrialResult:
    return TrialResult.model_validate_json(path.read_text(encoding="utf-8"))


def strip_volatile(data: dict[str, Any]) -> dict[str, Any]:
    """``trial.json`` as a dict without its wall-clock keys (for reproducibility checks)."""
    return {k: v for k, v in data.items() if k not in VOLATILE_KEYS}


def load_trial_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def capped_sorted(values: Sequence[float], cap: int = LATENCY_CAP) -> list[float]:
    """``values`` sorted; when there are more than ``cap``, the ``cap`` order statistics at
    evenly spaced ranks (the smallest and the largest always kept), so the kept values trace
    the same empirical CDF to within ``1 / cap``. Deterministic: no random draw."""
    arr = np.sort(np.asarray(values, dtype=np.float64))
    arr = arr[np.isfinite(arr)]
    if arr.size > cap:
        arr = arr[np.round(np.linspace(0, arr.size - 1, cap)).astype(np.int64)]
    return [round(float(v), 4) for v in arr]


class SideLatencies(_Model):
    """One side's per-request latencies (ms), sorted, at most :data:`LATENCY_CAP` each."""

    requests: int = Field(description="completed requests of the run, before the cap")
    ttft_ms: list[float] = Field(default_factory=list)
    tpot_ms: list[float] = Field(default_factory=list)
    e2e_ms: list[float] = Field(default_factory=list)


class TrialLatencies(_Model):
    """``latencies.json``: the first evaluation pair's per-request latencies."""

    schema_: str = Field(default=LATENCIES_SCHEMA, alias="schema")
    cap: int = LATENCY_CAP
    method: str = (
        "first evaluation pair (for a rate objective, the run at the rate that side reached); "
        "each list sorted; above the cap, order statistics at evenly spaced ranks"
    )
    baseline: SideLatencies | None = None
    submission: SideLatencies | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def side_latencies(latencies: RequestLatencies | None) -> SideLatencies | None:
    """A run's latencies as ``latencies.json`` keeps them."""
    if latencies is None:
        return None
    return SideLatencies(
        requests=len(latencies.e2e_ms),
        ttft_ms=capped_sorted(latencies.ttft_ms),
        tpot_ms=capped_sorted(latencies.tpot_ms),
        e2e_ms=capped_sorted(latencies.e2e_ms),
    )


def write_latencies(folder: Path, latencies: dict[str, SideLatencies]) -> Path | None:
    """Write ``latencies.json`` (atomically) from an evaluation's ``latencies``
    (``baseline``, ``submission``); nothing when it is empty."""
    if not latencies:
        return None
    doc = TrialLatencies(baseline=latencies.get("baseline"), submission=latencies.get("submission"))
    path = folder / LATENCIES_FILE
    write_atomic(path, doc.model_dump_json(by_alias=True) + "\n")
    return path


def read_latencies(folder: Path) -> TrialLatencies | None:
    """A trial folder's ``latencies.json``; None when there is none or it does not parse
    (older trials have none)."""
    path = folder / LATENCIES_FILE
    try:
        return TrialLatencies.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
