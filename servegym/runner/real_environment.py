"""The agent's window on a real-track task (cpu; gpu where a GPU host runs it):
:class:`RealTaskEnvironment`.

It offers what :class:`~servegym.runner.environment.SimTaskEnvironment` offers, on real
servers. **An experiment** checks the config against the engine's capability table (a
refused config costs nothing but the experiment), launches a server for it, runs the dev
workload (``quick``: fewer requests), and stops the server. It returns the objective, the
improvement over the baseline on the same dev workload (measured once, on first need, and
not charged), the accuracy ratio (agreement of the outputs with the reference model's over
the baseline's: see :func:`servegym.cpu_track.reference.agreement`), or the launch error or
crash with the log's tail.

**The budget** is wall-clock seconds: each experiment is charged its own seconds, start-up
included. An experiment asked for when nothing is left raises
:class:`~servegym.agents.base.BudgetExhausted`; the one that crosses the limit completes
and is charged in full. Every experiment is appended (and flushed) to ``experiments.jsonl``.
"""

from __future__ import annotations

import asyncio
import json
import time
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
)
from servegym.cpu_track.reference import Reference, agreement
from servegym.engines.base import Engine, ModelRef, get_engine
from servegym.engines.config import ServingConfig
from servegym.engines.knob_info import KnobInfo
from servegym.engines.launcher import LauncherSubmission
from servegym.engines.models import resolve_model
from servegym.engines.pipeline_knobs import pipeline_knob_infos
from servegym.engines.process import read_tail
from servegym.engines.served import ManagedServer, ScriptServer, ServedRun, benchmark_server
from servegym.errors import BrokenTask, HarnessError, UserError
from servegym.loadgen.target import RunOptions
from servegym.runner.agent_watch import Action
from servegym.runner.environment import EnvironmentBase, changed_knobs, config_key
from servegym.runner.workspace import MeteredWorkspace
from servegym.runner.workspace_config import read_workspace_config, write_workspace_config
from servegym.sandbox.local import Isolation, tree_digest
from servegym.sandbox.workspace import WorkspaceError
from servegym.scoring.objectives import ObjectiveMeasurement, measurement_improvement
from servegym.tasks.loader import LoadedTask
from servegym.tracks.base import DevBaseline
from servegym.tracks.cpu_pipeline import PipelineExperiments
from servegym.tracks.real import outputs_reference
from servegym.tracks.real_measure import measure_run, real_objective_problem
from servegym.tracks.sandbox import seed_workspace, workspace_sandbox
from servegym.workloads.model import Workload
from servegym.workloads.spec import WorkloadSpec
from servegym.workloads.summary import summarise

__all__ = ["RealTaskEnvironment", "config_key"]


def knob_infos() -> list[KnobInfo]:
    """Every ServingConfig knob, its engine default left to the engine."""
    out = []
    for name, field in ServingConfig.model_fields.items():
        if name in ("extra_args", "env"):
            help_ = "engine-native " + ("flags" if name == "extra_args" else "environment")
        else:
            help_ = field.description or name.replace("_", " ")
        out.append(KnobInfo(name=name, default="engine default", help=help_))
    return out


class RealTaskEnvironment(EnvironmentBase):
    """The :class:`~servegym.agents.base.TaskEnvironment` of a cpu- or gpu-track task."""

    def __init__(
        self,
        loaded: LoadedTask,
        *,
        trial_seed: int = 0,
        log_path: Path | None = None,
        server_logs: Path,
        on_experiment: Callable[[ExperimentResult], None] | None = None,
        engine: Engine | None = None,
        model: ModelRef | None = None,
        workspace: Path | None = None,
        submission_dir: Path | None = None,
        isolation: Isolation = "auto",
    ) -> None:
        """``engine`` and ``model`` default to the task's (tests pass stand-ins).
        ``workspace`` (default: a ``workspace`` folder beside ``server_logs``) is the agent's
        folder, seeded with the baseline's ``start_server.sh``; ``submission_dir`` (default
        ``submission`` beside it) receives the snapshot a workspace submission makes."""
        task = loaded.task
        if task.traits.simulated:
            raise ValueError(f"task {task.id} is a sim-track task")
        problem = real_objective_problem(task.objective)
        if problem is not None:
            raise UserError(f"task {task.id}: {problem}")
        self.loaded = loaded
        self.task = task
        self.trial_seed = trial_seed
        self.on_experiment = on_experiment
        self.engine = engine if engine is not None else get_engine(task.engines[0])
        self.model: ModelRef = model if model is not None else resolve_model(task.model)
        self.dev_seed = task.workload.dev_seed
        self.server_logs = server_logs
        self._specs: dict[bool, tuple[WorkloadSpec, Path]] = {}
        self._workloads: dict[bool, Workload] = {}
        self._baseline: dict[bool, DevBaseline] = {}
        self.pipeline = (
            PipelineExperiments(loaded, self.engine, self.model, server_logs)
            if task.pipeline is not None
            else None
        )
        """The pipeline plug-in of a pipeline task (its experiments), else None."""
        self._references: dict[bool, Reference | None] = {}
        self.experiments: list[ExperimentResult] = []
        self.submission: ServingConfig | LauncherSubmission | None = None
        self.submissions = 0
        self.wall_seconds_used = 0.0
        self.harness_error: str | None = None
        self.broken_task: str | None = None
        """Set when the task's own baseline does not start (a :class:`BrokenTask`)."""
        self._open_log(log_path)
        root = workspace if workspace is not None else server_logs.parent / "workspace"
        self.submission_dir = (
            submission_dir if submission_dir is not None else server_logs.parent / "submission"
        )
        self.sandbox = workspace_sandbox(task, self.engine, self.model, root, isolation=isolation)
        if self.tuning == "config":
            if not (self.sandbox.root / CONFIG_FILE).exists():
                write_workspace_config(self.sandbox.root, task.baseline, self._knobs())
        elif not (self.sandbox.root / LAUNCHER).exists():
            seed_workspace(self.sandbox, self.engine, task.baseline)
        self.workspace = MeteredWorkspace(
            self.sandbox, charge=self._charge, exhausted=lambda: self.budget_left().exhausted
        )

    # ------------------------------------------------------------------ harness side

    def workspace_commands(self) -> int | None:
        return self.workspace.commands

    def workspace_actions(self) -> list[Action]:
        return self.workspace.actions.actions

    @property
    def tuning(self) -> Tuning:
        """A pipeline task is tuned through configs (the harness deploys its servers and
        retrieval stages); any other real-track task through its workspace's launcher."""
        return "config" if self.pipeline is not None else "workspace"

    def _knobs(self) -> list[KnobInfo]:
        return knob_infos() + (pipeline_knob_infos() if self.pipeline is not None else [])

    @property
    def budget_limit(self) -> float | None:
        return self.task.budget.wall_seconds

    budget_unit = "wall_seconds"

    @property
    def budget_used(self) -> float:
        return self.wall_seconds_used

    def _charge(self, seconds: float) -> None:
        self.wall_seconds_used += seconds

    def charge_wall_seconds(self, seconds: float) -> None:
        self._charge(max(float(seconds), 0.0))

    def _reference(self, quick: bool) -> Reference | None:
        if quick not in self._references:
            self._references[quick] = outputs_reference(
                self.engine, self.model, self._workload(quick), self.server_logs
            )
        return self._references[quick]

    def _serve(self, config: ServingConfig, quick: bool, name: str) -> ServedRun:
        managed = ManagedServer(
            self.engine, config, self.model, self.server_logs / f"{name}.log",
            start_timeout_s=self.task.evaluation.start_timeout_s,
        )  # fmt: skip
        return self._benchmark(managed, quick)

    def _benchmark(self, managed: ManagedServer, quick: bool) -> ServedRun:
        options = RunOptions(
            model=self.model.served_name,
            keep_outputs=True,
            request_timeout_s=self.task.evaluation.request_timeout_s,
        )
        return asyncio.run(benchmark_server(managed, [self._workload(quick)], options))

    def _accuracy(self, served: ServedRun, quick: bool) -> float | None:
        ref = self._reference(quick)
        if ref is None or not served.results:
            return None
        return agreement(served.results[0], ref)

    def baseline_dev(self, quick: bool = False) -> DevBaseline:
        """The baseline's objective and accuracy on the dev workload (once; not charged)."""
        if quick not in self._baseline:
            if self.pipeline is not None:
                try:
                    self._baseline[quick] = self.pipeline.baseline(quick)
                except HarnessError as e:
                    self.harness_error = str(e)
                    if isinstance(e, BrokenTask):
                        self.broken_task = self.harness_error
                    raise
                return self._baseline[quick]
            served = self._serve(self.task.baseline, quick, f"dev-baseline{'-quick' * quick}")
            if not served.ok or not served.results:
                self.harness_error = (
                    f"the task's baseline config does not run: {served.outcome}: {served.message}"
                )
                self.broken_task = self.harness_error
                raise BrokenTask(self.harness_error)
            m = measure_run(self.task, served.results[0])
            try:
                accuracy = self._accuracy(served, quick)
            except UserError as e:
                self.harness_error = f"reference outputs for the dev workload: {e.message}"
                raise HarnessError(self.harness_error) from None
            self._baseline[quick] = DevBaseline(m, accuracy)
        return self._baseline[quick]

    def measured_baseline(self, quick: bool = False) -> ObjectiveMeasurement | None:
        got = self._baseline.get(quick)
        return got.measurement if got is not None else None

    # ------------------------------------------------------------------ agent side

    def describe(self) -> TaskDescription:
        task = self.task
        spec, _ = self._spec(False)
        quick_spec, _ = self._spec(True)
        workload: dict[str, Any] = {
            "name": spec.name,
            "kind": spec.kind,
            "dev_seed": self.dev_seed,
            "spec": spec.model_dump(mode="json"),
            "summary": summarise(self._workload(False)).model_dump(mode="json"),
            "quick_requests": quick_spec.num_requests,
        }
        if self.pipeline is not None:
            workload["pipeline"] = self.pipeline.describe()
        return TaskDescription(
            task_id=task.id,
            title=task.title,
            instruction=self.loaded.instruction,
            track=task.track,
            model=task.model,
            hardware=task.hardware,
            num_gpus_available=task.max_gpus,
            price_per_gpu_hour=task.price_per_hour or 0.0,
            engines=list(task.engines),
            baseline=changed_knobs(task.baseline),
            knobs=self._knobs(),
            workload=workload,
            objective=task.objective.label(),
            higher_is_better=task.objective.higher_is_better,
            sla=task.sla.model_dump(exclude_none=True) if task.sla is not None else None,
            accuracy_min_ratio=task.accuracy.min_ratio,
            budget=self.budget_left(),
            max_agent_tokens=task.budget.max_agent_tokens,
            max_agent_dollars=task.budget.max_agent_dollars,
            tuning=self.tuning,
        )

    def budget_left(self) -> BudgetState:
        b = self.task.budget
        n = len(self.experiments)
        used = self.wall_seconds_used
        return BudgetState(
            experiments_run=n,
            experiments_left=None if b.max_experiments is None else max(b.max_experiments - n, 0),
            sim_gpu_seconds_used=0.0,
            sim_gpu_seconds_left=None,
            wall_seconds_used=used,
            wall_seconds_left=None if b.wall_seconds is None else max(b.wall_seconds - used, 0.0),
        )

    def _may_run(self) -> None:
        """Raise unless another experiment may run (a broken harness, a spent budget)."""
        if self.harness_error is not None:
            raise HarnessError(self.harness_error)
        if self.budget_left().exhausted:
            raise BudgetExhausted(
                f"budget exhausted after {len(self.experiments)} experiments "
                f"({self.wall_seconds_used:.0f} wall seconds)"
            )

    def run_experiment(self, config: ServingConfig, quick: bool = False) -> ExperimentResult:
        self._may_run()
        if self.pipeline is not None:
            return self._pipeline_experiment(self.pipeline, config, quick)
        self.baseline_dev(quick)  # measured (uncharged) before the experiment's clock starts
        index = len(self.experiments)
        started = time.monotonic()
        try:
            raw = config.model_dump() if isinstance(config, ServingConfig) else config
            config = ServingConfig.model_validate(raw)
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(x) for x in first["loc"]) or "config"
            message = f"error: argument {loc}: {first['msg']} (the engine refused its arguments)"
            return self._finish(index, started, raw, quick, ok=False, error=message, tail=message)
        served = self._serve(config, quick, f"experiment-{index:03d}")
        return self._served_result(index, started, changed_knobs(config), quick, served)

    def _pipeline_experiment(
        self, pipeline: PipelineExperiments, config: ServingConfig | dict[str, Any], quick: bool
    ) -> ExperimentResult:
        """One experiment of a pipeline task (see :class:`PipelineExperiments`)."""
        baseline = self.baseline_dev(quick)
        index = len(self.experiments)
        started = time.monotonic()
        raw = config.model_dump() if isinstance(config, ServingConfig) else config
        try:
            parsed = ServingConfig.model_validate(raw)
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(x) for x in first["loc"]) or "config"
            message = f"error: argument {loc}: {first['msg']}"
            return self._finish(index, started, raw, quick, ok=False, error=message, tail=message)
        record = changed_knobs(parsed)
        ran = pipeline.run(parsed, quick, index, baseline)
        m = ran.measurement
        if m is None:
            return self._finish(
                index, started, record, quick, ok=False, error=ran.error, tail=ran.tail
            )
        return self._finish(
            index,
            started,
            record,
            quick,
            ok=True,
            value=m.value,
            improvement=measurement_improvement(self.task.objective, baseline.measurement, m),
            accuracy=ran.recall_ratio,
            pipeline=m.pipeline.summary() if m.pipeline is not None else None,
        )

    def run_benchmark(self, quick: bool = False) -> ExperimentResult:
        """Benchmark the workspace's ``start_server.sh`` (see
        :class:`~servegym.agents.base.WorkspaceEnvironment`); the experiment's config is
        ``{"launcher": ..., "digest": ...}``, the digest of the workspace's files. On a task
        tuned through configs it runs the workspace's ``serving.toml`` as an experiment."""
        self._may_run()
        if self.tuning == "config":
            return self.run_experiment(read_workspace_config(self.sandbox.root), quick)
        if not (self.sandbox.root / LAUNCHER).is_file():
            raise WorkspaceError(f"the workspace has no {LAUNCHER}")
        self.baseline_dev(quick)  # measured (uncharged) before the experiment's clock starts
        index = len(self.experiments)
        started = time.monotonic()
        record = {"launcher": LAUNCHER, "digest": tree_digest(self.sandbox.root)[:16]}
        managed = ScriptServer(
            self.sandbox, LAUNCHER, self.model,
            self.server_logs / f"experiment-{index:03d}.log",
            start_timeout_s=self.task.evaluation.start_timeout_s,
        )  # fmt: skip
        served = self._benchmark(managed, quick)
        result = self._served_result(index, started, record, quick, served)
        if result.ok and result.log_tail is None:
            # the agent's own server: it gets its log's tail even when all went well
            result.log_tail = read_tail(managed.log_path, 40)
            self.experiments[-1].log_tail = result.log_tail
        return result

    def submit_workspace(self) -> str:
        """Snapshot the workspace as the submission; returns a one-line summary. On a task
        tuned through configs the workspace's ``serving.toml`` is the submission."""
        if self.tuning == "config":
            config = read_workspace_config(self.sandbox.root)
            self.submit(config)
            return f"submitted {CONFIG_FILE}: {json.dumps(changed_knobs(config), default=str)}"
        if not (self.sandbox.root / LAUNCHER).is_file():
            raise WorkspaceError(f"the workspace has no {LAUNCHER}: write it, then submit")
        files, size, digest = self.sandbox.snapshot(self.submission_dir)
        self.submission = LauncherSubmission(
            path=str(self.submission_dir), files=files, bytes=size, digest=digest
        )
        self.submissions += 1
        return (
            f"submitted the workspace: {files} files, {size:,} bytes, digest {digest[:16]} "
            f"(the final evaluation starts {LAUNCHER} from these files alone)"
        )

    def _served_result(
        self,
        index: int,
        started: float,
        record: dict[str, Any],
        quick: bool,
        served: ServedRun,
    ) -> ExperimentResult:
        dev = self.baseline_dev(quick)
        baseline, base_accuracy = dev.measurement, dev.accuracy
        if not served.ok or not served.results:
            tail = served.exit.log_tail if served.exit is not None else served.message
            return self._finish(
                index, started, record, quick, ok=False, error=served.message, tail=tail
            )
        m = measure_run(self.task, served.results[0])
        accuracy = self._accuracy(served, quick)
        ratio = None
        if accuracy is not None and base_accuracy:
            ratio = accuracy / base_accuracy
        return self._finish(
            index,
            started,
            record,
            quick,
            ok=True,
            value=m.value,
            improvement=measurement_improvement(self.task.objective, baseline, m),
            accuracy=ratio,
            metrics=m.metrics,
        )

    def _finish(
        self,
        index: int,
        started: float,
        config: Any,
        quick: bool,
        *,
        ok: bool,
        error: str | None = None,
        tail: str | None = None,
        value: float | None = None,
        improvement: float | None = None,
        accuracy: float | None = None,
        metrics: Any = None,
        pipeline: dict[str, Any] | None = None,
    ) -> ExperimentResult:
        spent = time.monotonic() - started
        self.wall_seconds_used += spent
        result = ExperimentResult(
            index=index,
            config=config if isinstance(config, dict) else {"value": repr(config)},
            quick=quick,
            ok=ok,
            launch_error=error,
            log_tail=tail,
            objective_value=value,
            improvement=improvement,
            accuracy_ratio=accuracy,
            metrics=metrics,
            cost_wall_seconds=spent,
            budget=self._state_after(index),
            pipeline=pipeline,
        )
        return self._record(result)
