"""Errors a user can cause.

Every error a user can cause is raised as a :class:`UserError` whose message names the file,
field or flag at fault. The command line prints that message as one line and exits with
code 2; it never shows a traceback for one.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input: one line, naming what is wrong."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
