"""The simulator's step-time model: the roofline terms and their arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from sim_support import H100, LLAMA_8B, engine

from servegym.engines.sim.cost_model import CostModel
from servegym.engines.sim.launch import launch
from servegym.engines.sim.profiles import QuantizationProfile, get_engine

BF16 = QuantizationProfile(
    format="bf16", bytes_per_param=2.0, accuracy_ratio=1.0, dequant_overhead=0
)


def _cost(**kw: object) -> CostModel:
    args: dict[str, object] = {
        "tp": 1,
        "quant": BF16,
        "weight_only_dequant": 0.15,
        "act_bytes": 2.0,
        "kv_elem_bytes": 2.0,
        "graph_max_tokens": 512,
        "eager": False,
        "spec": None,
        "engine": get_engine("vllm"),
    }
    args.update(kw)
    return CostModel(LLAMA_8B, H100, **args)  # type: ignore[arg-type]


def test_batch1_decode_is_weight_bytes_over_bandwidth_plus_overhead() -> None:
    """A batch-1 decode step reads every weight once: its time is weight bytes over the
    effective bandwidth plus the fixed step overhead, within a few percent (the rest is the
    short context's KV read)."""
    c = _cost()
    weights = LLAMA_8B.num_parameters * 2.0
    bw = H100.hbm_bandwidth_tbs * 1e12 * H100.mem_efficiency
    e = c.engine
    expected = weights / bw + e.step_overhead_ms * 1e-3 + e.per_seq_overhead_us * 1e-6
    got = c.batch1_decode_s(context=100)
    assert got == pytest.approx(expected, rel=0.02)
    # Longer contexts add their KV read: 128 KiB per token for Llama-3.1-8B in bf16.
    extra = c.batch1_decode_s(context=100_100) - got
    assert extra == pytest.approx(100_000 * 131072 / bw, rel=0.01)


def test_prefill_is_compute_bound_and_quadratic_in_length() -> None:
    """An 8k-token prefill runs at the GEMM rate; attention FLOPs grow with the square."""
    c = _cost()
    n = 8192.0
    t = c.step_time(n, 1.0, n, n * (n + 1) / 2, 1.0, 1.0)
    peak = H100.peak_tflops.bf16 * 1e12 * H100.compute_efficiency
    linear = 2 * (LLAMA_8B.num_parameters - 2 * 128256 * 4096) * n / peak
    assert t > linear
    attn1 = c.step_time(1024.0, 1.0, 1024.0, 1024.0 * 1025 / 2, 1.0, 1.0)
    fixed = c.c_step + c.c_seq + c.c_eager  # per-step host costs, the same for both
    # 8x the tokens costs more than 8x (quadratic attention)
    assert (t - fixed) / (attn1 - fixed) > 8.0


def test_weight_formats_change_bytes_and_compute_rate() -> None:
    """fp8 halves the weight bytes (W8A8 on fp8 tensor cores); int4 quarters them but
    computes at the bf16 rate plus dequantization, so it loses at large batch."""
    fp8 = QuantizationProfile(
        format="fp8", bytes_per_param=1.0, accuracy_ratio=1, dequant_overhead=0
    )
    int4 = QuantizationProfile(
        format="int4",
        bytes_per_param=0.52,
        accuracy_ratio=0.97,
        dequant_overhead=0.15,
        compute_dtype="bf16",
    )
    base, f8, i4 = _cost(), _cost(quant=fp8), _cost(quant=int4)
    # The body shrinks; embeddings and LM head (1 GB of Llama-3.1-8B's 16) stay 16-bit.
    assert f8.c_weights == pytest.approx(0.565 * base.c_weights, rel=0.01)
    assert i4.c_weights == pytest.approx(0.357 * base.c_weights, rel=0.01)
    assert f8.a_lin == pytest.approx(base.a_lin / 2, rel=0.01)  # fp8 peak: twice bf16
    assert i4.a_lin == pytest.approx(base.a_lin * 1.15)
    big = 4096.0
    assert i4.step_time(big, big, big, big, 1.0, big) > base.step_time(big, big, big, big, 1.0, big)


def test_fp8_without_fp8_tensor_cores_runs_weight_only() -> None:
    a100 = H100.model_copy(
        update={"peak_tflops": H100.peak_tflops.model_copy(update={"fp8": None})}
    )
    fp8 = QuantizationProfile(
        format="fp8", bytes_per_param=1.0, accuracy_ratio=1, dequant_overhead=0
    )
    c = CostModel(
        LLAMA_8B,
        a100,
        tp=1,
        quant=fp8,
        weight_only_dequant=0.15,
        act_bytes=2.0,
        kv_elem_bytes=2.0,
        graph_max_tokens=512,
        eager=False,
        spec=None,
        engine=get_engine("vllm"),
    )
    assert c.weight_only
    assert c.a_lin == pytest.approx(_cost().a_lin * 1.15)


def test_tensor_parallel_splits_work_and_adds_all_reduces() -> None:
    one, two = _cost(), _cost(tp=2)
    assert two.c_weights == pytest.approx(one.c_weights / 2)
    assert two.a_kv == pytest.approx(one.a_kv / 2)
    assert two.c_comm == pytest.approx(2 * 32 * H100.allreduce_latency_us * 1e-6)
    assert two.a_comm > 0 and one.a_comm == 0


def test_eager_and_large_steps_pay_the_launch_overhead() -> None:
    c = _cost()
    assert c.graph_flag(512) == 0.0 and c.graph_flag(513) == 1.0
    eager = _cost(eager=True, graph_max_tokens=0)
    assert eager.graph_flag(1) == 1.0
    assert eager.batch1_decode_s(100) - c.batch1_decode_s(100) == pytest.approx(
        H100.eager_overhead_ms * 1e-3
    )


def test_decode_run_prices_each_step_like_step_time() -> None:
    c = _cost()
    n, ctx0 = 64, 64 * 3000.0
    grown = np.arange(200, dtype=np.float64)
    run = c.decode_run(n, 1.0, ctx0, grown, 0.0)
    one = [
        c.step_time(n, n, ctx0 + n * g + n, (ctx0 + n * g) + n, 0.0, n, ctx0 + n * g + n, 0.0)
        for g in grown
    ]
    np.testing.assert_allclose(run, one, rtol=1e-12)


def test_launched_engine_cost_matches_profile_data() -> None:
    e = engine()
    assert e.cost.memory.kv_bytes_per_token_total == 2 * 32 * 8 * 128 * 2
    fp8kv = engine(kv_cache_dtype="fp8")
    assert (
        fp8kv.cost.memory.kv_bytes_per_token_per_gpu == e.cost.memory.kv_bytes_per_token_per_gpu / 2
    )
    assert launch(LLAMA_8B, H100).cost.batch1_decode_s(1) == pytest.approx(
        _cost().batch1_decode_s(1)
    )
