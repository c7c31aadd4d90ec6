"""The SGLang launcher (gpu track): renders a ServingConfig to
``python -m sglang.launch_server --model-path MODEL ...``.

SGLang needs CUDA GPUs, so on machines without one this engine is tested for the command it
builds and the configs it refuses; launching it is the gpu track's (``sandbox/sglang``).
"""

from __future__ import annotations

import sys

from servegym.engines.base import Engine, EngineMetrics, ModelRef, register_engine
from servegym.engines.capabilities import (
    CapabilityTable,
    Rule,
    allowed_values,
    no_pipeline_table,
    tensor_parallel_fits_gpus,
)
from servegym.engines.config import ServingConfig
from servegym.engines.host import HostInfo

SGLANG_VERSION = "0.5.23"
"""The SGLang version the gpu track's image pins (``sandbox/sglang/Dockerfile``)."""

_KV_CACHE_DTYPE = {
    "auto": "auto",
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
}
_QUANTIZATION = {"fp8": "fp8", "int8": "w8a8_int8", "awq": "awq", "gptq": "gptq"}
_SPECULATIVE = {"ngram": "NGRAM", "draft_model": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3"}
ATTENTION_BACKENDS = ("fa3", "flashinfer", "triton", "torch_native", "flashmla", "trtllm_mha")


def _no_kv_bytes() -> Rule:
    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        if config.kv_cache_memory_bytes is None:
            return None
        return "SGLang sizes its KV cache by memory fraction: use gpu_memory_utilization"

    return Rule("kv_cache_memory_bytes", violation)


def _speculative_supported() -> Rule:
    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        spec = config.speculative
        if spec is None:
            return None
        if spec.method not in _SPECULATIVE:
            return f"method {spec.method} has no SGLang equivalent (use eagle or eagle3)"
        if spec.method != "ngram" and spec.draft_model is None:
            return f"method {spec.method} needs speculative.draft_model"
        return None

    return Rule("speculative", violation)


def _quantization_supported() -> Rule:
    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        if config.quantization == "int4":
            return "SGLang has no online int4 quantization; serve an AWQ or GPTQ checkpoint"
        return None

    return Rule("quantization", violation)


def _priority_needs_flag() -> Rule:
    # Kept as a rule so the table documents it: SGLang's priority scheduling is a separate
    # switch; fcfs and priority both render.
    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        return None

    return Rule("scheduling_policy", violation)


SGLANG_METRICS = EngineMetrics(
    prefix="sglang:",
    requests="sglang:num_requests_total",
    prompt_tokens="sglang:prompt_tokens_total",
    generation_tokens="sglang:generation_tokens_total",
    # SGLang counts the prompt tokens its radix cache served, not lookups: every prompt
    # token is looked up, so its prompt tokens are the queries.
    prefix_cache_queries="sglang:prompt_tokens_total",
    prefix_cache_hits="sglang:cached_tokens_total",
    preemptions="sglang:num_retracted_requests_total",
    queue_time="sglang:queue_time_seconds",
    ttft="sglang:time_to_first_token_seconds",
    kv_cache_usage="sglang:token_usage",
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
)
"""SGLang's ``/metrics`` names, as ``sglang/srt/metrics/collector.py`` defines them: the
counters, TTFT histogram and request count of its tokenizer manager
(``TokenizerMetricsCollector``), the gauges, queue-time histogram and retraction counter of
its scheduler (``SchedulerMetricsCollector``). SGLang serves them only with
``--enable-metrics``, which :meth:`SglangEngine.render_args` always adds."""


@register_engine("sglang")
class SglangEngine(Engine):
    """SGLang's server. Needs a CUDA GPU."""

    platform = "gpu"
    tracks = ("gpu",)
    metrics = SGLANG_METRICS
    prompt_logprobs = False
    """Its ``/v1/completions`` has no ``prompt_logprobs`` (vLLM's extension); re-scoring
    through its native ``/generate`` (``return_logprob``) is not built yet."""
    table = CapabilityTable(
        engine="sglang",
        platform="gpu",
        rules=(
            allowed_values("block_size", (1, 16, 32, 64, 128)),
            allowed_values("attention_backend", ATTENTION_BACKENDS),
            tensor_parallel_fits_gpus(),
            no_pipeline_table(),
            _no_kv_bytes(),
            _speculative_supported(),
            _quantization_supported(),
        ),
    )

    def versions(self) -> dict[str, str]:
        return {"sglang": SGLANG_VERSION}

    def command(self) -> list[str]:
        return [sys.executable if _in_sglang_env() else "python3", "-m", "sglang.launch_server"]

    def render_args(
        self, config: ServingConfig, model: ModelRef, host_addr: str, port: int
    ) -> list[str]:
        c = config
        args = ["--model-path", model.path, "--served-model-name", model.served_name]
        args += ["--host", host_addr, "--port", str(port)]
        args.append("--enable-metrics")  # the server figures' /metrics (vLLM's is always on)
        pairs: list[tuple[str, object | None]] = [
            ("max-running-requests", c.max_num_seqs),
            ("context-length", c.max_model_len),
            ("page-size", c.block_size),
            ("dtype", c.dtype),
            ("tp-size", c.tensor_parallel_size),
            ("attention-backend", c.attention_backend),
        ]
        if c.gpu_memory_utilization is not None:
            pairs.append(("mem-fraction-static", f"{c.gpu_memory_utilization:g}"))
        if c.kv_cache_dtype is not None:
            pairs.append(("kv-cache-dtype", _KV_CACHE_DTYPE[c.kv_cache_dtype]))
        if c.quantization not in (None, "none"):
            pairs.append(("quantization", _QUANTIZATION[c.quantization]))
        if c.enable_chunked_prefill is False:
            pairs.append(("chunked-prefill-size", -1))
        elif c.max_num_batched_tokens is not None:
            pairs.append(("chunked-prefill-size", c.max_num_batched_tokens))
        if c.max_num_batched_tokens is not None:
            pairs.append(("max-prefill-tokens", c.max_num_batched_tokens))
        if c.scheduling_policy is not None:
            pairs.append(("schedule-policy", "fcfs"))
        for flag, value in pairs:
            if value is not None:
                args += [f"--{flag}", str(value)]
        if c.scheduling_policy == "priority":
            args.append("--enable-priority-scheduling")
        if c.enable_prefix_caching is False:
            args.append("--disable-radix-cache")
        if c.enforce_eager:
            args.append("--disable-cuda-graph")
        spec = c.speculative
        if spec is not None:
            args += ["--speculative-algorithm", _SPECULATIVE[spec.method]]
            args += ["--speculative-num-draft-tokens", str(spec.num_speculative_tokens + 1)]
            if spec.method != "ngram":
                args += ["--speculative-num-steps", str(spec.num_speculative_tokens)]
                args += ["--speculative-eagle-topk", "1"]
                args += ["--speculative-draft-model-path", str(spec.draft_model)]
        return [*args, *c.extra_args]


def _in_sglang_env() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang") is not None
