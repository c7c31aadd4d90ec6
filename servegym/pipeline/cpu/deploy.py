"""A cpu-track pipeline task's side, deployed: its LLM server(s), its retrieval index, a run.

What the final evaluation (:mod:`servegym.tracks.cpu_pipeline`) and the agent's
experiments (:class:`servegym.tracks.cpu_pipeline.CpuPipelineDevSession`) share:

- :class:`CpuPipelineTask`: the task's corpus (every ``modules_every``-th module of
  :data:`~servegym.pipeline.cpu.corpus.MODULES`) and its question sets (``workload.requests``
  questions, ``workload.quick_requests`` for a quick experiment, drawn by
  :func:`~servegym.pipeline.cpu.corpus.make_questions` at a seed: the dev seed for the
  agent, the hidden scoring seed for scoring);
- :func:`split_config`: a submitted :class:`ServingConfig` into the server's config (the
  ``[pipeline]`` table taken off) and the pipeline's knobs (its defaults when absent);
- :class:`Deployment`: the answer server and, with ``grade_server = "dedicated"``, the
  grader's own (the task's ``grade_model``, the same server knobs, ``max_num_seqs`` from
  ``grade_max_num_seqs``);
- :class:`IndexPool`: retrieval workers, each holding one index; an index is built once per
  set of index knobs (``embed_batch_size``, ``hnsw_m``, ``ef_construction``) and reused;
- :func:`measure_run`: a run's :class:`~servegym.scoring.objectives.ObjectiveMeasurement`,
  valued as the sim track's (:func:`servegym.pipeline.measure.pipeline_value`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from servegym.engines.base import Engine, ModelRef
from servegym.engines.capabilities import ConfigRejected
from servegym.engines.config import ServingConfig
from servegym.engines.models import resolve_model
from servegym.engines.pipeline_knobs import PipelineKnobs
from servegym.engines.process import ServerError, ServerProcess
from servegym.engines.served import ManagedServer
from servegym.errors import UserError
from servegym.pipeline.cpu.corpus import MODULES, Corpus, Question, build_corpus, make_questions
from servegym.pipeline.cpu.retrieval import BuildStats, WorkerRetriever
from servegym.pipeline.cpu.runner import CpuPipelineRun, PipelineSettings, run_pipeline
from servegym.pipeline.measure import pipeline_measurement
from servegym.scoring.objectives import IntegrityCounts, ObjectiveMeasurement
from servegym.tasks.loader import LoadedTask
from servegym.tasks.pipeline_spec import PipelineSpec
from servegym.tasks.spec import ObjectiveSpec

DEFAULT_QUESTIONS = 16
IndexKey = tuple[int, int, int]


@dataclass(frozen=True)
class CpuPipelineTask:
    """A cpu-track pipeline task's corpus and questions."""

    loaded: LoadedTask

    @property
    def spec(self) -> PipelineSpec:
        spec = self.loaded.task.pipeline
        if spec is None:
            raise ValueError(f"task {self.loaded.id} is not a pipeline task")
        return spec

    @cached_property
    def corpus(self) -> Corpus:
        return build_corpus(MODULES[:: self.spec.modules_every])

    def count(self, quick: bool = False) -> int:
        w = self.loaded.task.workload
        full = w.requests or DEFAULT_QUESTIONS
        if not quick:
            return full
        return w.quick_requests or max(1, full // 4)

    def questions(self, seed: int, quick: bool = False, count: int | None = None) -> list[Question]:
        """``count`` questions (default: a run's, or a quick experiment's) at ``seed``."""
        try:
            return make_questions(self.corpus, count or self.count(quick), seed)
        except ValueError as e:
            raise UserError(f"task {self.loaded.id}: workload.requests: {e}") from None


def questions_digest(questions: Sequence[Question]) -> str:
    """sha256 of the questions (what the evaluation records as its workload hash)."""
    data = json.dumps([q.model_dump(mode="json") for q in questions], sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()


def split_config(config: ServingConfig) -> tuple[ServingConfig, PipelineKnobs]:
    """The server's config (no ``[pipeline]`` table) and the pipeline's knobs."""
    knobs = config.pipeline if config.pipeline is not None else PipelineKnobs()
    return config.model_copy(update={"pipeline": None}), knobs


def index_key(knobs: PipelineKnobs) -> IndexKey:
    return (knobs.embed_batch_size, knobs.hnsw_m, knobs.ef_construction)


@dataclass
class Deployment:
    """One side's LLM servers (the answer server, and a dedicated grader's when asked)."""

    servers: list[ManagedServer] = field(default_factory=list)
    procs: list[ServerProcess] = field(default_factory=list)
    error: str | None = None

    @property
    def up(self) -> bool:
        return self.error is None and bool(self.procs)

    @property
    def main(self) -> ServerProcess:
        return self.procs[0]

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.procs[i].spec.port}"

    def died(self) -> str | None:
        """How a server of this side ended, if one did."""
        for proc in self.procs:
            info = proc.poll()
            if info is not None:
                return info.describe()
        return None

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()


async def deploy(
    loaded: LoadedTask,
    engine: Engine,
    model: ModelRef,
    config: ServingConfig,
    log_dir: Path,
    name: str,
) -> Deployment:
    """Start ``config``'s servers; a refused config or a server that does not start leaves
    ``error`` set (and nothing running)."""
    task = loaded.task
    server_config, knobs = split_config(config)
    timeout = task.evaluation.start_timeout_s
    d = Deployment()
    d.servers.append(
        ManagedServer(
            engine, server_config, model, log_dir / f"{name}.log", start_timeout_s=timeout
        )
    )
    if knobs.grade_server == "dedicated":
        grade_config = server_config
        if knobs.grade_max_num_seqs is not None:
            grade_config = server_config.model_copy(
                update={"max_num_seqs": knobs.grade_max_num_seqs}
            )
        grade_model = grade_model_ref(loaded, model)
        d.servers.append(
            ManagedServer(
                engine,
                grade_config,
                grade_model,
                log_dir / f"{name}-grade.log",
                start_timeout_s=timeout,
            )
        )
    for i, server in enumerate(d.servers):
        try:
            d.procs.append(await server.start())
        except (ConfigRejected, ServerError) as e:
            what = "" if i == 0 else "the dedicated grade server: "
            d.error = what + e.message
            await d.stop()
            d.procs = []
            break
        except asyncio.CancelledError:
            # (the evaluation starts both sides at once and ends one whose baseline failed)
            await d.stop()
            raise
    return d


def grade_model_ref(loaded: LoadedTask, model: ModelRef) -> ModelRef:
    """The dedicated grader's model: the task's ``grade_model`` (``model`` itself when that
    is the task's model, as on the cpu track, whose one model is servegym-tiny)."""
    spec = loaded.task.pipeline
    if spec is None or spec.grade_model == loaded.task.model:
        return model
    return resolve_model(spec.grade_model)


def settings_for(
    loaded: LoadedTask, model: ModelRef, deployment: Deployment, knobs: PipelineKnobs
) -> PipelineSettings:
    spec = loaded.task.pipeline
    assert spec is not None
    dedicated = knobs.grade_server == "dedicated" and len(deployment.procs) > 1
    return PipelineSettings(
        answer_url=deployment.url(0),
        grade_url=deployment.url(1) if dedicated else None,
        model=model.served_name,
        grade_model=grade_model_ref(loaded, model).served_name if dedicated else None,
        passages_kept=spec.passages_kept,
    )


class IndexPool:
    """Retrieval workers, each holding one index over the corpus.

    :meth:`index` returns a worker whose index was built with the knobs' index settings:
    one already built, a new worker (at most ``max_workers``), or else the least recently
    used worker, rebuilt. Use as ``async with IndexPool(...) as pool``."""

    def __init__(self, spec: PipelineSpec, corpus: Corpus, log: Path, max_workers: int = 2):
        self.spec = spec
        self.corpus = corpus
        self.log = log
        self.max_workers = max_workers
        self._held: list[tuple[WorkerRetriever, IndexKey | None, BuildStats | None]] = []
        self.builds = 0

    async def __aenter__(self) -> IndexPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _start(self) -> WorkerRetriever:
        python = sys.executable if self.spec.retrieval_backend == "hash" else None
        self.log.parent.mkdir(parents=True, exist_ok=True)
        return await WorkerRetriever.start(
            python, backend=self.spec.retrieval_backend, stderr=self.log
        )

    async def warm(self) -> None:
        """Start the first worker (its model load) ahead of need."""
        if not self._held:
            self._held.append((await self._start(), None, None))

    async def index(self, knobs: PipelineKnobs) -> tuple[WorkerRetriever, BuildStats]:
        key = index_key(knobs)
        for i, (worker, k, build) in enumerate(self._held):
            if k == key and build is not None:
                self._held.append(self._held.pop(i))  # most recently used last
                return worker, build
        idle = next((i for i, (_, k, _b) in enumerate(self._held) if k is None), None)
        if idle is not None:
            worker = self._held.pop(idle)[0]
        elif len(self._held) < self.max_workers:
            worker = await self._start()
        else:
            worker = self._held.pop(0)[0]
        build = await worker.build(
            [p.text for p in self.corpus.passages],
            batch_size=knobs.embed_batch_size,
            hnsw_m=knobs.hnsw_m,
            ef_construction=knobs.ef_construction,
        )
        self.builds += 1
        self._held.append((worker, key, build))
        return worker, build

    async def close(self) -> None:
        held, self._held = self._held, []
        for worker, _, _ in held:
            await worker.close()


async def run_side(
    pool: IndexPool,
    loaded: LoadedTask,
    model: ModelRef,
    deployment: Deployment,
    config: ServingConfig,
    questions: Sequence[Question],
) -> CpuPipelineRun:
    """One run of ``questions`` through ``config``'s pipeline on ``deployment``."""
    _, knobs = split_config(config)
    worker, build = await pool.index(knobs)
    return await run_pipeline(
        pool.corpus,
        questions,
        worker,
        knobs,
        settings_for(loaded, model, deployment, knobs),
        task=loaded.id,
        built=build,
    )


def measure_run(objective: ObjectiveSpec, run: CpuPipelineRun) -> ObjectiveMeasurement:
    """The objective (each component of a composite) on one run, holding the run's result."""
    counts = IntegrityCounts(requests=len(run.result.tasks), unit="questions")
    return pipeline_measurement(objective, run.result, counts)
