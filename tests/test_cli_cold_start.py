"""``servegym --help`` stays cheap: importing the command line and building its help
(the root's and every group's) imports no heavy library. Each command imports what it runs
inside its function; ``benchmarks/cli_cold_start.py`` measures the CPU time."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("pandas", "optuna", "anthropic", "openai", "matplotlib", "ray", "aiohttp", "scipy")

_PROBE = """
import json, sys
import click
import typer.main
import servegym.cli

command = typer.main.get_command(servegym.cli.app)
ctx = click.Context(command, info_name="servegym")
command.get_help(ctx)
names = list(command.list_commands(ctx))
for name in names:
    sub = command.get_command(ctx, name)
    sub_ctx = click.Context(sub, info_name=name, parent=ctx)
    sub.get_help(sub_ctx)
    if isinstance(sub, click.Group):
        for inner in sub.list_commands(sub_ctx):
            leaf = sub.get_command(sub_ctx, inner)
            leaf.get_help(click.Context(leaf, info_name=inner, parent=sub_ctx))
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))
print(json.dumps({"commands": names, "heavy": heavy}))
"""


def test_help_imports_nothing_heavy() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *HEAVY], capture_output=True, text=True, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])  # after the help texts
    assert {"run", "sweep", "task", "leaderboard", "bench", "sim"} <= set(found["commands"])
    assert found["heavy"] == []


def test_importing_the_command_line_imports_no_servegym_package_below_it() -> None:
    """``import servegym.cli`` loads the cli package (and ``servegym.errors``) alone: the
    runner, tasks, scoring and engines come in when a command runs."""
    code = (
        "import sys, servegym.cli; "
        "print(sorted(m for m in sys.modules if m.startswith('servegym.') "
        "and not m.startswith('servegym.cli')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['servegym.errors']"
