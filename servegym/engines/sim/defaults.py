"""The simulated engine's defaults, in one place: what ``None`` in a ServingConfig means.

The simulator models vLLM v1 serving through its OpenAI-compatible server, so every default
here is vLLM's for that entry point (``vllm serve``), including the ones that depend on the
GPU. ``EngineArgs.get_batch_defaults`` in vLLM picks the batch defaults by GPU memory and
name: GPUs with at least 70 GiB that are not an A100 (H100, H200, MI300x) get
``max_num_batched_tokens`` 8192 and ``max_num_seqs`` 1024 for the API server; the rest get
2048 and 256 (vLLM PR #17885 measured that the larger budget lowers A100 throughput). With
chunked prefill off and no budget given, vLLM raises the budget to ``max_model_len``, since
a prompt must then fit a step whole.

:func:`resolve` turns a (possibly partial) :class:`ServingConfig` into a
:class:`ResolvedConfig` of concrete values; :data:`KNOBS` and :func:`knob_defaults` describe
every knob for ``servegym sim --list``.
"""

from __future__ import annotations

from dataclasses import dataclass

from servegym.engines.config import ServingConfig, SpeculativeConfig
from servegym.engines.sim.profiles import HardwareProfile, ModelProfile

VALID_BLOCK_SIZES: tuple[int, ...] = (1, 8, 16, 32, 64, 128)
"""vLLM's CacheConfig accepts these block sizes (tokens per KV block) on CUDA."""

DEFAULT_BLOCK_SIZE = 16
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
LARGE_GPU_MIN_GIB = 70.0
"""vLLM's threshold for the larger batch defaults (``device_memory >= 70 GiB``)."""

LARGE_GPU_MAX_NUM_BATCHED_TOKENS = 8192
LARGE_GPU_MAX_NUM_SEQS = 1024
SMALL_GPU_MAX_NUM_BATCHED_TOKENS = 2048
SMALL_GPU_MAX_NUM_SEQS = 256

CUDA_GRAPH_MAX_CAPTURE_SIZE = 512
"""Largest batch (in tokens) vLLM v1 captures CUDA graphs for (``max_cudagraph_capture_size``
is 512 by default, and never more than ``max_num_batched_tokens``). Steps up to this many
tokens replay a graph; larger steps run without one and pay the launch overhead."""

MAX_TENSOR_PARALLEL = 8
"""GPUs in one simulated node: tensor parallel sizes above this cannot be placed."""

ATTENTION_BACKENDS: tuple[str, ...] = (
    "FLASH_ATTN",
    "FLASHINFER",
    "TRITON_ATTN",
    "FLEX_ATTENTION",
    "TREE_ATTN",
    "XFORMERS",
)
"""Attention backend names the simulated engine accepts (``VLLM_ATTENTION_BACKEND``)."""


def is_large_gpu(hw: HardwareProfile) -> bool:
    """vLLM's rule for the larger batch defaults: >= 70 GiB and not an A100."""
    return hw.memory_gib >= LARGE_GPU_MIN_GIB and "a100" not in f"{hw.id} {hw.name}".lower()


def default_max_num_seqs(hw: HardwareProfile) -> int:
    return LARGE_GPU_MAX_NUM_SEQS if is_large_gpu(hw) else SMALL_GPU_MAX_NUM_SEQS


def default_max_num_batched_tokens(
    hw: HardwareProfile, *, chunked_prefill: bool = True, max_model_len: int = 0
) -> int:
    base = (
        LARGE_GPU_MAX_NUM_BATCHED_TOKENS if is_large_gpu(hw) else SMALL_GPU_MAX_NUM_BATCHED_TOKENS
    )
    if not chunked_prefill:
        # A prompt must fit one step whole, so vLLM raises the budget to the context length.
        return max(base, max_model_len)
    return base


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """A ServingConfig with every default filled in, as the simulated engine runs it."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    block_size: int
    kv_cache_dtype: str
    kv_fp8: bool
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    scheduling_policy: str
    dtype: str
    quantization: str
    weight_format: str
    speculative: SpeculativeConfig | None
    tensor_parallel_size: int
    enforce_eager: bool
    attention_backend: str | None
    cuda_graph_max_tokens: int
    extra_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, object]:
        """The resolved knobs, for ``sim.json`` and reports."""
        return {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "block_size": self.block_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "enable_prefix_caching": self.enable_prefix_caching,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "scheduling_policy": self.scheduling_policy,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "speculative": None if self.speculative is None else self.speculative.model_dump(),
            "tensor_parallel_size": self.tensor_parallel_size,
            "enforce_eager": self.enforce_eager,
            "attention_backend": self.attention_backend,
        }


WEIGHT_FORMAT_OF: dict[str, str] = {
    "none": "bf16",
    "fp8": "fp8",
    "int8": "int8",
    "awq": "int4",
    "gptq": "int4",
    "int4": "int4",
}
"""ServingConfig.quantization -> the weight format the cost model prices (AWQ and GPTQ are
4-bit weight-only schemes)."""


def resolve(
    config: ServingConfig | None, model: ModelProfile, hw: HardwareProfile
) -> ResolvedConfig:
    """Fill every ``None`` knob of ``config`` with vLLM's default for this model and GPU.

    Nothing is validated here beyond what the defaults need; :func:`launch` checks the
    result the way the engine would at start-up.
    """
    c = config if config is not None else ServingConfig()
    chunked = True if c.enable_chunked_prefill is None else c.enable_chunked_prefill
    max_model_len = (
        c.max_model_len if c.max_model_len is not None else model.max_position_embeddings
    )
    budget = (
        c.max_num_batched_tokens
        if c.max_num_batched_tokens is not None
        else default_max_num_batched_tokens(
            hw, chunked_prefill=chunked, max_model_len=max_model_len
        )
    )
    kv_dtype = c.kv_cache_dtype or "auto"
    quant = c.quantization or "none"
    eager = bool(c.enforce_eager)
    return ResolvedConfig(
        max_num_seqs=c.max_num_seqs if c.max_num_seqs is not None else default_max_num_seqs(hw),
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        gpu_memory_utilization=(
            c.gpu_memory_utilization
            if c.gpu_memory_utilization is not None
            else DEFAULT_GPU_MEMORY_UTILIZATION
        ),
        kv_cache_memory_bytes=c.kv_cache_memory_bytes,
        block_size=c.block_size if c.block_size is not None else DEFAULT_BLOCK_SIZE,
        kv_cache_dtype=kv_dtype,
        kv_fp8=kv_dtype.startswith("fp8"),
        enable_prefix_caching=True if c.enable_prefix_caching is None else c.enable_prefix_caching,
        enable_chunked_prefill=chunked,
        scheduling_policy=c.scheduling_policy or "fcfs",
        dtype=c.dtype or "auto",
        quantization=quant,
        weight_format=WEIGHT_FORMAT_OF[quant],
        speculative=c.speculative,
        tensor_parallel_size=c.tensor_parallel_size or 1,
        enforce_eager=eager,
        attention_backend=c.attention_backend,
        cuda_graph_max_tokens=0 if eager else min(CUDA_GRAPH_MAX_CAPTURE_SIZE, budget),
        extra_args=tuple(c.extra_args),
        env=tuple(sorted(c.env.items())),
    )


@dataclass(frozen=True, slots=True)
class Knob:
    """One ServingConfig knob as ``servegym sim --list`` shows it."""

    name: str
    default: str
    help: str


KNOBS: tuple[Knob, ...] = (
    Knob(
        "max_num_seqs",
        f"{LARGE_GPU_MAX_NUM_SEQS} on >=70 GiB GPUs except A100, else {SMALL_GPU_MAX_NUM_SEQS}",
        "most requests running at once (batch size cap)",
    ),
    Knob(
        "max_num_batched_tokens",
        f"{LARGE_GPU_MAX_NUM_BATCHED_TOKENS} on >=70 GiB GPUs except A100, else "
        f"{SMALL_GPU_MAX_NUM_BATCHED_TOKENS}; max_model_len when chunked prefill is off",
        "token budget of one engine step (decodes + prefill chunks)",
    ),
    Knob("max_model_len", "the model's max_position_embeddings", "longest prompt + output"),
    Knob(
        "gpu_memory_utilization",
        str(DEFAULT_GPU_MEMORY_UTILIZATION),
        "fraction of GPU memory for weights, activations and KV cache",
    ),
    Knob(
        "kv_cache_memory_bytes",
        "unset",
        "KV cache bytes per GPU (overrides gpu_memory_utilization for the cache)",
    ),
    Knob(
        "block_size",
        str(DEFAULT_BLOCK_SIZE),
        "tokens per KV block: " + ", ".join(map(str, VALID_BLOCK_SIZES)),
    ),
    Knob("kv_cache_dtype", "auto", "auto (model dtype) or fp8 / fp8_e4m3 / fp8_e5m2"),
    Knob("enable_prefix_caching", "true", "reuse KV blocks of identical prompt prefixes"),
    Knob("enable_chunked_prefill", "true", "split long prompts across steps, mixed with decodes"),
    Knob("scheduling_policy", "fcfs", "fcfs or priority (later turns of a session first)"),
    Knob("dtype", "auto", "auto / bfloat16 / float16 / float32"),
    Knob("quantization", "none", "weights: none, fp8, int8, awq, gptq, int4"),
    Knob(
        "speculative",
        "unset",
        "method (ngram, draft_model, eagle, eagle3, mtp), num_speculative_tokens, draft_model",
    ),
    Knob("tensor_parallel_size", "1", f"GPUs per replica: 1, 2, 4 or {MAX_TENSOR_PARALLEL}"),
    Knob("enforce_eager", "false", "no CUDA graphs: faster start-up, slower small-batch steps"),
    Knob("attention_backend", "auto", ", ".join(ATTENTION_BACKENDS)),
    Knob(
        "pipeline",
        "none",
        "pipeline tasks only: [pipeline] table of retrieval knobs (see docs/pipelines.md)",
    ),
)


def knob_defaults(model: ModelProfile, hw: HardwareProfile) -> dict[str, object]:
    """The concrete defaults on this model and GPU (what ``ServingConfig()`` resolves to)."""
    return resolve(None, model, hw).as_dict()
