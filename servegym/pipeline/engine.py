"""Starting a pipeline task's deployment on the simulator: :class:`PipelineEngine`.

A pipeline deployment is the main LLM server (the task's model, configured by the
ServingConfig's engine knobs: it runs query decomposition and answer generation, and
grading when ``grade_server = "shared"``), optionally a dedicated grade server (the task's
smaller ``grade_model`` on a GPU of its own, ``grade_server = "dedicated"``), the embedder
and reranker (on the main GPU, in the memory the LLM server leaves) and the HNSW index (on
the host's cores).

:class:`PipelineEngine` wraps the started servers (each a
:class:`~servegym.engines.sim.launch.LaunchedEngine`) and states the deployment's totals as
the sim track reads them of any started side: ``num_gpus`` and ``price_per_hour`` add the
grade server's, ``startup_s`` is the slower server's, ``hardware`` the main server's, and
``accuracy_ratio`` is the main model's modelled accuracy times the pipeline's modelled
retrieval recall (:func:`servegym.pipeline.cost.final_recall`), so the task's accuracy gate
(submission over baseline at least ``accuracy.min_ratio``) gates recall too. The sim track
(:class:`servegym.tracks.sim.SimPipelineTrack`, the track of a sim pipeline task) starts it
through :func:`launch_pipeline`.
"""

from __future__ import annotations

from dataclasses import dataclass

from servegym.engines.config import ServingConfig
from servegym.engines.pipeline_knobs import PipelineKnobs
from servegym.engines.sim.launch import LaunchedEngine, LaunchError, launch
from servegym.engines.sim.profiles import HardwareProfile, ModelProfile, get_model
from servegym.pipeline.cost import encoder_memory_gib, final_recall, index_build_docs_per_s
from servegym.tasks.pipeline_spec import PipelineSpec
from servegym.tasks.spec import Task


@dataclass(frozen=True, slots=True)
class PipelineEngine:
    """A started pipeline deployment: its servers, and the deployment's totals."""

    knobs: PipelineKnobs
    pipeline: PipelineSpec
    main: LaunchedEngine
    grade: LaunchedEngine | None
    recall: float
    """The modelled recall@k after every round (k = ``pipeline.passages_kept``)."""
    index_build_docs_per_s: float

    @property
    def hardware(self) -> HardwareProfile:
        return self.main.hardware

    @property
    def num_gpus(self) -> int:
        return self.main.num_gpus + (self.grade.num_gpus if self.grade is not None else 0)

    @property
    def price_per_hour(self) -> float:
        grade = self.grade.price_per_hour if self.grade is not None else 0
        return self.main.price_per_hour + grade

    @property
    def startup_s(self) -> float:
        return max(self.main.startup_s, self.grade.startup_s if self.grade is not None else 0.0)

    @property
    def accuracy_ratio(self) -> float:
        return self.main.accuracy_ratio * self.recall


def launch_pipeline(
    task: Task,
    model: ModelProfile,
    hardware: HardwareProfile,
    config: ServingConfig,
    *,
    workload_family: str = "synthetic",
) -> PipelineEngine:
    """Start ``config`` as ``task``'s pipeline, or raise :class:`LaunchError`."""
    spec = task.pipeline
    if spec is None:
        raise ValueError(f"task {task.id} is not a pipeline task")
    knobs = config.pipeline if config.pipeline is not None else PipelineKnobs()
    server = config.model_copy(update={"pipeline": None})
    main = launch(
        model,
        hardware,
        server,
        workload_family=workload_family,
        available_gpus=task.max_gpus,
        engine=task.sim_engine,
    )
    grade: LaunchedEngine | None = None
    if knobs.grade_server == "dedicated":
        if main.num_gpus >= task.max_gpus:
            raise LaunchError(
                f"ValueError: grade_server = 'dedicated' needs a GPU of its own: the main "
                f"server uses {main.num_gpus} of the {task.max_gpus} GPU(s) available"
            )
        try:
            grade = launch(
                get_model(spec.grade_model, "pipeline.grade_model"),
                hardware,
                ServingConfig(max_num_seqs=knobs.grade_max_num_seqs),
                workload_family=workload_family,
                available_gpus=1,
                engine=task.sim_engine,
            )
        except LaunchError as e:
            raise LaunchError(f"the grade server failed to start: {e.message}") from None
    free_gib = hardware.memory_gib * (1.0 - main.config.gpu_memory_utilization)
    need_gib = encoder_memory_gib(spec, knobs)
    if need_gib > free_gib:
        raise LaunchError(
            f"torch.OutOfMemoryError: the embedder and reranker need {need_gib:.2f} GiB "
            f"(embed_batch_size={knobs.embed_batch_size}) but the LLM server's "
            f"gpu_memory_utilization={main.config.gpu_memory_utilization:g} leaves "
            f"{free_gib:.2f} GiB: lower embed_batch_size or gpu_memory_utilization"
        )
    return PipelineEngine(
        knobs=knobs,
        pipeline=spec,
        main=main,
        grade=grade,
        recall=final_recall(spec, knobs),
        index_build_docs_per_s=index_build_docs_per_s(hardware, spec, knobs),
    )
