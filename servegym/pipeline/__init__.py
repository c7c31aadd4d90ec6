"""Pipeline tasks: an end-to-end RAG pipeline scored as a whole (issue 9).

The stages (:data:`servegym.pipeline.result.STAGES`) are query decomposition, embedding,
retrieval, reranking, grading and answer generation; :mod:`servegym.pipeline.result` holds
the result every track writes (:class:`~servegym.pipeline.result.PipelineResult`) and the
Amdahl arithmetic that reads it. The simulator track's pipeline lives in
:mod:`servegym.pipeline.sim`, the CPU track's parts in :mod:`servegym.pipeline.cpu`.
"""

from servegym.pipeline.result import (
    STAGES,
    LatencyPercentiles,
    PipelineResult,
    Stage,
    TaskRecord,
    amdahl_ceiling,
    pipeline_speedup,
    speedup_if,
)

__all__ = [
    "STAGES",
    "LatencyPercentiles",
    "PipelineResult",
    "Stage",
    "TaskRecord",
    "amdahl_ceiling",
    "pipeline_speedup",
    "speedup_if",
]
