"""``servegym leaderboard``: the leaderboard of run folders, as a table for a terminal or
as markdown, CSV or JSON on stdout, with an optional HTML report."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from servegym.cli.console import console as stdout_console
from servegym.cli.console import err_console as stderr_console
from servegym.cli.console import print_user_error
from servegym.errors import UserError

if TYPE_CHECKING:
    from servegym.reporting.leaderboard import Leaderboard

RANK_COLUMNS: tuple[str, ...] = ("rank", "agent", "tasks", "runs")
PROCESS_COLUMNS: tuple[str, ...] = (
    "shipped best", "best/shipped", "exps/run", "tokens/run", "$/run", "GPU-h/run",
)  # fmt: skip
_SHORT = {
    "exps/run": "exps",
    "tokens/run": "tokens",
    "$/run": "$",
    "GPU-h/run": "GPU-h",
}


def rich_table(board: Leaderboard) -> Group:
    """The leaderboard for a terminal: three narrow Rich tables (ranking; outcome shares;
    process and cost) over the same agents, then the notes."""
    from servegym.reporting.leaderboard import OUTCOME_LABELS, display_frame
    from servegym.runner.results import OUTCOMES

    frame = display_frame(board)
    cols = list(frame.columns)
    process = [c for c in PROCESS_COLUMNS if c in cols]
    outcome_cols = [OUTCOME_LABELS[o] for o in OUTCOMES if OUTCOME_LABELS[o] in cols]
    ranking = [c for c in cols if c not in process and c not in outcome_cols]
    groups = [
        (f"leaderboard: {len(board.agents)} agents, {len(board.tasks)} tasks", ranking),
        ("outcomes (share of runs)", ["agent", *outcome_cols]),
        ("process and cost (mean per run)", ["agent", *process]),
    ]
    parts: list[Any] = []
    for title, columns in groups:
        table = Table(title=title, title_justify="left")
        for c in columns:
            table.add_column(
                _SHORT.get(c, c) if title.startswith("process") else c,
                justify="left" if c in ("agent", "missing") else "right",
                style="bold" if c == "agent" else None,
                no_wrap=c != "missing",
            )
        for _, r in frame.iterrows():
            table.add_row(*(str(r[c]) for c in columns))
        parts.append(table)
    parts.extend(Text(f"note: {n}", style="dim") for n in board.notes)
    return Group(*parts)


def leaderboard_command(
    run_dirs: Sequence[Path],
    fmt: str,
    html: Path | None,
    task: str | None,
    console: Console,
    err_console: Console,
) -> None:
    """``servegym leaderboard``: print the leaderboard in ``fmt``; with ``html``, write the
    report too. Raises :class:`UserError` for bad input."""
    import sys

    from servegym.reporting.leaderboard import (
        FORMATS,
        build_leaderboard,
        default_task,
        format_csv,
        format_json,
        format_markdown,
        scan_trials,
        trials_frame,
    )

    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, not '{fmt}'")
    scan = scan_trials(run_dirs)
    df = trials_frame(scan.trials)
    if task is not None and task not in set(df["task"]):
        known = ", ".join(sorted(set(df["task"])))
        raise UserError(f"--task {task}: no trial of it in the run folders (tasks: {known})")
    if html is not None and html.exists() and html.is_dir():
        raise UserError(f"--html {html}: is a folder")
    board = build_leaderboard(df, left_out=scan.notes())
    if fmt == "csv":  # CSV has no room for notes: what was left out goes to stderr
        for note in scan.notes():
            err_console.print(f"note: {note}", highlight=False, soft_wrap=True)
    if fmt == "table":
        console.print(rich_table(board))
    elif fmt == "markdown":
        sys.stdout.write(format_markdown(board))
    elif fmt == "csv":
        sys.stdout.write(format_csv(board))
    else:
        sys.stdout.write(format_json(board))
    if html is not None:
        from servegym.reporting.report import write_report

        chosen = task if task is not None else default_task(df)
        try:
            write_report(html, df, board, chosen, run_dirs=run_dirs)
        except OSError as e:
            raise UserError(f"--html {html}: cannot write ({e.strerror or e})") from None
        err_console.print(f"wrote {html}", highlight=False)


def leaderboard(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="run folders of <task>__<agent>__s<seed>/trial.json")
    ],
    format_: Annotated[
        str, typer.Option("--format", help="table, markdown, csv or json (to stdout)")
    ] = "table",
    html: Annotated[
        Path | None, typer.Option("--html", help="also write a self-contained HTML report")
    ] = None,
    task: Annotated[
        str | None,
        typer.Option("--task", help="the report's task (default: the one with most agents)"),
    ] = None,
) -> None:
    """Rank agents over every trial in the run folders: geometric mean of improvement over
    tasks with a bootstrap interval over seeds, outcomes, process and cost."""
    try:
        leaderboard_command(run_dirs, format_, html, task, stdout_console, stderr_console)
    except UserError as e:  # one line and exit 2, also when called without main()
        print_user_error(e)
        raise typer.Exit(e.exit_code) from None
