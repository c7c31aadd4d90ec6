"""``servegym score``: the final evaluation of a server that is already running."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from servegym.cli.console import console, err_console


def score(
    task: Annotated[str, typer.Option("--task", help="a cpu- or gpu-track task id or folder")],
    base_url: Annotated[
        str, typer.Option("--base-url", help="the running server, http://HOST:PORT")
    ],
    out: Annotated[Path, typer.Option("--out", help="folder for the trial folder")] = Path("runs"),
    seed: Annotated[int, typer.Option("--seed", min=0, help="which hidden sample")] = 0,
) -> None:
    """Score a server that is already running: the task's final evaluation (hidden
    workload, gates, paired comparison with the baseline, which the harness launches)."""
    from servegym.cli.run import render_trial
    from servegym.runner.score_server import AGENT, score_server
    from servegym.runner.trial import trial_folder

    with err_console.status(f"scoring {base_url} on {task}"):
        result = score_server(task, base_url, out, seed=seed)
    console.print(render_trial(result, trial_folder(out, result.task, AGENT, seed)))
    if result.outcome == "harness_error":
        raise typer.Exit(1)
