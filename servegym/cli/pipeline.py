"""``servegym pipeline analyze RESULT``: per-stage time shares and the Amdahl table.

RESULT is a :class:`~servegym.pipeline.result.PipelineResult` JSON file (``pipeline.json``),
or a pipeline task's trial folder or its ``trial.json`` (then the folder's
``pipeline.json``, the submission's run, or with ``--baseline`` the baseline's
``pipeline_baseline.json``). Bad input ends in one line naming the file, exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from servegym.cli.console import console, print_user_error
from servegym.errors import UserError

if TYPE_CHECKING:
    from servegym.pipeline.result import PipelineResult

pipeline_app = typer.Typer(help="Analyse pipeline tasks' results.", no_args_is_help=True)


def render_summary(path: Path, result: PipelineResult) -> Table:
    """The run's headline figures."""
    table = Table(title=f"pipeline result: {path}", show_header=False, title_justify="left")
    table.add_column("key", style="bold")
    table.add_column("value")
    lat = result.latency_s
    rows = [
        ("track / task", f"{result.track} / {result.task or '-'}"),
        ("questions answered", str(len(result.tasks))),
        ("answering rate", f"{result.answering_tasks_per_s:.3f} tasks/s"),
        ("index build rate", f"{result.index_build_docs_per_s:,.0f} docs/s"),
        ("latency p50 / p90 / p99", f"{lat.p50:.3f} / {lat.p90:.3f} / {lat.p99:.3f} s"),
        ("wall", f"{result.wall_s:.2f} s"),
    ]
    if result.recall_at_k is not None:
        rows.append((f"recall@{result.k or '?'}", f"{result.recall_at_k:.4f}"))
    for key, value in rows:
        table.add_row(key, value)
    return table


def render_shares(result: PipelineResult) -> Table:
    """Per-stage time: total seconds, share, mean per answered question."""
    from servegym.pipeline.result import STAGES

    table = Table(title="time per stage (queueing included)", title_justify="left")
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    table.add_column("per question", justify="right")
    shares = result.stage_shares()
    n = len(result.tasks)
    for stage in STAGES:
        seconds = result.stage_totals_s.get(stage, 0.0)
        table.add_row(
            stage,
            f"{seconds:.2f}",
            f"{100 * shares[stage]:.1f}%",
            f"{seconds / n:.3f} s" if n else "-",
        )
    return table


def render_amdahl(result: PipelineResult, factors: tuple[float, ...] | None = None) -> Table:
    """The Amdahl table: the pipeline's speed-up if one stage alone were ``s`` times faster,
    and the ceiling if it took no time (``factors``: the pipeline's ``AMDAHL_FACTORS``)."""
    from servegym.pipeline.report import fmt_speedup
    from servegym.pipeline.result import AMDAHL_FACTORS

    if factors is None:
        factors = AMDAHL_FACTORS
    table = Table(
        title="Amdahl: whole-pipeline speed-up if only this stage were s times faster",
        title_justify="left",
    )
    table.add_column("stage")
    table.add_column("share", justify="right")
    for f in factors:
        table.add_column(f"{f:g}x", justify="right")
    table.add_column("free (ceiling)", justify="right")
    for row in result.amdahl_rows(factors):
        style = "bold" if row.share >= 0.5 else None
        table.add_row(
            Text(row.stage, style=style or ""),
            f"{100 * row.share:.1f}%",
            *[fmt_speedup(row.speedups[f]) for f in factors],
            fmt_speedup(row.ceiling),
        )
    return table


def render_analysis(path: Path, result: PipelineResult) -> Group:
    return Group(render_summary(path, result), render_shares(result), render_amdahl(result))


@pipeline_app.command("analyze")
def analyze_command(
    result: Annotated[
        Path,
        typer.Argument(help="pipeline.json, or a pipeline task's trial folder or trial.json"),
    ],
    baseline: Annotated[
        bool, typer.Option("--baseline", help="the trial's baseline run, not the submission's")
    ] = False,
) -> None:
    """Per-stage time shares and the Amdahl table of a pipeline run."""
    from servegym.pipeline.files import load_result

    try:
        path, loaded = load_result(result, baseline=baseline)
    except UserError as e:  # one line and exit 2, also when called without main()
        print_user_error(e)
        raise typer.Exit(e.exit_code) from None
    console.print(render_analysis(path, loaded))
