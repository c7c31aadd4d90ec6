"""The sim track: a config starts as a simulated engine and is measured in virtual time;
on a pipeline task (:class:`SimPipelineTrack`, chosen by :func:`servegym.tracks.track_for`)
it starts as a simulated pipeline deployment
(:func:`servegym.pipeline.engine.launch_pipeline`).

**The agent phase** (:class:`SimDevSession`): an experiment launches the config and measures
the task's objective on the dev workload (``quick``: fewer requests), with measurement
noise seeded from ``(task, dev seed, trial seed, experiment index)``, so repeating an
experiment gives a slightly different number, as on a real GPU. The budget (simulated
GPU-seconds) is charged per experiment: ``(startup_s + virtual seconds of every simulation
it ran) x GPUs``, the simulation time including warm-up and, for a rate search, every probe.
A rate search stops between probes once the experiment has spent what was left of the
budget, and reports the best rate it had bracketed (``log_tail`` says so): probes at low
rates are long, and one bad config must not overspend the budget many times over. A single
run is never cut short, so one experiment can still cross the limit by up to its own
length. A config that fails to launch costs :data:`LAUNCH_FAILURE_SIM_SECONDS` x its GPUs (a
real engine fails part-way through its start-up); one the engine refuses before start-up
costs :data:`INVALID_CONFIG_SIM_SECONDS`.

**The final evaluation** (:class:`SimEvaluation`): pair ``i`` runs its own sample of the
scoring workload (the task's spec at :func:`~servegym.tracks.base.pair_seed` of the hidden
scoring seed, as the real tracks do), each run with its own noise seed
(``stable_seed("score-<role>", task, scoring seed, i)``), so the pairs vary as the workload
and repeated runs on a real GPU do, and a trial's interval covers both. Rate searches start,
for the first pair, at the geometric middle of the range (baseline) and at the rate the
baseline found (submission), bracketing by factors of 2; for every later pair at the rate
that side found on the first pair, bracketing by :data:`NEAR_BRACKET` (a sample moves a
side's rate by a few percent, so a narrow bracket finds it in fewer probes). A side's
accuracy is the launch's modelled accuracy; a side costs the task's price per GPU-hour
(default: the hardware profile's) for every GPU it occupies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servegym.engines.config import ServingConfig
from servegym.engines.knob_info import KnobInfo
from servegym.engines.pipeline_knobs import pipeline_knob_infos
from servegym.engines.sim.defaults import KNOBS, knob_defaults
from servegym.engines.sim.launch import LaunchError, launch
from servegym.engines.sim.profiles import HardwareProfile, ModelProfile, get_hardware, get_model
from servegym.errors import BrokenTask, HarnessError, UserError
from servegym.pipeline.engine import launch_pipeline
from servegym.scoring.objectives import RATE_BRACKET_FACTOR, ObjectiveMeasurement
from servegym.tasks.loader import TASK_FILE, LoadedTask, workload_spec
from servegym.tasks.secrets import stable_seed
from servegym.tasks.spec import RATE_KINDS, Task
from servegym.tracks.base import (
    DevBaseline,
    EvaluationSession,
    Role,
    SampleInfo,
    StartedSide,
    Track,
    TrackSetup,
    pair_seed,
    register_track,
)
from servegym.tracks.dev import (
    DevRun,
    DevSession,
    DevWorkloads,
    GpuSecondsBudget,
    changed_knobs,
)
from servegym.tracks.sim_measure import SimEngine, measure_objective, task_price
from servegym.workloads.generate import materialise

LAUNCH_FAILURE_SIM_SECONDS = 30.0
"""Simulated seconds per GPU charged for a config that fails to launch."""
INVALID_CONFIG_SIM_SECONDS = 1.0
"""Simulated GPU-seconds charged for a config the engine rejects before start-up (bad
arguments): little, but not nothing, so an agent cannot loop on invalid configs for free."""
TRUNCATED_NOTE = (
    "note: the budget ran out during the arrival-rate search; it stopped early and reports "
    "the highest passing rate it had bracketed (0 if none)"
)
NEAR_BRACKET = 1.05
"""The bracketing factor of a rate search that starts at the same side's rate on another
sample of the workload."""


def first_rate(m: ObjectiveMeasurement) -> float | None:
    """The arrival rate a rate objective (or a composite's first rate component) reached:
    where the next rate search starts."""
    if m.rate is not None and m.kind in ("max_rate_at_sla", "cost_at_sla"):
        return m.rate
    for c in m.components:
        r = first_rate(c)
        if r is not None:
            return r
    return None


def engine_knobs(
    model: ModelProfile, hardware: HardwareProfile, *, pipeline_table: bool
) -> list[KnobInfo]:
    """The simulated engine's knobs with their defaults on ``model`` and ``hardware``; the
    ``pipeline`` table among them only on a pipeline task."""
    defaults = knob_defaults(model, hardware)
    return [
        KnobInfo(
            name=k.name,
            default=str(defaults.get(k.name, k.default)),
            help=f"{k.help} (default: {k.default})",
        )
        for k in KNOBS
        if k.name != "pipeline" or pipeline_table
    ]


@dataclass
class SimSide(StartedSide):
    engine: SimEngine | None = None


def started(task: Task, engine: SimEngine) -> SimSide:
    price = task_price(task, engine)
    return SimSide(
        up=True,
        startup_s=engine.startup_s,
        num_gpus=engine.num_gpus,
        price_per_hour=price.price_per_hour * price.gpus,
        engine=engine,
    )


@register_track("sim")
class SimTrack(Track):
    """The simulator (see the module docstring): a config starts as one simulated engine."""

    name = "sim"

    @classmethod
    def for_task(cls, loaded: LoadedTask, setup: TrackSetup) -> Track:
        if setup.servers != "local":
            raise UserError(
                f"--sandbox {setup.servers}: task {loaded.id} is on the simulator, which "
                "starts no server (the sandbox is for the cpu and gpu tracks)"
            )
        return SimPipelineTrack() if loaded.task.pipeline is not None else cls()

    @classmethod
    def preflight(cls, loaded: LoadedTask) -> None:
        """A launch is a pure function of the config, the model and the hardware, so the
        baseline's is tried here; and the budget must cover one start-up of it (below that
        no experiment can run, and since the experiment that crosses the limit completes, a
        budget of 1 GPU-second would be overspent about 60x by the first one)."""
        task = loaded.task
        track = cls.for_task(loaded, TrackSetup())
        assert isinstance(track, SimTrack)
        model, hardware = SimTrack.profiles(task)
        spec, _ = workload_spec(loaded)
        try:
            engine = track.launch(task, model, hardware, task.baseline, workload_family=spec.kind)
        except LaunchError as e:
            raise BrokenTask(f"the task's baseline config does not launch: {e.message}") from None
        startup = engine.startup_s * engine.num_gpus
        limit = task.budget.sim_gpu_seconds
        if limit is not None and limit < startup:
            raise UserError(
                f"{loaded.path / TASK_FILE}: budget.sim_gpu_seconds = {limit:g} does not cover "
                f"one start-up of the baseline ({startup:.1f} simulated GPU-seconds): no "
                "experiment could run within it"
            )

    def launch(
        self, task: Task, model: ModelProfile, hardware: HardwareProfile, config: ServingConfig,
        *, workload_family: str,
    ) -> SimEngine:  # fmt: skip
        """Start ``config`` for ``task``, or raise :class:`LaunchError`."""
        return launch(
            model, hardware, config, workload_family=workload_family,
            available_gpus=task.max_gpus, engine=task.sim_engine,
        )  # fmt: skip

    def knobs(self, task: Task, model: ModelProfile, hardware: HardwareProfile) -> list[KnobInfo]:
        """The knobs an agent may set, with their defaults on ``model`` and ``hardware``."""
        return engine_knobs(model, hardware, pipeline_table=False)

    def workload_facts(self, task: Task) -> dict[str, Any]:
        """What an agent is told of the workload beyond its shape: a rate search's range."""
        objective = task.objective
        if objective.kind in RATE_KINDS or any(c.kind in RATE_KINDS for c in objective.components):
            return {
                "rate_search": {
                    "arrival": "poisson",
                    "rate_min": objective.rate_min,
                    "rate_max": objective.rate_max,
                    "attainment_target": objective.attainment_target,
                    "rate_tolerance": objective.rate_tolerance,
                }
            }
        return {}

    def dev_session(self, loaded: LoadedTask, trial_seed: int) -> DevSession:
        return SimDevSession(self, loaded, trial_seed)

    def evaluation(self, loaded: LoadedTask, scoring_seed: int) -> EvaluationSession:
        return SimEvaluation(self, loaded, scoring_seed)

    @staticmethod
    def profiles(task: Task) -> tuple[ModelProfile, HardwareProfile]:
        return get_model(task.model, "model"), get_hardware(task.hardware, "hardware")


class SimPipelineTrack(SimTrack):
    """A pipeline task on the simulator: a config starts as a pipeline deployment (its LLM
    server(s), embedder, reranker and index: :mod:`servegym.pipeline.engine`), tuned through
    its ``[pipeline]`` knobs besides the server's."""

    def launch(
        self, task: Task, model: ModelProfile, hardware: HardwareProfile, config: ServingConfig,
        *, workload_family: str,
    ) -> SimEngine:  # fmt: skip
        return launch_pipeline(task, model, hardware, config, workload_family=workload_family)

    def knobs(self, task: Task, model: ModelProfile, hardware: HardwareProfile) -> list[KnobInfo]:
        return engine_knobs(model, hardware, pipeline_table=True) + pipeline_knob_infos()

    def workload_facts(self, task: Task) -> dict[str, Any]:
        assert task.pipeline is not None
        return {"pipeline": task.pipeline.model_dump(mode="json"), **super().workload_facts(task)}


class SimEvaluation(EvaluationSession):
    """One final evaluation in virtual time (see the module docstring)."""

    def __init__(self, track: SimTrack, loaded: LoadedTask, scoring_seed: int) -> None:
        self.track = track
        self.task = task = loaded.task
        self.scoring_seed = scoring_seed
        self.model, self.hardware = SimTrack.profiles(task)
        self.spec, self.base_dir = workload_spec(loaded)
        self.seeds = [pair_seed(scoring_seed, i) for i in range(task.evaluation.pair_limit)]
        self.workloads = [materialise(self.spec, s, base_dir=self.base_dir) for s in self.seeds]
        first = self.workloads[0]
        self.sample = SampleInfo(
            first.spec.name,
            first.spec.num_requests,
            first.content_hash(),
            tuple(w.content_hash() for w in self.workloads),
        )
        self.min_accuracy = task.accuracy.min_ratio
        self.hint: float | None = None
        self.first_rates: dict[Role, float | None] = {}

    def _launch(self, config: ServingConfig) -> SimEngine:
        return self.track.launch(
            self.task, self.model, self.hardware, config, workload_family=self.spec.kind
        )

    async def start_baseline(self) -> StartedSide:
        try:
            engine = self._launch(self.task.baseline)
        except LaunchError as e:
            raise BrokenTask(f"the task's baseline config does not launch: {e.message}") from None
        return started(self.task, engine)

    async def start_submission(self, submission: Any) -> StartedSide:
        assert isinstance(submission, ServingConfig)
        try:
            engine = self._launch(ServingConfig.model_validate(submission.model_dump()))
        except LaunchError as e:
            return SimSide(up=False, error=e.message)
        return started(self.task, engine)

    async def measure(self, side: StartedSide, role: Role, i: int) -> ObjectiveMeasurement:
        assert isinstance(side, SimSide) and side.engine is not None
        hint, bracket = self.hint, RATE_BRACKET_FACTOR
        if i > 0 and self.first_rates.get(role) is not None:
            hint, bracket = self.first_rates[role], NEAR_BRACKET
        m = measure_objective(
            self.task,
            side.engine,
            self.spec,
            self.seeds[i],
            stable_seed(f"score-{role}", self.task.id, self.scoring_seed, i),
            base_dir=self.base_dir,
            workload=self.workloads[i],
            rate_hint=hint,
            bracket_factor=bracket,
        )
        if i == 0:
            self.first_rates[role] = first_rate(m)
            if role == "baseline":
                self.hint = first_rate(m)
        return m

    def accuracy(self, side: StartedSide | None, role: Role) -> float | None:
        if not isinstance(side, SimSide) or side.engine is None:
            return None
        return side.engine.accuracy_ratio

    async def close(self) -> None:
        """Nothing runs between calls in virtual time."""


# --------------------------------------------------------------------------- agent phase


def launch_log(loaded: LoadedTask, config: ServingConfig, message: str) -> str:
    """The tail of a (simulated) engine log that ends in a failed start-up."""
    task = loaded.task
    lines = [
        f"INFO [sim] Starting the simulated vLLM engine: model={task.model} "
        f"hardware={task.hardware}",
        f"INFO [sim] Engine arguments set: {changed_knobs(config) or '{} (all defaults)'}",
        "ERROR [sim] Engine core initialization failed. See the root cause above.",
        *message.splitlines(),
    ]
    return "\n".join(lines)


class SimDevSession(DevSession):
    """The agent phase in virtual time (see the module docstring)."""

    refusal_cost = INVALID_CONFIG_SIM_SECONDS

    def __init__(self, track: SimTrack, loaded: LoadedTask, trial_seed: int) -> None:
        self.track = track
        self.loaded = loaded
        self.task = task = loaded.task
        self.trial_seed = trial_seed
        self.model, self.hardware = SimTrack.profiles(task)
        self.workloads = DevWorkloads(loaded)
        self.dev_seed = self.workloads.dev_seed
        self.budget = GpuSecondsBudget(task.budget)
        self.price_per_gpu_hour = (
            task.price_per_hour if task.price_per_hour is not None else self.hardware.price_per_hour
        )

    def _launch(self, config: ServingConfig) -> SimEngine:
        spec, _ = self.workloads.spec(False)
        return self.track.launch(
            self.task, self.model, self.hardware, config, workload_family=spec.kind
        )

    def knobs(self) -> list[KnobInfo]:
        return self.track.knobs(self.task, self.model, self.hardware)

    def workload_facts(self) -> dict[str, Any]:
        return self.track.workload_facts(self.task)

    def baseline(self, quick: bool) -> DevBaseline:
        """The baseline's objective and modelled accuracy on the dev workload."""
        try:
            engine = self._launch(self.task.baseline)
        except LaunchError as e:
            raise BrokenTask(f"the task's baseline config does not launch: {e.message}") from None
        spec, base_dir = self.workloads.spec(quick)
        try:
            m = measure_objective(
                self.task,
                engine,
                spec,
                self.dev_seed,
                stable_seed("dev-baseline", self.task.id, self.dev_seed, quick),
                base_dir=base_dir,
                workload=self.workloads.workload(quick),
            )
        except Exception as e:
            raise HarnessError(f"baseline dev measurement: {type(e).__name__}: {e}") from e
        return DevBaseline(m, engine.accuracy_ratio)

    def run(self, config: ServingConfig, quick: bool, index: int, baseline: DevBaseline) -> DevRun:
        try:
            engine = self._launch(config)
        except LaunchError as e:
            gpus = min(config.tensor_parallel_size or 1, self.task.max_gpus)
            return DevRun(
                cost=LAUNCH_FAILURE_SIM_SECONDS * gpus,
                error=e.message,
                tail=launch_log(self.loaded, config, e.message),
            )
        spec, base_dir = self.workloads.spec(quick)
        left = self.budget.left()
        cap = None if left is None else max(left / engine.num_gpus - engine.startup_s, 0.0)
        try:
            m = measure_objective(
                self.task,
                engine,
                spec,
                self.dev_seed,
                stable_seed(
                    "dev-experiment", self.task.id, self.dev_seed, self.trial_seed, index, quick
                ),
                base_dir=base_dir,
                workload=self.workloads.workload(quick),
                rate_hint=first_rate(baseline.measurement),
                sim_seconds_cap=cap,
            )
        except Exception as e:  # the harness's own failure, not the agent's
            raise HarnessError(f"experiment {index}: {type(e).__name__}: {e}") from e
        return DevRun(
            cost=(engine.startup_s + m.sim_seconds) * engine.num_gpus,
            measurement=m,
            accuracy=engine.accuracy_ratio,
            metrics=m.metrics,
            pipeline=m.pipeline.summary() if m.pipeline is not None else None,
            tail=TRUNCATED_NOTE if m.search_truncated else None,
        )
