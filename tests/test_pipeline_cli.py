"""``servegym pipeline analyze``: the shares and Amdahl table of a result file or a trial
folder; bad input is one line naming the file, exit code 2. And the leaderboard report's
pipeline section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servegym.cli import app
from servegym.pipeline.files import PIPELINE_BASELINE_FILE, PIPELINE_FILE
from servegym.pipeline.report import pipeline_section
from servegym.pipeline.result import PipelineResult, TaskRecord
from servegym.run_folder import TRIAL_FILE

runner = CliRunner()


def mlperf_result() -> PipelineResult:
    """Answer generation at share 0.68, as in MLPerf's write-up."""
    task = TaskRecord(
        index=0, latency_s=1.0, rounds=1, stage_s={"answer": 0.68, "retrieve": 0.2, "embed": 0.12}
    )
    return PipelineResult.from_tasks(
        track="sim", task="demo", tasks=[task], wall_s=1.0, index_build_docs_per_s=1000.0
    )


@pytest.fixture
def trial_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "demo__default__s0"
    folder.mkdir()
    mlperf_result().write(folder / PIPELINE_FILE)
    mlperf_result().write(folder / PIPELINE_BASELINE_FILE)
    (folder / TRIAL_FILE).write_text("{}")
    return folder


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_analyze_a_result_file_prints_shares_and_amdahl(trial_folder: Path) -> None:
    r = runner.invoke(app, ["pipeline", "analyze", str(trial_folder / PIPELINE_FILE)])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "68.0%" in out
    answer = next(line for line in _lines(out) if "answer" in line and "x" in line)
    # 2x, 3x, 4x, 10x and the ceiling for the answer stage at share 0.68.
    for cell in ("1.52x", "1.83x", "2.04x", "2.58x", "3.13x"):
        assert cell in answer, answer


@pytest.mark.parametrize("which", ["folder", "trial.json"])
def test_analyze_a_trial_folder_or_its_trial_json(trial_folder: Path, which: str) -> None:
    target = trial_folder if which == "folder" else trial_folder / TRIAL_FILE
    for extra in ([], ["--baseline"]):
        r = runner.invoke(app, ["pipeline", "analyze", str(target), *extra])
        assert r.exit_code == 0, r.output
        assert "1.83x" in r.output
        name = PIPELINE_BASELINE_FILE if extra else PIPELINE_FILE
        assert name.removesuffix(".json") in r.output.replace("\n", "")


def test_analyze_bad_input_is_one_line_exit_two(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": "servegym.pipeline/1", "track": "sim"}))
    empty_folder = tmp_path / "empty"
    empty_folder.mkdir()
    cases = [
        ([str(tmp_path / "missing.json")], "missing.json"),
        ([str(bad)], "bad.json"),
        ([str(wrong)], "wrong.json"),
        ([str(empty_folder)], PIPELINE_FILE),
        ([str(bad), "--baseline"], "--baseline"),
    ]
    for args, named in cases:
        r = runner.invoke(app, ["pipeline", "analyze", *args])
        assert r.exit_code == 2, (args, r.output)
        lines = _lines(r.output)
        assert len(lines) == 1, r.output
        assert lines[0].startswith("error:") and named in lines[0]
        assert "Traceback" not in r.output


def test_report_section_shows_each_pipeline_tasks_amdahl_table(trial_folder: Path) -> None:
    html = pipeline_section([("demo", str(trial_folder)), ("plain", str(trial_folder.parent))])
    assert "<h3>demo (baseline)</h3>" in html
    assert "1.83x" in html and "3.13x" in html
    assert "plain" not in html and "<script" not in html
    assert pipeline_section([("plain", str(trial_folder.parent))]) == ""
