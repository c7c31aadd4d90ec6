"""The simulator against published measurements (``calibration.toml``,
``benchmarks/sim_calibration.py``, the Calibration section of ``docs/simulator.md``).

The bounds asserted here are what the fitted profiles achieve, with a margin, so a change to
the cost model or the profiles that moves the calibrated figures fails a test. The fast
tests check the cheap points (batch-1, the RTX 4090 and long-prompt concurrency sweeps) and
that the fit and the leave-one-source-out procedure run; the slow test checks the whole
table against the numbers docs/simulator.md reports. Sources added after the shipped fit
(``HELD_OUT_GROUPS``) are checked apart, against their held-out errors.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from servegym.engines.sim.calibration import (
    CalibrationPoint,
    load_calibration,
    load_ratios,
)
from servegym.errors import UserError
from servegym.workloads.spec import LengthDistribution

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "sim_calibration.py"

CHEAP_MEDIAN_BOUND = 0.04
"""Median absolute error of the cheap vLLM points (achieved: 2.8%)."""
CHEAP_MAX_BOUND = 0.16
"""Largest absolute error of one cheap vLLM point (achieved: 14.4%, the median ITL at
concurrency 8 with an FP8 KV cache)."""
CHEAP_GROUPS = (
    "vLLM PR #16937",
    "SGLang PR #4716",
    "Mistral-7B on RTX 4090 blog",
    "Tim Wang blog",
    "kvcached H100 check",
    "vLLM blog, FP8 KV cache",
)
"""Sources whose points simulate in well under a second each. The IOG Foundation benchmarks
are as cheap but not here: the shipped profiles were not fitted to them (HELD_OUT_GROUPS)."""
IOG = "IOG Foundation benchmarks"
HELD_OUT_GROUPS = (IOG,)
"""Sources added after the shipped fit and evaluated with it unchanged: their errors are
held-out errors, outside the fitted table's bounds (IOG's mean TTFT of vLLM 0.8.5 under
Poisson load comes out up to 108% long). The next refit takes them in; then they leave this
tuple and the bounds below are re-measured."""
HELD_OUT_TPOT_BOUND = 0.20
"""Largest held-out error of IOG's mean TPOT points (achieved: 17.2%, Nemotron-70B FP8 at
TP2 and 4 req/s, simulated fast)."""
HELD_OUT_TTFT_BOUND = 1.15
"""Largest held-out error of IOG's mean TTFT points (achieved: +108.4%, Llama-3-8B on the
H100 PCIe at 1 req/s: the shipped serving path, ~27 ms fitted to kvcached's vLLM 0.19.0,
where these vLLM 0.8.5 runs leave ~5 ms)."""
STAND_IN_SENSITIVITY = 0.08
"""An IOG point is simulable only where its simulated figure moves by less than this between
fixed stand-in lengths and a lognormal of the same means (calibration.toml, its section)."""
MLPERF_RATIO = "mlperf51-redhat-llama31-8b-fp8-h100-over-l40s-offline"
PERF_CI = "vLLM perf CI"
"""vLLM's CI benchmark on its H100 and H200 machines: the only vLLM measurements of the H200."""
PERF_CI_RATIO_BOUND = 0.03
"""Largest error of vLLM's H100/H200 latency ratios (achieved: +0.6% and +0.9%)."""
DOC_TARGET_MEDIAN = 0.10
DOC_TARGET_MAX = 0.25
"""The issue's aim, as docs/simulator.md states it."""


@pytest.fixture(scope="module")
def cal() -> ModuleType:
    """``benchmarks/sim_calibration.py`` as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("sim_calibration", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _vllm_family(points: list[CalibrationPoint]) -> list[CalibrationPoint]:
    return [p for p in points if p.engine in ("vllm", "sglang") and p.simulable]


def test_calibration_file_loads() -> None:
    """At least 25 simulable vLLM points from at least 4 independent sources (issue 18)."""
    points = load_calibration()
    ids = [p.id for p in points]
    assert len(ids) == len(set(ids)) >= 11
    vllm = [p for p in _vllm_family(points) if p.engine == "vllm"]
    assert len(vllm) >= 25
    assert len({p.source_group for p in vllm}) >= 4
    assert any(p.engine == "tensorrt-llm" for p in points)
    for p in points:
        assert p.value > 0 and p.url.startswith("http")
        if p.simulable:
            inp, out = p.workload.simulated_lengths()
            assert inp is not None and out is not None, p.id
        else:
            assert p.not_simulable_reason, p.id
        p.serving_config()  # the knobs form a valid ServingConfig
    ratios = load_ratios()
    assert MLPERF_RATIO in {r.id for r in ratios}
    assert {r.source_group for r in ratios if r.published_workload} == {PERF_CI}
    for r in ratios:
        assert {r.numerator, r.denominator} <= set(ids)


def test_calibration_file_errors(tmp_path: Path) -> None:
    good = (ROOT / "servegym/engines/sim/calibration.toml").read_text()
    bad_model = tmp_path / "model.toml"
    bad_model.write_text(good.replace('model = "llama-3.1-8b"', 'model = "llama-9"', 1))
    with pytest.raises(UserError, match="unknown model 'llama-9'"):
        load_calibration(bad_model)
    bad_ratio = tmp_path / "ratio.toml"
    bad_ratio.write_text(
        good.replace(
            'denominator = "mlperf51-redhat-llama31-8b-fp8-l40s-offline"',
            'denominator = "no-such-point"',
        )
    )
    with pytest.raises(UserError, match="unknown calibration point 'no-such-point'"):
        load_ratios(bad_ratio)


def test_script_computes_the_table(cal: ModuleType) -> None:
    """The core function simulates every simulable point, lists the rest with a reason,
    summarises per engine family and renders both formats (request counts cut for speed)."""
    points = load_calibration()
    report = cal.calibrate(max_requests=200)
    assert [r.id for r in report.rows] == [p.id for p in points]
    for row, p in zip(report.rows, points, strict=True):
        if p.simulable:
            assert row.reason is None and row.simulated is not None and row.simulated > 0
            assert row.error == pytest.approx(row.simulated / p.value - 1.0)
        else:
            assert row.simulated is None and row.reason
    groups = {s.group: s for s in report.summaries}
    regimes = {f"{cal.FAMILY_VLLM}: {r}" for r in cal.REGIMES}
    assert set(groups) == {cal.ALL, cal.FAMILY_VLLM, cal.FAMILY_TRT} | regimes
    assert groups[cal.ALL].points == sum(p.simulable for p in points)
    assert groups[cal.FAMILY_VLLM].points + groups[cal.FAMILY_TRT].points == (
        groups[cal.ALL].points
    )
    ratios = {r.id: r for r in report.ratios}
    assert set(ratios) == {r.id for r in load_ratios()}
    ratio = ratios[MLPERF_RATIO]
    assert ratio.published == pytest.approx(5777.0 / 1642.0)
    assert len(ratio.spread) == 3 and all(v > 1 for _, v in ratio.spread)
    md = cal.render(report, markdown=True)
    assert md.startswith("| id | source | setting | published | simulated | error |")
    text = cal.render(report, markdown=False)
    for p in points:
        assert p.id in md and p.id in text


def test_cheap_points_within_bound(cal: ModuleType) -> None:
    """The fitted profiles reproduce the cheap vLLM/SGLang points: batch-1 decode (8B on one
    H100 and one B200, at 1k and 100k prompt tokens; 70B at TP8), the RTX 4090 concurrency
    sweep, the long-prompt waves and closed loops, and the 0.6B model's host-bound burst and
    Poisson load."""
    points = [p for p in _vllm_family(load_calibration()) if p.source_group in CHEAP_GROUPS]
    report = cal.calibrate(points, ratios=[])
    s = report.summary(cal.FAMILY_VLLM)
    assert s.points == len(points) >= 25
    assert s.median_abs_error <= CHEAP_MEDIAN_BOUND <= DOC_TARGET_MEDIAN
    assert s.max_abs_error <= CHEAP_MAX_BOUND <= DOC_TARGET_MAX


def test_iog_poisson_points_held_out(cal: ModuleType) -> None:
    """IOG Foundation's vLLM 0.8.5 runs under Poisson load (200 ShareGPT prompts, 1-16 req/s;
    Llama-3-8B on an H100 PCIe and an RTX 4090, Llama-3-70B and Nemotron-70B FP8 at TP2),
    never fitted: the simulated mean TPOT stays within 20% of the published one, and the mean
    TTFT within the held-out bound (today over-predicted: the shipped serving path). Each
    simulable point uses stand-in lengths at the run's published means, and the stand-in
    hardly matters: with a lognormal of the same means the figure moves by less than 8%."""
    points = [p for p in load_calibration() if p.source_group == IOG]
    simulable = [p for p in points if p.simulable]
    assert len(simulable) >= 20
    assert {(p.model, p.hardware, p.tensor_parallel, p.weights) for p in simulable} == {
        ("llama-3.1-8b", "h100-pcie", 1, "bf16"),
        ("llama-3.1-8b", "rtx-4090", 1, "bf16"),
        ("llama-3.1-70b", "h100-pcie", 2, "bf16"),
        ("llama-3.1-70b", "h100-pcie", 2, "fp8"),
    }
    for p in points:
        assert p.workload.arrival == "poisson" and p.workload.num_prompts == 200
        assert p.workload.uses_stand_in and p.workload.stand_in_input_tokens == 206
        assert "1ffd7960d341d7ff15e962af098ca5b08d9f253e" in p.url
    report = cal.calibrate(simulable, ratios=[])
    for row in report.rows:
        assert row.error is not None and "Poisson" in row.setting, row.id
        bound = HELD_OUT_TPOT_BOUND if row.metric == "tpot_ms" else HELD_OUT_TTFT_BOUND
        assert abs(row.error) <= bound, (row.id, row.error)
    (point,) = [p for p in simulable if p.id == "iog-llama3-8b-h100pcie-sharegpt-poisson16-ttft"]
    inp, out = point.workload.simulated_lengths()
    assert inp is not None and out is not None
    fixed = cal._workload_spec(point.id, cal._arrival(point.workload), 200, inp, out)

    def lognormal(mean: int) -> LengthDistribution:
        # sigma 1, median mean / e^(1/2): the same mean before the sampler's 4-1,024 clamp
        return LengthDistribution(
            dist="lognormal", median=mean / math.exp(0.5), sigma=1.0, min=4, max=1024
        )

    spread = fixed.model_copy(
        update={"input_tokens": lognormal(inp), "output_tokens": lognormal(out)}
    )
    ttft = [
        cal._run(point.model, point.hardware, point.serving_config(), spec)[0].ttft_ms.mean
        for spec in (fixed, spread)
    ]
    assert abs(ttft[1] / ttft[0] - 1.0) < STAND_IN_SENSITIVITY


def test_h200_over_h100_matches_vllms_own_ratio(cal: ModuleType) -> None:
    """vLLM's CI latency benchmark (a batch of 8, 32/128 tokens, offline) on its H100 and H200
    machines: the simulated H100/H200 latency ratio of Llama-3.1-8B on one GPU and Llama-3-70B
    at TP4 matches the published one (1.197 and 1.177), each GPU simulated offline, without
    the API server; and the simulated H200 stays faster than the H100 by less than its
    bandwidth ratio (1.43x) and more than not at all, offline and at batch 1."""
    every = {p.id: p for p in load_calibration()}
    ratios = [r for r in load_ratios() if r.source_group == PERF_CI]
    assert len(ratios) == 2
    for r in ratios:
        row = cal.simulate_ratio(r, every)
        assert every[r.numerator].hardware == "h100-sxm" and every[r.denominator].hardware == "h200"
        assert every[r.numerator].endpoint == every[r.denominator].endpoint == "offline"
        assert "stand-in" not in row.setting and "32/128" in row.setting
        assert row.group == PERF_CI
        assert abs(row.error) <= PERF_CI_RATIO_BOUND, (r.id, row.simulated, row.published)
    speed = cal.h200_over_h100()
    assert 1.05 < speed["offline throughput"] < 1.25
    assert 1.05 < speed["batch-1 decode"] < 1.25


def test_range_ratio_spreads_lengths_and_breaks_lockstep(cal: ModuleType) -> None:
    """A point measured with ``--random-range-ratio`` is simulated with lengths uniform
    within the ratio: a closed loop of such requests falls out of step, so its median TTFT
    is one request's prefill riding along with decodes, not a wave of simultaneous
    prefills (the same loop at fixed lengths)."""
    (point,) = [
        p for p in load_calibration() if p.id == "vllmblog-fp8kv-llama31-8b-h100-c8-20k-ttft"
    ]
    assert point.workload.range_ratio == pytest.approx(0.15)
    spec = cal._workload_spec("x", cal._arrival(point.workload), 50, 20000, 2000, 0.15)
    assert spec.input_tokens.dist == "uniform"
    assert (spec.input_tokens.low, spec.input_tokens.high) == (17000, 23000)
    assert (spec.output_tokens.low, spec.output_tokens.high) == (1700, 2300)
    spread = cal.simulate_point(point, max_requests=40)
    fixed = cal.simulate_point(
        point.model_copy(
            update={"workload": point.workload.model_copy(update={"range_ratio": 0.0})}
        ),
        max_requests=40,
    )
    assert spread.simulated is not None and fixed.simulated is not None
    assert spread.simulated < 0.5 * fixed.simulated
    assert "+-15%" in spread.setting


def test_gpustack_h100_decodes_like_a_pcie_card(cal: ModuleType) -> None:
    """Why GPUStack's "H100" is simulated as an H100 PCIe: its Qwen3-32B decode step at a
    32,000-token context (median ITL 43.3 ms, one sequence at a time) is what a 2.0 TB/s card
    gives, and an SXM module (3.35 TB/s) would take ~40% less."""
    (point,) = [p for p in load_calibration() if p.id == "gpustack-qwen3-32b-h100-32000-100-itl"]
    assert point.hardware == "h100-pcie"
    pcie = cal.simulate_point(point, max_requests=3)
    sxm = cal.simulate_point(point.model_copy(update={"hardware": "h100-sxm"}), max_requests=3)
    assert pcie.error is not None and sxm.error is not None
    assert abs(pcie.error) < 0.06
    assert sxm.error < -0.3


def test_fit_moves_a_parameter_toward_the_data(cal: ModuleType) -> None:
    """Least squares on the batch-1 point alone, fitting only vLLM's step overhead from a
    bad start (8 ms instead of ~1.4): the fit lands where the point is matched."""
    (point,) = [p for p in load_calibration() if p.id == "vllm-llama31-8b-h100-bs1-mtbench"]
    step = next(q for q in cal.FIT_PARAMS if q.name == "vllm.step_overhead_ms")
    bad = {step.name: 7.9}
    before = cal.simulate_point(
        point, profiles=cal.apply_params([step], [7.9], cal.shipped_profiles())
    )
    res = cal.fit([point], params=[step], start=bad, max_requests=20, max_nfev=12)
    after = cal.simulate_point(point, profiles=res.profiles())
    assert res.params == [step] and res.start == [pytest.approx(7.9, rel=1e-3)]
    assert abs(after.error) < 0.5 * abs(before.error)
    assert 0.5 < res.values[0] < 4.0


def test_leave_one_source_out_runs(cal: ModuleType) -> None:
    """Each held-out source is predicted by a fit on the others: two cheap sources, one
    parameter, a few evaluations (the procedure, not its accuracy)."""
    points = [
        p
        for p in load_calibration()
        if p.source_group in ("vLLM PR #16937", "Mistral-7B on RTX 4090 blog") and p.simulable
    ]
    params = [q for q in cal.FIT_PARAMS if q.name == "vllm.step_overhead_ms"]
    held = cal.leave_one_source_out(
        points, params=params, max_requests=40, predict_max_requests=40, max_nfev=4
    )
    assert [h.group for h in held] == ["Mistral-7B on RTX 4090 blog", "vLLM PR #16937"]
    for h in held:
        assert {r.group for r in h.rows} == {h.group}
        assert list(h.fitted) == ["vllm.step_overhead_ms"]
        assert all(r.error is not None and abs(r.error) < 1.0 for r in h.rows)
    text = cal.render_loso(held, cal.calibrate(points, ratios=[], max_requests=40), markdown=True)
    assert "| held out |" in text and "each source predicted by a fit without it" in text


def test_leave_one_source_out_holds_out_a_source_of_ratios(cal: ModuleType) -> None:
    """A source that only contributes ratios (vLLM's H100/H200 CI runs) is held out like a
    source of points: its ratios leave the fit and are predicted by the fit on the rest, and
    the default hold-out list includes it."""
    (point,) = [p for p in load_calibration() if p.id == "vllm-llama31-8b-h100-bs1-mtbench"]
    ratios = load_ratios()
    params = [
        q for q in cal.FIT_PARAMS if q.name in ("vllm.step_overhead_ms", "h200.mem_efficiency")
    ]
    held = cal.leave_one_source_out(
        [point],
        groups=[PERF_CI],
        params=params,
        ratios=ratios,
        max_requests=40,
        predict_max_requests=40,
        max_nfev=3,
    )
    (h,) = held
    assert h.group == PERF_CI and h.rows == []
    assert list(h.fitted) == ["vllm.step_overhead_ms"]  # nothing left informs the H200
    assert {r.group for r in h.ratios} == {PERF_CI} and len(h.ratios) == 2
    text = cal.render_loso(held, cal.calibrate([point], max_requests=40), markdown=True)
    assert "Ratio checks: fitted with every source, and held out" in text


@pytest.mark.slow
def test_full_calibration_as_documented(cal: ModuleType) -> None:
    """The whole table at the published request counts (a few minutes on one core), as
    docs/simulator.md reports it: vLLM/SGLang median 3.2% and worst 20.1% (a short-prompt
    burst's TTFT), TensorRT-LLM median 9.0% and worst 16.4% (its prefill-heavy H100 point,
    which the lower H200 bandwidth moved from +14.9% through TensorRT-LLM's GEMM scale), the
    MLPerf H100/L40S ratio -2.0% (3.45-3.57 over the stand-ins). Sources the shipped
    profiles were not fitted to (HELD_OUT_GROUPS) are left out of the vLLM/SGLang bounds."""
    report = cal.calibrate()
    fitted = [
        r for r in report.rows if r.family == cal.FAMILY_VLLM and r.group not in HELD_OUT_GROUPS
    ]
    vllm = cal._summary(cal.FAMILY_VLLM, fitted)
    assert vllm.points >= 58
    assert vllm.median_abs_error <= 0.05 and vllm.max_abs_error <= 0.22
    trt = report.summary(cal.FAMILY_TRT)
    assert trt.median_abs_error <= 0.12 and trt.max_abs_error <= 0.18
    ratio = next(r for r in report.ratios if r.id == MLPERF_RATIO)
    assert -0.15 <= ratio.error <= 0.0
    assert max(v for _, v in ratio.spread) - min(v for _, v in ratio.spread) < 0.2
