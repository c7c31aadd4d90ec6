"""The consoles every command prints to, and the one line a user error prints."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from servegym.errors import UserError

console = Console()
err_console = Console(stderr=True)


def print_user_error(e: UserError) -> None:
    """The one line a user error prints: ``error: <message>`` (the message is not markup)."""
    err_console.print(f"[bold red]error:[/] {escape(e.message)}", highlight=False, soft_wrap=True)
