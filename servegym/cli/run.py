"""``servegym run --task ID --agent NAME [--seed N] [--out DIR] [--force]``, and the
result table ``servegym score`` prints too.

:func:`run_trial_command` runs one trial (:func:`servegym.runner.trial.run_trial`) with a
progress bar over the agent phase (experiments run, simulated GPU-seconds against the
budget, best improvement so far) and the evaluation, then prints the result: baseline
against submission for every metric, the gates, the outcome and the score with its 95%
interval. Unknown tasks or agents and bad task files raise
:class:`~servegym.errors.UserError` (one line, exit code 2, printed by the command line).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console, Group
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from servegym.cli.console import console as stdout_console
from servegym.cli.options import ProviderTimeoutOption, ProviderTriesOption, given
from servegym.errors import UserError

if TYPE_CHECKING:
    from servegym.runner.results import TrialResult
    from servegym.tracks.base import ServerPlace

DEFAULT_OUT = Path("runs")

_OUTCOME_STYLE = {
    "scored": "bold green",
    "accuracy_failed": "bold yellow",
    "integrity_flagged": "bold red",
    "launch_failed": "bold yellow",
    "crashed": "bold red",
    "no_submission": "yellow",
    "provider_unavailable": "yellow",
    "harness_error": "bold red",
}


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "fraction":
        return f"{value:.1%}"
    a = abs(value)
    digits = 3 if a < 10 else 2 if a < 100 else 1 if a < 10_000 else 0
    return f"{value:,.{digits}f}"


def _ratio(value: float | None) -> Text:
    if value is None:
        return Text("-")
    style = "green" if value > 1.005 else "red" if value < 0.995 else ""
    return Text(f"{value:.3f}x", style=style)


def _objective_mean(values: list[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return sum(real) / len(real) if real else None


def render_trial(result: TrialResult, folder: Path | None = None) -> Group:
    """The result table, the gates and the outcome line."""
    title = f"{result.task} · {result.agent} · seed {result.seed}"
    table = Table(title=title, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("unit")
    table.add_column("baseline", justify="right")
    table.add_column("submission", justify="right")
    table.add_column("improvement", justify="right")
    obj = result.objective
    if obj is not None:
        base = _objective_mean(result.baseline.objective_values) if result.baseline else None
        sub = _objective_mean(result.submission.objective_values) if result.submission else None
        direction = "higher" if obj.higher_is_better else "lower"
        table.add_row(
            f"objective: {obj.label}",
            f"{obj.unit} ({direction} better)",
            _num(base),
            _num(sub),
            _ratio(result.raw_score),
        )
        for label, part in obj.components.items():
            table.add_row(
                f"  component: {label}",
                part.unit,
                _num(part.baseline, part.unit),
                _num(part.submission, part.unit),
                _ratio(part.improvement),
            )
        table.add_section()
    for name, cmp in result.improvement.items():
        table.add_row(
            name,
            cmp.unit,
            _num(cmp.baseline, cmp.unit),
            _num(cmp.submission, cmp.unit),
            _ratio(cmp.improvement),
        )

    gates = Table(title="gates", title_justify="left")
    gates.add_column("gate", style="bold")
    gates.add_column("result")
    gates.add_column("detail", overflow="fold")
    for name, g in result.gates.items():
        verdict = (
            Text("pass", style="green")
            if g.passed
            else Text("not reached", style="dim")
            if g.passed is None
            else Text("FAIL", style="bold red")
        )
        gates.add_row(name, verdict, g.detail)

    lines: list[Text] = []
    outcome = Text.assemble(
        ("outcome: ", "bold"), (result.outcome, _OUTCOME_STYLE.get(result.outcome, ""))
    )
    if result.score is not None and result.score_ci is not None:
        lo, hi = result.score_ci
        outcome.append(f"   score {result.score:.3f}x [{lo:.3f}, {hi:.3f}] (95% CI)", "bold")
    elif result.raw_score is not None and result.raw_score_ci is not None:
        lo, hi = result.raw_score_ci
        outcome.append(
            f"   leaderboard 1.000x (measured {result.raw_score:.3f}x [{lo:.3f}, {hi:.3f}])"
        )
    else:
        outcome.append("   leaderboard 1.000x")
    lines.append(outcome)
    if result.agent_error:
        lines.append(Text(f"agent error: {result.agent_error}", style="yellow"))
    if result.error:
        lines.append(Text(f"harness error: {result.error}", style="red"))
    p, b = result.process, result.budget
    limit = f" of {b.limit:,.0f}" if b.limit else ""
    best = ""
    if result.best_seen is not None and result.best_seen.improvement is not None:
        ttb = p.time_to_best
        frac = (
            f", {ttb.budget_fraction:.0%} of the budget" if ttb.budget_fraction is not None else ""
        )
        best = (
            f"; best dev {result.best_seen.improvement:.3f}x at experiment "
            f"{result.best_seen.index}{frac}"
        )
    lines.append(
        Text(
            f"{p.experiments} experiments ({p.distinct_configs} distinct configs, "
            f"{p.launch_failures} launch failures), {b.used:,.0f}{limit} "
            f"{'wall seconds' if b.unit == 'wall_seconds' else 'simulated GPU-seconds'}"
            f"{best}"
        )
    )
    if result.scoring_seed is not None:
        ev = result.evaluation
        n = len(ev.pair_workload_hashes) or ev.repeats
        why = {
            "narrow": f" (interval narrow: +/-{(ev.half_width or 0):.1%})",
            "max_repeats": f" (the pair limit; interval +/-{(ev.half_width or 0):.1%})",
            "time_budget": f" (the pairs' time budget; interval +/-{(ev.half_width or 0):.1%})",
        }.get(ev.pairs_stopped or "", "")
        lines.append(
            Text(
                f"scoring workload: {ev.workload}, seed {result.scoring_seed}, "
                f"{n} paired repeats{why}",
                style="dim",
            )
        )
    if folder is not None:
        from servegym.run_folder import TRIAL_FILE

        lines.append(Text(f"wrote {folder / TRIAL_FILE}", style="dim"))
    return Group(table, gates, *lines)


def server_place(sandbox: str) -> ServerPlace:
    """``--sandbox`` as a track's server place; one line naming the flag otherwise."""
    if sandbox not in ("local", "docker"):
        raise UserError(f"--sandbox: '{sandbox}' is not a server sandbox (local, docker)")
    return "docker" if sandbox == "docker" else "local"


def run_trial_command(
    task_id: str,
    agent: str,
    seed: int = 0,
    out: Path | None = None,
    force: bool = False,
    console: Console | None = None,
    *,
    tasks_root: Path | None = None,
    agent_options: dict[str, Any] | None = None,
    sandbox: str = "local",
) -> int:
    """Run (or show, when finished and not ``force``) one trial; returns the exit code
    (0; 1 when the harness itself failed). Raises UserError for bad input. ``tasks_root``
    is where task ids are looked up (default: the shipped tasks); ``sandbox`` where a real
    track's servers run (``local`` or ``docker``)."""
    from servegym.agents.base import make_agent
    from servegym.cli.trial_progress import RichTrialProgress
    from servegym.run_folder import TRIAL_FILE
    from servegym.runner.trial import run_trial, trial_folder
    from servegym.tasks.loader import load_task

    servers = server_place(sandbox)
    console = console or Console()
    out_dir = out if out is not None else DEFAULT_OUT
    # Bad names fail here, in one line, before any progress bar is drawn.
    loaded = load_task(task_id, tasks_root)
    make_agent(agent, **(agent_options or {}))
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        result = run_trial(
            loaded,
            agent,
            seed,
            out_dir,
            force,
            progress=RichTrialProgress(progress),
            agent_options=agent_options,
            servers=servers,
        )
    folder = trial_folder(out_dir, result.task, agent, seed)
    if result.skipped:
        console.print(
            f"trial already finished: {folder / TRIAL_FILE} (use --force to run it again)",
            highlight=False,
        )
    console.print(render_trial(result, folder))
    return 1 if result.outcome == "harness_error" else 0


def run(
    task: Annotated[str, typer.Option("--task", help="task id (see tasks/) or task folder")],
    agent: Annotated[str, typer.Option("--agent", help="agent name, e.g. default, random, tpe")],
    seed: Annotated[int, typer.Option("--seed", min=0, help="trial seed")] = 0,
    out: Annotated[Path, typer.Option("--out", help="folder for trial folders")] = Path("runs"),
    force: Annotated[
        bool, typer.Option("--force", help="run again even if the trial finished")
    ] = False,
    base_url: Annotated[
        str | None,
        typer.Option("--base-url", help="model agents: the provider's URL (openai-compatible)"),
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option("--api-key-env", help="model agents: the variable holding the API key"),
    ] = None,
    max_turns: Annotated[
        int | None, typer.Option("--max-turns", min=1, help="model agents: model calls at most")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, help="model agents: tokens per answer")
    ] = None,
    temperature: Annotated[
        float | None, typer.Option("--temperature", min=0.0, help="model agents: sampling")
    ] = None,
    reasoning_effort: Annotated[
        str | None,
        typer.Option("--reasoning-effort", help="model agents: e.g. low, medium, high"),
    ] = None,
    max_agent_tokens: Annotated[
        int | None,
        typer.Option("--max-agent-tokens", min=1, help="model agents: cap on tokens, all calls"),
    ] = None,
    max_agent_dollars: Annotated[
        float | None,
        typer.Option("--max-agent-dollars", min=0.0, help="model agents: cap on US dollars"),
    ] = None,
    script: Annotated[
        Path | None,
        typer.Option("--script", help="scripted agent: JSON Lines of tool calls (or a trajectory)"),
    ] = None,
    provider_timeout: ProviderTimeoutOption = None,
    provider_tries: ProviderTriesOption = None,
    sandbox: Annotated[
        str,
        typer.Option(
            "--sandbox",
            help="cpu and gpu tracks: where the servers run: local (the host's engine "
            "environment) or docker (containers of the engine's image; see sandbox/README.md)",
        ),
    ] = "local",
) -> None:
    """Run one trial: the agent works the task within its budget, then its submission is
    scored against the baseline on the hidden scoring workload. Agents: default, random,
    tpe, scripted (--script), a model: anthropic:MODEL, openai:MODEL,
    openai-compatible:MODEL (--base-url), or a coding CLI on a real track: claude-code,
    codex, gemini-cli (each :MODEL), opencode:PROVIDER/MODEL."""
    options = given(
        base_url=base_url,
        api_key_env=api_key_env,
        max_turns=max_turns,
        max_tokens=max_tokens,
        temperature=temperature,
        reasoning_effort=reasoning_effort,
        max_agent_tokens=max_agent_tokens,
        max_agent_dollars=max_agent_dollars,
        script=script,
        provider_timeout_s=provider_timeout,
        provider_tries=provider_tries,
    )
    code = run_trial_command(
        task, agent, seed, out, force, stdout_console, agent_options=options, sandbox=sandbox
    )
    if code:
        raise typer.Exit(code)
