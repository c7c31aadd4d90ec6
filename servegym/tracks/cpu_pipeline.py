"""A cpu-track pipeline task: the real-server track wrapped with the pipeline plug-in.

Its final evaluation (the order is :func:`servegym.runner.evaluation.evaluate`'s) scores
the whole pipeline in pairs, as :mod:`servegym.tracks.real` does for a server: the
baseline's and the submission's servers (each side's answer server, and its grader's with
``grade_server = "dedicated"``) start fresh from their configs and stay up; they are measured
in pairs ``B, S, S, B, ...`` for ``evaluation.repeats`` repeats, each pair on its
own question set (the hidden scoring seed for the first pair, seeds derived from it for the
others; both sides of a pair get the same questions). Before the pairs each side runs
:data:`WARMUP_QUESTIONS` questions of a warm-up seed, not measured: it builds the side's
index and warms its servers and the worker (the first calls into a fresh server or a fresh
embedder are slower, which would favour whichever side runs second). A run is
:func:`~servegym.pipeline.cpu.runner.run_pipeline` with that side's ``[pipeline]`` knobs
over one retrieval worker's index, built once per set of index knobs and reused across the
repeats (:class:`~servegym.pipeline.cpu.deploy.IndexPool`); index building is not timed in
the objective. The objective is valued as on the sim track.

Gates: integrity as any config (a workspace submission is refused: a pipeline task takes a
config with a ``[pipeline]`` table); the launch; accuracy is retrieval quality: the
submission's mean recall@k over its runs must be at least the task's
``pipeline.min_recall`` (without one, ``accuracy.min_ratio`` of the baseline's), or the trial
is ``accuracy_failed`` with the recall in the gate's detail. A submission whose server dies
or stops answering mid-evaluation is ``crashed``; a baseline that does not run is a broken
task (:class:`~servegym.errors.BrokenTask`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegym.agents.base import CONFIG_FILE
from servegym.agents.workspace_config import write_workspace_config
from servegym.engines.base import Engine, ModelRef
from servegym.engines.config import ServingConfig
from servegym.engines.knob_info import KnobInfo
from servegym.engines.pipeline_knobs import pipeline_knob_infos
from servegym.engines.process import read_tail
from servegym.errors import BrokenTask, HarnessError, UserError
from servegym.pipeline.cpu.corpus import Question
from servegym.pipeline.cpu.deploy import (
    CpuPipelineTask,
    Deployment,
    IndexPool,
    deploy,
    measure_run,
    questions_digest,
    run_side,
)
from servegym.pipeline.cpu.runner import CpuPipelineRun
from servegym.sandbox.local import LocalSandbox
from servegym.sandbox.quiet import QuietRuns
from servegym.scoring import gates
from servegym.scoring.gates import GateResult
from servegym.scoring.objectives import ObjectiveMeasurement
from servegym.tasks.loader import LoadedTask
from servegym.tasks.pipeline_spec import PipelineSpec
from servegym.tasks.secrets import stable_seed
from servegym.tracks.base import (
    DevBaseline,
    EvaluationSession,
    Role,
    SampleInfo,
    SideCrashed,
    StartedSide,
    Track,
    pair_seed,
)
from servegym.tracks.dev import DevRun, DevSession
from servegym.tracks.real import RealDevSession, RealServerTrack, knob_infos
from servegym.tracks.real_measure import real_price

WARMUP_QUESTIONS = 2
NOT_A_CONFIG = (
    "a pipeline task takes a config submission (server knobs and a [pipeline] table), "
    "not a launcher workspace or a running server"
)


def recall_gate(sub: float, base: float, spec: PipelineSpec, min_ratio: float) -> GateResult:
    """Retrieval quality as the accuracy gate: ``sub`` (the submission's mean recall@k)
    against ``spec.min_recall``, or, without one, ``min_ratio`` of the baseline's ``base``."""
    k = spec.passages_kept
    if spec.min_recall is not None:
        ok = sub >= spec.min_recall - 1e-12
        verb = ">=" if ok else "<"
        return GateResult(
            passed=ok,
            detail=(
                f"recall@{k} {sub:.3f} {verb} the minimum {spec.min_recall:.3f} "
                f"(baseline {base:.3f})"
            ),
            value=sub,
            threshold=spec.min_recall,
        )
    g = gates.check_accuracy(sub, base, min_ratio)
    return g.model_copy(update={"detail": f"recall@{k} {sub:.3f}, baseline {base:.3f}: {g.detail}"})


def _mean_recall(runs: list[CpuPipelineRun]) -> float | None:
    values = [r.result.recall_at_k for r in runs if r.result.recall_at_k is not None]
    return sum(values) / len(values) if values else None


class CpuPipelineTrack(Track):
    """The pipeline plug-in around a real-server track: its engine, model and logs."""

    def __init__(self, servers: RealServerTrack) -> None:
        self.servers = servers
        self.name = servers.name

    def dev_session(self, loaded: LoadedTask, trial_seed: int) -> DevSession:
        return CpuPipelineDevSession(self.servers, loaded)

    def evaluation(self, loaded: LoadedTask, scoring_seed: int) -> EvaluationSession:
        return CpuPipelineEvaluation(self.servers, loaded, scoring_seed)


@dataclass
class PipelineSide(StartedSide):
    deployment: Deployment | None = None
    config: ServingConfig | None = None
    runs: list[CpuPipelineRun] = field(default_factory=list)


class CpuPipelineEvaluation(EvaluationSession):
    """One final evaluation of a pipeline on real servers (see the module docstring)."""

    def __init__(self, servers: RealServerTrack, loaded: LoadedTask, scoring_seed: int) -> None:
        self.loaded = loaded
        self.task = task = loaded.task
        self.engine, self.model = servers.engine, servers.model
        self.server_logs = servers.server_logs
        self.scoring_seed = scoring_seed
        self.cpu = CpuPipelineTask(loaded)
        self.spec = self.cpu.spec
        self.samples = [
            self.cpu.questions(pair_seed(scoring_seed, i))
            for i in range(task.evaluation.pair_limit)
        ]
        self.sample = SampleInfo(
            f"{task.id} questions",
            len(self.samples[0]),
            questions_digest(self.samples[0]),
            tuple(questions_digest(q) for q in self.samples),
        )
        price = real_price(task)
        self.price_per_hour = price.price_per_hour if price is not None else None
        self.min_accuracy = task.accuracy.min_ratio
        self.no_accuracy = "no recall measured"
        self.sides: list[PipelineSide] = []
        self.quiet: QuietRuns = QuietRuns()
        self.pool: IndexPool | None = None
        self.warm: asyncio.Task[None] | None = None

    async def _deploy(self, config: ServingConfig, name: str) -> PipelineSide:
        dep = await deploy(self.loaded, self.engine, self.model, config, self.server_logs, name)
        side = PipelineSide(
            up=dep.up,
            error=dep.error,
            startup_s=dep.main.ready_after_s if dep.up else None,
            price_per_hour=self.price_per_hour if dep.up else None,
            deployment=dep,
            config=config,
        )
        self.sides.append(side)
        return side

    async def start_baseline(self) -> StartedSide:
        self.server_logs.mkdir(parents=True, exist_ok=True)
        self.pool = IndexPool(self.spec, self.cpu.corpus, self.server_logs / "eval-retrieval.log")
        self.warm = asyncio.create_task(self.pool.warm())
        side = await self._deploy(self.task.baseline, "eval-baseline")
        if not side.up:
            raise BrokenTask(f"the task's baseline config does not run: {side.error}")
        return side

    async def start_submission(self, submission: Any) -> StartedSide:
        if not isinstance(submission, ServingConfig):
            return PipelineSide(up=False, error=NOT_A_CONFIG)
        config = ServingConfig.model_validate(submission.model_dump())
        # the runs use the submission as submitted; the servers start from its copy
        side = await self._deploy(config, "eval-submission")
        side.config = submission
        return side

    async def warm_up(self, baseline: StartedSide, submission: StartedSide | None) -> str | None:
        assert self.warm is not None
        try:
            await self.warm
        except UserError as e:
            raise HarnessError(f"the retrieval worker did not start: {e.message}") from None
        warmup = self.cpu.questions(
            stable_seed("pipeline-warmup", self.scoring_seed), count=WARMUP_QUESTIONS
        )
        await self._run(baseline, "baseline", warmup)
        if submission is not None and submission.up:
            try:
                await self._run(submission, "submission", warmup)
            except SideCrashed as e:
                return e.reason
        return None

    async def _run(
        self, side: StartedSide, role: Role, questions: list[Question]
    ) -> CpuPipelineRun:
        assert isinstance(side, PipelineSide) and side.deployment is not None
        assert side.config is not None and self.pool is not None
        dep = side.deployment
        try:
            return await run_side(self.pool, self.loaded, self.model, dep, side.config, questions)
        except UserError as e:
            died = dep.died()
            if role == "baseline":
                why = f"died: {died}" if died else f"failed: {e.message}"
                raise HarnessError(f"the baseline's pipeline {why}") from None
            raise SideCrashed(died or e.message) from None

    async def measure(self, side: StartedSide, role: Role, i: int) -> ObjectiveMeasurement:
        assert isinstance(side, PipelineSide)
        others = [
            proc
            for other in self.sides
            if other is not side and other.deployment is not None
            for proc in other.deployment.procs
        ]
        async with self.quiet.alone(others):
            run = await self._run(side, role, self.samples[i])
        side.runs.append(run)
        return measure_run(self.task.objective, run)

    def accuracy(self, side: StartedSide | None, role: Role) -> float | None:
        if not isinstance(side, PipelineSide):
            return None
        return _mean_recall(side.runs)

    def accuracy_gate(self, submission: float | None, baseline: float | None) -> GateResult:
        if submission is None or baseline is None:
            return gates.not_reached(self.no_accuracy)
        return recall_gate(submission, baseline, self.spec, self.min_accuracy)

    async def close(self) -> None:
        if self.warm is not None:
            if not self.warm.done():
                self.warm.cancel()
            with contextlib.suppress(asyncio.CancelledError, UserError):
                await self.warm
        if self.pool is not None:
            await self.pool.close()
        for side in self.sides:
            if side.deployment is not None:
                await side.deployment.stop()


# --------------------------------------------------------------------------- agent phase


async def dev_run(
    loaded: LoadedTask,
    engine: Engine,
    model: ModelRef,
    config: ServingConfig,
    *,
    quick: bool,
    log_dir: Path,
    name: str,
) -> tuple[CpuPipelineRun | None, str | None, str | None]:
    """One run of the dev questions through ``config``: ``(run, None, None)``, or ``(None,
    error, log tail)`` when a server did not start, died or the pipeline failed."""
    cpu = CpuPipelineTask(loaded)
    questions = cpu.questions(loaded.task.workload.dev_seed, quick)
    log_dir.mkdir(parents=True, exist_ok=True)
    pool = IndexPool(cpu.spec, cpu.corpus, log_dir / f"{name}-retrieval.log", max_workers=1)
    warm = asyncio.create_task(pool.warm())
    dep: Deployment | None = None
    try:
        dep = await deploy(loaded, engine, model, config, log_dir, name)
        if not dep.up:
            tail = read_tail(log_dir / f"{name}.log", 40)
            return None, dep.error, tail
        await warm
        return await run_side(pool, loaded, model, dep, config, questions), None, None
    except UserError as e:
        died = dep.died() if dep is not None else None
        error = f"a server died: {died}" if died else e.message
        return None, error, read_tail(log_dir / f"{name}.log", 40)
    finally:
        if not warm.done():
            warm.cancel()
        with contextlib.suppress(asyncio.CancelledError, UserError):
            await warm
        await pool.close()
        if dep is not None:
            await dep.stop()


def describe_questions(loaded: LoadedTask) -> dict[str, Any]:
    """What an agent is told of the pipeline's questions and corpus."""
    cpu = CpuPipelineTask(loaded)
    spec = cpu.spec
    return {
        "questions": cpu.count(False),
        "quick_questions": cpu.count(True),
        "arrival": "all at once (a closed loop of pipeline.concurrency)",
        "corpus_passages": len(cpu.corpus.passages),
        "passages_kept": spec.passages_kept,
        "min_recall": spec.min_recall,
    }


class CpuPipelineDevSession(RealDevSession):
    """The agent phase of a cpu-track pipeline task: the real-server track's (its wall-clock
    budget, its workspace), tuned through configs: the workspace holds ``serving.toml``
    rather than a launcher, since the harness deploys the servers and the retrieval stages
    from the config. An experiment deploys the config's LLM server(s), starts a retrieval
    worker and builds its index with the config's ``[pipeline]`` knobs, runs the dev
    questions (the task's dev seed; ``quick``: ``workload.quick_requests`` of them) through
    the pipeline, and stops everything; it is charged its wall seconds, start-ups and index
    build included. Its accuracy is the run's recall@k."""

    tuning = "config"
    refusal_note = ""

    def knobs(self) -> list[KnobInfo]:
        return knob_infos() + pipeline_knob_infos()

    def workload_facts(self) -> dict[str, Any]:
        return {"pipeline": describe_questions(self.loaded)}

    def seed_workspace(self, sandbox: LocalSandbox) -> None:
        """Write the baseline's ``serving.toml``, unless the workspace has one."""
        if not (sandbox.root / CONFIG_FILE).exists():
            write_workspace_config(sandbox.root, self.task.baseline, self.knobs())

    def _dev_run(
        self, config: ServingConfig, quick: bool, name: str
    ) -> tuple[CpuPipelineRun | None, str | None, str | None]:
        return asyncio.run(
            dev_run(
                self.loaded, self.engine, self.model, config, quick=quick,
                log_dir=self.server_logs, name=name,
            )
        )  # fmt: skip

    def baseline(self, quick: bool) -> DevBaseline:
        """The baseline's measurement and recall@k on the dev questions."""
        run, error, _ = self._dev_run(self.task.baseline, quick, f"dev-baseline{'-quick' * quick}")
        if run is None:
            raise BrokenTask(f"the task's baseline pipeline does not run: {error}")
        return DevBaseline(measure_run(self.task.objective, run), run.result.recall_at_k)

    def run(self, config: ServingConfig, quick: bool, index: int, baseline: DevBaseline) -> DevRun:
        started = time.monotonic()
        run, error, tail = self._dev_run(config, quick, f"experiment-{index:03d}")
        cost = time.monotonic() - started
        if run is None:
            return DevRun(cost=cost, error=error, tail=tail)
        m = measure_run(self.task.objective, run)
        return DevRun(
            cost=cost,
            measurement=m,
            accuracy=run.result.recall_at_k,
            pipeline=m.pipeline.summary() if m.pipeline is not None else None,
        )
