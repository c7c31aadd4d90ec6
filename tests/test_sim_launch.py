"""Launching the simulated engine: defaults, start-up time, and engine-like failures."""

from __future__ import annotations

import pytest
from sim_support import engine, hardware, model

from servegym.engines.config import SpeculativeConfig
from servegym.engines.sim.defaults import KNOBS, knob_defaults
from servegym.engines.sim.launch import LaunchError


def test_defaults_follow_vllm_by_gpu() -> None:
    """>= 70 GiB GPUs except the A100: 8192 tokens and 1024 sequences; others 2048 and 256."""
    h100 = engine()
    assert h100.config.max_num_batched_tokens == 8192 and h100.config.max_num_seqs == 1024
    a100 = engine(hw_id="a100-80gb")
    assert a100.config.max_num_batched_tokens == 2048 and a100.config.max_num_seqs == 256
    l40s = engine(hw_id="l40s", max_model_len=32768)
    assert l40s.config.max_num_batched_tokens == 2048 and l40s.config.max_num_seqs == 256
    c = h100.config
    assert (c.block_size, c.gpu_memory_utilization, c.max_model_len) == (16, 0.9, 131072)
    assert c.enable_prefix_caching and c.enable_chunked_prefill and not c.enforce_eager
    assert c.scheduling_policy == "fcfs" and c.quantization == "none"
    off = engine(enable_chunked_prefill=False, max_model_len=16384)
    assert off.config.max_num_batched_tokens == 16384  # a prompt must fit a step whole


def test_knob_listing_covers_every_servingconfig_knob() -> None:
    from servegym.engines.config import ServingConfig

    names = {k.name for k in KNOBS}
    assert names == set(ServingConfig.model_fields) - {"extra_args", "env"}
    d = knob_defaults(model("llama-3.1-8b"), hardware("h100-sxm"))
    assert d["max_num_seqs"] == 1024


def test_startup_time_and_eager_mode() -> None:
    """Start-up = weight load + torch.compile + CUDA-graph capture; eager skips the last two."""
    hw = hardware("h100-sxm")
    e = engine()
    load = e.cost.memory.checkpoint_bytes_per_gpu / (hw.weight_load_gbs * 1e9)
    assert e.startup_s == pytest.approx(load + hw.compile_s + hw.cuda_graph_capture_s)
    eager = engine(enforce_eager=True)
    assert eager.startup_s == pytest.approx(load)


def _fails(
    match: str, model_id: str = "llama-3.1-8b", hw_id: str = "h100-sxm", **knobs: object
) -> str:
    with pytest.raises(LaunchError, match=match) as info:
        engine(model_id, hw_id, **knobs)
    assert info.value.exit_code == 3
    return info.value.message


def test_model_that_does_not_fit_fails_with_cuda_oom() -> None:
    msg = _fails("CUDA out of memory", "llama-3.1-70b", "h100-sxm")
    assert "does not fit" in msg
    _fails("No available memory for the cache blocks", "llama-3.1-70b", "h200")


def test_memory_fraction_rules() -> None:
    _fails("less than desired GPU memory utilization", gpu_memory_utilization=1.0)
    # Leaves room for the CUDA context but not for CUDA-graph capture ...
    _fails("during CUDA graph capture", gpu_memory_utilization=0.985)
    # ... which eager mode skips.
    assert engine(gpu_memory_utilization=0.985, enforce_eager=True).kv_capacity_tokens > 0
    _fails("No available memory for the cache blocks", gpu_memory_utilization=0.15)


def test_kv_cache_must_hold_one_max_length_sequence() -> None:
    msg = _fails("larger than the available KV cache memory", gpu_memory_utilization=0.23)
    assert "estimated maximum model length is" in msg
    assert engine(gpu_memory_utilization=0.23, max_model_len=8192).kv_capacity_tokens >= 8192


def test_invalid_combinations() -> None:
    _fails(r"must be divisible by tensor parallel size \(3\)", tensor_parallel_size=3)
    _fails("exceeds the total number of available GPUs", tensor_parallel_size=16)
    _fails("block_size", block_size=24)
    _fails("greater than the derived max_model_len", max_model_len=200_000)
    assert engine(max_model_len=200_000, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    _fails(r"must be greater than or equal to max_num_seqs", max_num_batched_tokens=512)
    _fails(
        "smaller than max_model_len",
        enable_chunked_prefill=False,
        max_num_batched_tokens=4096,
        max_num_seqs=256,
    )
    _fails("Invalid attention backend", attention_backend="FAST_ATTN")
    _fails(
        "kv_cache_dtype not supported",
        "llama-3.1-8b",
        "a100-80gb",
        kv_cache_dtype="fp8",
        attention_backend="FLASH_ATTN",
    )
    assert engine(hw_id="a100-80gb", kv_cache_dtype="fp8").kv_capacity_tokens > 0
    assert engine(hw_id="a100-80gb", quantization="fp8").cost.weight_only
    _fails("float32 is not supported", dtype="float32", quantization="awq")


def test_speculative_config_checks() -> None:
    def spec(method: str, **kw: object) -> SpeculativeConfig:
        return SpeculativeConfig(method=method, num_speculative_tokens=3, **kw)  # type: ignore[arg-type]

    msg = _fails("without speculative model", speculative=spec("draft_model"))
    assert "llama-3.2-1b" in msg  # names the usual draft
    _fails("not a valid model identifier", speculative=spec("draft_model", draft_model="nope"))
    _fails("vocabulary", speculative=spec("draft_model", draft_model="qwen3-0.6b"))
    _fails("multi-token prediction", speculative=spec("mtp"))
    _fails("without speculative model", speculative=spec("eagle3"))
    _fails("No EAGLE draft head", "mistral-7b-v0.3", speculative=spec("eagle", draft_model="x"))
    _fails("prompt_lookup_min", speculative=spec("ngram", prompt_lookup_min=5, prompt_lookup_max=2))
    ok = engine(speculative=spec("draft_model", draft_model="llama-3.2-1b"))
    assert ok.spec is not None and ok.spec.tokens_per_step > 1
    # The draft model's weights and KV cache take memory from the target's cache.
    assert ok.kv_capacity_tokens < engine().kv_capacity_tokens


def test_accuracy_ratio_multiplies_weight_and_kv_formats() -> None:
    assert engine().accuracy_ratio == 1.0
    fp8 = engine(quantization="fp8").accuracy_ratio
    int4 = engine(quantization="awq").accuracy_ratio
    both = engine(quantization="fp8", kv_cache_dtype="fp8").accuracy_ratio
    assert 1.0 > fp8 > int4
    assert both < fp8
