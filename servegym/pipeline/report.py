"""The leaderboard report's pipeline section: each pipeline task's Amdahl table.

For every task whose trials wrote ``pipeline_baseline.json``, the section shows the
baseline's per-stage time shares and the whole pipeline's speed-up if one stage alone were
2, 3, 4 or 10 times faster, and the ceiling if it were free (from the first trial folder
of the task, in sorted order: the baseline config is the same in every trial). Plain HTML
tables, no scripts.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from pathlib import Path

from servegym.errors import UserError
from servegym.pipeline.files import PIPELINE_BASELINE_FILE
from servegym.pipeline.result import AMDAHL_FACTORS, PipelineResult


def fmt_speedup(x: float) -> str:
    """``1.83x``; ``inf`` for an infinite ceiling."""
    return "inf" if math.isinf(x) else f"{x:.2f}x"


def amdahl_html(result: PipelineResult) -> str:
    """One HTML table: stage, share, speed-up at each factor, ceiling."""
    head = "".join(
        f"<th>{html.escape(h)}</th>"
        for h in ["stage", "share", *[f"{f:g}x" for f in AMDAHL_FACTORS], "free (ceiling)"]
    )
    rows = []
    for row in result.amdahl_rows():
        cells = [
            html.escape(row.stage),
            f"{100 * row.share:.1f}%",
            *[fmt_speedup(row.speedups[f]) for f in AMDAHL_FACTORS],
            fmt_speedup(row.ceiling),
        ]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def pipeline_section(trials: Iterable[tuple[str, str]]) -> str:
    """The section for ``(task, trial folder)`` pairs; empty when no trial is of a
    pipeline task (a file that does not parse is skipped)."""
    first: dict[str, PipelineResult] = {}
    for task, folder in sorted(trials):
        if task in first:
            continue
        path = Path(folder) / PIPELINE_BASELINE_FILE
        if not path.is_file():
            continue
        try:
            first[task] = PipelineResult.load(path)
        except UserError:
            continue
    if not first:
        return ""
    parts = ["<h2 id='pipelines'>Pipeline tasks: where the time goes</h2>"]
    for task, result in first.items():
        lat = result.latency_s
        parts.append(f"<h3>{html.escape(task)} (baseline)</h3>")
        parts.append(
            f"<p class='meta'>answering rate {result.answering_tasks_per_s:.3f} tasks/s; "
            f"latency p50 {lat.p50:.2f} s, p90 {lat.p90:.2f} s; index build "
            f"{result.index_build_docs_per_s:,.0f} docs/s"
            + (
                f"; recall@{result.k} {result.recall_at_k:.3f}"
                if result.recall_at_k is not None
                else ""
            )
            + "</p>"
        )
        parts.append(amdahl_html(result))
    parts.append(
        "<p class='note'>Amdahl: the whole pipeline's speed-up if only that stage were s "
        "times faster, 1 / ((1 - p) + p / s) at its share p of the stage time; the ceiling, "
        "1 / (1 - p), if it took no time.</p>"
    )
    return "\n".join(parts)
