"""``servegym sweep``: run a grid of trials with a progress display, then a summary.

The display shows trials done, running and failed, with the time left estimated from the
trials finished so far (skipped ones, already finished by an earlier run, do not count
towards the estimate). The summary counts outcomes per agent and says how many finished
trials were skipped.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from servegym.cli.console import console as stdout_console
from servegym.cli.options import ProviderTimeoutOption, ProviderTriesOption, given
from servegym.errors import UserError

if TYPE_CHECKING:
    from servegym.runner.executors import Executor, TrialOutcome
    from servegym.runner.sweep import SweepConfig, Track, TrialSpec


class _Display:
    """The sweep's :class:`~servegym.runner.executors.SweepEvents`, drawn with Rich."""

    def __init__(self, progress: Progress, total: int) -> None:
        self.progress = progress
        self.bar = progress.add_task("trials", total=total)
        self.running = 0
        self.failed = 0
        self.done = 0
        self.ran = 0
        self.ran_seconds = 0.0
        self.t0 = time.monotonic()
        self._refresh()

    def _refresh(self) -> None:
        total = self.progress.tasks[self.bar].total or 0
        left = total - self.done
        eta = ""
        if self.ran and left:
            per = (time.monotonic() - self.t0) / self.ran
            eta = f", about {_duration(per * left)} left"
        self.progress.update(
            self.bar,
            completed=self.done,
            description=f"{self.running} running, {self.failed} failed{eta}",
        )

    def started(self, spec: TrialSpec) -> None:
        self.running += 1
        self._refresh()

    def finished(self, spec: TrialSpec, outcome: TrialOutcome) -> None:
        self.running -= 1
        self.done += 1
        if outcome.failed:
            self.failed += 1
            self.progress.console.print(
                f"[red]failed[/] {spec.key}: {outcome.error or outcome.outcome}", highlight=False
            )
        if not outcome.skipped:
            self.ran += 1
        self._refresh()


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def run_sweep_command(
    tasks: str,
    agents: str,
    seeds: int,
    out: Path,
    console: Console,
    *,
    executor: str = "local",
    max_concurrent: int | None = None,
    address: str | None = None,
    track: Track | None = None,
    agent_options: dict[str, Any] | None = None,
    tasks_root: Path | None = None,
) -> int:
    """Run the sweep; returns the exit code (1 when a trial failed, else 0)."""
    from servegym.runner.executors import make_executor
    from servegym.runner.sweep import build_config, hold_run_dir

    config, tracks = build_config(
        tasks.split(","),
        agents.split(","),
        seeds,
        track=track,
        agent_options=agent_options,
        tasks_root=tasks_root,
    )
    settings: dict[str, Any] = {"max_concurrent": max_concurrent}
    if executor == "ray":
        settings["address"] = address
    runner = make_executor(executor, **settings)
    with hold_run_dir(out):  # one driver per folder; a second one is refused in one line
        return _run_grid(runner, executor, config, tracks, out, console)


def _run_grid(
    runner: Executor,
    executor: str,
    config: SweepConfig,
    tracks: dict[str, Track],
    out: Path,
    console: Console,
) -> int:
    from servegym.runner.sweep import claim_run_dir, is_finished

    resumed = claim_run_dir(out, config)
    specs = config.grid(tracks)
    finished = {s.key for s in specs if is_finished(out, s)}
    already = [s for s in specs if s.key in finished]
    todo = [s for s in specs if s.key not in finished]
    console.print(
        f"sweep {config.digest()}: {len(config.tasks)} tasks x {len(config.agents)} agents x "
        f"{len(config.seeds)} seeds = {len(specs)} trials on '{executor}'"
        + (f"; resuming, {len(already)} finished already" if resumed else ""),
        highlight=False,
    )
    with Progress(
        TextColumn("[bold]sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        display = _Display(progress, len(todo))
        outcomes = runner.run(todo, out, config, display)
    _summary(console, outcomes, len(already))
    return 1 if any(o.failed for o in outcomes) else 0


def _summary(console: Console, outcomes: list[TrialOutcome], finished_before: int) -> None:
    table = Table(title="sweep outcomes")
    table.add_column("agent")
    kinds = sorted({o.outcome for o in outcomes})
    for k in kinds:
        table.add_column(k, justify="right")
    per_agent: dict[str, Counter[str]] = {}
    for o in outcomes:
        per_agent.setdefault(o.agent, Counter())[o.outcome] += 1
    for agent, counts in per_agent.items():
        table.add_row(agent, *(str(counts.get(k, 0)) for k in kinds))
    if outcomes:
        console.print(table)
    skipped = sum(1 for o in outcomes if o.skipped) + finished_before
    console.print(
        f"{len(outcomes)} trials run, {skipped} finished trials skipped (not run again)",
        highlight=False,
    )


def sweep(
    tasks: Annotated[
        str, typer.Option("--tasks", help="task id patterns, comma-separated (e.g. '*')")
    ],
    agents: Annotated[str, typer.Option("--agents", help="agents, comma-separated")],
    out: Annotated[Path, typer.Option("--out", help="the sweep's run folder")],
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="seeds 0..N-1 per cell")] = 1,
    executor: Annotated[
        str, typer.Option("--executor", help="local (worker processes) or ray")
    ] = "local",
    max_concurrent: Annotated[
        int | None, typer.Option("--max-concurrent", min=1, help="trials at once")
    ] = None,
    address: Annotated[
        str | None, typer.Option("--address", help="ray: an existing cluster's address")
    ] = None,
    track: Annotated[
        str | None, typer.Option("--track", help="only tasks of this track: sim, cpu, gpu")
    ] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="model agents: the provider's URL")
    ] = None,
    api_key_env: Annotated[
        str | None, typer.Option("--api-key-env", help="model agents: the key's variable")
    ] = None,
    max_turns: Annotated[
        int | None, typer.Option("--max-turns", min=1, help="model agents: calls at most")
    ] = None,
    max_agent_dollars: Annotated[
        float | None, typer.Option("--max-agent-dollars", min=0.0, help="model agents: cap")
    ] = None,
    provider_timeout: ProviderTimeoutOption = None,
    provider_tries: ProviderTriesOption = None,
) -> None:
    """Run every trial of tasks x agents x seeds into one folder; re-running the same
    command resumes (finished trials are skipped, partial ones restarted)."""
    from servegym.tasks.spec import track_names

    if track is not None and track not in track_names():
        raise UserError(f"--track must be one of {', '.join(track_names())}, not '{track}'")
    if executor != "ray" and address is not None:
        raise UserError("--address is for --executor ray")
    options = given(
        base_url=base_url,
        api_key_env=api_key_env,
        max_turns=max_turns,
        max_agent_dollars=max_agent_dollars,
        provider_timeout_s=provider_timeout,
        provider_tries=provider_tries,
    )
    code = run_sweep_command(
        tasks,
        agents,
        seeds,
        out,
        stdout_console,
        executor=executor,
        max_concurrent=max_concurrent,
        address=address,
        track=track,
        agent_options=options,
    )
    if code:
        raise typer.Exit(code)
