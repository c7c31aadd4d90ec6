"""The leaderboard's HTML report: one self-contained file, no network, no JavaScript.

:func:`render_report` turns a :func:`~servegym.reporting.leaderboard.trials_frame` and its
:class:`~servegym.reporting.leaderboard.Leaderboard` into one HTML page:

1. the leaderboard table, with its notes;
2. per-task scores with their intervals (a table and a dot-and-whisker plot);
3. outcome bars: each agent's share of every outcome;
4. best-so-far improvement (dev workload) against budget spent, one panel per agent, one
   line per seed, on the chosen task;
5. latency CDFs (TTFT, TPOT, E2E; each trial's first evaluation pair, ``latencies.json``,
   pooled over seeds) for the baseline and each agent's submissions on the chosen task;
6. throughput against E2E p99 latency, baseline and submission of every trial of the chosen
   task, a line joining the two runs of a trial;

and, when some trials are of pipeline tasks, each such task's Amdahl table (after the
per-task scores; :mod:`servegym.pipeline.report`).

Plots are matplotlib figures (no pyplot, so no global backend) saved as SVG with text as
text and inlined; the page's styles are inline too, so it opens offline anywhere.
"""

from __future__ import annotations

import html
import io
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from servegym.pipeline.report import pipeline_section
from servegym.reporting.leaderboard import (
    LEVEL,
    Leaderboard,
    curves_frame,
    display_frame,
    latencies_frame,
    score_cell,
)
from servegym.run_folder import write_atomic
from servegym.runner.results import OUTCOMES

OUTCOME_COLOURS: dict[str, str] = {
    "scored": "#2e7d32",
    "accuracy_failed": "#ef6c00",
    "integrity_flagged": "#c62828",
    "launch_failed": "#6a1b9a",
    "crashed": "#5d4037",
    "no_submission": "#9e9e9e",
    "provider_unavailable": "#607d8b",
    "harness_error": "#212121",
}
PALETTE: tuple[str, ...] = (
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
    "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f",
)  # fmt: skip
BASELINE_COLOUR = "#000000"
_SVG_START = re.compile(r"<svg\b")

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px;
       color: #1a1a1a; max-width: 1340px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 14px; margin-top: 18px; }
p.meta, p.note, li.note { color: #555; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #d0d0d0; padding: 4px 8px; }
th { background: #f0f3f7; text-align: center; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.agent { font-weight: 600; white-space: nowrap; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px;
          border-radius: 2px; vertical-align: middle; }
figure { margin: 12px 0; }
figcaption { color: #555; font-size: 12px; }
svg { max-width: 100%; height: auto; }
"""


def agent_colours(agents: Sequence[str]) -> dict[str, str]:
    """A fixed colour per agent, in the given order."""
    return {a: PALETTE[i % len(PALETTE)] for i, a in enumerate(agents)}


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def svg(fig: Any) -> str:
    """``fig`` as an inline ``<svg>`` element (text as text, no XML prologue, no metadata)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "servegym"}):
        fig.savefig(
            buf,
            format="svg",
            metadata={"Creator": None, "Date": None, "Format": None, "Type": None},
        )
    text = buf.getvalue()
    m = _SVG_START.search(text)
    return text[m.start() :] if m else text


# --------------------------------------------------------------------------- plots


def _plain_ticks(axis: Any) -> None:
    """Ticks of a log axis at 1, 2, 5 x 10^k, labelled as plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def plot_per_task(board: Leaderboard, colours: dict[str, str]) -> str:
    pt = board.per_task
    tasks = board.tasks
    agents = list(board.agents["agent"])
    fig = _figure(9.0, max(2.2, 0.55 * len(tasks) * max(1, len(agents)) ** 0.5 + 1.2))
    ax = fig.add_subplot()
    n = len(agents)
    for k, agent in enumerate(agents):
        rows = pt[pt["agent"] == agent]
        ys, xs, lo, hi = [], [], [], []
        for _, r in rows.iterrows():
            ys.append(tasks.index(r["task"]) + (k - (n - 1) / 2) * 0.7 / max(n, 1))
            xs.append(r["geomean"])
            lo.append(r["geomean"] - (r["ci_low"] if not math.isnan(r["ci_low"]) else r["geomean"]))
            hi.append(
                (r["ci_high"] if not math.isnan(r["ci_high"]) else r["geomean"]) - r["geomean"]
            )
        ax.errorbar(
            xs, ys, xerr=[lo, hi], fmt="o", color=colours[agent], label=agent, capsize=3, ms=5
        )
    ax.axvline(1.0, color="#888", lw=1, ls="--")
    ax.set_xscale("log")
    _plain_ticks(ax.xaxis)
    ax.set_yticks(range(len(tasks)), tasks)
    ax.invert_yaxis()
    ax.set_xlabel(f"improvement over baseline (geomean over seeds, {int(LEVEL * 100)}% interval)")
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.margins(x=0.08)
    # beside the axes, never over a point
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return svg(fig)


def plot_outcomes(board: Leaderboard) -> str:
    a = board.agents
    agents = list(a["agent"])
    fig = _figure(9.0, 0.45 * len(agents) + 1.3)
    ax = fig.add_subplot()
    left = np.zeros(len(agents))
    for o in OUTCOMES:
        share = np.asarray(a[f"share_{o}"], dtype=np.float64)
        if not share.any():
            continue
        ax.barh(agents, share, left=left, color=OUTCOME_COLOURS[o], label=o, height=0.6)
        left += share
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of trials")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=8, frameon=False)
    return svg(fig)


def plot_best_so_far(
    df: pd.DataFrame, task: str, agents: Sequence[str], colours: dict[str, str]
) -> str:
    curves = curves_frame(df, task)
    shown = [a for a in agents if a in set(curves["agent"])]
    if not shown:
        return "<p class='note'>No experiments on this task.</p>"
    ncols = min(3, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig = _figure(4.2 * ncols, 3.0 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    finals = df[df["task"] == task]
    for i, agent in enumerate(shown):
        ax = axes[i // ncols][i % ncols]
        c = curves[curves["agent"] == agent]
        for seed, g in c.groupby("seed"):
            g = g.sort_values("step")
            ax.step(g["x"], g["y"], where="post", color=colours[agent], alpha=0.8, lw=1.4)
            fin = finals[(finals["agent"] == agent) & (finals["seed"] == seed)]
            if len(fin) and len(g):
                ax.plot(
                    [float(g["x"].iloc[-1])],
                    [float(fin["leaderboard_score"].iloc[0])],
                    marker="D",
                    color=colours[agent],
                    ms=4,
                    ls="none",
                )
        ax.axhline(1.0, color="#888", lw=1, ls="--")
        ax.axvline(1.0, color="#bbb", lw=0.8, ls=":")
        ax.set_title(agent, fontsize=10)
        ax.set_xlabel("budget spent (fraction)")
        if i % ncols == 0:
            ax.set_ylabel("best dev improvement so far")
        ax.grid(alpha=0.3)
    for j in range(len(shown), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    return svg(fig)


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(values)
    return v, np.arange(1, v.size + 1) / v.size


def plot_latency_cdfs(
    df: pd.DataFrame, task: str, agents: Sequence[str], colours: dict[str, str]
) -> str:
    lat = latencies_frame(df, task)
    if lat.empty:
        return "<p class='note'>No per-request latencies for this task (latencies.json).</p>"
    fig = _figure(12.0, 3.4)
    axes = fig.subplots(1, 3, squeeze=False)[0]
    names = {"ttft_ms": "TTFT (ms)", "tpot_ms": "TPOT (ms)", "e2e_ms": "E2E latency (ms)"}
    for ax, (metric, label) in zip(axes, names.items(), strict=True):
        m = lat[lat["metric"] == metric]
        base = np.asarray(m.loc[m["side"] == "baseline", "value"], dtype=np.float64)
        if base.size:
            x, y = _ecdf(base)
            ax.step(x, y, where="post", color=BASELINE_COLOUR, ls="--", lw=1.5, label="baseline")
        for agent in agents:
            sub = m[(m["side"] == "submission") & (m["agent"] == agent)]
            vals = np.asarray(sub["value"], dtype=np.float64)
            if vals.size:
                x, y = _ecdf(vals)
                ax.step(x, y, where="post", color=colours[agent], lw=1.5, label=agent)
        positive = m["value"][m["value"] > 0]
        if len(positive) and float(positive.max()) / float(positive.min()) > 20:
            ax.set_xscale("log")
            _plain_ticks(ax.xaxis)
        ax.set_xlabel(label)
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    axes[0].legend(fontsize=8, loc="lower right")
    return svg(fig)


def plot_throughput_latency(
    df: pd.DataFrame, task: str, agents: Sequence[str], colours: dict[str, str]
) -> str:
    t = df[df["task"] == task]
    fig = _figure(7.5, 4.6)
    ax = fig.add_subplot()
    drew = False
    first_base = True
    for agent in agents:
        rows = t[t["agent"] == agent]
        labelled = False
        for _, r in rows.iterrows():
            bx, by = r["base_e2e_p99"], r["base_throughput"]
            sx, sy = r["sub_e2e_p99"], r["sub_throughput"]
            if not (math.isnan(bx) or math.isnan(by)):
                ax.plot(
                    [bx], [by], "o", color=BASELINE_COLOUR, mfc="white", ms=6,
                    label="baseline" if first_base else None,
                )  # fmt: skip
                first_base = False
                drew = True
            if not (math.isnan(sx) or math.isnan(sy)):
                ax.plot(
                    [sx], [sy], "o", color=colours[agent], ms=6,
                    label=None if labelled else agent,
                )  # fmt: skip
                labelled = True
                drew = True
                if not (math.isnan(bx) or math.isnan(by)):
                    ax.plot([bx, sx], [by, sy], color=colours[agent], lw=0.8, alpha=0.5)
    if not drew:
        return "<p class='note'>No measured runs on this task.</p>"
    ax.set_xlabel("E2E latency p99 (ms)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return svg(fig)


# --------------------------------------------------------------------------- page


def _table(frame: pd.DataFrame, colours: dict[str, str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body: list[str] = []
    for _, r in frame.iterrows():
        cells: list[str] = []
        for c in frame.columns:
            v = html.escape(str(r[c]))
            if c == "agent":
                sw = ""
                if colours and str(r[c]) in colours:
                    sw = f"<span class='swatch' style='background:{colours[str(r[c])]}'></span>"
                cells.append(f"<td class='agent'>{sw}{v}</td>")
            elif c in ("task", "missing"):
                cells.append(f"<td>{v}</td>")
            else:
                cells.append(f"<td class='num'>{v}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def per_task_display(board: Leaderboard) -> pd.DataFrame:
    """Tasks as rows, agents as columns: ``geomean [low, high] (n seeds)``."""
    agents = list(board.agents["agent"])
    rows: list[dict[str, str]] = []
    pt = board.per_task
    for task in board.tasks:
        row = {"task": task}
        for agent in agents:
            m = pt[(pt["task"] == task) & (pt["agent"] == agent)]
            if m.empty:
                row[agent] = "-"
            else:
                r = m.iloc[0]
                row[agent] = (
                    f"{score_cell(r['geomean'], r['ci_low'], r['ci_high'])} (n={r['seeds']})"
                )
        rows.append(row)
    return pd.DataFrame(rows, columns=["task", *agents])


def _figure_block(body: str, caption: str) -> str:
    return f"<figure>{body}<figcaption>{html.escape(caption)}</figcaption></figure>"


def render_report(
    df: pd.DataFrame,
    board: Leaderboard,
    task: str,
    *,
    run_dirs: Sequence[Path] = (),
) -> str:
    """The report as one HTML string (see the module docstring)."""
    agents = list(board.agents["agent"])
    colours = agent_colours(agents)
    esc = html.escape
    task_agents = [a for a in agents if a in set(df.loc[df["task"] == task, "agent"])]
    objective = next((o for o in df.loc[df["task"] == task, "objective"] if o), "")
    notes = "".join(f"<li class='note'>{esc(n)}</li>" for n in board.notes)
    dirs = ", ".join(esc(str(d)) for d in run_dirs)
    parts = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        "<title>ServeGym leaderboard</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>ServeGym leaderboard</h1>",
        f"<p class='meta'>{len(df)} trials, {len(agents)} agents, {len(board.tasks)} tasks"
        + (f" from {dirs}" if dirs else "")
        + "</p>",
        "<h2 id='leaderboard'>Leaderboard</h2>",
        _table(display_frame(board), colours),
        f"<ul>{notes}</ul>" if notes else "",
        "<p class='note'>geomean: geometric mean over tasks of each task's geometric mean of "
        "leaderboard_score over seeds (a trial that is not scored counts 1.0); interval: "
        "percentile bootstrap over seeds within tasks; rank: 1 + agents whose interval lies "
        "wholly above (= marks a shared rank); best/shipped: best dev improvement seen over "
        "the final score (dev and scoring workloads differ: see docs/scoring.md).</p>",
        "<h2 id='per-task'>Per-task scores</h2>",
        _table(per_task_display(board), colours),
        _figure_block(
            plot_per_task(board, colours),
            "Each agent's geometric mean over seeds per task, with its bootstrap interval "
            "(log scale; dashed: the baseline, 1.0).",
        ),
        pipeline_section(zip(df["task"], df["folder"], strict=True)),
        "<h2 id='outcomes'>Outcomes</h2>",
        _figure_block(plot_outcomes(board), "Share of each agent's trials by outcome."),
        f"<h2 id='task'>Task {esc(task)}</h2>",
        f"<p class='meta'>objective: {esc(objective)}; agents: {esc(', '.join(task_agents))}</p>",
        "<h3>Best-so-far improvement against budget spent</h3>",
        _figure_block(
            plot_best_so_far(df, task, task_agents, colours),
            "Running best dev-workload improvement of the agent's successful experiments "
            "(1.0 before the first), one line per seed; diamond: the trial's final "
            "leaderboard score on the hidden scoring workload.",
        ),
        "<h3>Latency distributions</h3>",
        _figure_block(
            plot_latency_cdfs(df, task, task_agents, colours),
            "Empirical CDFs of per-request latency in the first evaluation pair, pooled over "
            "seeds (at most 2,000 values per run, evenly spaced order statistics).",
        ),
        "<h3>Throughput against tail latency</h3>",
        _figure_block(
            plot_throughput_latency(df, task, task_agents, colours),
            "Each trial's baseline (open) and submission (filled) in the first evaluation "
            "pair; a line joins the two runs of a trial.",
        ),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def write_report(
    path: Path,
    df: pd.DataFrame,
    board: Leaderboard,
    task: str,
    *,
    run_dirs: Sequence[Path] = (),
) -> Path:
    """Render the report and write it to ``path`` (atomically; readable by all, as a page
    to share)."""
    write_atomic(path, render_report(df, board, task, run_dirs=run_dirs))
    path.chmod(0o644)
    return path
