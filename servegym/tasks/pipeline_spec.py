"""A pipeline task's fixed shape: the ``[pipeline]`` table of ``task.toml``.

It says what the agent cannot change: the corpus, the passages per answer, the models of
the embedder, reranker and grader, and the hardware the retrieval runs on. Each question of
the task's workload is one pipeline task: its prompt length is the question's, its output
length the answer's, its arrival the question's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class PipelineSpec(BaseModel):
    """``[pipeline]`` in ``task.toml``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    corpus_docs: int = Field(default=2_000_000, ge=1000, le=10**10)
    passage_tokens: int = Field(default=200, ge=16, le=8192)
    passages_kept: int = Field(
        default=4, ge=1, le=64, description="passages per sub-query after reranking"
    )
    embed_dim: int = Field(default=1024, ge=16, le=8192)
    embedder_params: float = Field(default=3.35e8, gt=0, description="embedding model parameters")
    reranker_params: float = Field(default=5.6e8, gt=0, description="cross-encoder parameters")
    query_tokens: int = Field(default=32, ge=1, le=4096, description="tokens of one sub-query")
    sub_queries_min: int = Field(default=1, ge=1, le=16)
    sub_queries_max: int = Field(default=3, ge=1, le=16)
    grade_model: str = Field(default="qwen3-0.6b", description="model of a dedicated grade server")
    system_prompt_tokens: int = Field(default=160, ge=0, le=8192, description="per LLM stage")
    decompose_tokens_per_sub_query: int = Field(default=24, ge=1, le=1024)
    grade_tokens_per_passage: int = Field(default=6, ge=1, le=256)
    cpu_cores: int = Field(default=16, ge=1, le=1024, description="cores searching the index")
    distance_us: float = Field(
        default=2.0, gt=0, description="one HNSW distance computation, microseconds (memory-bound)"
    )
    embedding_recall_scale: float = Field(
        default=8.0,
        gt=0,
        description="depth at which the embedder ranks a supporting passage: it lies in the "
        "top d with probability 1 - 0.6 exp(-d / scale)",
    )

    min_recall: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="cpu track: the submission's measured recall@k must be at least this "
        "(default: accuracy.min_ratio of the baseline's)",
    )
    modules_every: int = Field(
        default=1, ge=1, le=64, description="cpu track: the corpus from every Nth module"
    )
    retrieval_backend: Literal["minilm", "hash"] = Field(
        default="minilm",
        description="cpu track: the retrieval worker's embedder (hash: numpy only, for tests)",
    )

    @model_validator(mode="after")
    def _check(self) -> PipelineSpec:
        if self.sub_queries_min > self.sub_queries_max:
            raise ValueError("sub_queries_min must be <= sub_queries_max")
        return self
