"""The ``servegym`` command: the root app, its entry point and how errors end.

Every error a user can cause ends in one line naming what is wrong and exit code 2
(:class:`servegym.errors.UserError`); nothing here prints a traceback for one.
"""

from __future__ import annotations

import errno
import signal
import sys
from typing import NoReturn

import typer

from servegym.cli import (
    bench,
    doctor,
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
app.command("doctor")(doctor.doctor)


_STOPPED_BY: list[int] = []
"""The signals that stopped the command (SIGINT, SIGTERM), for its last line."""

_SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
_SIGNAL_WORDS = {
    signal.SIGINT: "interrupted (SIGINT, Ctrl-C)",
    signal.SIGTERM: "terminated (SIGTERM)",
}

_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG}
"""What the file system says when a folder is full, read-only or not the user's: the
user's to fix, so one line naming the file (exit 2) wherever in a command it surfaces (the
commands word the ones they expect themselves; this is the net under the rest)."""


def _stop(signum: int, frame: object) -> None:
    """SIGINT and SIGTERM unwind like Ctrl-C (every server a command started is stopped on
    the way out); the signal is remembered for the closing line."""
    _STOPPED_BY.append(signum)
    raise KeyboardInterrupt


def _stopped() -> NoReturn:
    signum = _STOPPED_BY[0] if _STOPPED_BY else signal.SIGINT
    err_console.print(
        f"servegym: {_SIGNAL_WORDS[signal.Signals(signum)]}: stopped",
        highlight=False,
    )
    sys.exit(_SIGNAL_EXIT[signal.Signals(signum)])


def main() -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2, and a
    signal into one line and 130 (SIGINT) or 143 (SIGTERM).

    Usage errors (a bad flag or flag value) are Typer's own: one message, exit code 2.
    """
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        app()
    except UserError as e:
        print_user_error(e)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        _stopped()
    except SystemExit as e:
        # Typer turns KeyboardInterrupt into a silent exit 130: say why the command stopped
        if e.code == 130 and _STOPPED_BY:
            _stopped()
        raise
    except OSError as e:
        if e.errno not in _WRITE_ERRORS:
            raise
        where = f"{e.filename}: " if e.filename else ""
        print_user_error(UserError(f"{where}{e.strerror or e}"))
        sys.exit(2)


if __name__ == "__main__":
    main()
