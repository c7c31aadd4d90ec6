"""The simulator against published measurements (``calibration.toml``,
``benchmarks/sim_calibration.py``, the Calibration section of ``docs/simulator.md``).

The bounds asserted here are what the simulator achieves, with a small margin, so a change to
the cost model or the profiles that moves the calibrated figures fails a test: on the
vLLM/SGLang points (the engines the simulator models) the doc reports a median absolute
error of 5.4% and a worst of 6.6%; the tests allow 8% and 10%.
"""

from __future__ import annotations

import importlib.util
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

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "sim_calibration.py"

VLLM_MEDIAN_BOUND = 0.08
"""Median absolute error over the simulable vLLM/SGLang points (achieved: 5.4%)."""
VLLM_MAX_BOUND = 0.10
"""Largest absolute error of one vLLM/SGLang point (achieved: 6.6%)."""
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
    points = load_calibration()
    ids = [p.id for p in points]
    assert len(ids) == len(set(ids)) >= 11
    assert len(_vllm_family(points)) >= 2
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
    assert ratios, "the MLPerf H100/L40S ratio check"
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
    assert set(groups) == {cal.ALL, cal.FAMILY_VLLM, cal.FAMILY_TRT}
    assert groups[cal.ALL].points == sum(p.simulable for p in points)
    assert groups[cal.FAMILY_VLLM].points + groups[cal.FAMILY_TRT].points == (
        groups[cal.ALL].points
    )
    (ratio,) = report.ratios
    assert ratio.published == pytest.approx(5777.0 / 1642.0)
    assert len(ratio.spread) == 3 and all(v > 1 for _, v in ratio.spread)
    md = cal.render(report, markdown=True)
    assert md.startswith("| id | source | setting | published | simulated | error |")
    text = cal.render(report, markdown=False)
    for p in points:
        assert p.id in md and p.id in text


def test_vllm_family_error_within_bound(cal: ModuleType) -> None:
    """Batch-1 decode on 8B (one H100) and 70B (TP8): the simulator's roofline plus overhead
    lands a few percent above the published throughput (+6.6%, +4.3%)."""
    points = _vllm_family(load_calibration())
    report = cal.calibrate(points, ratios=[])
    s = report.summary(cal.FAMILY_VLLM)
    assert s.points == len(points) >= 2
    assert s.median_abs_error <= VLLM_MEDIAN_BOUND <= DOC_TARGET_MEDIAN
    assert s.max_abs_error <= VLLM_MAX_BOUND <= DOC_TARGET_MAX
    for row in report.rows:
        assert row.error is not None and 0.0 < row.error < VLLM_MAX_BOUND, row.id


@pytest.mark.slow
def test_full_calibration_as_documented(cal: ModuleType) -> None:
    """The whole table at the published request counts (about 10 s): TensorRT-LLM points
    within 20% (achieved: median 10.6%, worst -15.8%), the H100/L40S ratio 10-25% low
    (achieved: -16%, the same for every stand-in prompt length)."""
    report = cal.calibrate()
    trt = report.summary(cal.FAMILY_TRT)
    assert trt.median_abs_error <= 0.13 and trt.max_abs_error <= 0.20
    assert report.summary(cal.ALL).max_abs_error <= DOC_TARGET_MAX
    (ratio,) = report.ratios
    assert -0.25 <= ratio.error <= -0.10
    assert max(v for _, v in ratio.spread) - min(v for _, v in ratio.spread) < 0.15
