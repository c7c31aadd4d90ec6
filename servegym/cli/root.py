"""The ``servegym`` command: the root app, its entry point and how errors end.

Every error a user can cause ends in one line naming what is wrong and exit code 2
(:class:`servegym.errors.UserError`); nothing here prints a traceback for one.
"""

from __future__ import annotations

import signal
import sys

import typer

from servegym.cli import (
    bench,
    judge,
    leaderboard,
    mock_server,
    run,
    score,
    serve,
    sim,
    sweep,
)
from servegym.cli.console import err_console, print_user_error
from servegym.cli.pipeline import pipeline_app
from servegym.cli.setup import setup_app
from servegym.cli.task import task_app
from servegym.cli.workload import workload_app
from servegym.errors import UserError

app = typer.Typer(
    name="servegym",
    help="ServeGym: a benchmark of AI agents as LLM-serving engineers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(workload_app, name="workload")
app.add_typer(task_app, name="task")
app.add_typer(pipeline_app, name="pipeline")
app.command("mock-server")(mock_server.mock_server)
app.command("bench")(bench.bench)
app.command("sim")(sim.sim)
app.command("run")(run.run)
app.command("score")(score.score)
app.command("sweep")(sweep.sweep)
app.add_typer(setup_app, name="setup")
app.command("serve")(serve.serve)
app.command("judge")(judge.judge)
app.command("leaderboard")(leaderboard.leaderboard)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2.

    Usage errors (a bad flag or flag value) are Typer's own: one message, exit code 2.
    """
    # SIGTERM unwinds like Ctrl-C, so every server a command started is stopped on the way out.
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app()
    except UserError as e:
        print_user_error(e)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
