"""The pipeline's result type and its Amdahl arithmetic, against MLPerf Inference v6.1's
RAG write-up: answer generation at share 0.68 made 3x faster speeds the pipeline up 1.83x,
its ceiling (free) is about 3.1x, and modest 2-4x gains on every stage give 2.12x."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from servegym.errors import UserError
from servegym.pipeline.result import (
    STAGES,
    PipelineResult,
    TaskRecord,
    amdahl_ceiling,
    amdahl_rows,
    pipeline_speedup,
    speedup_if,
    stage_shares,
)

MLPERF = {"answer": 0.68, "retrieve": 0.32}

# Shares and per-stage factors (each 2x, 3x or 4x) whose whole-pipeline speed-up is the
# write-up's 2.12x: 1 / (0.04/2 + 0.02/4 + 0.12/3 + 0.02/3 + 0.12/2 + 0.68/2) = 2.1201.
EVERY_STAGE_SHARES = {
    "decompose": 0.04,
    "embed": 0.02,
    "retrieve": 0.12,
    "rerank": 0.02,
    "grade": 0.12,
    "answer": 0.68,
}
EVERY_STAGE_FACTORS = {
    "decompose": 2.0,
    "embed": 4.0,
    "retrieve": 3.0,
    "rerank": 3.0,
    "grade": 2.0,
    "answer": 2.0,
}


def test_mlperf_headline_three_x_is_one_point_eight_three() -> None:
    assert speedup_if(MLPERF, "answer", 3) == pytest.approx(1 / (0.32 + 0.68 / 3))
    assert round(speedup_if(MLPERF, "answer", 3), 2) == 1.83


def test_mlperf_ceiling_is_about_three_point_one() -> None:
    assert amdahl_ceiling(MLPERF, "answer") == pytest.approx(3.125)
    assert round(amdahl_ceiling(MLPERF, "answer"), 1) == 3.1


def test_modest_gains_on_every_stage_give_two_point_one_two() -> None:
    assert sum(EVERY_STAGE_SHARES.values()) == pytest.approx(1.0)
    assert all(2 <= f <= 4 for f in EVERY_STAGE_FACTORS.values())
    x = pipeline_speedup(EVERY_STAGE_SHARES, EVERY_STAGE_FACTORS)
    assert round(x, 2) == 2.12
    # ... beating the 3x answer stage alone, from the same shares.
    assert x > speedup_if(EVERY_STAGE_SHARES, "answer", 3)


def test_amdahl_edges() -> None:
    shares = {"answer": 1.0}
    assert math.isinf(amdahl_ceiling(shares, "answer"))
    assert speedup_if(shares, "answer", 4) == pytest.approx(4)
    assert speedup_if(MLPERF, "embed", 10) == 1.0  # a stage with no time
    assert pipeline_speedup(MLPERF, {}) == pytest.approx(1.0)
    assert pipeline_speedup(MLPERF, {"answer": 3}) == pytest.approx(speedup_if(MLPERF, "answer", 3))
    with pytest.raises(ValueError, match="unknown stage"):
        speedup_if(MLPERF, "sufficiency", 2)
    with pytest.raises(ValueError, match="> 0"):
        speedup_if(MLPERF, "answer", 0)
    rows = amdahl_rows(MLPERF)
    assert [r.stage for r in rows] == list(STAGES)
    answer = rows[-1]
    assert answer.speedups[3.0] == pytest.approx(1.829, abs=1e-3)


def _result() -> PipelineResult:
    tasks = [
        TaskRecord(index=0, latency_s=2.0, rounds=1, stage_s={"answer": 1.36, "retrieve": 0.64}),
        TaskRecord(index=1, latency_s=4.0, rounds=2, stage_s={"answer": 1.36, "retrieve": 0.64}),
    ]
    return PipelineResult.from_tasks(
        track="sim", tasks=tasks, wall_s=4.0, index_build_docs_per_s=10
    )


def test_result_totals_shares_and_percentiles() -> None:
    r = _result()
    assert r.answering_tasks_per_s == pytest.approx(0.5)
    assert r.stage_totals_s["answer"] == pytest.approx(2.72)
    assert r.stage_shares()["answer"] == pytest.approx(0.68)
    assert sum(r.stage_shares().values()) == pytest.approx(1.0)
    assert r.speedup_if("answer", 3) == pytest.approx(1.829, abs=1e-3)
    assert r.ceiling("answer") == pytest.approx(3.125)
    assert r.latency_s.p50 == pytest.approx(3.0)
    assert r.latency_s.p90 == pytest.approx(3.8)
    assert stage_shares({}) == dict.fromkeys(STAGES, 0.0)


def test_result_round_trips_and_bad_files_are_one_line(tmp_path: Path) -> None:
    r = _result()
    path = tmp_path / "pipeline.json"
    r.write(path)
    assert json.loads(path.read_text())["schema"] == "servegym.pipeline/1"
    assert PipelineResult.load(path) == r
    bad = tmp_path / "bad.json"
    for text, match in [
        ("{", "not JSON"),
        ('{"schema": "servegym.pipeline/1"}', "not a pipeline result"),
        (path.read_text().replace('"answer"', '"sufficiency"', 1), "not a pipeline result"),
    ]:
        bad.write_text(text)
        with pytest.raises(UserError, match=match) as e:
            PipelineResult.load(bad)
        assert str(bad) in e.value.message and "\n" not in e.value.message
    with pytest.raises(UserError, match="cannot read"):
        PipelineResult.load(tmp_path / "missing.json")
