"""The task specification: what ``tasks/<id>/task.toml`` says.

A task names the model, hardware, engine(s), the baseline config, the workload and its dev
seed, the objective (and SLA), the accuracy gate and the budget. Beside it lie
``instruction.md`` (shown to the agent) and ``oracle.toml`` (an expert ServingConfig, never
shown to agents). The scoring seed is not in the task: the harness derives it from a secret.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from servegym.engines.config import ServingConfig
from servegym.scoring.sla import SLA
from servegym.tasks.pipeline_spec import PipelineSpec
from servegym.workloads.rng import MAX_SEED
from servegym.workloads.spec import MAX_COUNT, MAX_SCALE


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


Track = str
"""A track's name: a built-in's (``sim``, ``cpu``, ``gpu``, each with its row in
:data:`TRACK_TRAITS`) or an installed plug-in track's (see :func:`track_traits`)."""
Engine = Literal["sim", "vllm", "vllm-cpu", "sglang"]
Statistic = Literal["mean", "p50", "p90", "p95", "p99"]

ObjectiveKind = Literal[
    "output_throughput",  # output tokens/s, higher is better
    "ttft",  # TTFT at `statistic`, lower is better
    "tpot",
    "itl",
    "e2e",
    "turn_latency",  # agentic mean (or statistic) turn latency, lower is better
    "goodput",  # requests/s meeting every SLO at the workload's fixed rate, higher is better
    "max_rate_at_sla",  # highest arrival rate with SLA attainment >= target, higher is better
    "cost_at_sla",  # $ per M output tokens at that rate, lower is better
    "composite",  # geometric mean of the components' improvement ratios
    "pipeline_rate",  # pipeline tasks: answered questions/s, higher is better
    "pipeline_latency",  # pipeline tasks: question latency at `statistic`, s, lower is better
]
PIPELINE_KINDS = ("pipeline_rate", "pipeline_latency")


class ObjectiveSpec(_Strict):
    """What the task scores, and in which direction.

    Latency kinds take a ``statistic`` (default p90). ``max_rate_at_sla`` and ``cost_at_sla``
    search the arrival rate (Poisson, as MLPerf's Server scenario) between ``rate_min`` and
    ``rate_max`` for the highest rate whose SLA attainment is at least
    ``attainment_target`` in steady state: each probe sends ``rate_requests`` arrivals and
    counts those after the first ``rate_warmup`` of the arrival span, a window long enough
    that a queue growing by a few percent of the rate breaks the SLA inside it (a burst of a
    few hundred requests hides one); they need the task's ``sla``. ``composite`` scores the
    geometric mean of its ``components``' improvement ratios (each with its own direction).
    """

    kind: ObjectiveKind
    statistic: Statistic = "p90"
    attainment_target: float = Field(default=0.9, gt=0, le=1)
    rate_min: float = Field(default=0.1, gt=0)
    rate_max: float = Field(default=200.0, gt=0)
    rate_tolerance: float = Field(
        default=0.01, gt=0, lt=1, description="relative resolution of the rate search"
    )
    rate_requests: int = Field(
        default=4800,
        ge=50,
        le=100_000,
        description="requests one probe of the rate search sends as one steady Poisson "
        "stream (on an agentic workload, sessions enough for about that many turns)",
    )
    rate_warmup: float = Field(
        default=0.2,
        ge=0,
        le=0.5,
        description="share of a probe's arrival span dropped as warm-up before its SLA "
        "attainment is counted",
    )
    components: list[ObjectiveSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> ObjectiveSpec:
        if self.kind == "composite" and len(self.components) < 2:
            raise ValueError("a composite objective needs at least two components")
        if self.kind != "composite" and self.components:
            raise ValueError("only a composite objective has components")
        if self.rate_min >= self.rate_max:
            raise ValueError("rate_min must be < rate_max")
        return self

    @property
    def higher_is_better(self) -> bool:
        return self.kind in (
            "output_throughput",
            "goodput",
            "max_rate_at_sla",
            "composite",
            "pipeline_rate",
        )

    @property
    def needs_sla(self) -> bool:
        if self.kind == "composite":
            return any(c.needs_sla for c in self.components)
        return self.kind in ("goodput", "max_rate_at_sla", "cost_at_sla")

    def label(self) -> str:
        if self.kind in ("ttft", "tpot", "itl", "e2e", "turn_latency", "pipeline_latency"):
            return f"{self.kind} {self.statistic}"
        if self.kind == "composite":
            return "composite(" + ", ".join(c.label() for c in self.components) + ")"
        return self.kind


class WorkloadRef(_Strict):
    """The task's workload: a shipped workload by name, with field overrides."""

    name: str
    overrides: list[str] = Field(
        default_factory=list, description="dotted key=value, as `--set` on the command line"
    )
    requests: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    scale: float | None = Field(default=None, gt=0, le=MAX_SCALE)
    dev_seed: int = Field(default=0, ge=0, le=MAX_SEED, description="the seed agents see")
    quick_requests: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="requests of a quick experiment (default: a quarter)",
    )


class AccuracyGate(_Strict):
    """The submission's accuracy must be at least ``min_ratio`` of the baseline's. On a
    real track it also keeps answering the quality set (:mod:`servegym.scoring.quality`):
    its right answers at least ``quality_min_ratio`` of the baseline's."""

    min_ratio: float = Field(default=0.98, gt=0, le=1)
    quality_set: bool | None = Field(
        default=None,
        description="real tracks: ask both sides the quality set; default: on unless the "
        "model has random weights (servegym-tiny)",
    )
    quality_min_ratio: float = Field(default=0.95, gt=0, le=1)


class BudgetSpec(_Strict):
    """What the agent phase may spend. Sim: simulated GPU-seconds (each experiment costs the
    simulated start-up plus the benchmark's virtual duration, times the GPUs it uses); real
    tracks: wall seconds. ``max_experiments`` caps both."""

    sim_gpu_seconds: float | None = Field(default=None, gt=0)
    wall_seconds: float | None = Field(default=None, gt=0)
    max_experiments: int | None = Field(default=None, ge=1)
    max_agent_tokens: int | None = Field(default=None, ge=1)
    max_agent_dollars: float | None = Field(default=None, gt=0)


MIN_REPEATS = 5
"""The fewest paired repeats a final evaluation may run. The score's bootstrap interval is
over pairs, and no bootstrap reaches past the data: with ``n`` pairs the interval lies within
the pairs' range, which holds the centre with probability ``1 - 2^(1 - n)`` (75% for 3
pairs, 94% for 5; see :mod:`servegym.scoring.score`)."""


class IntegritySpec(_Strict):
    """The probe check of a real-track evaluation (see :mod:`servegym.scoring.probes`): the
    reference model re-scores ``probe_requests`` answers of the submission drawn after the
    run; a probe fails when fewer than ``min_within_share`` of its tokens are the
    reference's greedy choice within ``max_gap_nats``; the check fails when more than
    ``max_failed_share`` of the probes fail. The defaults pass honest bfloat16 (largest gap
    measured: 0.013 nats) and fail another model, replayed or constant tokens and sampling
    (gaps of about 1 nat)."""

    probe_requests: int = Field(default=32, ge=1, le=10_000)
    max_gap_nats: float = Field(default=0.1, gt=0, le=20)
    min_within_share: float = Field(default=0.95, gt=0, le=1)
    max_failed_share: float = Field(default=0.0, ge=0, lt=1)


class EvaluationSpec(_Strict):
    """How the final evaluation measures baseline and submission (paired, alternating)."""

    repeats: int = Field(
        default=5,
        ge=MIN_REPEATS,
        le=100,
        description="paired baseline/submission runs; at least 5: the score's bootstrap "
        "interval is over pairs",
    )
    max_repeats: int | None = Field(
        default=None,
        le=100,
        description="adaptive pairs: add pairs past `repeats` until the score's interval "
        "half-width is at most `target_half_width`, this many pairs ran, or `pairs_time_s` is "
        "spent (None: exactly `repeats` pairs)",
    )
    target_half_width: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="adaptive pairs stop once sqrt(high / low) - 1 of the interval is at most this",
    )
    pairs_time_s: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="adaptive pairs: wall seconds the pairs may take; no pair is added that "
        "would overrun it",
    )
    bootstrap_samples: int = Field(default=2000, ge=100)
    oracle_min_score: float = Field(
        default=1.2, gt=1.0, description="the expert config must score at least this"
    )
    nop_tolerance: float = Field(
        default=0.05, gt=0, description="the baseline must score 1.0 within this"
    )
    start_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=7200,
        description="real tracks: a server not ready within this is a launch failure",
    )
    request_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=7200,
        description="real tracks: a request not finished within this fails (a hung stream)",
    )
    warmup_runs: int = Field(
        default=1,
        ge=0,
        le=10,
        description="real tracks: unmeasured runs of each side, on a workload sample no pair "
        "uses, before the pairs (a server's first runs after start are slower)",
    )

    @field_validator("repeats", mode="before")
    @classmethod
    def _enough_pairs(cls, value: object) -> object:
        # Before the ``ge`` check, so a task author reads why rather than a bare bound.
        if isinstance(value, int) and not isinstance(value, bool) and value < MIN_REPEATS:
            raise ValueError(
                f"at least {MIN_REPEATS} paired repeats are needed, got {value}: the score's "
                "bootstrap interval is over pairs"
            )
        return value

    @model_validator(mode="after")
    def _limit_above_minimum(self) -> EvaluationSpec:
        if self.max_repeats is not None and self.max_repeats < self.repeats:
            raise ValueError(
                f"max_repeats ({self.max_repeats}) must be at least repeats ({self.repeats})"
            )
        return self

    @property
    def pair_limit(self) -> int:
        """The most pairs an evaluation may run (each needs its own workload sample)."""
        return self.max_repeats if self.max_repeats is not None else self.repeats


@dataclass(frozen=True, slots=True)
class TrackTraits:
    """What a track allows and how it counts, as data: the task spec's validation reads it
    here, low; the track classes (:mod:`servegym.tracks`) and the runner read it too, so no
    layer tests a track's name."""

    engines: tuple[str, ...]
    simulated: bool
    """Virtual time on modelled hardware: a sim GPU-seconds budget, rate-search objectives,
    and the model and hardware must be profiles of the simulator."""
    pipelines: bool
    """Pipeline tasks may run on it."""
    readiness: Literal["none", "cpu_engine", "nvidia_gpus"]
    """What the machine needs before a trial runs (see ``check_track_ready``)."""
    occupies: Literal["nothing", "host_cpus", "one_gpu"]
    """What one trial holds while it runs, so a sweep schedules it: ``nothing`` (virtual
    time: trials run side by side), ``host_cpus`` (real servers on the host's cores: one
    such trial at a time per host, or they measure each other), ``one_gpu``."""

    @property
    def budget_unit(self) -> Literal["sim_gpu_seconds", "wall_seconds"]:
        return "sim_gpu_seconds" if self.simulated else "wall_seconds"

    @property
    def rate_objectives(self) -> bool:
        """Objectives that search the arrival rate over tens of runs."""
        return self.simulated


TRACK_TRAITS: dict[str, TrackTraits] = {
    "sim": TrackTraits(
        engines=("sim",), simulated=True, pipelines=True, readiness="none", occupies="nothing"
    ),
    "cpu": TrackTraits(
        engines=("vllm-cpu",),
        simulated=False,
        pipelines=True,
        readiness="cpu_engine",
        occupies="host_cpus",
    ),
    "gpu": TrackTraits(
        engines=("vllm", "sglang"),
        simulated=False,
        pipelines=False,
        readiness="nvidia_gpus",
        occupies="one_gpu",
    ),
}
TRACK_ENGINES: dict[str, tuple[str, ...]] = {k: t.engines for k, t in TRACK_TRAITS.items()}
TRACKS_GROUP = "servegym.tracks"
"""The entry-point group of plug-in tracks (:data:`servegym.tracks.base.TRACKS` reads it too)."""


def track_traits(name: str) -> TrackTraits | None:
    """The traits of the track called ``name``, or None for no such track. A built-in's
    are its row of :data:`TRACK_TRAITS`; a plug-in track's class declares its own
    (``traits``): read here through its ``servegym.tracks`` entry point on first need (so a
    task names it without ServeGym being edited), or recorded when the class is registered
    in-process (:func:`servegym.tracks.base.register_track`)."""
    if name not in TRACK_TRAITS:
        for ep in importlib.metadata.entry_points(group=TRACKS_GROUP, name=name):
            try:
                traits = getattr(ep.load(), "traits", None)
            except Exception as e:
                raise ValueError(f"plug-in track '{name}' cannot be loaded: {e}") from None
            if isinstance(traits, TrackTraits):
                TRACK_TRAITS[name] = traits
            break
    return TRACK_TRAITS.get(name)


def track_names() -> list[str]:
    """Every track a task may name: the built-ins and installed plug-ins."""
    found = set(TRACK_TRAITS)
    found.update(ep.name for ep in importlib.metadata.entry_points(group=TRACKS_GROUP))
    return sorted(found)


RATE_KINDS = ("max_rate_at_sla", "cost_at_sla")


MAX_ID_LENGTH = 128
"""The longest task id: it names the task's folder and its trial folders (a file name holds
at most 255 bytes)."""


class Task(_Strict):
    """One task (``tasks/<id>/task.toml``)."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=MAX_ID_LENGTH)
    title: str
    track: Track
    model: str
    hardware: str
    price_per_hour: float | None = Field(
        default=None, ge=0, description="$ per GPU-hour; default: the hardware profile's"
    )
    engines: list[Engine] = Field(min_length=1)
    sim_engine: str = Field(
        default="vllm",
        description="sim track: which serving engine the simulator models (an engine profile "
        "of servegym/engines/sim/profiles/engines/: vllm, tensorrt-llm)",
    )
    max_gpus: int = Field(
        default=1, ge=1, le=8, description="GPUs the deployment may use (tensor parallel cap)"
    )
    baseline: ServingConfig = Field(default_factory=ServingConfig)
    workload: WorkloadRef
    objective: ObjectiveSpec
    sla: SLA | None = None
    accuracy: AccuracyGate = Field(default_factory=AccuracyGate)
    integrity: IntegritySpec = Field(default_factory=IntegritySpec)
    budget: BudgetSpec
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    tags: list[str] = Field(default_factory=list)
    pipeline: PipelineSpec | None = Field(
        default=None,
        description="a pipeline task: the RAG pipeline's fixed shape (servegym.pipeline)",
    )
    agent_network: bool = Field(
        default=False,
        description="real tracks: whether the agent's commands may reach the network",
    )
    mirror_of: str | None = Field(
        default=None,
        description="the sim task this real-track task mirrors (same model, hardware, "
        "workload, objective and budget); `servegym task validate` checks its oracle on it",
    )
    validated: bool | None = Field(
        default=None,
        description="real tracks: whether `servegym task validate` has passed the task on a "
        "host of its track (it writes this and validated_on); None: not tracked",
    )
    validated_on: str | None = Field(
        default=None, description="the host and date of that validation (written by it)"
    )

    @field_validator("track")
    @classmethod
    def _known_track(cls, value: str) -> str:
        if track_traits(value) is None:
            raise ValueError(f"unknown track '{value}' (known: {', '.join(track_names())})")
        return value

    @property
    def traits(self) -> TrackTraits:
        """The task's track's :class:`TrackTraits`."""
        return TRACK_TRAITS[self.track]

    @model_validator(mode="after")
    def _check(self) -> Task:
        if self.objective.needs_sla and self.sla is None:
            raise ValueError(f"objective '{self.objective.label()}' needs an [sla] table")
        tp = self.baseline.tensor_parallel_size or 1
        if tp > self.max_gpus:
            raise ValueError(
                f"the baseline's tensor_parallel_size {tp} exceeds max_gpus {self.max_gpus}"
            )
        traits = self.traits
        if traits.simulated and self.engines != list(traits.engines):
            raise ValueError(f"a {self.track} task's engines must be {list(traits.engines)}")
        if traits.simulated and self.budget.sim_gpu_seconds is None:
            raise ValueError(f"a {self.track} task needs budget.sim_gpu_seconds")
        if traits.simulated and self.accuracy.quality_set:
            raise ValueError(
                "accuracy.quality_set is asked of real servers; the simulator models accuracy"
            )
        if traits.simulated and self.validated is not None:
            raise ValueError("validated is for real-track tasks (a sim task validates anywhere)")
        if not traits.simulated and self.sim_engine != "vllm":
            raise ValueError(
                f"sim_engine is for sim tasks; the {self.track} track runs real engines"
            )
        if not traits.simulated and self.budget.wall_seconds is None:
            raise ValueError(f"a {self.track} task needs budget.wall_seconds")
        allowed = traits.engines
        wrong = [e for e in self.engines if e not in allowed]
        if wrong:
            raise ValueError(
                f"engine '{wrong[0]}' does not run on the {self.track} track "
                f"(allowed: {', '.join(allowed)})"
            )
        objectives = self.objective.components or [self.objective]
        pipeline_kinds = [o.kind for o in objectives if o.kind in PIPELINE_KINDS]
        if self.pipeline is not None:
            if not traits.pipelines:
                on = [k for k, t in TRACK_TRAITS.items() if t.pipelines]
                raise ValueError(f"pipeline tasks run on the {' and '.join(on)} tracks (for now)")
            if len(pipeline_kinds) != len(objectives):
                raise ValueError(
                    "a pipeline task's objective must be pipeline_rate or pipeline_latency"
                )
        elif pipeline_kinds:
            raise ValueError(f"objective '{pipeline_kinds[0]}' needs a [pipeline] table")
        if self.pipeline is None and self.baseline.pipeline is not None:
            raise ValueError("baseline.pipeline is for pipeline tasks only (no [pipeline] table)")
        if not traits.rate_objectives:
            rate = [o.kind for o in objectives if o.kind in RATE_KINDS]
            if rate:
                raise ValueError(
                    f"objective '{rate[0]}' searches the arrival rate over tens of runs: "
                    "sim tasks only (real tracks score one-run objectives)"
                )
        return self
