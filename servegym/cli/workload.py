"""``servegym workload list | show``."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from servegym.cli.console import console
from servegym.cli.options import RequestsOption, ScaleOption, SeedOption, SetOption

workload_app = typer.Typer(help="List and inspect workloads.", no_args_is_help=True)


@workload_app.command("list")
def workload_list() -> None:
    """List the workloads that ship with ServeGym."""
    from servegym.cli.render import render_workload_list
    from servegym.workloads.registry import list_workloads

    console.print(render_workload_list(list_workloads()))


@workload_app.command("show")
def workload_show(
    name: Annotated[str, typer.Argument(help="workload name or path to a .toml file")],
    seed: SeedOption = 0,
    set_: SetOption = None,
    requests: RequestsOption = None,
    scale: ScaleOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Materialise a workload and show its counts, length percentiles and content hash."""
    from servegym.cli.render import render_workload_summary
    from servegym.workloads.generate import materialise
    from servegym.workloads.registry import load_spec
    from servegym.workloads.summary import summarise

    spec, base_dir = load_spec(name, set_ or [], requests=requests, scale=scale)
    summary = summarise(materialise(spec, seed, base_dir=base_dir))
    if as_json:
        sys.stdout.write(summary.model_dump_json(indent=2) + "\n")
    else:
        console.print(render_workload_summary(spec, seed, summary))
