"""Errors a user can cause.

Every error a user can cause is raised as a :class:`UserError` whose message names the file,
field or flag at fault. The command line prints that message as one line and exits with
code 2; it never shows a traceback for one. A message that quotes the user's input (a key
holding a newline, say) is kept on one line: control characters in it are escaped.
"""

from __future__ import annotations


def one_line(text: str) -> str:
    """``text`` with every character that is not printable (a newline, a carriage return, a
    tab, ...) written as its escape (``\\n``), so it prints as one line."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


class UserError(Exception):
    """A problem with the user's input: one line, naming what is wrong."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        message = one_line(message)
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class HarnessError(RuntimeError):
    """The harness itself failed (a measurement raised, a reference is missing, ...)."""


class BrokenTask(HarnessError):
    """The task's own baseline config does not start: the task is broken, not the agent's
    work nor the harness. Raised where the baseline is started (a :class:`HarnessError`, so
    an agent's tool call never swallows it); a trial turns it into a one-line
    :class:`UserError` naming the task (exit code 2) and records no result, and
    ``servegym task validate`` fails the task on it."""
