"""The leaderboard and its HTML report: aggregation math on hand-built frames, the four
formats and the report over real sim trials (run once per session), latencies.json, bad
input, and a headless-Chromium screenshot of the report."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from servegym.cli import app
from servegym.reporting.leaderboard import (
    TRIAL_COLUMNS,
    FoundTrial,
    best_so_far,
    build_leaderboard,
    default_task,
    find_trials,
    format_csv,
    format_json,
    format_markdown,
    ranks,
    trial_row,
    trials_frame,
)
from servegym.reporting.report import render_report
from servegym.run_folder import TRIAL_FILE
from servegym.runner.results import (
    LATENCIES_FILE,
    LATENCY_CAP,
    TrialResult,
    capped_sorted,
    read_latencies,
    read_trial,
)
from servegym.runner.trial import run_trial
from servegym.scoring.metrics import percentiles

TASKS = Path(__file__).parent / "data" / "tasks"
AGENTS = ("default", "random")
SEEDS = {"tiny-throughput": (0, 1, 2), "tiny-latency": (0, 1)}

runner = CliRunner()


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real sim trials: two tasks x default, random x 2-3 seeds (about a second each)."""
    out = tmp_path_factory.mktemp("leaderboard-runs")
    for task, seeds in SEEDS.items():
        for agent in AGENTS:
            for seed in seeds:
                run_trial(TASKS / task, agent, seed, out)
    return out


@pytest.fixture(scope="session")
def report(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    html = tmp_path_factory.mktemp("leaderboard-report") / "report.html"
    result = runner.invoke(
        app, ["leaderboard", str(run_dir), "--format", "csv", "--html", str(html)]
    )
    assert result.exit_code == 0, result.output
    return html


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A trials frame from a few fields a row (the rest defaulted as a scored sim trial)."""
    base = {c: math.nan for c in TRIAL_COLUMNS}
    base.update(
        track="sim", outcome="scored", objective="x", experiments=1, budget_unit="sim_gpu_seconds",
        budget_used=3600.0, budget_limit=7200.0, gpu_hours=1.0, wall_hours=0.001, folder=".",
    )  # fmt: skip
    full = []
    for r in rows:
        row = dict(base)
        row.update(r)
        if "score" not in r and row["outcome"] == "scored":
            row["score"] = row["leaderboard_score"]
        full.append(row)
    return pd.DataFrame(full, columns=list(TRIAL_COLUMNS))


# --------------------------------------------------------------------------- aggregation


def test_geomean_per_task_over_seeds_then_over_tasks_and_median() -> None:
    df = frame(
        [
            {"agent": "a", "task": "t1", "seed": 0, "leaderboard_score": 2.0},
            {"agent": "a", "task": "t1", "seed": 1, "leaderboard_score": 8.0},
            {"agent": "a", "task": "t2", "seed": 0, "leaderboard_score": 1.0},
            {"agent": "a", "task": "t2", "seed": 1, "leaderboard_score": 1.0},
            {"agent": "a", "task": "t3", "seed": 0, "leaderboard_score": 0.5},
            {"agent": "a", "task": "t3", "seed": 1, "leaderboard_score": 0.5},
        ]
    )
    board = build_leaderboard(df)
    row = board.agents.iloc[0]
    # per task: 4, 1, 0.5; over tasks: (4 * 1 * 0.5) ** (1/3) = 2 ** (1/3)
    assert row["geomean"] == pytest.approx(2.0 ** (1 / 3))
    assert row["median_task"] == pytest.approx(1.0)
    pt = board.per_task.set_index("task")
    assert pt.loc["t1", "geomean"] == pytest.approx(4.0)
    assert pt.loc["t1", "seeds"] == 2
    # the bootstrap over seeds: task t1 draws 2, 4 or 8; the others never vary
    lo, hi = row["ci_low"], row["ci_high"]
    assert (2.0 * 0.5) ** (1 / 3) - 1e-9 <= lo <= row["geomean"] <= hi
    assert hi <= (8.0 * 0.5) ** (1 / 3) + 1e-9
    assert pt.loc["t2", "ci_low"] == pytest.approx(1.0)
    assert pt.loc["t2", "ci_high"] == pytest.approx(1.0)
    # reproducible: the same frame gives the same interval
    again = build_leaderboard(df).agents.iloc[0]
    assert (again["ci_low"], again["ci_high"]) == (lo, hi)


def test_non_scored_trial_counts_one() -> None:
    failed = TrialResult(task="t", agent="a", seed=0, outcome="launch_failed")
    row = trial_row(FoundTrial(Path("."), failed))
    assert row["leaderboard_score"] == 1.0
    assert math.isnan(row["score"])
    df = frame(
        [
            {"agent": "a", "task": "t", "seed": 0, "leaderboard_score": 4.0},
            {**row, "folder": "."},
        ]
    )
    board = build_leaderboard(df)
    assert board.agents.iloc[0]["geomean"] == pytest.approx(2.0)  # sqrt(4 * 1)
    assert board.agents.iloc[0]["share_launch_failed"] == pytest.approx(0.5)


def test_outcome_shares_cost_and_best_vs_shipped() -> None:
    df = frame(
        [
            {"agent": "a", "task": "t", "seed": 0, "leaderboard_score": 2.0, "best_seen": 4.0,
             "shipped_best": 0.0, "agent_tokens": 1000.0, "agent_dollars": 0.5},
            {"agent": "a", "task": "t", "seed": 1, "leaderboard_score": 2.0, "best_seen": 2.0,
             "shipped_best": 1.0, "agent_tokens": 3000.0, "agent_dollars": 1.5},
            {"agent": "a", "task": "t", "seed": 2, "outcome": "crashed", "leaderboard_score": 1.0},
            {"agent": "a", "task": "t", "seed": 3, "outcome": "no_submission",
             "leaderboard_score": 1.0},
        ]
    )  # fmt: skip
    row = build_leaderboard(df).agents.iloc[0]
    assert row["share_scored"] == 0.5
    assert row["share_crashed"] == 0.25
    assert row["share_no_submission"] == 0.25
    assert row["share_accuracy_failed"] == 0.0
    assert row["shipped_best_share"] == 0.5
    assert row["best_vs_shipped"] == pytest.approx(math.sqrt(2.0))  # sqrt(4/2 * 2/2)
    assert row["tokens_per_run"] == 2000.0
    assert row["dollars_per_run"] == 1.0
    assert row["gpu_hours_per_run"] == 1.0
    assert row["runs"] == 4


def test_ranks_count_agents_clearly_better_and_mark_ties() -> None:
    assert ranks([3.0, 2.0, 1.0], [2.5, 1.5, 0.9], [3.5, 2.6, 1.1]) == [1, 1, 3]
    assert ranks([3.0, 2.0], [math.nan, math.nan], [math.nan, math.nan]) == [1, 2]
    rows = []
    for agent, scores in {"a": [3.0, 3.3], "b": [2.9, 3.2], "c": [1.0, 1.05]}.items():
        for seed, s in enumerate(scores):
            rows.append({"agent": agent, "task": "t", "seed": seed, "leaderboard_score": s})
    board = build_leaderboard(frame(rows)).agents.set_index("agent")
    assert board.loc["a", "rank"] == board.loc["b", "rank"] == 1
    assert board.loc["a", "tied"] and board.loc["b", "tied"]
    assert board.loc["c", "rank"] == 3 and not board.loc["c", "tied"]
    assert board.loc["a", "tied_with"] == "b"
    assert board.loc["c", "tied_with"] == ""


def test_agents_are_compared_on_common_tasks_and_missing_ones_flagged() -> None:
    df = frame(
        [
            {"agent": "a", "task": "t1", "seed": 0, "leaderboard_score": 2.0},
            {"agent": "a", "task": "t2", "seed": 0, "leaderboard_score": 8.0},
            {"agent": "b", "task": "t1", "seed": 0, "leaderboard_score": 3.0},
        ]
    )
    board = build_leaderboard(df)
    assert board.common_tasks == ["t1"]
    rows = board.agents.set_index("agent")
    assert rows.loc["a", "geomean"] == pytest.approx(2.0)  # t2 is not compared
    assert rows.loc["b", "missing"] == "t2"
    assert any("every agent has" in n for n in board.notes)
    assert any("one seed" in n for n in board.notes)
    assert "t2" in format_markdown(board)
    disjoint = frame(
        [
            {"agent": "a", "task": "t1", "seed": 0, "leaderboard_score": 2.0},
            {"agent": "b", "task": "t2", "seed": 0, "leaderboard_score": 3.0},
        ]
    )
    board = build_leaderboard(disjoint)
    assert board.scored_on == "own"
    assert any("no task is common" in n for n in board.notes)


def test_best_so_far_is_a_running_max_from_one() -> None:
    exps = [
        {"ok": False, "improvement": None, "budget": {"sim_gpu_seconds_used": 30.0}},
        {"ok": True, "improvement": 0.8, "budget": {"sim_gpu_seconds_used": 50.0}},
        {"ok": True, "improvement": 1.5, "budget": {"sim_gpu_seconds_used": 80.0}},
        {"ok": True, "improvement": 1.2, "budget": {"sim_gpu_seconds_used": 100.0}},
    ]
    pts = best_so_far(exps, unit="sim_gpu_seconds", limit=100.0)
    assert pts == [(0.0, 1.0), (0.3, 1.0), (0.5, 0.8), (0.8, 1.5), (1.0, 1.5)]
    wall = [{"ok": True, "improvement": 2.0, "budget": {"wall_seconds_used": 5.0}}]
    assert best_so_far(wall, unit="wall_seconds", limit=None) == [(0.0, 1.0), (1.0, 2.0)]


def test_capped_sorted_keeps_the_extremes_and_is_deterministic() -> None:
    rng = np.random.default_rng(1)
    values = list(rng.lognormal(size=5000))
    kept = capped_sorted(values)
    assert len(kept) == LATENCY_CAP
    assert kept == sorted(kept)
    assert kept[0] == pytest.approx(min(values), abs=1e-4)
    assert kept[-1] == pytest.approx(max(values), abs=1e-4)
    assert capped_sorted(values) == kept
    assert np.median(kept) == pytest.approx(np.median(values), rel=0.01)
    assert capped_sorted([3.0, 1.0, 2.0]) == [1.0, 2.0, 3.0]


# --------------------------------------------------------------------------- real trials


def test_trials_write_latencies_matching_their_metrics(run_dir: Path) -> None:
    folder = run_dir / "tiny-throughput__random__s0"
    trial = read_trial(folder / TRIAL_FILE)
    lat = read_latencies(folder)
    assert lat is not None and lat.baseline is not None and lat.submission is not None
    assert (folder / LATENCIES_FILE).stat().st_mtime <= (folder / TRIAL_FILE).stat().st_mtime
    for side, data in (("baseline", lat.baseline), ("submission", lat.submission)):
        result = trial.baseline if side == "baseline" else trial.submission
        assert result is not None and result.metrics is not None
        m = result.metrics
        assert data.requests == m.completed == len(data.e2e_ms)
        assert data.e2e_ms == sorted(data.e2e_ms)
        for name, values in (("e2e_ms", data.e2e_ms), ("ttft_ms", data.ttft_ms),
                             ("tpot_ms", data.tpot_ms)):  # fmt: skip
            want = getattr(m, name)
            got = percentiles(values)
            assert got.p50 == pytest.approx(want.p50, abs=1e-3), name
            assert got.p99 == pytest.approx(want.p99, abs=1e-3), name


def test_frame_has_every_trial(run_dir: Path) -> None:
    df = trials_frame(find_trials([run_dir]))
    assert len(df) == 2 * sum(len(s) for s in SEEDS.values())
    assert set(df["agent"]) == set(AGENTS)
    assert (df["budget_unit"] == "sim_gpu_seconds").all()
    assert (df["gpu_hours"] == df["budget_used"] / 3600).all()
    assert default_task(df) == "tiny-throughput"  # both tasks have both agents; more trials


def test_table_format(run_dir: Path) -> None:
    result = runner.invoke(app, ["leaderboard", str(run_dir)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "geomean" in out and "random" in out and "default" in out
    assert "outcomes" in out and "process and cost" in out


def test_markdown_format(run_dir: Path) -> None:
    result = runner.invoke(app, ["leaderboard", str(run_dir), "--format", "markdown"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + len(AGENTS)
    assert "geomean [95% CI]" in rows[0]
    assert set(rows[1].replace("|", "").split()) <= {"---", "---:"}
    assert "| random |" in rows[2]  # the random search beats the baseline on both tasks


def test_csv_format(run_dir: Path) -> None:
    result = runner.invoke(app, ["leaderboard", str(run_dir), "--format", "csv"])
    assert result.exit_code == 0, result.output
    df = pd.read_csv(io.StringIO(result.stdout))
    assert list(df["agent"]) == ["random", "default"]
    assert {"rank", "geomean", "ci_low", "ci_high", "share_scored", "gpu_hours_per_run"} <= set(
        df.columns
    )
    assert (df["ci_low"] <= df["geomean"]).all() and (df["geomean"] <= df["ci_high"]).all()


def test_json_format(run_dir: Path) -> None:
    result = runner.invoke(app, ["leaderboard", str(run_dir), "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "servegym.leaderboard/1"
    assert doc["common_tasks"] == sorted(SEEDS)
    assert [a["agent"] for a in doc["agents"]] == ["random", "default"]
    assert doc["agents"][0]["rank"] == 1 and doc["agents"][1]["rank"] == 2
    assert len(doc["per_task"]) == len(AGENTS) * len(SEEDS)
    assert doc["agents"][1]["share_scored"] == 1.0
    assert doc["agents"][1]["tokens_per_run"] is None  # search baselines spend no tokens
    # the same trials give the same table, byte for byte
    again = runner.invoke(app, ["leaderboard", str(run_dir), "--format", "json"])
    assert again.stdout == result.stdout
    board = build_leaderboard(trials_frame(find_trials([run_dir])))
    assert json.loads(format_json(board)) == doc
    assert format_csv(board).splitlines()[0].startswith("rank,tied,agent")


def test_html_report_is_self_contained(report: Path) -> None:
    text = report.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert text.count("<svg") >= 5  # per task, outcomes, best so far, CDFs, throughput
    assert "<table" in text and "random" in text and "default" in text
    assert "Latency distributions" in text and "Best-so-far" in text
    # nothing to load: no scripts, stylesheets, images or fonts from anywhere
    assert "<script" not in text and "<link" not in text and "@import" not in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", text)
    assert "<img" not in text


def test_report_for_a_chosen_task(run_dir: Path) -> None:
    df = trials_frame(find_trials([run_dir]))
    text = render_report(df, build_leaderboard(df), "tiny-latency")
    assert "Task tiny-latency" in text
    assert "tpot p90" in text


# --------------------------------------------------------------------------- bad input


def _one_error_line(result: Any) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:")
    assert "Traceback" not in result.output
    return str(lines[0])


def test_empty_run_dir_exits_2(tmp_path: Path) -> None:
    line = _one_error_line(runner.invoke(app, ["leaderboard", str(tmp_path)]))
    assert "no finished trial" in line


def test_missing_run_dir_exits_2(tmp_path: Path) -> None:
    line = _one_error_line(runner.invoke(app, ["leaderboard", str(tmp_path / "nope")]))
    assert "not a folder" in line


@pytest.mark.parametrize("content", ["{not json", '{"task": "t"}', ""])
def test_unreadable_trial_exits_2(tmp_path: Path, content: str) -> None:
    (tmp_path / "t__a__s0").mkdir()
    (tmp_path / "t__a__s0" / TRIAL_FILE).write_text(content)
    line = _one_error_line(runner.invoke(app, ["leaderboard", str(tmp_path)]))
    assert "trial.json" in line


def test_bad_format_task_and_duplicates_exit_2(run_dir: Path, tmp_path: Path) -> None:
    line = _one_error_line(runner.invoke(app, ["leaderboard", str(run_dir), "--format", "xml"]))
    assert "--format" in line
    args = ["leaderboard", str(run_dir), "--html", str(tmp_path / "r.html"), "--task", "nope"]
    line = _one_error_line(runner.invoke(app, args))
    assert "--task nope" in line
    copy = tmp_path / "copy"
    shutil.copytree(run_dir / "tiny-latency__default__s0", copy / "tiny-latency__default__s0")
    line = _one_error_line(runner.invoke(app, ["leaderboard", str(run_dir), str(copy)]))
    assert "also in" in line


# --------------------------------------------------------------------------- screenshot


@pytest.mark.slow
def test_report_renders_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    from matplotlib.image import imread

    png = tmp_path / "report.png"
    subprocess.run(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
         "--window-size=1400,2400", "--hide-scrollbars", report.resolve().as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert png.is_file()
    img = imread(png)
    assert img.shape[:2] == (2400, 1400)
    rgb = img[..., :3]
    if rgb.dtype != np.float32:
        rgb = rgb.astype(np.float32) / 255.0
    non_white = (rgb < 0.94).any(axis=2)
    assert non_white.mean() > 0.03, "the page looks blank"
    # the plots: below the tables, many distinct colours (agents, outcomes, lines)
    plots = (rgb[700:2400] * 255).round().astype(np.int32)
    colours = {tuple(c) for c in plots.reshape(-1, 3)[::7]}
    assert len(colours) > 20
    # the agents' colours are drawn: blue (random) and red (default) pixels
    blue = (plots[..., 2] > 150) & (plots[..., 0] < 80)
    red = (plots[..., 0] > 180) & (plots[..., 1] < 80) & (plots[..., 2] < 80)
    assert blue.sum() > 200 and red.sum() > 200
