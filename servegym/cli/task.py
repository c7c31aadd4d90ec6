"""``servegym task list | show | new | validate``.

- ``task list``: every task under ``tasks/`` (id, track, model, hardware, workload, objective;
  a real-track task that tracks its validation shows it beside its track: ``gpu (not
  validated)`` until ``task validate`` has passed it on a GPU host); a task that does not
  load is listed with its error.
- ``task show ID``: the task as the harness reads it, and the instruction the agent gets.
  Never the oracle.
- ``task new ID [--from EXISTING]``: scaffold ``tasks/ID/`` (a commented ``task.toml``, an
  ``instruction.md`` and an ``oracle.toml``) that validates as written; ``--from`` copies an
  existing task instead. An existing id is refused (:mod:`servegym.tasks.scaffold`).
- ``task validate [ID ...]``: every task (or the ones named) loads and has an oracle; on a
  sim task, the **nop check** (the baseline config scores 1.0 within
  ``evaluation.nop_tolerance``) and the **oracle check** (the oracle scores at least
  ``evaluation.oracle_min_score``), both through the final evaluation on the scoring
  workloads of trial seeds ``0 .. seeds-1`` (:mod:`servegym.runner.validate` runs them).
  Exit code 1 and a table of the failures when any check fails.

Every error a user can cause (unknown id, malformed ``task.toml``, bad field) is a one-line
:class:`~servegym.errors.UserError` (exit code 2), naming the file and field.

The functions take a ``root`` (default: the shipped ``tasks/`` folder) and a Rich console;
:data:`task_app` wraps them as a Typer sub-app (``app.add_typer(task_app, name="task")``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.console import Console, Group
from rich.markdown import Markdown
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from servegym.cli.console import console as stdout_console

if TYPE_CHECKING:
    from servegym.runner.validate import CheckResult
    from servegym.tasks.loader import LoadedTask
    from servegym.tasks.spec import Task


def _workload_label(task: Task) -> str:
    ref = task.workload
    parts = [ref.name]
    arrival = [o.split("=", 1)[1] for o in ref.overrides if o.startswith("arrival.kind=")]
    if arrival:
        parts.append(arrival[-1])
    return " ".join(parts)


# --------------------------------------------------------------------------- list


LIST_COLUMNS = ("id", "track", "model", "hardware", "workload", "objective")


def _track_label(task: Task) -> str:
    """The track, and for a real-track task that tracks it, whether ``task validate`` has
    passed it on a host of its track."""
    if task.validated is None:
        return task.track
    return f"{task.track} ({'validated' if task.validated else 'not validated'})"


def _task_rows(root: Path | None) -> list[tuple[str, ...]]:
    """One row of :data:`LIST_COLUMNS` per task, or ``(id, error)`` for one that does not
    load."""
    from servegym.tasks.loader import list_tasks

    rows: list[tuple[str, ...]] = []
    for info in list_tasks(root):
        if info.task is None:
            rows.append((info.id, f"error: {info.error}"))
            continue
        t = info.task
        direction = "max" if t.objective.higher_is_better else "min"
        objective = f"{direction} {t.objective.label()}"
        rows.append((t.id, _track_label(t), t.model, t.hardware, _workload_label(t), objective))
    return rows


def render_task_list(root: Path | None = None, width: int | None = None) -> Table:
    """The ``task list`` table: one row per task and a column per field when ``width``
    (default: the terminal's) holds them all, else two lines per task (id, track, model and
    hardware; then workload and objective), so no column is ever squeezed to a sliver."""
    from servegym.tasks.loader import tasks_dir

    rows = _task_rows(root)
    title = f"tasks ({root or tasks_dir()})"
    widths = [len(c) for c in LIST_COLUMNS]
    for row in rows:
        if len(row) == len(LIST_COLUMNS):
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    wide = sum(widths) + 3 * len(widths) + 1  # a Rich box: one border and two pads a column
    if wide <= (width if width is not None else stdout_console.width):
        table = Table(title=title, title_justify="left")
        table.add_column("id", style="bold", no_wrap=True)
        for column in LIST_COLUMNS[1:]:
            table.add_column(column, overflow="fold")
        for row in rows:
            if len(row) != len(LIST_COLUMNS):
                table.add_row(Text(row[0]), Text(row[1], style="red"), "", "", "", "")
            else:  # Text: a task's strings are the author's, never markup
                table.add_row(*(Text(cell) for cell in row))
        return table
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("id", style="bold", overflow="fold")
    table.add_column("track · model @ hardware\nworkload → objective", overflow="fold")
    for row in rows:
        if len(row) != len(LIST_COLUMNS):
            table.add_row(Text(row[0]), Text(row[1], style="red"))
            continue
        tid, track, model, hardware, workload, objective = row
        table.add_row(
            Text(tid),
            Text(f"{track} · {model} @ {hardware}\n{workload} → {objective}"),
        )
    return table


def task_list(console: Console, root: Path | None = None) -> None:
    console.print(render_task_list(root, console.width))


# --------------------------------------------------------------------------- show


def _kv_table(rows: list[tuple[str, str]]) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, Text(v))  # the task author's text, never markup
    return table


def _fmt_dict(d: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) if d else "-"


def render_task(loaded: LoadedTask) -> Group:
    """The ``task show`` view: the task and its instruction, never the oracle."""
    from servegym.tasks.loader import INSTRUCTION_FILE

    t = loaded.task
    ref = t.workload
    obj = t.objective
    rows: list[tuple[str, str]] = [
        ("id", t.id),
        ("title", t.title),
        ("track", t.track),
        ("model", t.model),
        ("hardware", t.hardware),
        (
            "price",
            f"${t.price_per_hour:g}/GPU-hour" if t.price_per_hour is not None else "hardware's",
        ),
        ("engines", ", ".join(t.engines)),
        ("baseline", _fmt_dict(t.baseline.changed()) if t.baseline.changed() else "defaults"),
        (
            "workload",
            _fmt_dict(
                {
                    "name": ref.name,
                    "overrides": " ".join(ref.overrides) or "-",
                    "requests": ref.requests if ref.requests is not None else "file's",
                    "scale": ref.scale if ref.scale is not None else 1,
                    "dev_seed": ref.dev_seed,
                }
            ),
        ),
        (
            "objective",
            f"{'maximise' if obj.higher_is_better else 'minimise'} {obj.label()}",
        ),
    ]
    if obj.kind in ("max_rate_at_sla", "cost_at_sla") or any(
        c.kind in ("max_rate_at_sla", "cost_at_sla") for c in obj.components
    ):
        rows.append(
            (
                "rate search",
                f"Poisson {obj.rate_min:g}-{obj.rate_max:g} req/s, attainment >= "
                f"{obj.attainment_target:g}",
            )
        )
    if t.sla is not None:
        rows.append(("sla", t.sla.to_flag() or "-"))
    if t.pipeline is not None:
        rows.append(("pipeline", _fmt_dict(t.pipeline.model_dump())))
    rows.append(("accuracy", f"min ratio {t.accuracy.min_ratio:g} of the baseline's"))
    rows.append(("budget", _fmt_dict(t.budget.model_dump(exclude_none=True))))
    rows.append(("evaluation", _fmt_dict(t.evaluation.model_dump())))
    if t.tags:
        rows.append(("tags", ", ".join(t.tags)))
    rows.append(("folder", str(loaded.path)))
    return Group(
        Panel(_kv_table(rows), title=f"task {t.id}", title_align="left"),
        Panel(Markdown(loaded.instruction), title=INSTRUCTION_FILE, title_align="left"),
    )


def task_show(task_id: str, console: Console, root: Path | None = None) -> None:
    from servegym.tasks.loader import load_task

    console.print(render_task(load_task(task_id, root, flag="task show")))


# --------------------------------------------------------------------------- new


def task_new(
    task_id: str, console: Console, from_: str | None = None, root: Path | None = None
) -> Path:
    """Scaffold ``tasks/<task_id>/`` (from the template, or a copy of ``from_``)."""
    from servegym.tasks.loader import INSTRUCTION_FILE, ORACLE_FILE, TASK_FILE
    from servegym.tasks.scaffold import new_task

    folder, made = new_task(task_id, from_, root)
    console.print(f"created {folder}/ ({made}): {TASK_FILE}, {INSTRUCTION_FILE}, {ORACLE_FILE}")
    console.print(
        f"next: edit them (docs/adding-a-task.md), then `servegym task validate {task_id}`"
    )
    return folder


# --------------------------------------------------------------------------- validate


def _cell(result: CheckResult | None) -> Text:
    if result is None:
        return Text("-", style="dim")
    if result.skipped:
        return Text(result.short or "skipped", style="dim")
    if result.passed:
        return Text(result.short or "pass", style="green")
    return Text("FAIL" + (f" {result.short}" if result.short else ""), style="bold red")


def render_validation(results: list[CheckResult], n_tasks: int) -> Table:
    """One row per task, one column per check (scores where there are some)."""
    from servegym.runner.validate import CHECKS

    table = Table(title=f"task validate ({n_tasks} tasks)", title_justify="left")
    table.add_column("task", style="bold", no_wrap=True)
    # the mirror check is a column only where a task has one (a mirror of a sim task)
    shown = [c for c in CHECKS if c != "mirror" or any(r.check == c for r in results)]
    for check in shown:
        table.add_column(check, overflow="fold")
    by_task: dict[str, dict[str, CheckResult]] = {}
    for r in results:
        by_task.setdefault(r.task, {})[r.check] = r
    for task_id, checks in by_task.items():
        table.add_row(Text(task_id), *(_cell(checks.get(c)) for c in shown))
    return table


def render_failures(failures: list[CheckResult]) -> Table:
    noun = "check" if len(failures) == 1 else "checks"
    table = Table(title=f"{len(failures)} failed {noun}", title_justify="left")
    table.add_column("task", style="bold", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("why", overflow="fold")
    for r in failures:
        table.add_row(Text(r.task), r.check, Text(r.detail))
    return table


def task_validate(
    task_ids: list[str],
    console: Console,
    *,
    root: Path | None = None,
    seeds: int = 1,
    schema_only: bool = False,
    checklist: bool = True,
) -> int:
    """Validate the named tasks (all when none); print the checks; return the exit code
    (0: every check passed, 1: some failed). Unknown ids raise :class:`UserError`."""
    from servegym.runner.validate import folders_to_validate, validate_task

    folders = folders_to_validate(task_ids, root, seeds)
    results: list[CheckResult] = []
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress:
        bar: TaskID = progress.add_task("validating", total=len(folders))
        for folder in folders:
            progress.update(bar, description=f"validating {folder.name}")
            results.extend(
                validate_task(folder, seeds=seeds, schema_only=schema_only, checklist=checklist)
            )
            progress.advance(bar)
    failures = [r for r in results if not r.passed]
    console.print(render_validation(results, len(folders)))
    if failures:
        console.print(render_failures(failures))
        return 1
    console.print(f"[green]all {len(folders)} tasks valid[/]")
    return 0


# --------------------------------------------------------------------------- Typer app

task_app = typer.Typer(help="List, show, scaffold and validate tasks.", no_args_is_help=True)

RootOption = Annotated[
    Path | None,
    typer.Option("--root", help="tasks folder (default: the shipped tasks/)"),
]


@task_app.command("list")
def list_command(root: RootOption = None) -> None:
    """List the tasks: id, track, model, hardware, workload, objective."""
    task_list(stdout_console, root)


@task_app.command("show")
def show_command(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="task id or task folder")],
    root: RootOption = None,
) -> None:
    """Show a task and the instruction its agent reads (never the oracle)."""
    task_show(task_id, stdout_console, root)


@task_app.command("new")
def new_command(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="the new task's id")],
    from_: Annotated[
        str | None, typer.Option("--from", help="copy this existing task instead")
    ] = None,
    root: RootOption = None,
) -> None:
    """Scaffold tasks/ID/: a commented task.toml, instruction.md and oracle.toml."""
    task_new(task_id, stdout_console, from_=from_, root=root)


@task_app.command("validate")
def validate_command(
    task_ids: Annotated[
        list[str] | None, typer.Argument(metavar="[ID]...", help="tasks (default: all)")
    ] = None,
    seeds: Annotated[
        int, typer.Option("--seeds", min=1, help="scoring workloads per check (trial seeds)")
    ] = 1,
    schema_only: Annotated[
        bool, typer.Option("--schema-only", help="skip the nop, oracle and checklist checks")
    ] = False,
    checklist: Annotated[
        bool,
        typer.Option(
            "--checklist/--no-checklist", help="run the checklist agent against the oracle"
        ),
    ] = True,
    root: RootOption = None,
) -> None:
    """Check tasks: schema and oracle.toml; on sim tasks the nop, oracle and checklist checks.

    The nop check: the baseline config scores 1.0 within evaluation.nop_tolerance. The
    oracle check: oracle.toml scores at least evaluation.oracle_min_score. Both run the
    final evaluation on the scoring workloads of trial seeds 0 .. seeds-1. The checklist
    check (simulated tasks): the checklist agent's trials score below 90% of the oracle's.
    """
    code = task_validate(
        task_ids or [],
        stdout_console,
        root=root,
        seeds=seeds,
        schema_only=schema_only,
        checklist=checklist,
    )
    if code:
        raise typer.Exit(code)
