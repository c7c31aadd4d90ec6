"""``servegym doctor [--track gpu|cpu|sim]``: what this host has for each track, what each
is missing, and the command that fixes each (:mod:`servegym.runner.doctor` looks and
judges; this draws). Exit code 1 when the asked track cannot run here."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from servegym.cli.console import console as stdout_console
from servegym.errors import UserError


def render_doctor(
    checks: list[tuple[str, bool, str, str]], tracks: dict[str, list[tuple[str, str]]]
) -> tuple[Table, list[Text]]:
    """The table of checks (item, ok, found, tracks that need it) and, per track, its
    verdict and each missing item's fix."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="this host", title_justify="left")
    table.add_column("", width=1, no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("found", overflow="fold", ratio=1)
    table.add_column("for", no_wrap=True)
    for item, ok, found, needed in checks:
        mark = Text("✓", style="green") if ok else Text("✗", style="red" if needed else "yellow")
        table.add_row(mark, Text(item), Text(found), Text(needed or "optional"))
    lines: list[Text] = []
    for track, missing in tracks.items():
        if not missing:
            lines.append(Text.assemble((f"{track}: ", "bold"), ("ready", "green")))
            continue
        names = ", ".join(item for item, _ in missing)
        lines.append(Text.assemble((f"{track}: ", "bold"), ("cannot run", "red"), f": {names}"))
        for item, fix in missing:
            for step in fix.split("; "):  # one command a line
                lines.append(Text(f"  fix {item}: {step}"))
    return table, lines


def doctor(
    track: Annotated[
        str | None,
        typer.Option("--track", help="the track to judge: gpu, cpu or sim (default: all)"),
    ] = None,
) -> None:
    """What this host has (GPUs, driver, NVIDIA container runtime, Docker, images, models,
    disk), what each track is missing, and the command that fixes it."""
    from servegym.runner.doctor import TRACK_NAMES, diagnose, probe_host

    if track is not None and track not in TRACK_NAMES:
        raise UserError(f"--track {track}: no such track (known: {', '.join(TRACK_NAMES)})")
    diagnosis = diagnose(probe_host())
    asked = [track] if track is not None else list(TRACK_NAMES)
    rows = [
        (c.item, c.ok, c.found, ", ".join(c.needed_by))
        for c in diagnosis.checks
        if track is None or track in c.needed_by or not c.needed_by
    ]
    verdicts = {t: [(c.item, c.fix) for c in diagnosis.missing(t)] for t in asked}
    out: Console = stdout_console
    table, lines = render_doctor(rows, verdicts)
    out.print(table)
    for line in lines:
        out.print(line, soft_wrap=False)
    if track is not None and verdicts[track]:
        raise typer.Exit(1)
