"""The sim track: a config starts as a simulated engine (or, on a pipeline task, a simulated
pipeline deployment: :func:`servegym.pipeline.engine.launch_task`) and is measured in
virtual time.

In the final evaluation pair ``i`` runs its own sample of the scoring workload (the task's
spec at :func:`~servegym.tracks.base.pair_seed` of the hidden scoring seed, as the real
tracks do), each run with its own noise seed
(``stable_seed("score-<role>", task, scoring seed, i)``), so the pairs vary as the workload
and repeated runs on a real GPU do, and a trial's interval covers both. Rate searches start,
for the first pair, at the geometric middle of the range (baseline) and at the rate the
baseline found (submission), bracketing by factors of 2; for every later pair at the rate
that side found on the first pair, bracketing by :data:`NEAR_BRACKET` (a sample moves a
side's rate by a few percent, so a narrow bracket finds it in fewer probes). A side's
accuracy is the launch's modelled accuracy; a side costs the task's price
per GPU-hour (default: the hardware profile's) for every GPU it occupies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servegym.engines.config import ServingConfig
from servegym.engines.sim.launch import LaunchError
from servegym.engines.sim.profiles import HardwareProfile, ModelProfile, get_hardware, get_model
from servegym.errors import HarnessError
from servegym.pipeline.engine import launch_task
from servegym.scoring.objectives import RATE_BRACKET_FACTOR, ObjectiveMeasurement
from servegym.tasks.loader import LoadedTask, workload_spec
from servegym.tasks.secrets import stable_seed
from servegym.tasks.spec import Task
from servegym.tracks.base import (
    EvaluationSession,
    Role,
    SampleInfo,
    StartedSide,
    Track,
    pair_seed,
)
from servegym.tracks.sim_measure import SimEngine, measure_objective, task_price
from servegym.workloads.generate import materialise

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


class SimTrack(Track):
    """The simulator (see the module docstring)."""

    name = "sim"

    def evaluation(self, loaded: LoadedTask, scoring_seed: int) -> EvaluationSession:
        return SimEvaluation(loaded, scoring_seed)

    @staticmethod
    def profiles(task: Task) -> tuple[ModelProfile, HardwareProfile]:
        return get_model(task.model, "model"), get_hardware(task.hardware, "hardware")


class SimEvaluation(EvaluationSession):
    """One final evaluation in virtual time (see the module docstring)."""

    def __init__(self, loaded: LoadedTask, scoring_seed: int) -> None:
        self.task = task = loaded.task
        self.scoring_seed = scoring_seed
        self.model, self.hardware = SimTrack.profiles(task)
        self.spec, self.base_dir = workload_spec(loaded)
        self.seeds = [pair_seed(scoring_seed, i) for i in range(task.evaluation.repeats)]
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
        return launch_task(
            self.task, self.model, self.hardware, config, workload_family=self.spec.kind
        )

    async def start_baseline(self) -> StartedSide:
        try:
            engine = self._launch(self.task.baseline)
        except LaunchError as e:
            raise HarnessError(f"the task's baseline config does not launch: {e.message}") from None
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
