"""vLLM launchers: ``vllm`` (the CUDA build, the gpu track) and ``vllm-cpu`` (the CPU build,
the cpu track). Both render a :class:`~servegym.engines.config.ServingConfig` to
``vllm serve MODEL --flag ...``; they differ in their capability tables and defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

from servegym.engines.base import (
    Engine,
    EngineMetrics,
    ModelRef,
    find_program,
    register_engine,
)
from servegym.engines.capabilities import (
    CapabilityTable,
    Rule,
    allowed_values,
    no_pipeline_table,
    one_kv_cache_size,
    tensor_parallel_fits_gpus,
)
from servegym.engines.config import ServingConfig
from servegym.engines.cpu_home import TORCH_VERSION, track_paths
from servegym.engines.cpu_isa import CPU_ISA_ENV, track_host
from servegym.engines.host import HostInfo, this_host

VLLM_VERSION_GPU = "0.32.0"
"""The vLLM version the gpu track's image pins (``sandbox/vllm/Dockerfile``)."""
VLLM_CPU_VERSION = "0.32.0"
"""The vllm-cpu version ``servegym setup cpu`` installs; the CPU table's facts are its."""

DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30
"""vllm-cpu's KV cache when a config does not size it: 1 GiB (131,072 tokens of the CPU
track's model), well inside the machines' memory with room for two servers."""

_QUANTIZATION_FLAG = {
    "fp8": "fp8",
    "awq": "awq",
    "gptq": "gptq",
}
"""ServingConfig quantization -> vLLM's --quantization, where vLLM has one method for it."""


def _flag_bool(name: str, value: bool | None) -> list[str]:
    if value is None:
        return []
    return [f"--{name}" if value else f"--no-{name}"]


def _speculative_json(config: ServingConfig) -> str | None:
    spec = config.speculative
    if spec is None:
        return None
    out: dict[str, object] = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
    }
    if spec.draft_model is not None:
        out["model"] = spec.draft_model
    if spec.prompt_lookup_max is not None:
        out["prompt_lookup_max"] = spec.prompt_lookup_max
    if spec.prompt_lookup_min is not None:
        out["prompt_lookup_min"] = spec.prompt_lookup_min
    return json.dumps(out, separators=(",", ":"), sort_keys=True)


def _draft_model_named() -> Rule:
    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        spec = config.speculative
        if spec is None or spec.draft_model is not None:
            return None
        if spec.method in ("draft_model", "eagle", "eagle3"):
            return f"method {spec.method} needs speculative.draft_model"
        return None

    return Rule("speculative", violation)


def _no_prequantized_only(engine: str) -> Rule:
    """int8 and int4 weights need a checkpoint quantized ahead (vLLM has no online method
    for them on GPU): the agent serves that checkpoint, not a flag."""

    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        if config.quantization in ("int8", "int4"):
            return (
                f"{engine} has no online {config.quantization} weight quantization; serve a "
                "checkpoint quantized ahead (compressed-tensors, AWQ or GPTQ) instead"
            )
        return None

    return Rule("quantization", violation)


VLLM_METRICS = EngineMetrics(
    prefix="vllm:",
    requests="vllm:request_success_total",
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
    prefix_cache_queries="vllm:prefix_cache_queries_total",
    prefix_cache_hits="vllm:prefix_cache_hits_total",
    preemptions="vllm:num_preemptions_total",
    queue_time="vllm:request_queue_time_seconds",
    ttft="vllm:time_to_first_token_seconds",
    kv_cache_usage="vllm:kv_cache_usage_perc",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
)
"""vLLM's (V1 engine) ``/metrics`` names, the same in both builds."""


class _VllmBase(Engine):
    """``vllm serve``: flags common to both builds."""

    metrics = VLLM_METRICS

    def command(self) -> list[str]:
        return [find_program("vllm"), "serve"]

    def quantization_args(self, config: ServingConfig) -> list[str]:
        q = config.quantization
        if q is None or q == "none":
            return []
        return ["--quantization", _QUANTIZATION_FLAG.get(q, q)]

    def memory_args(self, config: ServingConfig) -> list[str]:
        out: list[str] = []
        if config.gpu_memory_utilization is not None:
            out += ["--gpu-memory-utilization", f"{config.gpu_memory_utilization:g}"]
        if config.kv_cache_memory_bytes is not None:
            out += ["--kv-cache-memory-bytes", str(config.kv_cache_memory_bytes)]
        return out

    def render_args(
        self, config: ServingConfig, model: ModelRef, host_addr: str, port: int
    ) -> list[str]:
        c = config
        args = [model.path, "--served-model-name", model.served_name]
        args += ["--host", host_addr, "--port", str(port)]
        pairs: list[tuple[str, object | None]] = [
            ("max-num-seqs", c.max_num_seqs),
            ("max-num-batched-tokens", c.max_num_batched_tokens),
            ("max-model-len", c.max_model_len),
            ("block-size", c.block_size),
            ("kv-cache-dtype", c.kv_cache_dtype),
            ("scheduling-policy", c.scheduling_policy),
            ("dtype", c.dtype),
            ("tensor-parallel-size", c.tensor_parallel_size),
            ("attention-backend", c.attention_backend),
        ]
        for flag, value in pairs:
            if value is not None:
                args += [f"--{flag}", str(value)]
        args += self.memory_args(c)
        args += _flag_bool("enable-prefix-caching", c.enable_prefix_caching)
        args += _flag_bool("enable-chunked-prefill", c.enable_chunked_prefill)
        args += _flag_bool("enforce-eager", c.enforce_eager)
        args += self.quantization_args(c)
        spec = _speculative_json(c)
        if spec is not None:
            args += ["--speculative-config", spec]
        return [*args, *c.extra_args]


GPU_ATTENTION_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")


@register_engine("vllm")
class VllmEngine(_VllmBase):
    """vLLM's CUDA build (the gpu track, in ``sandbox/vllm``)."""

    platform = "gpu"
    tracks = ("gpu",)
    table = CapabilityTable(
        engine="vllm",
        platform="gpu",
        rules=(
            allowed_values("block_size", (8, 16, 32, 64, 128)),
            allowed_values("attention_backend", GPU_ATTENTION_BACKENDS),
            tensor_parallel_fits_gpus(),
            no_pipeline_table(),
            one_kv_cache_size(),
            _no_prequantized_only("vllm"),
            _draft_model_named(),
        ),
    )

    def versions(self) -> dict[str, str]:
        return {"vllm": VLLM_VERSION_GPU}


# --- vllm-cpu ------------------------------------------------------------------------------


def _effective_cpu_dtype(config: ServingConfig) -> str:
    """vllm-cpu runs a float32 (or float16) checkpoint in bfloat16 unless told otherwise."""
    if config.dtype in (None, "auto"):
        return "bfloat16"
    return config.dtype


def _cpu_fp8_kv_cache() -> Rule:
    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        dtype = config.kv_cache_dtype
        if dtype is None or not dtype.startswith("fp8") or host.has_avx512 or host.has_amx:
            return None
        return (
            f"{dtype} KV cache needs AVX-512 or AMX on vllm-cpu; the CPU has {host.isa} "
            "(the CPU track runs every host as AVX2; use kv_cache_dtype=auto)"
        )

    return Rule("kv_cache_dtype", violation)


def _cpu_block_size() -> Rule:
    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        b = config.block_size
        if b is None or b % 32 == 0:
            return None
        return f"{b} is not a multiple of 32, which vllm-cpu's attention kernels need"

    return Rule("block_size", violation)


def _cpu_quantization() -> Rule:
    """vllm-cpu 0.32's online int8 (``int8_per_channel_weight_only``) needs bfloat16; note
    that it quantizes the experts of MoE models only, so on a dense model such as
    servegym-tiny it launches and changes nothing (the search space leaves it out)."""

    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        q = config.quantization
        dtype = _effective_cpu_dtype(config)
        if q == "fp8":
            return (
                "fp8 weights crash vllm-cpu's engine in bfloat16 and are refused in float32 "
                "(use int8, which vllm-cpu quantizes per channel, weight-only)"
            )
        if q == "int8" and dtype != "bfloat16":
            return f"int8 weight-only quantization needs dtype bfloat16 (this config: {dtype})"
        if q == "int4":
            return "vllm-cpu has no online int4 quantization; serve an AWQ or GPTQ checkpoint"
        return None

    return Rule("quantization", violation)


def _cpu_no_gpu_memory() -> Rule:
    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        if config.gpu_memory_utilization is None:
            return None
        return "there is no GPU memory on vllm-cpu; size the KV cache with kv_cache_memory_bytes"

    return Rule("gpu_memory_utilization", violation)


def _cpu_isa_pinned() -> Rule:
    def violation(config: ServingConfig, host: HostInfo) -> str | None:

        pinned = sorted(k for k in config.env if k in CPU_ISA_ENV)
        if not pinned:
            return None
        return (
            f"{pinned[0]}: the CPU track's hardware class (cpu-avx2) pins the vector ISA at "
            "AVX2 on every host; a config may not change it"
        )

    return Rule("env", violation)


def _cpu_one_worker() -> Rule:
    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        tp = config.tensor_parallel_size
        if tp is None or tp == 1:
            return None
        return f"{tp}: the CPU track runs one worker (tensor_parallel_size 1)"

    return Rule("tensor_parallel_size", violation)


MAX_SEEDED_CACHE_BYTES = 1 * 2**30
"""The most of the harness's Inductor cache an evaluation's workspace is given a copy of;
a larger cache is not copied (the submission's start then compiles, as a cold one does)."""


@register_engine("vllm-cpu")
class VllmCpuEngine(_VllmBase):
    """vLLM's CPU build, from the CPU track's environment (``servegym setup cpu``).

    Facts in its table were measured with vllm-cpu 0.32.0 on AVX2-only x86 CPUs; on any
    other x86 CPU the vector ISA is capped at AVX2 (:mod:`servegym.engines.cpu_isa`).
    """

    platform = "cpu"
    tracks = ("cpu",)
    search_space = "vllm-cpu"
    full_precision_dtype = "float32"
    table = CapabilityTable(
        engine="vllm-cpu",
        platform="cpu",
        rules=(
            _cpu_fp8_kv_cache(),
            _cpu_block_size(),
            _cpu_quantization(),
            _cpu_no_gpu_memory(),
            _cpu_one_worker(),
            _cpu_isa_pinned(),
            no_pipeline_table(),
            allowed_values("attention_backend", ("CPU_ATTN",)),
            _draft_model_named(),
        ),
    )

    def versions(self) -> dict[str, str]:
        return {"vllm-cpu": VLLM_CPU_VERSION, "torch": TORCH_VERSION}

    def check(self, config: ServingConfig, host: HostInfo | None = None) -> None:
        """As :meth:`Engine.check`; this machine is judged as the CPU track's hardware class
        (:func:`~servegym.engines.cpu_isa.track_host`), whatever its own ISA."""

        self.table.check(config, host or track_host(this_host()))

    def command(self) -> list[str]:

        return [find_program("vllm", track_paths().venv_bin / "vllm"), "serve"]

    def runtime_dirs(self) -> list[Path]:
        from servegym.paths import python_runtime_dirs

        venv = track_paths().venv
        return python_runtime_dirs(venv) if venv.exists() else []

    def tool_dirs(self) -> list[Path]:

        return [track_paths().venv_bin]

    def quantization_args(self, config: ServingConfig) -> list[str]:
        if config.quantization == "int8":
            return ["--quantization", "int8_per_channel_weight_only"]
        return super().quantization_args(config)

    def memory_args(self, config: ServingConfig) -> list[str]:
        size = config.kv_cache_memory_bytes or DEFAULT_CPU_KV_CACHE_BYTES
        return ["--kv-cache-memory-bytes", str(size)]

    def default_env(self) -> dict[str, str]:
        """vLLM's AOT compile path is off: vllm-cpu 0.32 saves an AOT artefact it cannot
        load again (``'function' object has no attribute 'finalize_loading'``), so every
        start compiled anew. Without it, a second start loads Inductor's cached graphs: the
        engine's start-up step took 23 s instead of 47 s under the same load
        (``benchmarks/compile_cache_startup.py`` measures whole starts)."""
        return {
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_USE_AOT_COMPILE": "0",
        }

    def compile_cache_env(self) -> dict[str, str]:
        """vLLM's cache (its AOT-compiled model, with Inductor's kernels inside each entry)
        and Inductor's own (what compiles outside vLLM's AOT path), under the harness's
        folder rather than ``~/.cache/vllm`` and ``/tmp/torchinductor_<user>``."""
        from servegym.engines.compile_cache import harness_compile_cache

        root = harness_compile_cache(self.name)
        return {
            "VLLM_CACHE_ROOT": str(root / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        }

    def workspace_env(self, cache_home: str) -> dict[str, str]:
        """The launch defaults (AOT off, see :meth:`default_env`) and both compile caches
        in the workspace's ``.cache``: Inductor's default, ``/tmp``, is private to each
        sandboxed start, so without this every start of a workspace compiled anew."""
        return {
            **self.default_env(),
            "VLLM_CACHE_ROOT": f"{cache_home}/vllm",
            "TORCHINDUCTOR_CACHE_DIR": f"{cache_home}/torchinductor",
        }

    def seed_workspace_cache(self, cache: Path, *, evaluation: bool) -> None:
        """vLLM's model-class inspection (``modelinfos``: JSON keyed by the model code's
        hash), which a start without it redoes in a subprocess of its own (15-20 s on the
        cpu track); for the evaluation's workspace also Inductor's cache (the compiled
        graphs, keyed by graph and versions: the baseline's and the reference's are there),
        up to :data:`MAX_SEEDED_CACHE_BYTES`. An agent's workspace does not get the compiled
        kernels: they come from every config the harness ran, other trials' among them."""
        from servegym.engines.compile_cache import copy_cache, harness_compile_cache

        harness = harness_compile_cache(self.name)
        copy_cache(harness / "vllm" / "modelinfos", cache / "vllm" / "modelinfos")
        if evaluation:
            copy_cache(harness / "inductor", cache / "torchinductor", MAX_SEEDED_CACHE_BYTES)

    def pinned_env(self) -> dict[str, str]:

        return dict(CPU_ISA_ENV)

    def unset_env(self) -> list[str]:
        # vllm-cpu lets VLLM_CPU_KVCACHE_SPACE (whole GiB) override --kv-cache-memory-bytes,
        # and refuses it empty: it must be absent for the knob to size the cache.
        return ["VLLM_CPU_KVCACHE_SPACE"]
