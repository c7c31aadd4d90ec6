"""The ``servegym`` command: every typer and rich import of the package lives here.

The other packages export plain functions and data; the modules here turn command-line
flags into calls of them and their results into terminal output. One module per command
(or command group); :mod:`servegym.cli.root` assembles the app. Importing this package
stays cheap (``servegym --help`` imports no pandas, optuna, SDK or engine): every command
imports what it runs inside its function.
"""

from servegym.cli.root import app, main

__all__ = ["app", "main"]
