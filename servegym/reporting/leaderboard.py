"""The leaderboard: every finished trial of one or more run folders, aggregated per agent.

:func:`scan_trials` reads ``RUN_DIR/<task>__<agent>__s<seed>/trial.json`` (a RUN_DIR may also
be one trial folder), leaving out, and counting in the notes, trials not finished yet and
``trial.json`` files it cannot read; :func:`trials_frame` makes a pandas DataFrame of them,
one row a trial; :func:`build_leaderboard` aggregates it per agent and per (agent, task). Everything
after reading the files is a pure function of the DataFrame. ``docs/scoring.md``
("Leaderboard") is the reference for what each number means; in short:

- a trial counts its ``leaderboard_score`` (the score when ``scored``, else 1.0);
- per (agent, task): the geometric mean over seeds; per agent: the geometric mean of those
  over the tasks every agent in the table has (the *common* tasks; an agent's other tasks
  are listed, not scored), and the median over tasks;
- the 95% interval is a percentile bootstrap that resamples seeds within each task, with a
  fixed numpy seed per agent (:data:`BOOTSTRAP_SEED`), so a table is reproducible;
- rank = 1 + the number of agents whose interval lies wholly above this agent's; agents
  sharing a rank are tied (marked ``=``), and ``tied_with`` lists every agent whose interval
  overlaps;
- outcome shares, best-seen vs shipped, experiments, agent cost and GPU hours are over all of
  an agent's trials.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from servegym.errors import UserError
from servegym.paths import quoted
from servegym.run_folder import TRIAL_FILE
from servegym.runner.results import (
    EXPERIMENTS_FILE,
    OUTCOMES,
    TrialResult,
    read_latencies,
    read_trial,
)
from servegym.tasks.spec import TRACK_TRAITS

BOOTSTRAP_SEED = 20_240_601
"""The numpy seed of every leaderboard bootstrap (mixed with the agent's and task's names)."""
BOOTSTRAP_SAMPLES = 2000
LEVEL = 0.95
FORMATS: tuple[str, ...] = ("table", "markdown", "csv", "json")

OUTCOME_LABELS: dict[str, str] = {
    "scored": "scored",
    "accuracy_failed": "acc fail",
    "integrity_flagged": "integrity",
    "launch_failed": "launch fail",
    "crashed": "crashed",
    "no_submission": "no sub",
    "provider_unavailable": "provider down",
    "harness_error": "harness err",
}


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class FoundTrial:
    folder: Path
    result: TrialResult


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ())) or "(top level)"
    return f"{loc}: {err.get('msg', 'invalid')}"


TRIAL_DIR = re.compile(r"^[^.].*__.+__s\d+$")
"""A trial folder's name, ``<task>__<agent>__s<seed>`` (a hidden one is a re-run's work)."""


@dataclass
class TrialScan:
    """What :func:`scan_trials` finds: the finished trials, and the trials it leaves out
    (folders without a ``trial.json`` yet; ``trial.json`` files it cannot read), each with
    why."""

    trials: list[FoundTrial] = field(default_factory=list)
    unfinished: list[Path] = field(default_factory=list)
    unreadable: list[tuple[Path, str]] = field(default_factory=list)

    def notes(self) -> list[str]:
        """One line per kind of trial left out: how many, which (the first few), why."""
        notes = []
        if self.unfinished:
            notes.append(
                f"{len(self.unfinished)} unfinished trial(s) left out (no {TRIAL_FILE} yet: "
                f"still running, or cut short; a sweep's resume runs them): "
                f"{_some(p.name for p in self.unfinished)}"
            )
        if self.unreadable:
            notes.append(
                f"{len(self.unreadable)} trial(s) left out whose {TRIAL_FILE} is unreadable "
                "(a re-run of the trial or a sweep's resume replaces it): "
                f"{_some(f'{p.parent.name} ({why})' for p, why in self.unreadable)}"
            )
        return notes


def _some(names: Iterable[str], most: int = 3) -> str:
    items = list(names)
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more


def _read_found(path: Path) -> tuple[TrialResult | None, str]:
    """The trial in ``path``, or None and why it cannot be read (one line)."""
    try:
        return read_trial(path), ""
    except ValidationError as e:
        return None, f"not a valid trial.json: {_first_error(e)}"
    except (OSError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        return None, f"unreadable: {msg}"


def scan_trials(run_dirs: Sequence[Path]) -> TrialScan:
    """Every ``trial.json`` under the run folders (one level down, or the folder itself),
    and the trials left out (unfinished, unreadable).

    Raises :class:`UserError` (one line) for a missing folder, a folder with no readable
    finished trial (saying what it left out), or one trial (task, agent, seed) found twice.
    """
    if not run_dirs:
        raise UserError("give at least one RUN_DIR")
    scan = TrialScan()
    seen: dict[tuple[str, str, int], Path] = {}
    for run_dir in run_dirs:
        try:
            is_dir = run_dir.is_dir()
        except OSError as e:  # a name too long for the file system, ...
            raise UserError(f"RUN_DIR {quoted(str(run_dir))}: {e.strerror or e}") from None
        if not is_dir:
            raise UserError(f"RUN_DIR {run_dir}: not a folder")
        n_unfinished, n_unreadable = len(scan.unfinished), len(scan.unreadable)
        direct = run_dir / TRIAL_FILE
        if direct.is_file():
            paths = [direct]
        else:
            try:
                folders = sorted(p for p in run_dir.iterdir() if TRIAL_DIR.match(p.name))
            except OSError as e:
                raise UserError(f"RUN_DIR {run_dir}: cannot read ({e.strerror or e})") from None
            paths = sorted(
                p for p in run_dir.glob(f"*/{TRIAL_FILE}") if not p.parent.name.startswith(".")
            )
            scan.unfinished += [p for p in folders if p.is_dir() and not (p / TRIAL_FILE).exists()]
        found_here = 0
        for path in paths:
            result, why = _read_found(path)
            if result is None:
                scan.unreadable.append((path, why))
                continue
            key = (result.task, result.agent, result.seed)
            if key in seen:
                raise UserError(
                    f"{path}: trial {result.task}/{result.agent}/seed {result.seed} is also in "
                    f"{seen[key]}; give each trial once"
                )
            seen[key] = path
            scan.trials.append(FoundTrial(folder=path.parent, result=result))
            found_here += 1
        if not found_here:
            left = TrialScan(
                unfinished=scan.unfinished[n_unfinished:],
                unreadable=scan.unreadable[n_unreadable:],
            ).notes()
            raise UserError(
                f"RUN_DIR {run_dir}: no finished trial (no <task>__<agent>__s<seed>/{TRIAL_FILE})"
                + ("; " + "; ".join(left) if left else "")
            )
    return scan


def find_trials(run_dirs: Sequence[Path]) -> list[FoundTrial]:
    """The finished trials of :func:`scan_trials` (those it leaves out are its notes)."""
    return scan_trials(run_dirs).trials


def _gpus(r: TrialResult) -> int:
    traits = TRACK_TRAITS.get(r.track)
    if traits is not None and traits.occupies == "host_cpus":
        return 0
    counts = [s.num_gpus for s in (r.baseline, r.submission) if s is not None and s.num_gpus]
    return max(counts, default=1)


def _metric(r: TrialResult, side: str, name: str) -> float:
    s = r.baseline if side == "baseline" else r.submission
    if s is None or s.metrics is None or not s.metrics.completed:
        return math.nan
    m = s.metrics
    value = {
        "output_throughput": m.output_throughput,
        "e2e_p99": m.e2e_ms.p99,
        "ttft_p99": m.ttft_ms.p99,
    }[name]
    return float(value)


def _nan(v: float | None) -> float:
    return math.nan if v is None else float(v)


def trial_row(found: FoundTrial) -> dict[str, Any]:
    """One trial as a leaderboard row (see :func:`trials_frame`)."""
    r = found.result
    b = r.budget
    fraction = b.used / b.limit if b.limit else math.nan
    if b.unit == "sim_gpu_seconds":
        gpu_hours = b.used / 3600.0
    else:  # real tracks: the trial's wall time on the machine, times its GPUs
        gpu_hours = r.timing.wall_s * _gpus(r) / 3600.0
    cost = r.agent_cost or {}
    tokens = (
        float(cost.get("input_tokens", 0) or 0) + float(cost.get("output_tokens", 0) or 0)
        if cost
        else math.nan
    )
    dollars = cost.get("dollars") if cost else None
    return {
        "task": r.task,
        "agent": r.agent,
        "seed": r.seed,
        "track": r.track,
        "outcome": r.outcome,
        "score": _nan(r.score),
        "leaderboard_score": float(r.leaderboard_score),
        "raw_score": _nan(r.raw_score),
        "objective": r.objective.label if r.objective is not None else "",
        "best_seen": _nan(r.best_seen.improvement if r.best_seen is not None else None),
        "shipped_best": math.nan
        if r.process.shipped_best is None
        else float(r.process.shipped_best),
        "experiments": r.process.experiments,
        "budget_unit": b.unit,
        "budget_used": b.used,
        "budget_limit": _nan(b.limit),
        "budget_fraction": fraction,
        "gpu_hours": gpu_hours,
        "wall_hours": r.timing.wall_s / 3600.0,
        "agent_tokens": tokens,
        "agent_dollars": _nan(dollars if isinstance(dollars, (int, float)) else None),
        "base_throughput": _metric(r, "baseline", "output_throughput"),
        "base_e2e_p99": _metric(r, "baseline", "e2e_p99"),
        "base_ttft_p99": _metric(r, "baseline", "ttft_p99"),
        "sub_throughput": _metric(r, "submission", "output_throughput"),
        "sub_e2e_p99": _metric(r, "submission", "e2e_p99"),
        "sub_ttft_p99": _metric(r, "submission", "ttft_p99"),
        "folder": str(found.folder),
    }


TRIAL_COLUMNS: tuple[str, ...] = (
    "task", "agent", "seed", "track", "outcome", "score", "leaderboard_score", "raw_score",
    "objective", "best_seen", "shipped_best", "experiments", "budget_unit", "budget_used",
    "budget_limit", "budget_fraction", "gpu_hours", "wall_hours", "agent_tokens",
    "agent_dollars", "base_throughput", "base_e2e_p99", "base_ttft_p99", "sub_throughput",
    "sub_e2e_p99", "sub_ttft_p99", "folder",
)  # fmt: skip


def trials_frame(trials: Sequence[FoundTrial]) -> pd.DataFrame:
    """One row per trial: task, agent, seed, track, outcome, score, leaderboard_score,
    raw_score, objective, best_seen (dev improvement), shipped_best (1/0/NaN), experiments,
    budget (unit, used, limit, fraction), gpu_hours, wall_hours, agent_tokens,
    agent_dollars, baseline and submission throughput / E2E p99 / TTFT p99 (the first
    evaluation pair's), folder."""
    rows = [trial_row(t) for t in trials]
    df = pd.DataFrame(rows, columns=list(TRIAL_COLUMNS))
    return df.sort_values(["agent", "task", "seed"], kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------- aggregation


def _rng(*names: str) -> np.random.Generator:
    return np.random.default_rng([BOOTSTRAP_SEED, *(zlib.crc32(n.encode()) for n in names)])


def bootstrap_geomeans(
    logs_by_task: Sequence[np.ndarray], *, samples: int, rng: np.random.Generator
) -> np.ndarray:
    """``samples`` bootstrap replicates of exp(mean over tasks of mean log score over seeds),
    resampling each task's seeds with replacement, independently per task."""
    total = np.zeros(samples, dtype=np.float64)
    for logs in logs_by_task:
        n = logs.size
        idx = rng.integers(0, n, size=(samples, n))
        total += logs[idx].mean(axis=1)
    out: np.ndarray = np.exp(total / max(len(logs_by_task), 1))
    return out


def geomean_interval(
    logs_by_task: Sequence[np.ndarray],
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    rng: np.random.Generator,
    level: float = LEVEL,
) -> tuple[float, float, float]:
    """(point, low, high): the geometric mean over tasks of the per-task geometric means over
    seeds, and its percentile-bootstrap interval; the interval is NaN when no task has two
    seeds (nothing to resample)."""
    if not logs_by_task:
        return math.nan, math.nan, math.nan
    point = float(np.exp(np.mean([float(np.mean(x)) for x in logs_by_task])))
    if all(x.size < 2 for x in logs_by_task):
        return point, math.nan, math.nan
    reps = bootstrap_geomeans(logs_by_task, samples=samples, rng=rng)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(reps, [tail, 100.0 - tail])
    return point, min(float(lo), point), max(float(hi), point)


def ranks(points: Sequence[float], lows: Sequence[float], highs: Sequence[float]) -> list[int]:
    """Rank of each agent: 1 + the number of agents clearly better (whose interval's low end
    is above this one's high end; without intervals, whose point is higher)."""
    out: list[int] = []
    for i in range(len(points)):
        hi_i = highs[i] if not math.isnan(highs[i]) else points[i]
        better = 0
        for j in range(len(points)):
            lo_j = lows[j] if not math.isnan(lows[j]) else points[j]
            if j != i and lo_j > hi_i:
                better += 1
        out.append(1 + better)
    return out


def overlaps(lo_a: float, hi_a: float, lo_b: float, hi_b: float) -> bool:
    return not (lo_a > hi_b or lo_b > hi_a)


@dataclass
class Leaderboard:
    """What :func:`build_leaderboard` finds: ``agents`` (one row an agent, ranked),
    ``per_task`` (one row an (agent, task)), the tasks, the common tasks, and notes."""

    agents: pd.DataFrame
    per_task: pd.DataFrame
    tasks: list[str]
    common_tasks: list[str]
    scored_on: str
    notes: list[str] = field(default_factory=list)


def _logs(df: pd.DataFrame) -> np.ndarray:
    values = np.asarray(df["leaderboard_score"], dtype=np.float64)
    return np.log(np.clip(values, 1e-12, None))


def per_task_table(
    df: pd.DataFrame, *, samples: int = BOOTSTRAP_SAMPLES, level: float = LEVEL
) -> pd.DataFrame:
    """One row per (agent, task): seeds, geomean over seeds and its bootstrap interval,
    outcome counts."""
    rows: list[dict[str, Any]] = []
    for (agent, task), g in df.groupby(["agent", "task"], sort=True):
        point, lo, hi = geomean_interval(
            [_logs(g)], samples=samples, rng=_rng(str(agent), str(task)), level=level
        )
        row: dict[str, Any] = {
            "agent": agent,
            "task": task,
            "seeds": len(g),
            "geomean": point,
            "ci_low": lo,
            "ci_high": hi,
            "scored": int((g["outcome"] == "scored").sum()),
        }
        rows.append(row)
    return pd.DataFrame(
        rows, columns=["agent", "task", "seeds", "geomean", "ci_low", "ci_high", "scored"]
    )


def _mean(series: pd.Series) -> float:
    values = pd.to_numeric(series, errors="coerce").dropna()
    return float(values.mean()) if len(values) else math.nan


def build_leaderboard(
    df: pd.DataFrame,
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    level: float = LEVEL,
    left_out: Sequence[str] = (),
) -> Leaderboard:
    """Aggregate a :func:`trials_frame` per agent (see the module docstring); ``left_out``
    are the notes of the trials the reading left out (:meth:`TrialScan.notes`)."""
    if df.empty:
        raise UserError("no trials to rank")
    tasks = sorted(str(t) for t in df["task"].unique())
    agents = sorted(str(a) for a in df["agent"].unique())
    own = {a: set(df.loc[df["agent"] == a, "task"]) for a in agents}
    common = sorted(set.intersection(*own.values()))
    notes: list[str] = []
    if common:
        scored_on = "common"
        if len(common) < len(tasks):
            notes.append(
                f"geomean and interval are over the {len(common)} task(s) every agent has "
                f"({', '.join(common)}); tasks an agent lacks are listed under 'missing'"
            )
    else:
        scored_on = "own"
        notes.append(
            "no task is common to all agents: each geomean is over the agent's own tasks, "
            "so the ranks compare different task sets"
        )
    per_task = per_task_table(df, samples=samples, level=level)

    rows: list[dict[str, Any]] = []
    for agent in agents:
        g = df[df["agent"] == agent]
        score_tasks = common if common else sorted(own[agent])
        logs = [_logs(g[g["task"] == t]) for t in score_tasks]
        point, lo, hi = geomean_interval(logs, samples=samples, rng=_rng(agent), level=level)
        task_gm = per_task[(per_task["agent"] == agent) & per_task["task"].isin(score_tasks)]
        shipped = pd.to_numeric(g["shipped_best"], errors="coerce").dropna()
        with_best = g[g["best_seen"].notna()]
        gap = (
            float(
                np.exp(
                    np.mean(
                        np.log(np.asarray(with_best["best_seen"], dtype=np.float64))
                        - np.log(np.asarray(with_best["leaderboard_score"], dtype=np.float64))
                    )
                )
            )
            if len(with_best)
            else math.nan
        )
        row: dict[str, Any] = {
            "rank": 0,
            "tied": False,
            "agent": agent,
            "tasks": len(own[agent]),
            "tasks_scored": len(score_tasks),
            "missing": ",".join(t for t in tasks if t not in own[agent]),
            "runs": len(g),
            "seeds_min": int(g.groupby("task").size().min()),
            "geomean": point,
            "ci_low": lo,
            "ci_high": hi,
            "median_task": float(task_gm["geomean"].median()) if len(task_gm) else math.nan,
        }
        for outcome in OUTCOMES:
            row[f"share_{outcome}"] = float((g["outcome"] == outcome).mean())
        row.update(
            {
                "shipped_best_share": float(shipped.mean()) if len(shipped) else math.nan,
                "best_vs_shipped": gap,
                "experiments_per_run": _mean(g["experiments"]),
                "tokens_per_run": _mean(g["agent_tokens"]),
                "dollars_per_run": _mean(g["agent_dollars"]),
                "gpu_hours_per_run": _mean(g["gpu_hours"]),
                "gpu_hours_total": float(g["gpu_hours"].sum()),
                "wall_hours_per_run": _mean(g["wall_hours"]),
                "tracks": ",".join(sorted(set(g["track"]))),
                "tied_with": "",
            }
        )
        rows.append(row)

    board = pd.DataFrame(rows)
    rk = ranks(list(board["geomean"]), list(board["ci_low"]), list(board["ci_high"]))
    board["rank"] = rk
    counts = pd.Series(rk).value_counts()
    board["tied"] = [bool(counts[r] > 1) for r in rk]
    tied_with: list[str] = []
    for i, a in board.iterrows():
        others = [
            str(b["agent"])
            for j, b in board.iterrows()
            if j != i
            and not math.isnan(a["ci_low"])
            and not math.isnan(b["ci_low"])
            and overlaps(a["ci_low"], a["ci_high"], b["ci_low"], b["ci_high"])
        ]
        tied_with.append(",".join(others))
    board["tied_with"] = tied_with
    board = board.sort_values(["rank", "geomean", "agent"], ascending=[True, False, True])
    board = board.reset_index(drop=True)

    if board["ci_low"].isna().all():
        notes.append("every task has one seed per agent: no interval, ties not assessed")
    elif int(board["seeds_min"].min()) < 5:
        notes.append(
            "fewer than 5 seeds on some task: a percentile bootstrap over so few seeds is "
            "too narrow (read the interval as well under 95%)"
        )
    n_harness = int((df["outcome"] == "harness_error").sum())
    if n_harness:
        notes.append(
            f"{n_harness} harness_error trial(s) count 1.0 here; they are the harness's "
            "failures, not the agent's: rerun them"
        )
    notes.extend(left_out)
    return Leaderboard(
        agents=board,
        per_task=per_task,
        tasks=tasks,
        common_tasks=common,
        scored_on=scored_on,
        notes=notes,
    )


def default_task(df: pd.DataFrame) -> str:
    """The task with the most agents (then the most trials, then the first by name)."""
    stats = df.groupby("task").agg(agents=("agent", "nunique"), trials=("seed", "size"))
    stats = stats.reset_index().sort_values(
        ["agents", "trials", "task"], ascending=[False, False, True]
    )
    return str(stats.iloc[0]["task"])


# --------------------------------------------------------------------------- report data


def best_so_far(
    experiments: Sequence[dict[str, Any]],
    *,
    unit: str,
    limit: float | None,
    max_experiments: int | None = None,
) -> list[tuple[float, float]]:
    """(budget fraction, best improvement so far) after each experiment, from (0, 1.0).

    The fraction is the budget used (``unit``: simulated GPU-seconds or wall seconds) over
    ``limit``; without a limit, experiments run over ``max_experiments``, else over the last
    experiment's use. The best is the running maximum of successful experiments'
    improvements, 1.0 before the first.
    """
    key = "wall_seconds_used" if unit == "wall_seconds" else "sim_gpu_seconds_used"
    used = [float((e.get("budget") or {}).get(key, 0.0) or 0.0) for e in experiments]
    runs = [
        float((e.get("budget") or {}).get("experiments_run", i + 1))
        for i, e in enumerate(experiments)
    ]
    if limit:
        xs = [u / limit for u in used]
    elif max_experiments:
        xs = [r / max_experiments for r in runs]
    else:
        top = max(used, default=0.0)
        xs = [u / top if top > 0 else 0.0 for u in used]
    points = [(0.0, 1.0)]
    best: float | None = None
    for x, e in zip(xs, experiments, strict=True):
        imp = e.get("improvement")
        if e.get("ok") and isinstance(imp, (int, float)) and math.isfinite(imp):
            best = float(imp) if best is None else max(best, float(imp))
        points.append((x, best if best is not None else 1.0))
    return points


def read_experiments(folder: Path) -> list[dict[str, Any]]:
    """The lines of a trial's ``experiments.jsonl`` (empty when it has none); a line that
    does not parse (a partial write) is skipped."""
    path = folder / EXPERIMENTS_FILE
    out: list[dict[str, Any]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def curves_frame(df: pd.DataFrame, task: str) -> pd.DataFrame:
    """Best-so-far curves of every trial of ``task``: agent, seed, step, x, y."""
    rows: list[dict[str, Any]] = []
    for _, t in df[df["task"] == task].iterrows():
        exps = read_experiments(Path(t["folder"]))
        limit = t["budget_limit"]
        pts = best_so_far(
            exps,
            unit=str(t["budget_unit"]),
            limit=None if math.isnan(limit) else float(limit),
        )
        for k, (x, y) in enumerate(pts):
            rows.append({"agent": t["agent"], "seed": t["seed"], "step": k, "x": x, "y": y})
    return pd.DataFrame(rows, columns=["agent", "seed", "step", "x", "y"])


def latencies_frame(df: pd.DataFrame, task: str) -> pd.DataFrame:
    """Per-request latencies of ``task``'s trials (``latencies.json``): agent, seed, side
    (baseline | submission), metric (ttft_ms | tpot_ms | e2e_ms), value."""
    rows: list[dict[str, Any]] = []
    for _, t in df[df["task"] == task].iterrows():
        lat = read_latencies(Path(t["folder"]))
        if lat is None:
            continue
        for side, data in (("baseline", lat.baseline), ("submission", lat.submission)):
            if data is None:
                continue
            for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
                for v in getattr(data, metric):
                    rows.append(
                        {
                            "agent": t["agent"],
                            "seed": t["seed"],
                            "side": side,
                            "metric": metric,
                            "value": v,
                        }
                    )
    return pd.DataFrame(rows, columns=["agent", "seed", "side", "metric", "value"])


# --------------------------------------------------------------------------- formats


def _num(v: float, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}f}"


def _sig(v: float) -> str:
    """A positive quantity with about three significant digits."""
    if v is None or math.isnan(v):
        return "-"
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _pct(v: float) -> str:
    return "-" if math.isnan(v) else f"{100 * v:.0f}%"


def score_cell(point: float, lo: float, hi: float) -> str:
    if math.isnan(point):
        return "-"
    if math.isnan(lo):
        return f"{point:.3f}"
    return f"{point:.3f} [{lo:.3f}, {hi:.3f}]"


def display_frame(board: Leaderboard) -> pd.DataFrame:
    """The leaderboard as strings, for the table, markdown and the HTML report."""
    a = board.agents
    n_tasks = len(board.tasks)
    rare = ("harness_error", "provider_unavailable")  # shown only when some run had one
    outcomes = [o for o in OUTCOMES if o not in rare or a[f"share_{o}"].any()]
    rows: list[dict[str, str]] = []
    for _, r in a.iterrows():
        row = {
            "rank": ("=" if r["tied"] else "") + str(int(r["rank"])),
            "agent": str(r["agent"]),
            "tasks": f"{int(r['tasks'])}/{n_tasks}",
            "runs": str(int(r["runs"])),
            f"geomean [{int(LEVEL * 100)}% CI]": score_cell(
                r["geomean"], r["ci_low"], r["ci_high"]
            ),
            "median task": _num(r["median_task"]),
        }
        for o in outcomes:
            row[OUTCOME_LABELS[o]] = _pct(r[f"share_{o}"])
        row.update(
            {
                "shipped best": _pct(r["shipped_best_share"]),
                "best/shipped": _num(r["best_vs_shipped"], 2),
                "exps/run": _num(r["experiments_per_run"], 1),
                "tokens/run": _sig(r["tokens_per_run"]),
                "$/run": _num(r["dollars_per_run"], 2),
                "GPU-h/run": _sig(r["gpu_hours_per_run"]),
                "missing": r["missing"] or "",
            }
        )
        rows.append(row)
    out = pd.DataFrame(rows)
    if not out.empty and (out["missing"] == "").all():
        out = out.drop(columns=["missing"])
    return out


def format_markdown(board: Leaderboard) -> str:
    frame = display_frame(board)
    cols = list(frame.columns)
    right = {c for c in cols if c not in ("agent", "missing")}
    lines = [
        "| " + " | ".join(cols) + " |",
        "| " + " | ".join("---:" if c in right else "---" for c in cols) + " |",
    ]
    for _, r in frame.iterrows():
        lines.append("| " + " | ".join(str(r[c]).replace("|", "\\|") for c in cols) + " |")
    out = "\n".join(lines) + "\n"
    if board.notes:
        out += "\n" + "\n".join(f"- {n}" for n in board.notes) + "\n"
    return out


def format_csv(board: Leaderboard) -> str:
    text: str = board.agents.to_csv(index=False, float_format="%.6g", lineterminator="\n")
    return text


def format_json(board: Leaderboard) -> str:
    def records(frame: pd.DataFrame) -> Any:
        return json.loads(frame.to_json(orient="records", double_precision=10))

    doc = {
        "schema": "servegym.leaderboard/1",
        "level": LEVEL,
        "method": (
            "per task: geometric mean of leaderboard_score over seeds; per agent: geometric "
            "mean over the scored tasks; percentile bootstrap resampling seeds within tasks"
        ),
        "bootstrap_seed": BOOTSTRAP_SEED,
        "bootstrap_samples": BOOTSTRAP_SAMPLES,
        "tasks": board.tasks,
        "common_tasks": board.common_tasks,
        "scored_on": board.scored_on,
        "notes": board.notes,
        "agents": records(board.agents),
        "per_task": records(board.per_task),
    }
    return json.dumps(doc, indent=2) + "\n"
