"""The ten behaviours the simulator must show (issue 3), each with its direction and size.

Every test runs with noise off (noise is tested elsewhere) on the shipped profiles (the
hand-built ones in ``sim_support`` stand in when the data is missing) and reads latencies
through ``compute_metrics``, as scoring does. Sizes are asserted loosely: they hold for any
sensible calibration of the profiles, not only today's.
"""

from __future__ import annotations

import numpy as np
import pytest
from sim_support import engine, hardware, metrics, model, run, simple_workload, workload

from servegym.engines.config import SpeculativeConfig
from servegym.engines.sim.cost_model import GIB
from servegym.engines.sim.launch import LaunchError
from servegym.loadgen.records import RunResult
from servegym.scoring.metrics import compute_metrics
from servegym.scoring.sla import Price


def test_1_batch1_decode_tpot_is_weight_bytes_over_bandwidth_plus_overhead() -> None:
    """Batch-1 decode TPOT = weight bytes / (HBM bandwidth x efficiency) + step overhead,
    within 5% (the rest is the short context's KV read): 16.06 GB / 2.85 TB/s + 1.4 ms =
    7.0 ms for Llama-3.1-8B on an H100."""
    eng = engine()
    hw, m = hardware("h100-sxm"), model("llama-3.1-8b")
    wl = simple_workload([128] * 3, [256] * 3, concurrency=1)
    tpot_ms = metrics(eng, wl, noise=False).tpot_ms.mean
    weights = m.num_parameters * 2
    expected_ms = (
        weights / (hw.hbm_bandwidth_tbs * 1e12 * hw.mem_efficiency) * 1e3
        + eng.cost.engine.step_overhead_ms
        + eng.cost.engine.per_seq_overhead_us * 1e-3
    )
    assert tpot_ms == pytest.approx(expected_ms, rel=0.05)
    assert tpot_ms >= expected_ms


def test_2_throughput_rises_with_max_num_seqs_then_saturates_while_latency_rises() -> None:
    """Output throughput grows almost linearly while decode is memory-bound (16 -> 64
    sequences: > 2.2x; the 500-token prefills riding along keep it below 4x, more so since
    the calibration priced vLLM's prefill at its measured rate), then flattens as the linear
    layers turn compute-bound (64 -> 256: > 1.15x) and saturates (256 -> 1024: < 1.15x, KV
    and compute bound), while TPOT and E2E latency keep rising."""
    wl = simple_workload([500] * 1024, [300] * 1024)
    thr, tpot = [], []
    for seqs in (4, 16, 64, 256, 1024):
        m = metrics(engine(max_num_seqs=seqs), wl, noise=False)
        thr.append(m.output_throughput)
        tpot.append(m.tpot_ms.p50)
    assert thr[1] > 3.0 * thr[0] and thr[2] > 2.2 * thr[1]
    assert thr[3] > 1.15 * thr[2]
    assert thr[4] < 1.15 * thr[3]
    assert tpot == sorted(tpot) and tpot[-1] > 2.0 * tpot[2]


def test_3_larger_token_budget_lowers_long_prompt_ttft_and_raises_decode_itl_p99() -> None:
    """Long prompts (8,000 tokens) arriving among 64 streaming decodes: an 8,192-token budget
    prefills each in one step instead of ~40 small ones, each paying the weight read and the
    step overhead again (TTFT about 1.5x lower than with a 256-token budget; asserted >1.3x),
    but the steps carrying them stall every decode riding along (ITL p99 of the short
    requests ~20x higher; asserted >5x)."""
    n_long, n_short = 8, 64
    wl = simple_workload(
        [8000] * n_long + [100] * n_short,
        [50] * n_long + [400] * n_short,
        arrivals=[2.0 + 0.5 * i for i in range(n_long)] + [0.0] * n_short,
    )
    out = {}
    for budget in (256, 8192):
        sim = run(engine(max_num_batched_tokens=budget, max_num_seqs=128), wl, noise=False)
        long = [r for r in sim.records if r.prompt_tokens == 8000]
        ttft = np.mean([r.first_token_ns - r.sent_ns for r in long]) / 1e6
        gaps = np.concatenate([np.diff(r.chunk_ns) for r in sim.records if r.prompt_tokens == 100])
        out[budget] = (ttft, np.percentile(gaps, 99) / 1e6)
    assert out[8192][0] * 1.3 < out[256][0]
    assert out[8192][1] > 5.0 * out[256][1]


def test_4_prefix_caching_cuts_agentic_ttft_and_changes_nothing_on_unique_prompts() -> None:
    """Agentic turns re-send their whole growing context: with prefix caching only the new
    tail is prefilled (mean TTFT at least 5x lower, >85% of prompt tokens hit). Random
    unique prompts never hit: identical metrics with caching on or off."""
    ag = workload("agentic", requests=3)
    on = metrics(engine(family="agentic"), ag, noise=False)
    off = metrics(engine(family="agentic", enable_prefix_caching=False), ag, noise=False)
    assert on.ttft_ms.mean * 5 < off.ttft_ms.mean
    assert run(engine(family="agentic"), ag, noise=False).stats.prefix_cache_hit_rate > 0.85  # type: ignore[operator]
    uniq = workload("balanced", requests=100)
    a = metrics(engine(), uniq, noise=False)
    b = metrics(engine(enable_prefix_caching=False), uniq, noise=False)
    assert a.ttft_ms == b.ttft_ms and a.output_throughput == b.output_throughput


def test_5_fp8_speeds_small_batch_decode_cheaply_int4_more_at_batch1_less_at_large_batch() -> None:
    """At batch 1 fp8 weights cut TPOT by >25% for <1% accuracy; int4 (AWQ) cuts it more
    (>40%) for a larger accuracy cost. At 512 concurrent requests the steps are
    compute-bound: fp8 (fp8 tensor cores) still gains >20% throughput, int4 (bf16 compute
    plus dequantization) gains nothing (at most +5%)."""
    b1 = simple_workload([200] * 4, [256] * 4, concurrency=1)
    big = simple_workload([200] * 1024, [256] * 1024, concurrency=512)
    tpot, thr, acc = {}, {}, {}
    for q in ("none", "fp8", "awq"):
        eng = engine(quantization=q)
        tpot[q] = metrics(eng, b1, noise=False).tpot_ms.mean
        thr[q] = metrics(eng, big, noise=False).output_throughput
        acc[q] = eng.accuracy_ratio
    assert tpot["fp8"] < 0.75 * tpot["none"] and acc["fp8"] >= 0.99
    assert tpot["awq"] < 0.6 * tpot["none"] and tpot["awq"] < tpot["fp8"]
    assert acc["awq"] < acc["fp8"]
    assert thr["fp8"] > 1.2 * thr["none"]
    assert thr["awq"] < 1.05 * thr["none"]
    gain_b1 = tpot["none"] / tpot["awq"]
    assert thr["awq"] / thr["none"] < gain_b1 - 0.5


def test_6_fp8_kv_cache_doubles_capacity_and_cuts_preemptions() -> None:
    """An fp8 KV cache holds 2x the tokens (+-2%); 1,000 offline balanced requests (2M tokens
    of context against ~0.44M of bf16 cache) then preempt at least 25% less often."""
    wl = workload("balanced", requests=1000)
    bf16, fp8 = engine(), engine(kv_cache_dtype="fp8")
    assert fp8.kv_capacity_tokens == pytest.approx(2 * bf16.kv_capacity_tokens, rel=0.02)
    a, b = run(bf16, wl, noise=False), run(fp8, wl, noise=False)
    assert a.stats.preemptions > 0
    assert b.stats.preemptions < 0.75 * a.stats.preemptions


def test_7_speculative_decoding_helps_at_concurrency_1_and_hurts_at_high_concurrency() -> None:
    """EAGLE-3 (k=4) on agentic text: at concurrency 1 decode is memory-bound and the ~3
    tokens per step cut TPOT by >30%; at 512 concurrent requests every verified token costs
    compute, so output throughput drops (by >3%) below plain decoding."""
    spec = SpeculativeConfig(method="eagle3", num_speculative_tokens=4, draft_model="eagle3-head")
    one = simple_workload([200] * 4, [256] * 4, concurrency=1)
    many = simple_workload([200] * 1024, [256] * 1024, concurrency=512)
    base, fast = engine(family="agentic"), engine(family="agentic", speculative=spec)
    assert (
        metrics(fast, one, noise=False).tpot_ms.mean
        < 0.7 * metrics(base, one, noise=False).tpot_ms.mean
    )
    hi_base = metrics(base, many, noise=False).output_throughput
    hi_spec = metrics(fast, many, noise=False).output_throughput
    assert hi_spec < 0.97 * hi_base


def test_8_model_that_does_not_fit_fails_and_kv_exhaustion_preempts_with_tail_latency() -> None:
    """Llama-3.1-70B (141 GB of bf16 weights) on one 80 GB H100 fails at launch with CUDA
    out of memory. With a KV cache too small for the load (2 GiB: ~16k tokens for 200
    requests of ~2,000), requests are preempted and recomputed: E2E p99 at least 1.5x and
    throughput lower than with the default cache."""
    with pytest.raises(LaunchError, match="CUDA out of memory"):
        engine("llama-3.1-70b", "h100-sxm")
    wl = workload("balanced", requests=200)
    small = engine(kv_cache_memory_bytes=2 * GIB, max_model_len=4096)
    roomy = engine(max_model_len=4096)
    a, b = run(small, wl, noise=False), run(roomy, wl, noise=False)
    assert a.stats.preemptions > 0 and b.stats.preemptions == 0
    ma, mb = metrics(small, wl, a), metrics(roomy, wl, b)
    assert ma.e2e_ms.p99 > 1.5 * mb.e2e_ms.p99
    assert ma.output_throughput < mb.output_throughput


def test_9_eager_mode_costs_small_batch_tpot_and_saves_startup() -> None:
    """Without CUDA graphs every step pays the Python kernel-launch cost: batch-1 TPOT rises
    by >15% (2 ms on 7 ms); start-up skips torch.compile and graph capture (>30 s less)."""
    wl = simple_workload([128] * 3, [256] * 3, concurrency=1)
    graphs, eager = engine(), engine(enforce_eager=True)
    t_graphs = metrics(graphs, wl, noise=False).tpot_ms.mean
    t_eager = metrics(eager, wl, noise=False).tpot_ms.mean
    assert t_eager > 1.15 * t_graphs
    assert eager.startup_s < graphs.startup_s - 30.0


def test_10_tensor_parallel_lowers_70b_tpot_and_doubles_gpu_cost() -> None:
    """Llama-3.1-70B on 4 vs 8 H100s: each GPU reads half the weights, so batch-1 TPOT falls
    by >25% despite the extra all-reduces, while the hourly price doubles (and cost per
    token rises, since decode at batch 1 does not scale perfectly)."""
    wl = simple_workload([128] * 2, [128] * 2, concurrency=1)
    tp4 = engine("llama-3.1-70b", "h100-sxm", tensor_parallel_size=4)
    tp8 = engine("llama-3.1-70b", "h100-sxm", tensor_parallel_size=8)
    assert tp8.price_per_hour == pytest.approx(2 * tp4.price_per_hour)
    costs, tpots = [], []
    for eng in (tp4, tp8):
        sim = run(eng, wl, noise=False)
        result = RunResult(
            target=eng.name,
            model="m",
            workload="w",
            workload_hash="-",
            seed=0,
            started_at="-",
            duration_s=sim.duration_s,
            records=sim.records,
        )
        m = compute_metrics(
            result, price=Price(price_per_hour=eng.hardware.price_per_hour, gpus=eng.num_gpus)
        )
        tpots.append(m.tpot_ms.mean)
        costs.append(m.cost_per_mtok)
    assert tpots[1] < 0.75 * tpots[0]
    assert costs[1] > costs[0]  # type: ignore[operator]
