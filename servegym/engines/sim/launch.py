"""Starting the simulated engine: check the config as vLLM would, size the KV cache, time
the start-up.

:func:`launch` resolves the config's defaults, checks it in the order the engine does and
raises :class:`LaunchError` with a message shaped like the engine's own (the exception type
and text vLLM prints) for what would crash a real start-up. On success it returns a
:class:`LaunchedEngine`: the cost model, the KV capacity and the start-up time.

**Memory (per GPU).** vLLM takes ``gpu_memory_utilization x memory`` for itself; weights
(split over the TP GPUs) and the activation peak of a ``max_num_batched_tokens`` step come
out of that, and the rest is KV cache, in blocks of ``block_size`` tokens. The activation
peak is ``activation_reserve_gib`` from the hardware profile (fitted at a budget of
:data:`REFERENCE_BUDGET` tokens) adjusted by the intermediate activations of the budget's
difference from that (:data:`ACT_BYTES_PER_TOKEN_FACTOR` x (intermediate + hidden) x 2
bytes per token, per GPU): a larger budget leaves a little less KV cache.
``kv_cache_memory_bytes`` replaces the computed KV size (per GPU), as in vLLM.

**Memory fraction too high (deterministic rule).** vLLM first checks that the fraction it
asks for is free: memory outside the fraction must hold the CUDA context
(:data:`CUDA_CONTEXT_GIB`), otherwise "Free memory on device ... is less than desired GPU
memory utilization". CUDA-graph capture then allocates outside the fraction too
(:data:`CUDA_GRAPH_POOL_GIB` more): a fraction that leaves room for the context but not the
graphs fails with CUDA out of memory during capture unless ``enforce_eager`` skips capture.
On an 80 GiB GPU that puts the limit near 0.98 (0.99 in eager mode).

**Start-up time.** Checkpoint bytes per GPU / ``weight_load_gbs`` (GPUs load their shards in
parallel) + ``compile_s`` (torch.compile) + ``cuda_graph_capture_s``; ``enforce_eager``
skips both of the last two (vLLM v1 compiles nothing in eager mode).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from servegym.engines.config import ServingConfig
from servegym.engines.sim.cost_model import BUILTIN_QUANT, GIB, KV_FP8_ACCURACY, CostModel
from servegym.engines.sim.defaults import (
    ATTENTION_BACKENDS,
    MAX_TENSOR_PARALLEL,
    VALID_BLOCK_SIZES,
    ResolvedConfig,
    resolve,
)
from servegym.engines.sim.profiles import (
    EngineProfile,
    HardwareProfile,
    ModelProfile,
    QuantizationProfile,
    get_engine,
    get_hardware,
    get_model,
    model_profiles,
    quantization_profiles,
)
from servegym.engines.sim.speculative import SpecPlan, method_profile
from servegym.engines.sim.speculative import plan as spec_plan

DEFAULT_ENGINE = "vllm"
"""The engine profile simulated unless a task or caller names another."""
CUDA_CONTEXT_GIB = 0.6
"""Memory outside vLLM's fraction taken by the CUDA context and the torch allocator."""
CUDA_GRAPH_POOL_GIB = 1.0
"""Extra memory outside the fraction that CUDA-graph capture needs."""
ACT_BYTES_PER_TOKEN_FACTOR = 3.0
"""Live activation tensors per token at the peak of a step, in units of
(intermediate + hidden) elements (gate/up outputs, residual, attention output)."""
REFERENCE_BUDGET = 8192
"""``activation_reserve_gib`` in the profiles is for a step of this many tokens."""
MIN_RESERVE_FRACTION = 0.4
"""A smaller budget never shrinks the reserve below this share (CUDA graphs, workspace)."""


class LaunchError(Exception):
    """The simulated engine failed to start; ``message`` reads like the engine's own error.

    The command line prints it and exits with code 3.
    """

    exit_code = 3

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class LaunchedEngine:
    """A simulated engine that started: everything a run needs, fixed for its lifetime."""

    model: ModelProfile
    hardware: HardwareProfile
    config: ResolvedConfig
    cost: CostModel
    quant: QuantizationProfile
    spec: SpecPlan | None
    num_gpus: int
    num_blocks: int
    block_size: int
    kv_capacity_tokens: int
    kv_cache_bytes_per_gpu: float
    weight_bytes_per_gpu: float
    startup_s: float
    accuracy_ratio: float
    price_per_hour: float
    """Dollars per hour for all the engine's GPUs."""
    workload_family: str

    @property
    def name(self) -> str:
        return f"sim:{self.model.id}@{self.hardware.id}"


def _gib(x: float) -> str:
    return f"{x / GIB:.2f}"


def _mib(x: float) -> str:
    return f"{x / 1024**2:.2f}"


def _quant_table() -> dict[str, QuantizationProfile]:
    try:
        return quantization_profiles()
    except FileNotFoundError:
        return {}


def quantization_for(fmt: str, method: str) -> QuantizationProfile:
    """The weight-format profile of a ``ServingConfig.quantization`` value
    (``profiles/quantization.toml``: the entry listing it in ``aliases``, else the entry of
    its format; the built-in fallback when the data has neither)."""
    weights = {k: q for k, q in _quant_table().items() if q.applies_to == "weights"}
    for q in weights.values():
        if method in q.aliases:
            return q
    for key, q in weights.items():
        if key == fmt or q.format == fmt:
            return q
    return BUILTIN_QUANT[fmt]


def kv_fp8_accuracy() -> float:
    """Accuracy ratio of an fp8 KV cache (the data's KV-cache entry, else the fallback)."""
    for q in _quant_table().values():
        if q.applies_to == "kv_cache":
            return q.accuracy_ratio
    return KV_FP8_ACCURACY


def _weight_only_dequant() -> float:
    """Dequantization overhead of a format run weight-only (the int4 / W4A16 entry's)."""
    return quantization_for("int4", "int4").dequant_overhead


def _profile(value: str | ModelProfile, flag: str) -> ModelProfile:
    return value if isinstance(value, ModelProfile) else get_model(value, flag)


def launch(
    model: str | ModelProfile,
    hardware: str | HardwareProfile,
    config: ServingConfig | None = None,
    *,
    workload_family: str = "synthetic",
    models: Mapping[str, ModelProfile] | None = None,
    available_gpus: int = MAX_TENSOR_PARALLEL,
    engine: str | EngineProfile = DEFAULT_ENGINE,
) -> LaunchedEngine:
    """Start the simulated engine, or raise :class:`LaunchError` as the engine would.

    ``available_gpus`` is how many GPUs the machine has (a task may grant fewer than 8).
    ``engine`` is the engine profile simulated (``profiles/engines/``: vLLM by default; a
    TensorRT-LLM-class engine for comparison): its host-side costs and kernel efficiency.

    ``workload_family`` (the workload's kind) selects speculative acceptance rates.
    ``models`` is where a draft model id is looked up (default: the shipped model
    profiles). Unknown model or hardware ids raise :class:`~servegym.errors.UserError` (bad
    input, not a failed launch).

    The phases run in the order vLLM's start-up meets them, so a config with several
    problems fails with the one the engine would report first.
    """
    m = _profile(model, "--model")
    hw = hardware if isinstance(hardware, HardwareProfile) else get_hardware(hardware)
    eng = engine if isinstance(engine, EngineProfile) else get_engine(engine)
    _reject_pipeline(config)
    cfg = resolve(config, m, hw)
    env = dict(cfg.env)
    _check_parallel(m, cfg, available_gpus)
    _check_model(m, cfg, env)
    _check_cache(hw, cfg, env)
    _check_scheduler(cfg)
    spec = _speculative_plan(m, cfg, models, workload_family)
    quant = quantization_for(cfg.weight_format, cfg.quantization)
    cost = _cost_model(m, hw, cfg, quant, spec, eng)
    memory = _plan_memory(m, hw, cfg, quant, cost)
    return LaunchedEngine(
        model=m,
        hardware=hw,
        config=cfg,
        cost=cost,
        quant=quant,
        spec=spec,
        num_gpus=cfg.tensor_parallel_size,
        num_blocks=memory.num_blocks,
        block_size=memory.block_size,
        kv_capacity_tokens=memory.capacity_tokens,
        kv_cache_bytes_per_gpu=memory.kv_cache_bytes_per_gpu,
        weight_bytes_per_gpu=memory.weight_bytes_per_gpu,
        startup_s=_startup_s(hw, cfg, cost),
        accuracy_ratio=_accuracy_ratio(cfg, quant),
        price_per_hour=hw.price_per_hour * cfg.tensor_parallel_size,
        workload_family=workload_family,
    )


# --- validation: what vLLM's config classes reject -----------------------------------------


def _reject_pipeline(config: ServingConfig | None) -> None:
    """A ``[pipeline]`` table belongs to pipeline tasks; the engine's argument parser has no
    such flag, so it fails before anything else is resolved."""
    if config is not None and config.pipeline is not None:
        raise LaunchError(
            "error: unrecognized arguments: the [pipeline] table configures a retrieval "
            "pipeline; only pipeline tasks have one"
        )


def _check_parallel(m: ModelProfile, cfg: ResolvedConfig, available_gpus: int) -> None:
    """Parallel config: the TP group must fit the machine's GPUs (at most
    :data:`MAX_TENSOR_PARALLEL`) and split the attention heads evenly."""
    tp = cfg.tensor_parallel_size
    gpus = min(available_gpus, MAX_TENSOR_PARALLEL)
    if tp > gpus:
        raise LaunchError(
            f"ValueError: The number of required GPUs exceeds the total number of available "
            f"GPUs in the placement group. (tensor_parallel_size={tp}, available GPUs: "
            f"{gpus})"
        )
    if m.num_attention_heads % tp:
        raise LaunchError(
            f"ValueError: Total number of attention heads ({m.num_attention_heads}) must be "
            f"divisible by tensor parallel size ({tp})."
        )


def _check_model(m: ModelProfile, cfg: ResolvedConfig, env: Mapping[str, str]) -> None:
    """Model config: ``max_model_len`` within the model's positions (unless the env var
    allows more, as in vLLM) and no float32 with a quantized checkpoint."""
    if cfg.max_model_len > m.max_position_embeddings and env.get(
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
    ) not in ("1", "true", "True"):
        raise LaunchError(
            f"ValueError: User-specified max_model_len ({cfg.max_model_len}) is greater than "
            f"the derived max_model_len (max_position_embeddings={m.max_position_embeddings} "
            "in model's config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with "
            "extreme caution."
        )
    if cfg.dtype == "float32" and cfg.quantization != "none":
        raise LaunchError(
            f"ValueError: torch.float32 is not supported for quantization method "
            f"{cfg.quantization}. Supported dtypes: [torch.bfloat16, torch.float16]"
        )


def _check_cache(hw: HardwareProfile, cfg: ResolvedConfig, env: Mapping[str, str]) -> None:
    """Cache config: a block size vLLM accepts, a known attention backend (the flag, else
    ``VLLM_ATTENTION_BACKEND``), and no fp8 KV cache on FlashAttention where the GPU lacks
    FlashAttention 3 (no fp8 compute)."""
    if cfg.block_size not in VALID_BLOCK_SIZES:
        raise LaunchError(
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig\n"
            f"block_size\n  Input should be {', '.join(map(str, VALID_BLOCK_SIZES[:-1]))} or "
            f"{VALID_BLOCK_SIZES[-1]} [type=literal_error, input_value={cfg.block_size}]"
        )
    backend = cfg.attention_backend or env.get("VLLM_ATTENTION_BACKEND")
    if backend is not None:
        if backend.upper() not in ATTENTION_BACKENDS:
            raise LaunchError(
                f"ValueError: Invalid attention backend: '{backend}'. Valid backends are: "
                f"{list(ATTENTION_BACKENDS)}"
            )
        if cfg.kv_fp8 and backend.upper() == "FLASH_ATTN" and hw.peak_tflops.fp8 is None:
            raise LaunchError(
                f"ValueError: Selected backend FLASH_ATTN is not valid for this configuration. "
                f"Reason: ['kv_cache_dtype not supported'] (kv_cache_dtype={cfg.kv_cache_dtype} "
                f"needs FlashAttention 3, which {hw.name} does not support)"
            )


def _check_scheduler(cfg: ResolvedConfig) -> None:
    """Scheduler config: the token budget holds one token per sequence, and without chunked
    prefill it holds a whole ``max_model_len`` prompt."""
    if cfg.max_num_batched_tokens < cfg.max_num_seqs:
        raise LaunchError(
            f"ValueError: max_num_batched_tokens ({cfg.max_num_batched_tokens}) must be greater "
            f"than or equal to max_num_seqs ({cfg.max_num_seqs})."
        )
    if not cfg.enable_chunked_prefill and cfg.max_num_batched_tokens < cfg.max_model_len:
        raise LaunchError(
            f"ValueError: max_num_batched_tokens ({cfg.max_num_batched_tokens}) is smaller than "
            f"max_model_len ({cfg.max_model_len}). This effectively limits the maximum sequence "
            "length to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
            "increase max_num_batched_tokens or decrease max_model_len."
        )


# --- speculative decoding ------------------------------------------------------------------


def _speculative_plan(
    m: ModelProfile,
    cfg: ResolvedConfig,
    models: Mapping[str, ModelProfile] | None,
    workload_family: str,
) -> SpecPlan | None:
    """Speculative config: check that the method can run on this model (native MTP layers,
    an EAGLE head for it, a draft model named where the method needs one, a sane n-gram
    window), then plan it; ``None`` when speculation is off."""
    if cfg.speculative is None:
        return None
    s = cfg.speculative
    prof, _ = method_profile(s.method)
    draft: ModelProfile | None = None
    if prof.requires_native_support:
        raise LaunchError(
            f"ValueError: Speculative method '{s.method}' needs a model that ships its own "
            f"multi-token prediction layers (num_nextn_predict_layers > 0); {m.hf_name} "
            "has none."
        )
    if s.method in ("eagle", "eagle3") and prof.heads and m.id not in prof.heads:
        raise LaunchError(
            f"ValueError: No {s.method.upper()} draft head is available for {m.hf_name} "
            f"(simulated heads exist for: {', '.join(sorted(prof.heads))}). Use another "
            "speculative method or model."
        )
    if s.method in ("draft_model", "eagle", "eagle3") and not s.draft_model:
        usual = m.draft_model if s.method == "draft_model" else prof.heads.get(m.id)
        raise LaunchError(
            "ValueError: num_speculative_tokens was provided but without speculative model. "
            f"(method '{s.method}' needs speculative_config.model"
            + (f", e.g. '{usual}')" if usual else ")")
        )
    if s.method == "ngram":
        lo, hi = s.prompt_lookup_min, s.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise LaunchError(
                f"ValueError: prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}"
            )
    if s.method == "draft_model":
        assert s.draft_model is not None
        draft = _draft_model(s.draft_model, m, cfg.tensor_parallel_size, models)
    return spec_plan(s, m, draft, workload_family)


def _draft_model(
    draft_id: str, m: ModelProfile, tp: int, models: Mapping[str, ModelProfile] | None
) -> ModelProfile:
    """The draft model of ``method = "draft_model"``: it must exist (``models``, else the
    shipped profiles), share the target's tokenizer and split over the same TP group."""
    known = dict(models) if models is not None else model_profiles()
    if draft_id not in known:
        raise LaunchError(
            f"OSError: {draft_id} is not a local folder and is not a valid model "
            "identifier listed on 'https://huggingface.co/models' (simulated draft "
            f"models: {', '.join(sorted(known)) or 'none'})"
        )
    draft = known[draft_id]
    if draft.vocab_size != m.vocab_size:
        raise LaunchError(
            f"ValueError: The draft model's vocabulary ({draft.vocab_size} tokens) does "
            f"not match the target model's ({m.vocab_size}); speculative decoding needs "
            "the same tokenizer."
        )
    if draft.num_attention_heads % tp:
        raise LaunchError(
            f"ValueError: Total number of attention heads ({draft.num_attention_heads}) "
            f"must be divisible by tensor parallel size ({tp}). (draft model "
            f"{draft.hf_name})"
        )
    return draft


# --- cost model ------------------------------------------------------------------------------


def _act_bytes(cfg: ResolvedConfig) -> float:
    """Bytes per activation element: 4 in float32, else 2 (bf16/fp16)."""
    return 4.0 if cfg.dtype == "float32" else 2.0


def _cost_model(
    m: ModelProfile,
    hw: HardwareProfile,
    cfg: ResolvedConfig,
    quant: QuantizationProfile,
    spec: SpecPlan | None,
    engine: EngineProfile,
) -> CostModel:
    """The step-time and memory model of this model on this hardware with this config:
    weight format, activation and KV element sizes (1 byte for an fp8 KV cache), CUDA-graph
    range, eager mode and the speculative plan."""
    act_bytes = _act_bytes(cfg)
    kv_elem = 1.0 if cfg.kv_fp8 else act_bytes
    return CostModel(
        m,
        hw,
        tp=cfg.tensor_parallel_size,
        quant=quant,
        weight_only_dequant=_weight_only_dequant(),
        act_bytes=act_bytes,
        kv_elem_bytes=kv_elem,
        graph_max_tokens=cfg.cuda_graph_max_tokens,
        eager=cfg.enforce_eager,
        spec=spec,
        engine=engine,
    )


# --- memory plan (per GPU) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _GpuMemory:
    """One GPU's memory as vLLM sees it at start-up, in bytes."""

    total: float
    utilization: float
    wanted: float
    """vLLM's share: ``gpu_memory_utilization x total``."""
    free_at_start: float
    """What the CUDA context leaves."""


@dataclass(frozen=True, slots=True)
class _MemoryPlan:
    """Where one GPU's memory went: the weights and the KV cache's blocks."""

    weight_bytes_per_gpu: float
    num_blocks: int
    block_size: int
    capacity_tokens: int
    kv_cache_bytes_per_gpu: float


def _plan_memory(
    m: ModelProfile,
    hw: HardwareProfile,
    cfg: ResolvedConfig,
    quant: QuantizationProfile,
    cost: CostModel,
) -> _MemoryPlan:
    """Per GPU: vLLM's share must be free, the weights must load, the activation peak is
    reserved, the rest (or ``kv_cache_memory_bytes``) is KV cache, CUDA graphs need room
    outside the share, and the cache must hold one ``max_model_len`` sequence."""
    gpu = _gpu_memory(hw, cfg)
    w_gpu = cost.memory.weight_bytes_per_gpu
    _check_weights_fit(m, cfg, quant, gpu, w_gpu)
    act_reserve = _activation_reserve(m, hw, cfg)
    kv_bytes = _kv_cache_bytes(cfg, gpu, w_gpu, act_reserve)
    _check_graph_pool(cfg, gpu)
    per_token = cost.memory.kv_bytes_per_token_per_gpu
    block = cfg.block_size
    num_blocks = _kv_blocks(cfg, kv_bytes, per_token)
    return _MemoryPlan(
        weight_bytes_per_gpu=w_gpu,
        num_blocks=num_blocks,
        block_size=block,
        capacity_tokens=num_blocks * block,
        kv_cache_bytes_per_gpu=num_blocks * block * per_token,
    )


def _gpu_memory(hw: HardwareProfile, cfg: ResolvedConfig) -> _GpuMemory:
    """vLLM's share of the GPU, which must be free beside the CUDA context
    (:data:`CUDA_CONTEXT_GIB`) or the engine refuses to start."""
    mem = hw.memory_gib * GIB
    util = cfg.gpu_memory_utilization
    wanted = util * mem
    free_at_start = mem - CUDA_CONTEXT_GIB * GIB
    if wanted > free_at_start:
        raise LaunchError(
            f"ValueError: Free memory on device ({_gib(free_at_start)}/{_gib(mem)} GiB) on "
            f"startup is less than desired GPU memory utilization ({util}, {_gib(wanted)} GiB). "
            "Decrease GPU memory utilization or reduce GPU memory used by other processes."
        )
    return _GpuMemory(total=mem, utilization=util, wanted=wanted, free_at_start=free_at_start)


def _check_weights_fit(
    m: ModelProfile,
    cfg: ResolvedConfig,
    quant: QuantizationProfile,
    gpu: _GpuMemory,
    w_gpu: float,
) -> None:
    """The weight shard must fit the free memory; loading stops at the first weight tensor
    that no longer fits (an MLP projection), which names the allocation in the error."""
    if w_gpu > gpu.free_at_start:
        tp = cfg.tensor_parallel_size
        mem, free_at_start = gpu.total, gpu.free_at_start
        tensor = m.intermediate_size * m.hidden_size * quant.bytes_per_param / tp
        left = free_at_start - (free_at_start // tensor) * tensor
        raise LaunchError(
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {_mib(tensor)} MiB. "
            f"GPU 0 has a total capacity of {_gib(mem)} GiB of which {_mib(left)} MiB is free. "
            f"Including non-PyTorch memory, this process has {_gib(mem - left)} GiB memory in "
            f"use. (loading {m.hf_name}: {_gib(w_gpu)} GiB of weights per GPU at "
            f"tensor_parallel_size={tp}; the model does not fit)"
        )


def _activation_reserve(m: ModelProfile, hw: HardwareProfile, cfg: ResolvedConfig) -> float:
    """The activation peak of a ``max_num_batched_tokens`` step: the profile's reserve at
    :data:`REFERENCE_BUDGET` tokens, moved by the intermediate activations of the budget's
    difference from it, never below :data:`MIN_RESERVE_FRACTION` of the profile's."""
    act_per_token = (
        ACT_BYTES_PER_TOKEN_FACTOR * (m.intermediate_size + m.hidden_size) * _act_bytes(cfg)
    )
    return max(
        hw.activation_reserve_gib * GIB
        + (cfg.max_num_batched_tokens - REFERENCE_BUDGET)
        * act_per_token
        / cfg.tensor_parallel_size,
        MIN_RESERVE_FRACTION * hw.activation_reserve_gib * GIB,
    )


def _kv_cache_bytes(
    cfg: ResolvedConfig, gpu: _GpuMemory, w_gpu: float, act_reserve: float
) -> float:
    """KV-cache bytes per GPU: ``kv_cache_memory_bytes`` if set (it must fit beside the
    weights and activations), else what is left of vLLM's share (it must be positive)."""
    if cfg.kv_cache_memory_bytes is not None:
        kv_bytes = float(cfg.kv_cache_memory_bytes)
        if w_gpu + act_reserve + kv_bytes > gpu.free_at_start:
            raise LaunchError(
                f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                f"{_mib(kv_bytes)} MiB. GPU 0 has a total capacity of {_gib(gpu.total)} GiB of "
                f"which {_mib(max(gpu.free_at_start - w_gpu - act_reserve, 0.0))} MiB is free. "
                f"(kv_cache_memory_bytes={cfg.kv_cache_memory_bytes} does not fit beside the "
                "weights and activations)"
            )
        return kv_bytes
    kv_bytes = gpu.wanted - w_gpu - act_reserve
    if kv_bytes <= 0:
        raise LaunchError(
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine."
        )
    return kv_bytes


def _check_graph_pool(cfg: ResolvedConfig, gpu: _GpuMemory) -> None:
    """CUDA-graph capture allocates :data:`CUDA_GRAPH_POOL_GIB` outside vLLM's share: a share
    that leaves room for the context but not the graphs fails during capture (not in eager
    mode, nor with an explicit ``kv_cache_memory_bytes``)."""
    graph_room = gpu.free_at_start - CUDA_GRAPH_POOL_GIB * GIB
    if not cfg.enforce_eager and cfg.kv_cache_memory_bytes is None and gpu.wanted > graph_room:
        raise LaunchError(
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            f"{_mib(CUDA_GRAPH_POOL_GIB * GIB)} MiB. GPU 0 has a total capacity of "
            f"{_gib(gpu.total)} GiB of which {_mib(gpu.free_at_start - gpu.wanted)} MiB is "
            f"free. (during CUDA graph capture: gpu_memory_utilization={gpu.utilization} "
            "leaves too little memory outside vLLM's share)"
        )


def _kv_blocks(cfg: ResolvedConfig, kv_bytes: float, per_token: float) -> int:
    """Whole KV blocks of ``block_size`` tokens in ``kv_bytes``; there must be some, and
    enough for one sequence of ``max_model_len`` tokens."""
    block = cfg.block_size
    num_blocks = int(kv_bytes // (per_token * block))
    if num_blocks <= 0:
        raise LaunchError(
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine."
        )
    capacity = num_blocks * block
    if capacity < cfg.max_model_len:
        needed = cfg.max_model_len * per_token
        raise LaunchError(
            f"ValueError: To serve at least one request with the models's max seq len "
            f"({cfg.max_model_len}), ({_gib(needed)} GiB KV cache is needed, which is larger "
            f"than the available KV cache memory ({_gib(kv_bytes)} GiB). Based on the available "
            f"memory, the estimated maximum model length is {capacity}. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
            "engine."
        )
    return num_blocks


# --- start-up time and accuracy --------------------------------------------------------------


def _startup_s(hw: HardwareProfile, cfg: ResolvedConfig, cost: CostModel) -> float:
    """Seconds to start: the checkpoint shard at ``weight_load_gbs`` (GPUs load in parallel),
    then torch.compile and CUDA-graph capture, both of which eager mode skips."""
    startup = cost.memory.checkpoint_bytes_per_gpu / (hw.weight_load_gbs * 1e9)
    if not cfg.enforce_eager:
        startup += hw.compile_s + hw.cuda_graph_capture_s
    return startup


def _accuracy_ratio(cfg: ResolvedConfig, quant: QuantizationProfile) -> float:
    """Accuracy relative to the full-precision model: the weight format's ratio, times the fp8
    KV cache's when it is on."""
    return quant.accuracy_ratio * (kv_fp8_accuracy() if cfg.kv_fp8 else 1.0)


def max_blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens."""
    return math.ceil(tokens / block_size)
