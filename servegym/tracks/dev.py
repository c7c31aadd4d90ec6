"""A track's agent phase: what the one task environment asks of its track.

The agent works a task through one environment on every track
(:class:`servegym.runner.environment.TrackEnvironment`). It owns what all tracks share: the
task's public description, the experiment log, the budget checks, the baseline's dev
measurement (once per workload size, never charged), the improvement and accuracy ratios,
the workspace tools and the submission. What differs between tracks it asks the track's
:class:`DevSession` (``Track.dev_session``):

- how the task is tuned (:data:`~servegym.agents.base.Tuning`: configs, or a workspace whose
  ``start_server.sh`` is the submission), which knobs an agent may set, what the agent is
  told of the workload beyond its shape, and the price per GPU-hour;
- how a config (or the workspace's launcher) runs on the dev workload: a :class:`DevRun`
  with its measurement and raw accuracy, or why it did not run, and what it cost;
- the budget's unit and how it is spent (:class:`Budget`: simulated GPU-seconds the run
  reports, or wall seconds);
- the agent's workspace, where the track has one (:class:`DevWorkspace`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from servegym.agents.base import BudgetState, Tuning
from servegym.engines.config import ServingConfig
from servegym.engines.knob_info import KnobInfo
from servegym.sandbox.local import LocalSandbox
from servegym.sandbox.workspace import WorkspaceError
from servegym.scoring.metrics import Metrics
from servegym.scoring.objectives import ObjectiveMeasurement
from servegym.tasks.loader import LoadedTask, workload_spec
from servegym.tasks.spec import BudgetSpec
from servegym.tracks.base import DevBaseline
from servegym.workloads.generate import materialise
from servegym.workloads.model import Workload
from servegym.workloads.spec import WorkloadSpec

BudgetUnit = Literal["sim_gpu_seconds", "wall_seconds"]

QUICK_DIVISOR = 4
"""A quick experiment runs ``requests // QUICK_DIVISOR`` requests unless the task says."""


def changed_knobs(config: ServingConfig) -> dict[str, Any]:
    """The knobs ``config`` sets (what an experiment records as its config)."""
    return config.model_dump(mode="json", exclude_defaults=True)


class DevWorkloads:
    """The task's dev workload, full and quick (``workload.quick_requests``, default a
    quarter of the requests), each spec and workload built once, on first need."""

    def __init__(self, loaded: LoadedTask) -> None:
        self.loaded = loaded
        self.dev_seed = loaded.task.workload.dev_seed
        self._specs: dict[bool, tuple[WorkloadSpec, Path]] = {}
        self._workloads: dict[bool, Workload] = {}

    def spec(self, quick: bool) -> tuple[WorkloadSpec, Path]:
        """The spec, and the folder a relative trace path is read from."""
        if quick not in self._specs:
            requests: int | None = None
            if quick:
                full, _ = self.spec(False)
                requests = self.loaded.task.workload.quick_requests or max(
                    1, full.num_requests // QUICK_DIVISOR
                )
            self._specs[quick] = workload_spec(self.loaded, requests=requests)
        return self._specs[quick]

    def workload(self, quick: bool) -> Workload:
        if quick not in self._workloads:
            spec, base_dir = self.spec(quick)
            self._workloads[quick] = materialise(spec, self.dev_seed, base_dir=base_dir)
        return self._workloads[quick]


class Budget(ABC):
    """What an agent phase has spent of its budget, in its track's unit, and what is left.
    ``max_experiments`` caps every track; the environment counts the experiments."""

    unit: ClassVar[BudgetUnit]
    spent_label: ClassVar[str]
    """The unit in words (``simulated GPU-seconds``), for the exhausted message."""

    def __init__(self, spec: BudgetSpec) -> None:
        self.spec = spec
        self.used = 0.0

    @property
    @abstractmethod
    def limit(self) -> float | None:
        """The limit in :attr:`unit` (None: none)."""

    def charge(self, amount: float) -> None:
        """Charge an experiment's cost, in :attr:`unit`."""
        self.used += amount

    @abstractmethod
    def charge_wall(self, seconds: float) -> None:
        """Charge wall time spent outside the experiments (a workspace command, a coding
        CLI's session)."""

    @abstractmethod
    def left(self) -> float | None:
        """What is left in :attr:`unit` (None: no limit)."""

    @abstractmethod
    def _spent(self) -> tuple[float, float | None, float]:
        """``(sim GPU-seconds used, sim GPU-seconds left, wall seconds used)``."""

    def state(self, experiments_run: int) -> BudgetState:
        """The budget after ``experiments_run`` experiments, as an agent reads it."""
        b = self.spec
        sim_used, sim_left, wall = self._spent()
        return BudgetState(
            experiments_run=experiments_run,
            experiments_left=(
                None if b.max_experiments is None else max(b.max_experiments - experiments_run, 0)
            ),
            sim_gpu_seconds_used=sim_used,
            sim_gpu_seconds_left=sim_left,
            wall_seconds_used=wall,
            wall_seconds_left=None if b.wall_seconds is None else max(b.wall_seconds - wall, 0.0),
        )

    @abstractmethod
    def costs(self, cost: float) -> tuple[float, float]:
        """An experiment's ``cost`` as :class:`~servegym.agents.base.ExperimentResult`
        records it: ``(simulated GPU-seconds, wall seconds)``."""


class GpuSecondsBudget(Budget):
    """Simulated GPU-seconds, as the runs report them. No wall time counts unless the task
    sets ``budget.wall_seconds`` (then the clock since the agent phase began), so results
    stay deterministic."""

    unit = "sim_gpu_seconds"
    spent_label = "simulated GPU-seconds"

    def __init__(self, spec: BudgetSpec) -> None:
        super().__init__(spec)
        self._started = time.monotonic()

    @property
    def limit(self) -> float | None:
        return self.spec.sim_gpu_seconds

    def charge_wall(self, seconds: float) -> None:
        """The clock counts itself here."""

    def left(self) -> float | None:
        limit = self.spec.sim_gpu_seconds
        return None if limit is None else max(limit - self.used, 0.0)

    def costs(self, cost: float) -> tuple[float, float]:
        return cost, 0.0

    def _spent(self) -> tuple[float, float | None, float]:
        wall = 0.0 if self.spec.wall_seconds is None else time.monotonic() - self._started
        return self.used, self.left(), wall


class WallSecondsBudget(Budget):
    """Wall-clock seconds: each experiment's own, start-up included, and every workspace
    command's."""

    unit = "wall_seconds"
    spent_label = "wall seconds"

    @property
    def limit(self) -> float | None:
        return self.spec.wall_seconds

    def charge_wall(self, seconds: float) -> None:
        self.used += seconds

    def left(self) -> float | None:
        limit = self.spec.wall_seconds
        return None if limit is None else max(limit - self.used, 0.0)

    def costs(self, cost: float) -> tuple[float, float]:
        return 0.0, cost

    def _spent(self) -> tuple[float, float | None, float]:
        return 0.0, None, self.used


@dataclass
class DevRun:
    """One experiment's run on the dev workload, as the track reports it: its measurement
    (None: it did not run, and ``error`` and ``tail`` say why), its raw accuracy (the
    environment divides it by the baseline's), and its cost in the budget's unit."""

    cost: float
    measurement: ObjectiveMeasurement | None = None
    accuracy: float | None = None
    metrics: Metrics | None = None
    pipeline: dict[str, Any] | None = None
    error: str | None = None
    tail: str | None = None


@dataclass(frozen=True)
class DevWorkspace:
    """The agent's workspace on a track that has one: its sandbox (seeded with the
    baseline), and the folder a workspace submission is snapshotted into."""

    sandbox: LocalSandbox
    submission_dir: Path


class DevSession(ABC):
    """A track's agent phase (see the module docstring). Methods that measure raise
    :class:`~servegym.errors.HarnessError` for the harness's own failures and
    :class:`~servegym.errors.BrokenTask` for a baseline that does not run (the task's fault);
    a config that does not start is a :class:`DevRun` without a
    measurement."""

    tuning: Tuning = "config"
    workloads: DevWorkloads
    budget: Budget
    price_per_gpu_hour: float = 0.0
    refusal_cost: float = 0.0
    """What a config the engine refuses before start-up (bad arguments) costs."""
    refusal_note: str = " (the engine refused its arguments)"
    """Ends the message of such a refusal."""

    @abstractmethod
    def knobs(self) -> list[KnobInfo]:
        """The knobs an agent may set, with their defaults."""

    def workload_facts(self) -> dict[str, Any]:
        """What the agent is told of the dev workload beyond its shape (a pipeline's
        questions, a rate search's range). Default: nothing."""
        return {}

    @abstractmethod
    def baseline(self, quick: bool) -> DevBaseline:
        """The task's baseline on the dev workload (not charged)."""

    @abstractmethod
    def run(self, config: ServingConfig, quick: bool, index: int, baseline: DevBaseline) -> DevRun:
        """Experiment ``index``: start ``config``, measure it on the dev workload, stop it."""

    def open_workspace(self) -> DevWorkspace | None:
        """The agent's workspace, seeded on first open; None (the default): the track has
        none, and is tuned through configs alone."""
        return None

    def run_launcher(
        self, workspace: DevWorkspace, quick: bool, index: int, baseline: DevBaseline
    ) -> DevRun:
        """Experiment ``index`` of a workspace-tuned task: start the workspace's
        ``start_server.sh`` and measure it (its log's tail in ``tail`` even when it ran)."""
        raise WorkspaceError("this task is tuned through configs: it has no launcher to run")
