"""``servegym task list | show | new | validate``.

- ``task list``: every task under ``tasks/`` (id, track, model, hardware, workload, objective);
  a task that does not load is listed with its error.
- ``task show ID``: the task as the harness reads it, and the instruction the agent gets.
  Never the oracle.
- ``task new ID [--from EXISTING]``: scaffold ``tasks/ID/`` (a commented ``task.toml``, an
  ``instruction.md`` and an ``oracle.toml``) that validates as written; ``--from`` copies an
  existing task instead. An existing id is refused.
- ``task validate [ID ...]``: every task (or the ones named) loads and has an oracle; on a
  sim task, the **nop check** (the baseline config scores 1.0 within
  ``evaluation.nop_tolerance``) and the **oracle check** (the oracle scores at least
  ``evaluation.oracle_min_score``), both through the final evaluation
  (:func:`servegym.runner.evaluation.evaluate`) on the scoring workloads of trial seeds
  ``0 .. seeds-1``. Exit code 1 and a table of the failures when any check fails.

Every error a user can cause (unknown id, malformed ``task.toml``, bad field) is a one-line
:class:`~servegym.errors.UserError` (exit code 2), naming the file and field.

The functions take a ``root`` (default: the shipped ``tasks/`` folder) and a Rich console;
:data:`task_app` wraps them as a Typer sub-app (``app.add_typer(task_app, name="task")``).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console, Group
from rich.markdown import Markdown
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from servegym.errors import UserError
from servegym.tasks.loader import (
    INSTRUCTION_FILE,
    ORACLE_FILE,
    TASK_FILE,
    LoadedTask,
    list_tasks,
    load_task,
    load_task_folder,
    resolve_task_folder,
    task_folders,
    tasks_dir,
)
from servegym.tasks.spec import Task

if TYPE_CHECKING:
    from servegym.engines.config import ServingConfig
    from servegym.runner.evaluation import Evaluation

_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def _workload_label(task: Task) -> str:
    ref = task.workload
    parts = [ref.name]
    arrival = [o.split("=", 1)[1] for o in ref.overrides if o.startswith("arrival.kind=")]
    if arrival:
        parts.append(arrival[-1])
    return " ".join(parts)


# --------------------------------------------------------------------------- list


def render_task_list(root: Path | None = None) -> Table:
    """The ``task list`` table."""
    table = Table(title=f"tasks ({root or tasks_dir()})", title_justify="left")
    table.add_column("id", style="bold", no_wrap=True)
    for column in ("track", "model", "hardware"):
        table.add_column(column, no_wrap=True)
    for column in ("workload", "objective"):
        table.add_column(column, overflow="fold")
    for info in list_tasks(root):
        if info.task is None:
            table.add_row(Text(info.id), Text(f"error: {info.error}", style="red"), "", "", "", "")
            continue
        t = info.task
        direction = "max" if t.objective.higher_is_better else "min"
        table.add_row(  # Text: a task's strings are the author's, never markup
            *(
                Text(cell)
                for cell in (
                    t.id,
                    t.track,
                    t.model,
                    t.hardware,
                    _workload_label(t),
                    f"{direction} {t.objective.label()}",
                )
            )
        )
    return table


def task_list(console: Console, root: Path | None = None) -> None:
    console.print(render_task_list(root))


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
    console.print(render_task(load_task(task_id, root, flag="task show")))


# --------------------------------------------------------------------------- new

TEMPLATE_TASK = """\
# A ServeGym task. Fields: docs/adding-a-task.md; knobs and defaults: `servegym sim --list`;
# workloads: `servegym workload list`. Check it with `servegym task validate {id}`.
id = "{id}"                 # must equal the folder name
title = "Offline throughput: Llama-3.1-8B on one H100 (edit me)"
track = "sim"                # sim | cpu | gpu
model = "llama-3.1-8b"       # a model profile (servegym sim --list)
hardware = "h100-sxm"        # a hardware profile; its $/GPU-hour prices cost objectives
# price_per_hour = 3.35      # $ per GPU-hour, to override the hardware profile's
engines = ["sim"]            # a sim task's engines are ["sim"]
tags = ["balanced", "offline", "throughput"]

# The config the submission is compared with: vLLM's defaults unless set here (any
# ServingConfig knob, e.g. tensor_parallel_size = 4 for a model that needs it).
[baseline]

[workload]
name = "balanced"            # a shipped workload, or a .toml path relative to this folder
overrides = []               # dotted key=value, e.g. ["arrival.kind=poisson", "arrival.rate=8"]
requests = 200               # requests (sessions, for agentic); keep an experiment fast
scale = 0.5                  # multiplies every token length
dev_seed = 0                 # the seed agents see; scoring uses a hidden one

# kind: output_throughput | ttft | tpot | itl | e2e | turn_latency (lower is better, with
# statistic = mean | p50 | p90 | p95 | p99) | goodput | max_rate_at_sla | cost_at_sla (need
# [sla]; the rate objectives search a Poisson rate in [rate_min, rate_max]) | composite
# (geometric mean of [[objective.components]]).
[objective]
kind = "output_throughput"

# [sla]                      # per-request objectives in ms (goodput and rate objectives)
# ttft_ms = 500
# tpot_ms = 50

[accuracy]
min_ratio = 0.98             # modelled accuracy vs the baseline's: fp8 0.997, int8 0.985, int4 0.97

[budget]
sim_gpu_seconds = 6000       # each experiment: (start-up + simulated run) x GPUs
max_experiments = 100

[evaluation]
repeats = 5                  # paired baseline/submission runs on the hidden workload (>= 5)
oracle_min_score = 1.2       # oracle.toml must score at least this
nop_tolerance = 0.05         # the baseline must score 1.0 within this
"""

TEMPLATE_INSTRUCTION = """\
You are the serving engineer for this deployment. The environment describes the model, the
hardware, the workload, the serving knobs and their defaults, the objective and your budget.

Find the serving configuration that does best on the objective, then submit it. Every
experiment costs budget (simulated GPU time, more for more GPUs); when it runs out, your last
submission stands.

Rules: serve the given model. Quantizing it (weights or KV cache) is allowed, but the
submission must keep at least the stated fraction of the baseline's accuracy. No other model
may answer the requests (a draft model for speculative decoding is fine).
"""

TEMPLATE_ORACLE = """\
# The expert ("oracle") config, never shown to agents: a ServingConfig (knobs at the top
# level, [speculative] as a table). `servegym task validate` checks it scores at least
# evaluation.oracle_min_score. Say why it should win; try it with
#   servegym sim --model ... --hardware ... --workload ... --config tasks/<id>/oracle.toml
quantization = "fp8"          # FP8 weights: FP8 tensor cores, half the weight bytes
kv_cache_dtype = "fp8"        # twice the tokens in the KV cache: larger batches
max_num_batched_tokens = 16384
"""


def task_new(
    task_id: str, console: Console, from_: str | None = None, root: Path | None = None
) -> Path:
    """Scaffold ``tasks/<task_id>/`` (from the template, or a copy of ``from_``)."""
    if not _ID_RE.match(task_id):
        raise UserError(
            f"task new: bad id '{task_id}': use lowercase letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    base = root if root is not None else tasks_dir()
    folder = base / task_id
    if folder.exists():
        raise UserError(f"task new: '{task_id}' exists already ({folder}); pick another id")
    if from_ is not None:
        source = resolve_task_folder(from_, root, flag="--from")
        text = (source / TASK_FILE).read_text(encoding="utf-8")
        new_text, n = re.subn(
            r'^(\s*id\s*=\s*)(["\']).*?\2', rf'\g<1>"{task_id}"', text, count=1, flags=re.M
        )
        if n == 0:
            raise UserError(f"{source / TASK_FILE}: no 'id = \"...\"' line to rewrite")
        folder.mkdir(parents=True)
        (folder / TASK_FILE).write_text(new_text, encoding="utf-8")
        for name in (INSTRUCTION_FILE, ORACLE_FILE):
            if (source / name).is_file():
                shutil.copyfile(source / name, folder / name)
        for extra in sorted(source.iterdir()):
            if extra.name not in (TASK_FILE, INSTRUCTION_FILE, ORACLE_FILE) and extra.is_file():
                shutil.copyfile(extra, folder / extra.name)
        made = f"copied from {source.name}"
    else:
        folder.mkdir(parents=True)
        (folder / TASK_FILE).write_text(TEMPLATE_TASK.format(id=task_id), encoding="utf-8")
        (folder / INSTRUCTION_FILE).write_text(TEMPLATE_INSTRUCTION, encoding="utf-8")
        (folder / ORACLE_FILE).write_text(TEMPLATE_ORACLE, encoding="utf-8")
        made = "from the template"
    console.print(f"created {folder}/ ({made}): {TASK_FILE}, {INSTRUCTION_FILE}, {ORACLE_FILE}")
    console.print(
        f"next: edit them (docs/adding-a-task.md), then `servegym task validate {task_id}`"
    )
    return folder


# --------------------------------------------------------------------------- validate


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check of one task."""

    task: str
    check: str
    passed: bool
    detail: str
    skipped: bool = False
    short: str = ""
    """What the summary table shows in the check's cell (e.g. the scores)."""


def _scoring_seeds(loaded: LoadedTask, seeds: int) -> list[tuple[int, int]]:
    from servegym.tasks.secrets import scoring_seed

    dev = loaded.task.workload.dev_seed
    return [(s, scoring_seed(loaded.task.id, s, avoid=dev)) for s in range(seeds)]


def _evaluate(loaded: LoadedTask, submission: ServingConfig, seed: int) -> Evaluation:
    """The final evaluation of the task's track (real servers for cpu and gpu tasks)."""
    import tempfile

    from servegym.runner.evaluation import evaluate
    from servegym.tracks import track_for

    logs = None
    if not loaded.task.traits.simulated:
        logs = Path(tempfile.mkdtemp(prefix=f"servegym-validate-{loaded.id}-"))
    return evaluate(loaded, submission, seed, track=track_for(loaded, server_logs=logs))


def _real_track_missing(loaded: LoadedTask) -> str | None:
    """Why this machine cannot run the task's nop and oracle checks, if it cannot."""
    from servegym.runner.trial import check_track_ready

    if loaded.task.track == "sim":
        return None
    try:
        check_track_ready(loaded)
    except UserError as e:
        return e.message
    return None


def check_nop(loaded: LoadedTask, seeds: int = 1) -> CheckResult:
    """The baseline config, submitted, scores 1.0 within ``evaluation.nop_tolerance``."""
    from servegym.errors import HarnessError

    t = loaded.task
    tol = t.evaluation.nop_tolerance
    scores: list[str] = []
    ok = True
    for trial_seed, seed in _scoring_seeds(loaded, seeds):
        try:
            ev = _evaluate(loaded, t.baseline.model_copy(deep=True), seed)
        except HarnessError as e:
            return CheckResult(t.id, "nop", False, str(e))
        score = ev.score
        if ev.outcome != "scored" or score is None:
            return CheckResult(
                t.id, "nop", False, f"seed {trial_seed}: outcome {ev.outcome}", short=ev.outcome
            )
        scores.append(f"{score:.3f}")
        ok = ok and abs(score - 1.0) <= tol
    detail = f"baseline scores {', '.join(scores)} (1.0 +- {tol:g})"
    return CheckResult(t.id, "nop", ok, detail, short=", ".join(scores))


def check_oracle(loaded: LoadedTask, seeds: int = 1) -> CheckResult:
    """The oracle config scores at least ``evaluation.oracle_min_score``."""
    from servegym.errors import HarnessError

    t = loaded.task
    if loaded.oracle is None:
        return CheckResult(t.id, "oracle", False, f"no {ORACLE_FILE} (every task needs one)")
    need = t.evaluation.oracle_min_score
    scores: list[str] = []
    ok = True
    for trial_seed, seed in _scoring_seeds(loaded, seeds):
        try:
            ev = _evaluate(loaded, loaded.oracle.model_copy(deep=True), seed)
        except HarnessError as e:
            return CheckResult(t.id, "oracle", False, str(e))
        if ev.outcome != "scored" or ev.score is None:
            why = next((g.detail for g in ev.gates.values() if g.passed is False), "")
            return CheckResult(
                t.id,
                "oracle",
                False,
                f"seed {trial_seed}: outcome {ev.outcome}" + (f" ({why})" if why else ""),
                short=ev.outcome,
            )
        scores.append(f"{ev.score:.3f}")
        ok = ok and ev.score >= need
    return CheckResult(
        t.id,
        "oracle",
        ok,
        f"oracle scores {', '.join(scores)} (>= {need:g})",
        short=f"{', '.join(scores)} (>= {need:g})",
    )


def validate_task(folder: Path, *, seeds: int = 1, schema_only: bool = False) -> list[CheckResult]:
    """Every check of the task in ``folder`` (schema first; the rest only if it loads)."""
    try:
        loaded = load_task_folder(folder)
    except UserError as e:
        return [CheckResult(folder.name, "schema", False, e.message)]
    if loaded.oracle is None:
        return [
            CheckResult(
                loaded.id,
                "schema",
                False,
                f"{folder / ORACLE_FILE}: missing (every task needs one)",
            )
        ]
    results = [
        CheckResult(
            loaded.id, "schema", True, "task.toml, instruction.md, oracle.toml load", short="ok"
        )
    ]
    if schema_only:
        return results
    missing = _real_track_missing(loaded)
    if missing is not None:
        note = f"nop and oracle checks need the {loaded.task.track} track: {missing}"
        results.append(CheckResult(loaded.id, "nop", True, note, skipped=True, short="skipped"))
        results.append(CheckResult(loaded.id, "oracle", True, note, skipped=True, short="skipped"))
        return results
    results.append(check_nop(loaded, seeds))
    results.append(check_oracle(loaded, seeds))
    return results


CHECKS: tuple[str, ...] = ("schema", "nop", "oracle")


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
    table = Table(title=f"task validate ({n_tasks} tasks)", title_justify="left")
    table.add_column("task", style="bold", no_wrap=True)
    for check in CHECKS:
        table.add_column(check, overflow="fold")
    by_task: dict[str, dict[str, CheckResult]] = {}
    for r in results:
        by_task.setdefault(r.task, {})[r.check] = r
    for task_id, checks in by_task.items():
        table.add_row(Text(task_id), *(_cell(checks.get(c)) for c in CHECKS))
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
) -> int:
    """Validate the named tasks (all when none); print the checks; return the exit code
    (0: every check passed, 1: some failed). Unknown ids raise :class:`UserError`."""
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    if task_ids:
        folders = [resolve_task_folder(t, root, flag="task validate") for t in task_ids]
    else:
        folders = task_folders(root)
        if not folders:
            raise UserError(f"task validate: no tasks in {root or tasks_dir()}")
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
            results.extend(validate_task(folder, seeds=seeds, schema_only=schema_only))
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

_console = Console()

RootOption = Annotated[
    Path | None,
    typer.Option("--root", help="tasks folder (default: the shipped tasks/)"),
]


@task_app.command("list")
def list_command(root: RootOption = None) -> None:
    """List the tasks: id, track, model, hardware, workload, objective."""
    task_list(_console, root)


@task_app.command("show")
def show_command(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="task id or task folder")],
    root: RootOption = None,
) -> None:
    """Show a task and the instruction its agent reads (never the oracle)."""
    task_show(task_id, _console, root)


@task_app.command("new")
def new_command(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="the new task's id")],
    from_: Annotated[
        str | None, typer.Option("--from", help="copy this existing task instead")
    ] = None,
    root: RootOption = None,
) -> None:
    """Scaffold tasks/ID/: a commented task.toml, instruction.md and oracle.toml."""
    task_new(task_id, _console, from_=from_, root=root)


@task_app.command("validate")
def validate_command(
    task_ids: Annotated[
        list[str] | None, typer.Argument(metavar="[ID]...", help="tasks (default: all)")
    ] = None,
    seeds: Annotated[
        int, typer.Option("--seeds", min=1, help="scoring workloads per check (trial seeds)")
    ] = 1,
    schema_only: Annotated[
        bool, typer.Option("--schema-only", help="skip the nop and oracle checks")
    ] = False,
    root: RootOption = None,
) -> None:
    """Check tasks: schema and oracle.toml; on sim tasks the nop and oracle checks.

    The nop check: the baseline config scores 1.0 within evaluation.nop_tolerance. The
    oracle check: oracle.toml scores at least evaluation.oracle_min_score. Both run the
    final evaluation on the scoring workloads of trial seeds 0 .. seeds-1.
    """
    code = task_validate(task_ids or [], _console, root=root, seeds=seeds, schema_only=schema_only)
    if code:
        raise typer.Exit(code)
