"""The engine-neutral serving configuration an agent tunes.

Every knob defaults to ``None``, meaning "the engine's own default" (vLLM's defaults depend on
the hardware, e.g. ``max_num_batched_tokens``), so a baseline config is simply
``ServingConfig()``. Each engine resolves the defaults and rejects, with a clear message, what
it cannot do. Engine-native flags the neutral knobs do not cover go in ``extra_args``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servegym.engines.pipeline_knobs import PipelineKnobs

KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
WeightQuantization = Literal["none", "fp8", "int8", "awq", "gptq", "int4"]
SpecMethod = Literal["ngram", "draft_model", "eagle", "eagle3", "mtp"]
Dtype = Literal["auto", "bfloat16", "float16", "float32"]


class SpeculativeConfig(BaseModel):
    """Speculative decoding: a proposer and how many tokens it proposes per step."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    method: SpecMethod
    num_speculative_tokens: int = Field(ge=1, le=16)
    draft_model: str | None = Field(
        default=None, description="draft model id (draft_model, eagle methods)"
    )
    prompt_lookup_max: int | None = Field(default=None, ge=1, description="ngram window max")
    prompt_lookup_min: int | None = Field(default=None, ge=1, description="ngram window min")


class ServingConfig(BaseModel):
    """Engine-neutral serving knobs; ``None`` means the engine's default."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_num_seqs: int | None = Field(default=None, ge=1, le=65536)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=16)
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=0)
    block_size: int | None = Field(default=None, ge=1)
    kv_cache_dtype: KvCacheDtype | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    scheduling_policy: Literal["fcfs", "priority"] | None = None
    dtype: Dtype | None = None
    quantization: WeightQuantization | None = None
    speculative: SpeculativeConfig | None = None
    tensor_parallel_size: int | None = Field(default=None, ge=1)
    enforce_eager: bool | None = None
    attention_backend: str | None = None
    pipeline: PipelineKnobs | None = Field(
        default=None,
        description="pipeline tasks only: the retrieval pipeline's knobs ([pipeline] table)",
    )
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> ServingConfig:
        if (
            self.max_num_batched_tokens is not None
            and self.max_model_len is not None
            and self.enable_chunked_prefill is False
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                "max_num_batched_tokens must be >= max_model_len when chunked prefill is off"
            )
        return self

    def changed(self) -> dict[str, object]:
        """The knobs set away from the engine default (for logs and reports)."""
        return self.model_dump(exclude_defaults=True)
