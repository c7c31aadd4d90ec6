"""The agent's window on its task, on every track: :class:`TrackEnvironment`.

An agent reads the task (:meth:`~TrackEnvironment.describe`), runs experiments
(:meth:`~TrackEnvironment.run_experiment`) and submits a config
(:meth:`~TrackEnvironment.submit`); on a track with a workspace (the real tracks) it also
works in its folder, benchmarks it and submits it
(:meth:`~TrackEnvironment.workspace_environment`). Everything it may see is the task's
public part: the instruction, model, hardware, knobs, the *dev* workload (its seed is
public), the objective, SLA, accuracy gate and budget. The scoring seed and the oracle
config never pass through here.

The environment is one class, parameterised by the task's track
(:func:`servegym.tracks.track_for`, chosen once). It owns what every track shares:

- **an experiment**: the config is validated (one the engine refuses costs the track's
  ``refusal_cost``), the track runs it on the dev workload (:class:`~servegym.tracks.dev.
  DevSession`), and the result reports the objective, the improvement over the baseline on
  the same dev workload and the accuracy over the baseline's; the baseline is measured once
  per workload size, on first need, never charged;
- **the budget**, in the track's unit (:class:`~servegym.tracks.dev.Budget`: simulated
  GPU-seconds on the simulator, wall seconds on real servers): an experiment asked for when
  nothing is left (that unit, experiments, or wall seconds where the task sets them) raises
  :class:`BudgetExhausted`; the experiment that crosses the limit completes and is charged
  in full;
- **the log**: every experiment is appended (and written through) to ``experiments.jsonl``
  as an :class:`ExperimentResult`, one whole line each: a write that fails (a full disk) is
  cut back to the last whole line and ends the trial with one line (:attr:`write_error`);
- **the workspace**, where the track opens one, metered like experiments
  (:class:`~servegym.runner.workspace.MeteredWorkspace`); what is benchmarked and submitted
  from it follows the task's tuning: its ``serving.toml`` as a config, or its
  ``start_server.sh`` as a launcher;
- **the submission** (the last call stands).

What a track does in its turn (how a config runs, what it costs, which knobs it has) is in
:mod:`servegym.tracks.sim`, :mod:`servegym.tracks.real` and
:mod:`servegym.tracks.cpu_pipeline`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servegym.agents.base import (
    CONFIG_FILE,
    LAUNCHER,
    BudgetExhausted,
    BudgetState,
    ExperimentResult,
    TaskDescription,
    Tuning,
    WorkspaceEnvironment,
)
from servegym.agents.workspace_config import read_workspace_config
from servegym.engines.config import ServingConfig
from servegym.engines.launcher import LauncherSubmission
from servegym.errors import BrokenTask, HarnessError, UserError
from servegym.run_folder import PRIVATE_DIR, LineLog
from servegym.runner.agent_watch import Action
from servegym.runner.workspace import MeteredWorkspace
from servegym.sandbox.local import tree_digest
from servegym.sandbox.workspace import WorkspaceError
from servegym.scoring.objectives import ObjectiveMeasurement, measurement_improvement
from servegym.tasks.loader import LoadedTask
from servegym.tracks import track_for
from servegym.tracks.base import DevBaseline, Track
from servegym.tracks.dev import DevRun, DevWorkspace, changed_knobs
from servegym.workloads.summary import summarise

__all__ = ["TrackEnvironment", "changed_knobs"]


def _raw_config(raw: object) -> dict[str, Any]:
    """Best-effort JSON-able form of a config that did not validate."""
    if isinstance(raw, dict):
        return {
            str(k): v if isinstance(v, str | int | float | bool | None) else repr(v)
            for k, v in raw.items()
        }
    return {"value": repr(raw)}


def _refusal(e: ValidationError) -> str:
    first = e.errors()[0]
    loc = ".".join(str(x) for x in first["loc"]) or "config"
    return f"error: argument {loc}: {first['msg']}"


class TrackEnvironment:
    """The :class:`~servegym.agents.base.TaskEnvironment` of a task on its track (see the
    module docstring). ``track`` defaults to :func:`~servegym.tracks.track_for`'s (which a
    real track needs told where its servers' logs go: pass it)."""

    def __init__(
        self,
        loaded: LoadedTask,
        track: Track | None = None,
        *,
        trial_seed: int = 0,
        log_path: Path | None = None,
        on_experiment: Callable[[ExperimentResult], None] | None = None,
    ) -> None:
        self.loaded = loaded
        self.task = loaded.task
        self.track = track if track is not None else track_for(loaded)
        self.dev = self.track.dev_session(loaded, trial_seed)
        self.budget = self.dev.budget
        self.trial_seed = trial_seed
        self.on_experiment = on_experiment
        self.experiments: list[ExperimentResult] = []
        self.submission: ServingConfig | LauncherSubmission | None = None
        self.submissions = 0
        self.harness_error: str | None = None
        self.broken_task: str | None = None
        """Set when the task's own baseline does not start (a :class:`BrokenTask`)."""
        self._baseline: dict[bool, DevBaseline] = {}
        self._log: LineLog | None = None
        self.write_error: UserError | None = None
        """Set when ``experiments.jsonl`` could not be written (a full disk): the trial
        cannot be recorded, so it ends with this one-line error and runs again next time."""
        if log_path is not None:
            try:
                log_path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
                self._log = LineLog(log_path)
            except OSError as e:
                raise UserError(f"--out: cannot write {log_path}: {e.strerror or e}") from None
        self._space: DevWorkspace | None = self.dev.open_workspace()
        self._workspace: MeteredWorkspace | None = None
        if self._space is not None:
            self._workspace = MeteredWorkspace(
                self._space.sandbox,
                charge=self.budget.charge_wall,
                exhausted=lambda: self.budget_left().exhausted,
            )

    # ------------------------------------------------------------------ harness side

    @property
    def tuning(self) -> Tuning:
        return self.dev.tuning

    @property
    def budget_unit(self) -> str:
        return self.budget.unit

    @property
    def budget_limit(self) -> float | None:
        return self.budget.limit

    @property
    def budget_used(self) -> float:
        return self.budget.used

    def baseline_dev(self, quick: bool = False) -> DevBaseline:
        """The baseline's objective and accuracy on the dev workload (measured once per
        workload size; never charged)."""
        if quick not in self._baseline:
            try:
                self._baseline[quick] = self.dev.baseline(quick)
            except HarnessError as e:
                self.harness_error = str(e)
                if isinstance(e, BrokenTask):
                    self.broken_task = self.harness_error
                raise
        return self._baseline[quick]

    def measured_baseline(self, quick: bool = False) -> ObjectiveMeasurement | None:
        """The baseline's dev measurement if an experiment needed it (no measuring here)."""
        got = self._baseline.get(quick)
        return got.measurement if got is not None else None

    def workspace_commands(self) -> int | None:
        """Commands the agent ran in its workspace (None: the task has no workspace)."""
        return self._workspace.commands if self._workspace is not None else None

    def workspace_actions(self) -> list[Action]:
        """Every workspace action the agent asked for (for the agent watch)."""
        return self._workspace.actions.actions if self._workspace is not None else []

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    # ------------------------------------------------------------------ agent side

    def describe(self) -> TaskDescription:
        task = self.task
        workloads = self.dev.workloads
        spec, _ = workloads.spec(False)
        quick_spec, _ = workloads.spec(True)
        workload: dict[str, Any] = {
            "name": spec.name,
            "kind": spec.kind,
            "dev_seed": workloads.dev_seed,
            "spec": spec.model_dump(mode="json"),
            "summary": summarise(workloads.workload(False)).model_dump(mode="json"),
            "quick_requests": quick_spec.num_requests,
            **self.dev.workload_facts(),
        }
        return TaskDescription(
            task_id=task.id,
            title=task.title,
            instruction=self.loaded.instruction,
            track=task.track,
            model=task.model,
            hardware=task.hardware,
            num_gpus_available=task.max_gpus,
            price_per_gpu_hour=self.dev.price_per_gpu_hour,
            engines=list(task.engines),
            baseline=changed_knobs(task.baseline),
            knobs=self.dev.knobs(),
            workload=workload,
            objective=task.objective.label(),
            higher_is_better=task.objective.higher_is_better,
            sla=task.sla.model_dump(exclude_none=True) if task.sla is not None else None,
            accuracy_min_ratio=task.accuracy.min_ratio,
            budget=self.budget_left(),
            max_agent_tokens=task.budget.max_agent_tokens,
            max_agent_dollars=task.budget.max_agent_dollars,
            tuning=self.dev.tuning,
        )

    def budget_left(self) -> BudgetState:
        return self.budget.state(len(self.experiments))

    def run_experiment(self, config: ServingConfig, quick: bool = False) -> ExperimentResult:
        self._may_run()
        baseline = self.baseline_dev(quick)
        index = len(self.experiments)
        # Re-validate: an object built with model_construct, or changed after validation.
        raw = config.model_dump() if isinstance(config, ServingConfig) else config
        try:
            parsed = ServingConfig.model_validate(raw)
        except ValidationError as e:
            message = _refusal(e) + self.dev.refusal_note
            refused = DevRun(cost=self.dev.refusal_cost, error=message, tail=message)
            return self._finish(index, quick, _raw_config(raw), refused, baseline)
        run = self._guarded(lambda: self.dev.run(parsed, quick, index, baseline))
        return self._finish(index, quick, changed_knobs(parsed), run, baseline)

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

    # ------------------------------------------------------------------ the workspace

    def workspace_environment(self) -> WorkspaceEnvironment | None:
        """This environment with its workspace tools, where the track opened a workspace
        (the real tracks); None on a track tuned through configs alone (the simulator)."""
        return self if self._workspace is not None else None

    @property
    def workspace(self) -> MeteredWorkspace:
        """The agent's workspace; :class:`WorkspaceError` on a task that has none."""
        if self._workspace is None:
            raise WorkspaceError(f"task {self.task.id} has no workspace: it takes configs")
        return self._workspace

    def run_benchmark(self, quick: bool = False) -> ExperimentResult:
        """Benchmark the workspace's ``start_server.sh`` (see
        :class:`~servegym.agents.base.WorkspaceEnvironment`); the experiment's config is
        ``{"launcher": ..., "digest": ...}``, the digest of the workspace's files. On a task
        tuned through configs it runs the workspace's ``serving.toml`` as an experiment."""
        self._may_run()
        root = self.workspace.root
        if self.dev.tuning == "config":
            return self.run_experiment(read_workspace_config(root), quick)
        if not (root / LAUNCHER).is_file():
            raise WorkspaceError(f"the workspace has no {LAUNCHER}")
        assert self._space is not None
        space = self._space
        baseline = self.baseline_dev(quick)  # measured, uncharged, before the experiment
        index = len(self.experiments)
        record = {"launcher": LAUNCHER, "digest": tree_digest(root)[:16]}
        run = self._guarded(lambda: self.dev.run_launcher(space, quick, index, baseline))
        return self._finish(index, quick, record, run, baseline)

    def submit_workspace(self) -> str:
        """Snapshot the workspace as the submission; returns a one-line summary. On a task
        tuned through configs the workspace's ``serving.toml`` is the submission."""
        root = self.workspace.root
        if self.dev.tuning == "config":
            config = read_workspace_config(root)
            self.submit(config)
            return f"submitted {CONFIG_FILE}: {json.dumps(changed_knobs(config), default=str)}"
        if not (root / LAUNCHER).is_file():
            raise WorkspaceError(f"the workspace has no {LAUNCHER}: write it, then submit")
        assert self._space is not None
        dest = self._space.submission_dir
        files, size, digest = self._space.sandbox.snapshot(dest)
        self.submission = LauncherSubmission(path=str(dest), files=files, bytes=size, digest=digest)
        self.submissions += 1
        return (
            f"submitted the workspace: {files} files, {size:,} bytes, digest {digest[:16]} "
            f"(the final evaluation starts {LAUNCHER} from these files alone)"
        )

    def charge_wall_seconds(self, seconds: float) -> None:
        """Charge time the agent spent outside the environment's own calls."""
        self.budget.charge_wall(max(float(seconds), 0.0))

    # ------------------------------------------------------------------ internals

    def _may_run(self) -> None:
        """Raise unless another experiment may run (a broken harness, a spent budget)."""
        if self.harness_error is not None:
            raise HarnessError(self.harness_error)
        if self.budget_left().exhausted:
            raise BudgetExhausted(
                f"budget exhausted after {len(self.experiments)} experiments "
                f"({self.budget.used:.0f} {self.budget.spent_label})"
            )

    def _guarded(self, run: Callable[[], DevRun]) -> DevRun:
        """``run()``; a harness failure is kept, so no later experiment runs."""
        try:
            return run()
        except HarnessError as e:
            self.harness_error = str(e)
            raise

    def _finish(
        self,
        index: int,
        quick: bool,
        config: dict[str, Any],
        run: DevRun,
        baseline: DevBaseline,
    ) -> ExperimentResult:
        """Charge ``run``, record it as experiment ``index``, and return a copy."""
        self.budget.charge(run.cost)
        m = run.measurement
        base = baseline.accuracy
        sim_cost, wall_cost = self.budget.costs(run.cost)
        result = ExperimentResult(
            index=index,
            config=config,
            quick=quick,
            ok=m is not None,
            launch_error=run.error,
            log_tail=run.tail,
            objective_value=m.value if m is not None else None,
            improvement=(
                measurement_improvement(self.task.objective, baseline.measurement, m)
                if m is not None
                else None
            ),
            accuracy_ratio=(
                run.accuracy / base if m is not None and run.accuracy is not None and base else None
            ),
            metrics=run.metrics,
            pipeline=run.pipeline,
            cost_sim_gpu_seconds=sim_cost,
            cost_wall_seconds=wall_cost,
            budget=self.budget.state(index + 1),
        )
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
