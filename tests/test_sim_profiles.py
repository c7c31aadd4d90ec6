"""The simulator's data: hardware, model, quantization and speculative-decoding profiles, and
the published calibration points. Every file loads and validates, and the numbers agree with
each other and with the physics they describe."""

from __future__ import annotations

from pathlib import Path

import pytest

from servegym.engines.sim.calibration import CalibrationPoint, load_calibration
from servegym.engines.sim.profiles import (
    ModelProfile,
    get_engine,
    get_hardware,
    get_model,
    hardware_profiles,
    model_profiles,
    quantization_profiles,
    speculative_profiles,
)
from servegym.errors import UserError

GIB = 2**30

HARDWARE = ["h100-sxm", "h200", "a100-80gb", "l40s", "b200"]
MODELS = ["llama-3.1-8b", "mistral-7b-v0.3", "qwen3-8b", "llama-3.1-70b"]
DRAFTS = ["llama-3.2-1b", "qwen3-0.6b"]


# ---------------------------------------------------------------- loading


def test_every_profile_loads() -> None:
    hw, models = hardware_profiles(), model_profiles()
    assert set(HARDWARE) <= set(hw)
    assert set(MODELS + DRAFTS) <= set(models)
    for key, h in hw.items():
        assert h.id == key, "the id inside a profile must match its file name"
        assert h.sources, f"{key}: a profile cites its sources"
        assert h.price_source and h.price_per_hour > 0
    for key, m in models.items():
        assert m.id == key, "the id inside a profile must match its file name"
        assert m.sources, f"{key}: a profile cites its sources"


def test_unknown_ids_are_user_errors_naming_the_flag() -> None:
    with pytest.raises(UserError, match="--hardware: unknown hardware 'h900'"):
        get_hardware("h900")
    with pytest.raises(UserError, match="--model: unknown model 'gpt-5'"):
        get_model("gpt-5")


def test_draft_models_exist_and_share_the_vocabulary() -> None:
    models = model_profiles()
    for m in models.values():
        if m.draft_model is None:
            continue
        draft = models[m.draft_model]
        assert draft.vocab_size == m.vocab_size, f"{m.id}: a draft must share the tokenizer"
        assert draft.num_parameters < m.num_parameters / 5
    assert models["llama-3.1-8b"].draft_model == "llama-3.2-1b"
    assert models["llama-3.1-70b"].draft_model == "llama-3.2-1b"
    assert models["qwen3-8b"].draft_model == "qwen3-0.6b"


# ---------------------------------------------------------------- hardware sanity


def test_memory_and_bandwidth_ordering() -> None:
    h100, h200, a100, l40s, b200 = (get_hardware(i) for i in HARDWARE)
    assert h200.memory_gib > h100.memory_gib
    assert b200.memory_gib > h200.memory_gib
    # H200 = H100 compute with ~1.43x the bandwidth; H100 ~1.64x A100; A100 ~2.4x L40S.
    assert h200.hbm_bandwidth_tbs / h100.hbm_bandwidth_tbs == pytest.approx(1.43, abs=0.02)
    assert h100.hbm_bandwidth_tbs / a100.hbm_bandwidth_tbs == pytest.approx(1.64, abs=0.03)
    assert a100.hbm_bandwidth_tbs / l40s.hbm_bandwidth_tbs == pytest.approx(2.36, abs=0.05)
    assert h200.peak_tflops == h100.peak_tflops
    # memory_gib is what CUDA reports: a little under the marketing size.
    assert 78 < h100.memory_gib < 80 and 139 < h200.memory_gib < 141 and 44 < l40s.memory_gib < 48


def test_dense_peaks() -> None:
    h100, _, a100, l40s, b200 = (get_hardware(i) for i in HARDWARE)
    for h in hardware_profiles().values():
        p = h.peak_tflops
        if p.fp8 is not None:
            assert p.fp8 == pytest.approx(2 * p.bf16, rel=0.03), f"{h.id}: FP8 = 2x BF16"
        assert p.int8 >= p.bf16
    assert a100.peak_tflops.fp8 is None, "Ampere has no FP8 tensor cores"
    assert h100.peak_tflops.int4 is None, "Hopper has no INT4 tensor cores"
    assert h100.peak_tflops.bf16 == pytest.approx(989.5)
    assert b200.peak_tflops.bf16 > 2 * h100.peak_tflops.bf16
    assert l40s.peak_tflops.bf16 < a100.peak_tflops.bf16 * 1.2


def test_interconnects() -> None:
    hw = hardware_profiles()
    l40s = hw["l40s"]
    pcie_cards = {"l40s", "rtx-4090", "h100-pcie"}
    for card in pcie_cards:
        assert hw[card].interconnect_kind == "pcie", f"the {card} has no NVLink"
    for h in hw.values():
        if h.id not in pcie_cards:
            assert h.interconnect_kind == "nvlink"
            assert h.interconnect_gbs >= 600
            assert h.interconnect_gbs > 5 * l40s.interconnect_gbs
            assert h.allreduce_latency_us < l40s.allreduce_latency_us
    assert hw["h100-sxm"].interconnect_gbs == hw["h200"].interconnect_gbs == 900
    assert hw["a100-80gb"].interconnect_gbs == 600


def test_efficiencies_and_overheads_are_plausible() -> None:
    for h in hardware_profiles().values():
        # Fitted (docs/simulator.md, Calibration) within the fit's physical bounds: weight
        # and KV streaming at 75-95% of peak bandwidth; vLLM's linear layers end to end at
        # 20-80% of the dense peak (about half on Hopper by vLLM's published prefill rates).
        assert 0.75 <= h.mem_efficiency <= 0.95, f"{h.id}: streaming reaches 75-95% of peak"
        assert 0.2 <= h.compute_efficiency <= 0.8, f"{h.id}: layers reach 20-80% of peak"
        assert h.eager_overhead_ms > 0, "eager mode must cost something at small batch"
        assert h.cuda_graph_capture_s + h.compile_s > 0, "eager mode must save start-up time"
        assert 0 < h.activation_reserve_gib < 0.1 * h.memory_gib


def test_batch1_decode_roofline_matches_vllm() -> None:
    """Batch-1 TPOT ~ weight bytes / effective bandwidth + overhead: Llama-3.1-8B bf16 on
    H100 measures 7.07 ms in vLLM (issue #20780); the profile numbers give within 10%."""
    m, h = get_model("llama-3.1-8b"), get_hardware("h100-sxm")
    e = get_engine("vllm")
    bytes_per_param = quantization_profiles()["bf16"].bytes_per_param
    weights = m.num_parameters * bytes_per_param
    tpot_ms = weights / (h.hbm_bandwidth_tbs * 1e12 * h.mem_efficiency) * 1e3
    tpot_ms += e.step_overhead_ms + e.per_seq_overhead_us * 1e-3
    assert tpot_ms == pytest.approx(7.07, rel=0.10)


# ---------------------------------------------------------------- model sanity


def test_kv_bytes_per_token() -> None:
    assert get_model("llama-3.1-8b").kv_bytes_per_token(2) == 131072
    assert get_model("mistral-7b-v0.3").kv_bytes_per_token(2) == 131072
    assert get_model("qwen3-8b").kv_bytes_per_token(2) == 147456
    assert get_model("llama-3.1-70b").kv_bytes_per_token(2) == 327680
    assert get_model("llama-3.1-8b").kv_bytes_per_token(1) == 65536  # fp8 KV halves it


@pytest.mark.parametrize("model_id", MODELS + DRAFTS)
def test_parameter_count_matches_architecture(model_id: str) -> None:
    m = get_model(model_id)
    assert m.num_parameters == pytest.approx(m.architecture_parameters(), rel=0.03)


def test_architecture_count_by_hand() -> None:
    """Spell one count out, so architecture_parameters() itself is checked."""
    m = get_model("llama-3.1-8b")
    h, kv = 4096, 8 * 128
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * 14336 + 2 * h
    assert m.architecture_parameters() == 32 * per_layer + 2 * 128256 * h + h
    tied = ModelProfile.model_validate(
        {**m.model_dump(), "tie_word_embeddings": True, "id": "tied"}
    )
    assert m.architecture_parameters() - tied.architecture_parameters() == 128256 * h


def test_heads_and_dims_are_consistent() -> None:
    for m in model_profiles().values():
        assert m.num_attention_heads % m.num_kv_heads == 0, f"{m.id}: GQA groups"
        assert m.head_dim in (64, 128)
        assert m.max_position_embeddings >= 32768


def test_70b_bf16_does_not_fit_one_80gb_gpu_but_fp8_does() -> None:
    m, h = get_model("llama-3.1-70b"), get_hardware("h100-sxm")
    q = quantization_profiles()
    assert m.num_parameters * q["bf16"].bytes_per_param / GIB > h.memory_gib
    assert m.num_parameters * q["fp8"].bytes_per_param / GIB < 0.9 * h.memory_gib
    for tp in (2, 4, 8):
        assert m.num_parameters * q["bf16"].bytes_per_param / tp / GIB < 0.9 * h.memory_gib
    # An 8B model fits everywhere, even the L40S.
    small = get_model("llama-3.1-8b")
    assert small.num_parameters * 2 / GIB < 0.5 * get_hardware("l40s").memory_gib


# ---------------------------------------------------------------- quantization


def test_quantization_ordering() -> None:
    q = quantization_profiles()
    assert {"bf16", "fp8", "int8", "int4", "kv_fp8"} <= set(q)
    b = {k: v.bytes_per_param for k, v in q.items()}
    assert b["bf16"] > b["fp8"] == b["int8"] > b["int4"]
    acc = {k: v.accuracy_ratio for k, v in q.items()}
    assert acc["int4"] < acc["int8"] <= acc["fp8"] <= acc["bf16"] == 1.0
    assert acc["fp8"] >= 0.99 and acc["int4"] >= 0.9, "documented losses are small"
    assert q["int4"].dequant_overhead > q["int8"].dequant_overhead >= q["fp8"].dequant_overhead
    assert q["int4"].compute_dtype == "bf16", "W4A16 computes in bf16"
    for name, profile in q.items():
        assert profile.sources, name
        assert profile.applies_to == ("kv_cache" if name == "kv_fp8" else "weights")
        assert profile.format == name or name == "kv_fp8"


def test_kv_fp8_halves_kv_bytes_with_a_small_cost() -> None:
    kv = quantization_profiles()["kv_fp8"]
    assert kv.bytes_per_param == 1.0
    assert 0.99 <= kv.accuracy_ratio < 1.0


def test_quantization_aliases_cover_the_serving_config() -> None:
    from typing import get_args

    from servegym.engines.config import WeightQuantization

    weights = [p for p in quantization_profiles().values() if p.applies_to == "weights"]
    covered = [a for p in weights for a in p.aliases]
    assert len(covered) == len(set(covered)), "each knob value maps to one format"
    assert set(get_args(WeightQuantization)) <= set(covered)


# ---------------------------------------------------------------- speculative decoding


def test_speculative_profiles() -> None:
    from typing import get_args

    from servegym.engines.config import SpecMethod

    spec = speculative_profiles()
    assert set(spec) == set(get_args(SpecMethod))
    models = model_profiles()
    for name, s in spec.items():
        assert s.method == name
        assert s.sources and s.judgment, f"{name}: cite sources, mark judgment"
        for family, rate in s.acceptance_rate.items():
            assert 0 <= rate < 1, (name, family)
        assert s.rate("synthetic") < s.rate("chat") <= s.rate("agentic")
        for model_id in s.heads:
            assert model_id in models, f"{name}: head for unknown model {model_id}"
    assert spec["ngram"].autoregressive is False
    assert spec["mtp"].requires_native_support
    assert "mistral-7b-v0.3" not in spec["eagle3"].heads


def test_ngram_gets_almost_nothing_on_random_prompts() -> None:
    ngram = speculative_profiles()["ngram"]
    assert ngram.expected_tokens_per_step("synthetic", 4) < 1.05
    assert ngram.expected_tokens_per_step("agentic", 4) > 1.5


def test_eagle_acceptance_reproduces_vllm_measurements() -> None:
    """Mean acceptance lengths measured in vLLM issue #20780 (Llama-3.1-8B, MT-Bench)."""
    spec = speculative_profiles()
    measured = {
        "eagle": [2.10, 2.29, 2.39, 2.43, 2.45, 2.47],
        "eagle3": [2.36, 2.79, 3.08, 3.32, 3.46, 3.54],
    }
    for method, lengths in measured.items():
        for k, length in zip(range(2, 8), lengths, strict=True):
            got = spec[method].expected_tokens_per_step("chat", k)
            assert got == pytest.approx(length, abs=0.12), (method, k)


# ---------------------------------------------------------------- calibration


def test_calibration_points_validate() -> None:
    points = load_calibration()
    assert len(points) >= 40
    assert len({p.id for p in points}) == len(points)
    for p in points:
        assert isinstance(p, CalibrationPoint)
        assert p.url.startswith("https://")
        p.serving_config()  # the knobs are real ServingConfig knobs
        if p.simulable and p.workload.dataset == "random":
            assert p.workload.input_tokens and p.workload.output_tokens
        if not p.simulable:
            assert p.not_simulable_reason, p.id


def test_calibration_covers_the_regimes() -> None:
    points = load_calibration()
    assert any(p.regime == "memory-bound" for p in points), "batch-1 points"
    assert any(p.regime == "compute-bound" for p in points), "high-throughput points"
    assert any(p.model == "llama-3.1-70b" and p.tensor_parallel > 1 for p in points)
    assert any(p.engine == "vllm" for p in points)
    assert {p.hardware for p in points} >= {"h100-sxm", "h200", "l40s"}
    assert sum(p.simulable for p in points) >= 8


def test_calibration_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "calibration.toml"
    bad.write_text('[[point]]\nid = "x"\n')
    with pytest.raises(UserError, match=r"calibration.toml: field 'point\.0\.source'"):
        load_calibration(bad)
    real = (Path(__file__).parents[1] / "servegym/engines/sim/calibration.toml").read_text()
    bad.write_text(real.replace('hardware = "h100-sxm"', 'hardware = "tpu-v9"', 1))
    with pytest.raises(UserError, match="unknown hardware 'tpu-v9'"):
        load_calibration(bad)
    bad.write_text(real + real[real.index("[[point]]") :])
    with pytest.raises(UserError, match="duplicate calibration point id"):
        load_calibration(bad)
