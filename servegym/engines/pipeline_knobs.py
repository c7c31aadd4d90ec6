"""The pipeline's own knobs: ``ServingConfig.pipeline``, a ``[pipeline]`` table in a config.

An agent on a pipeline task tunes these beside the LLM server's knobs (which apply to the
main server: query decomposition, answer generation, and grading when it shares that
server). Every field has a default, so ``[pipeline]`` may set only what it changes; a task's
baseline may set its own values in ``[baseline.pipeline]``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servegym.engines.knob_info import KnobInfo

GradeServer = Literal["shared", "dedicated"]


class PipelineKnobs(BaseModel):
    """What the agent may turn in the retrieval pipeline."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    embed_batch_size: int = Field(
        default=32,
        ge=1,
        le=1024,
        description="sequences per batch of the embedder and the reranker (dynamic batching)",
    )
    hnsw_m: int = Field(default=32, ge=4, le=128, description="HNSW graph degree M")
    ef_construction: int = Field(
        default=200, ge=8, le=4096, description="HNSW build beam width (build rate, graph quality)"
    )
    ef_search: int = Field(
        default=256, ge=1, le=8192, description="HNSW search beam width (search cost, recall)"
    )
    top_k: int = Field(default=50, ge=1, le=1000, description="candidates retrieved per query")
    rerank_depth: int = Field(
        default=50, ge=1, le=1000, description="candidates the cross-encoder reranks (<= top_k)"
    )
    max_rounds: int = Field(
        default=3, ge=1, le=8, description="retrieval rounds the sufficiency check may run"
    )
    concurrency: int = Field(
        default=32, ge=1, le=4096, description="questions the pipeline works on at once"
    )
    grade_server: GradeServer = Field(
        default="shared",
        description="grading on the main LLM server (shared) or on its own server with the "
        "task's smaller grade model, on a GPU of its own (dedicated)",
    )
    grade_max_num_seqs: int | None = Field(
        default=None, ge=1, le=65536, description="max_num_seqs of a dedicated grade server"
    )

    @model_validator(mode="after")
    def _check(self) -> PipelineKnobs:
        if self.rerank_depth > self.top_k:
            raise ValueError(
                f"rerank_depth ({self.rerank_depth}) cannot exceed top_k ({self.top_k}): "
                "the reranker only sees the retrieved candidates"
            )
        return self


def pipeline_knob_infos() -> list[KnobInfo]:
    """Each pipeline knob as an agent is told of it (``pipeline.<knob>``)."""
    defaults = PipelineKnobs()
    return [
        KnobInfo(
            name=f"pipeline.{name}",
            default=str(getattr(defaults, name)),
            help=f"{field.description} (default: {getattr(defaults, name)})",
        )
        for name, field in PipelineKnobs.model_fields.items()
    ]
