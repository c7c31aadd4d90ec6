"""The agent's window on a sim-track task: :class:`SimTaskEnvironment`.

An agent reads the task (:meth:`~SimTaskEnvironment.describe`), runs experiments
(:meth:`~SimTaskEnvironment.run_experiment`) and submits a config
(:meth:`~SimTaskEnvironment.submit`). Everything it may see is the task's public part:
the instruction, model, hardware, knobs, the *dev* workload (its seed is public), the
objective, SLA, accuracy gate and budget. The scoring seed and the oracle config never pass
through here.

**An experiment** launches the config on the simulated engine and measures the task's
objective on the dev workload (``quick``: the same workload with
``workload.quick_requests`` requests, default a quarter), with measurement noise seeded
from ``(task, dev seed, trial seed, experiment index)``, so repeating an experiment gives a
slightly different number, as on a real GPU. Its improvement is against the baseline config
measured on the same dev workload (once per workload size, on first need, never charged).

**The budget** (simulated GPU-seconds) is charged per experiment:
``(startup_s + virtual seconds of every simulation it ran) x GPUs``, the simulation time
including warm-up and, for a rate search, every probe. A rate search stops between probes
once the experiment has spent what was left of the budget, and reports the best rate it had
bracketed (``log_tail`` says so): probes at low rates are long, and one bad config must not
overspend the budget many times over. A single run is never cut short, so one experiment
can still cross the limit by up to its own length. A config that fails to launch costs
:data:`LAUNCH_FAILURE_SIM_SECONDS` x its GPUs (a real engine fails part-way through its
start-up). An experiment asked for when nothing is left (GPU-seconds, experiments, or wall
seconds where the task sets them) raises :class:`BudgetExhausted`; the experiment that
crosses the limit completes and is charged in full. The sim track counts no wall time
unless the task sets ``budget.wall_seconds``, so its results stay deterministic.

Every experiment is appended (and written through) to ``experiments.jsonl`` as an
:class:`ExperimentResult`, one whole line each: a write that fails (a full disk) is cut
back to the last whole line and ends the trial with one line (:attr:`write_error`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servegym.agents.base import BudgetExhausted, BudgetState, ExperimentResult, TaskDescription
from servegym.engines.config import ServingConfig
from servegym.engines.knob_info import KnobInfo
from servegym.engines.launcher import LauncherSubmission
from servegym.engines.pipeline_knobs import pipeline_knob_infos
from servegym.engines.sim.defaults import KNOBS, knob_defaults
from servegym.engines.sim.launch import LaunchError
from servegym.engines.sim.profiles import get_hardware, get_model
from servegym.errors import HarnessError, UserError
from servegym.pipeline.engine import launch_task
from servegym.run_folder import PRIVATE_DIR, LineLog
from servegym.runner.agent_watch import Action
from servegym.scoring.objectives import ObjectiveMeasurement, measurement_improvement
from servegym.tasks.loader import LoadedTask, workload_spec
from servegym.tasks.secrets import stable_seed
from servegym.tasks.spec import Task
from servegym.tracks.base import DevBaseline
from servegym.tracks.sim import first_rate
from servegym.tracks.sim_measure import SimEngine, measure_objective
from servegym.workloads.generate import materialise
from servegym.workloads.model import Workload
from servegym.workloads.spec import WorkloadSpec
from servegym.workloads.summary import summarise

LAUNCH_FAILURE_SIM_SECONDS = 30.0
"""Simulated seconds per GPU charged for a config that fails to launch."""
INVALID_CONFIG_SIM_SECONDS = 1.0
"""Simulated GPU-seconds charged for a config the engine rejects before start-up (bad
arguments): little, but not nothing, so an agent cannot loop on invalid configs for free."""
TRUNCATED_NOTE = (
    "note: the budget ran out during the arrival-rate search; it stopped early and reports "
    "the highest passing rate it had bracketed (0 if none)"
)
QUICK_DIVISOR = 4
"""A quick experiment runs ``requests // QUICK_DIVISOR`` requests unless the task says."""


def config_key(config: ServingConfig) -> str:
    """A canonical string of the knobs set (for counting distinct configs)."""
    return config.model_dump_json(exclude_defaults=True)


def changed_knobs(config: ServingConfig) -> dict[str, Any]:
    return config.model_dump(mode="json", exclude_defaults=True)


def _raw_config(raw: object) -> dict[str, Any]:
    """Best-effort JSON-able form of a config that did not validate."""
    if isinstance(raw, dict):
        return {
            str(k): v if isinstance(v, str | int | float | bool | None) else repr(v)
            for k, v in raw.items()
        }
    return {"value": repr(raw)}


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


class EnvironmentBase:
    """What both tracks' environments share: the task's dev workload, full and quick
    (``workload.quick_requests``, default a quarter of the requests), each built once; the
    experiment log (``experiments.jsonl``, flushed per line); the budget state an experiment
    reports; and the submission."""

    loaded: LoadedTask
    task: Task
    dev_seed: int
    experiments: list[ExperimentResult]
    submission: ServingConfig | LauncherSubmission | None
    submissions: int
    on_experiment: Callable[[ExperimentResult], None] | None
    _specs: dict[bool, tuple[WorkloadSpec, Path]]
    _workloads: dict[bool, Workload]
    harness_error: str | None
    _log: LineLog | None
    write_error: UserError | None
    """Set when ``experiments.jsonl`` could not be written (a full disk): the trial cannot be
    recorded, so it ends with this one-line error and runs again next time."""

    def budget_left(self) -> BudgetState:
        raise NotImplementedError

    def _open_log(self, log_path: Path | None) -> None:
        self._log = None
        self.write_error = None
        if log_path is not None:
            try:
                log_path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
                self._log = LineLog(log_path)
            except OSError as e:
                raise UserError(f"--out: cannot write {log_path}: {e.strerror or e}") from None

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def workspace_commands(self) -> int | None:
        """Commands the agent ran in its workspace (None: the task has no workspace)."""
        return None

    def workspace_actions(self) -> list[Action]:
        """Every workspace action the agent asked for (for the agent watch)."""
        return []

    def _spec(self, quick: bool) -> tuple[WorkloadSpec, Path]:
        if quick not in self._specs:
            requests: int | None = None
            if quick:
                full, _ = self._spec(False)
                requests = self.task.workload.quick_requests or max(
                    1, full.num_requests // QUICK_DIVISOR
                )
            self._specs[quick] = workload_spec(self.loaded, requests=requests)
        return self._specs[quick]

    def _workload(self, quick: bool) -> Workload:
        if quick not in self._workloads:
            spec, base_dir = self._spec(quick)
            self._workloads[quick] = materialise(spec, self.dev_seed, base_dir=base_dir)
        return self._workloads[quick]

    def _state_after(self, index: int) -> BudgetState:
        state = self.budget_left()
        # The experiment being recorded counts as run.
        b = self.task.budget
        return state.model_copy(
            update={
                "experiments_run": index + 1,
                "experiments_left": (
                    None if b.max_experiments is None else max(b.max_experiments - index - 1, 0)
                ),
            }
        )

    def _record(self, result: ExperimentResult) -> ExperimentResult:
        self.experiments.append(result)
        if self._log is not None:
            try:
                self._log.append(result.model_dump_json())
            except OSError as e:  # a full disk: the log keeps its whole lines, the trial ends
                self.write_error = UserError(
                    f"--out: cannot write {self._log.path}: {e.strerror or e}; the trial is "
                    "not recorded and runs again next time"
                )
                self.harness_error = self.write_error.message
                raise HarnessError(self.harness_error) from None
        if self.on_experiment is not None:
            self.on_experiment(result)
        return result.model_copy(deep=True)

    def submit(self, config: ServingConfig) -> None:
        """Declare ``config`` the submission (the last call stands).

        A value that is not a ServingConfig is validated into one (a ``ValidationError``
        goes back to the agent). A ServingConfig is stored as given (a deep copy), even one
        that bypassed validation: the final evaluation's integrity gate judges it.
        """
        if not isinstance(config, ServingConfig):
            config = ServingConfig.model_validate(config)
        self.submission = config.model_copy(deep=True)
        self.submissions += 1


class SimTaskEnvironment(EnvironmentBase):
    """The :class:`~servegym.agents.base.TaskEnvironment` of a sim-track task."""

    def __init__(
        self,
        loaded: LoadedTask,
        *,
        trial_seed: int = 0,
        log_path: Path | None = None,
        on_experiment: Callable[[ExperimentResult], None] | None = None,
    ) -> None:
        task = loaded.task
        if not task.traits.simulated:
            raise ValueError(f"task {task.id} is a {task.track}-track task, not sim")
        self.loaded = loaded
        self.task = task
        self.trial_seed = trial_seed
        self.on_experiment = on_experiment
        self.model = get_model(task.model, "model")
        self.hardware = get_hardware(task.hardware, "hardware")
        self.dev_seed = task.workload.dev_seed
        self._specs: dict[bool, tuple[WorkloadSpec, Path]] = {}
        self._workloads: dict[bool, Workload] = {}
        self._baseline: dict[bool, DevBaseline] = {}
        self.experiments: list[ExperimentResult] = []
        self.submission: ServingConfig | LauncherSubmission | None = None
        self.submissions = 0
        self.sim_gpu_seconds_used = 0.0
        self.harness_error: str | None = None
        self._started = time.monotonic()
        self._open_log(log_path)

    # ------------------------------------------------------------------ harness side

    def _launch(self, config: ServingConfig) -> SimEngine:
        spec, _ = self._spec(False)
        return launch_task(self.task, self.model, self.hardware, config, workload_family=spec.kind)

    def baseline_dev(self, quick: bool = False) -> DevBaseline:
        """The baseline's objective and modelled accuracy on the dev workload (measured
        once; never charged)."""
        if quick not in self._baseline:
            try:
                engine = self._launch(self.task.baseline)
            except LaunchError as e:
                self.harness_error = f"the task's baseline config does not launch: {e.message}"
                raise HarnessError(self.harness_error) from None
            spec, base_dir = self._spec(quick)
            try:
                m = measure_objective(
                    self.task,
                    engine,
                    spec,
                    self.dev_seed,
                    stable_seed("dev-baseline", self.task.id, self.dev_seed, quick),
                    base_dir=base_dir,
                    workload=self._workload(quick),
                )
            except Exception as e:
                self.harness_error = f"baseline dev measurement: {type(e).__name__}: {e}"
                raise HarnessError(self.harness_error) from e
            self._baseline[quick] = DevBaseline(m, engine.accuracy_ratio)
        return self._baseline[quick]

    def measured_baseline(self, quick: bool = False) -> ObjectiveMeasurement | None:
        """The baseline's dev measurement if an experiment needed it (no measuring here)."""
        got = self._baseline.get(quick)
        return got.measurement if got is not None else None

    @property
    def budget_limit(self) -> float | None:
        return self.task.budget.sim_gpu_seconds

    budget_unit = "sim_gpu_seconds"

    @property
    def budget_used(self) -> float:
        return self.sim_gpu_seconds_used

    def _wall_used(self) -> float:
        if self.task.budget.wall_seconds is None:
            return 0.0
        return time.monotonic() - self._started

    # ------------------------------------------------------------------ agent side

    def describe(self) -> TaskDescription:
        task = self.task
        spec, _ = self._spec(False)
        summary = summarise(self._workload(False))
        defaults = knob_defaults(self.model, self.hardware)
        knobs = [
            KnobInfo(
                name=k.name,
                default=str(defaults.get(k.name, k.default)),
                help=f"{k.help} (default: {k.default})",
            )
            for k in KNOBS
            if k.name != "pipeline" or task.pipeline is not None
        ]
        if task.pipeline is not None:
            knobs += pipeline_knob_infos()
        quick_spec, _ = self._spec(True)
        workload: dict[str, Any] = {
            "name": spec.name,
            "kind": spec.kind,
            "dev_seed": self.dev_seed,
            "spec": spec.model_dump(mode="json"),
            "summary": summary.model_dump(mode="json"),
            "quick_requests": quick_spec.num_requests,
        }
        if task.pipeline is not None:
            workload["pipeline"] = task.pipeline.model_dump(mode="json")
        objective = task.objective
        if objective.kind in ("max_rate_at_sla", "cost_at_sla") or any(
            c.kind in ("max_rate_at_sla", "cost_at_sla") for c in objective.components
        ):
            workload["rate_search"] = {
                "arrival": "poisson",
                "rate_min": objective.rate_min,
                "rate_max": objective.rate_max,
                "attainment_target": objective.attainment_target,
                "rate_tolerance": objective.rate_tolerance,
            }
        price = (
            task.price_per_hour if task.price_per_hour is not None else self.hardware.price_per_hour
        )
        return TaskDescription(
            task_id=task.id,
            title=task.title,
            instruction=self.loaded.instruction,
            track=task.track,
            model=task.model,
            hardware=task.hardware,
            num_gpus_available=self.task.max_gpus,
            price_per_gpu_hour=price,
            engines=list(task.engines),
            baseline=changed_knobs(task.baseline),
            knobs=knobs,
            workload=workload,
            objective=objective.label(),
            higher_is_better=objective.higher_is_better,
            sla=task.sla.model_dump(exclude_none=True) if task.sla is not None else None,
            accuracy_min_ratio=task.accuracy.min_ratio,
            budget=self.budget_left(),
            max_agent_tokens=task.budget.max_agent_tokens,
            max_agent_dollars=task.budget.max_agent_dollars,
            tuning="config",
        )

    def budget_left(self) -> BudgetState:
        b = self.task.budget
        n = len(self.experiments)
        wall = self._wall_used()
        return BudgetState(
            experiments_run=n,
            experiments_left=None if b.max_experiments is None else max(b.max_experiments - n, 0),
            sim_gpu_seconds_used=self.sim_gpu_seconds_used,
            sim_gpu_seconds_left=(
                None
                if b.sim_gpu_seconds is None
                else max(b.sim_gpu_seconds - self.sim_gpu_seconds_used, 0.0)
            ),
            wall_seconds_used=wall,
            wall_seconds_left=None if b.wall_seconds is None else max(b.wall_seconds - wall, 0.0),
        )

    def run_experiment(self, config: ServingConfig, quick: bool = False) -> ExperimentResult:
        if self.harness_error is not None:
            raise HarnessError(self.harness_error)
        if self.budget_left().exhausted:
            raise BudgetExhausted(
                f"budget exhausted after {len(self.experiments)} experiments "
                f"({self.sim_gpu_seconds_used:.0f} simulated GPU-seconds)"
            )
        dev = self.baseline_dev(quick)
        baseline, base_accuracy = dev.measurement, dev.accuracy
        assert base_accuracy is not None
        index = len(self.experiments)
        try:
            # Re-validate: an object built with model_construct, or changed after validation.
            raw = config.model_dump() if isinstance(config, ServingConfig) else config
            config = ServingConfig.model_validate(raw)
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(x) for x in first["loc"]) or "config"
            message = f"error: argument {loc}: {first['msg']} (the engine refused its arguments)"
            self.sim_gpu_seconds_used += INVALID_CONFIG_SIM_SECONDS
            result = ExperimentResult(
                index=index,
                config=_raw_config(raw),
                quick=quick,
                ok=False,
                launch_error=message,
                log_tail=message,
                cost_sim_gpu_seconds=INVALID_CONFIG_SIM_SECONDS,
                budget=self._state_after(index),
            )
            return self._record(result)
        try:
            engine = self._launch(config)
        except LaunchError as e:
            gpus = min(config.tensor_parallel_size or 1, self.task.max_gpus)
            cost = LAUNCH_FAILURE_SIM_SECONDS * gpus
            self.sim_gpu_seconds_used += cost
            result = ExperimentResult(
                index=index,
                config=changed_knobs(config),
                quick=quick,
                ok=False,
                launch_error=e.message,
                log_tail=launch_log(self.loaded, config, e.message),
                cost_sim_gpu_seconds=cost,
                budget=self._state_after(index),
            )
            return self._record(result)
        spec, base_dir = self._spec(quick)
        left = self.budget_left().sim_gpu_seconds_left
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
                workload=self._workload(quick),
                rate_hint=first_rate(baseline),
                sim_seconds_cap=cap,
            )
        except Exception as e:  # the harness's own failure, not the agent's
            self.harness_error = f"experiment {index}: {type(e).__name__}: {e}"
            raise HarnessError(self.harness_error) from e
        cost = (engine.startup_s + m.sim_seconds) * engine.num_gpus
        self.sim_gpu_seconds_used += cost
        result = ExperimentResult(
            index=index,
            config=changed_knobs(config),
            quick=quick,
            ok=True,
            objective_value=m.value,
            improvement=measurement_improvement(self.task.objective, baseline, m),
            accuracy_ratio=engine.accuracy_ratio / base_accuracy,
            metrics=m.metrics,
            pipeline=m.pipeline.summary() if m.pipeline is not None else None,
            log_tail=TRUNCATED_NOTE if m.search_truncated else None,
            cost_sim_gpu_seconds=cost,
            budget=self._state_after(index),
        )
        return self._record(result)
