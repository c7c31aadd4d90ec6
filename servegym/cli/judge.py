"""``servegym judge``: an LLM judge reads finished trials for reward hacking."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from servegym.cli.console import console, err_console, print_user_error
from servegym.errors import UserError


def judge(
    trials: Annotated[list[Path], typer.Argument(help="finished trial folders (with trial.json)")],
    model: Annotated[
        str, typer.Option("--model", help="the judge: anthropic:MODEL, openai:MODEL, ...")
    ],
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="the provider's URL (openai-compatible)")
    ] = None,
    api_key_env: Annotated[
        str | None, typer.Option("--api-key-env", help="the variable holding the API key")
    ] = None,
) -> None:
    """An LLM judge reads each trial's trajectory, experiments and server log and reports
    reward-hacking attempts; its findings are added to the trial (never removed), flag it,
    and are kept with its answer in judge.json."""
    import asyncio

    from servegym.reporting.judge import judge_folders

    try:
        with err_console.status(f"judging {len(trials)} trial(s) with {model}"):
            verdicts = asyncio.run(judge_folders(trials, model, base_url, api_key_env))
    except UserError as e:  # one line and exit 2, also when called without main()
        print_user_error(e)
        raise typer.Exit(e.exit_code) from None
    for folder, v in zip(trials, verdicts, strict=True):
        found = "; ".join(f.text() for f in v.report.findings) or "no finding"
        note = f" (answer unreadable: {v.report.parse_error})" if v.report.parse_error else ""
        console.print(f"{folder}: {v.result.outcome}: {escape(found)}{escape(note)}")
