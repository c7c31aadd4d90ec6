"""``servegym sim``: one workload on the simulated engine, and ``--list`` of what it knows."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from servegym.cli.console import console, err_console
from servegym.cli.options import (
    ConfigOption,
    KnobSetOption,
    RequestsOption,
    ScaleOption,
    SeedOption,
)
from servegym.errors import UserError


def sim(
    model: Annotated[
        str | None, typer.Option("--model", help="model id, e.g. llama-3.1-8b")
    ] = None,
    hardware: Annotated[
        str | None, typer.Option("--hardware", help="hardware id, e.g. h100-sxm")
    ] = None,
    workload: Annotated[
        str | None, typer.Option("--workload", help="workload name or .toml path")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="run folder to write")] = None,
    seed: SeedOption = 0,
    config: ConfigOption = None,
    set_: KnobSetOption = None,
    workload_set: Annotated[
        list[str] | None,
        typer.Option("--workload-set", help="workload field override: key=value (repeatable)"),
    ] = None,
    requests: RequestsOption = None,
    scale: ScaleOption = None,
    sla: Annotated[
        str | None, typer.Option("--sla", help="SLOs, e.g. ttft_ms=200,tpot_ms=50")
    ] = None,
    no_noise: Annotated[
        bool, typer.Option("--no-noise", help="turn the seeded measurement noise off")
    ] = False,
    list_: Annotated[
        bool, typer.Option("--list", help="list models, hardware and knobs with defaults")
    ] = False,
) -> None:
    """Run a workload on the simulated engine (virtual time, seconds, deterministic)."""
    from servegym.cli.render import render_metrics, render_sim_catalogue, render_sim_stats
    from servegym.engines.sim.launch import LaunchError
    from servegym.runner.sim_run import SimRequest, run_sim
    from servegym.scoring.metrics import SLA

    if list_:
        from servegym.engines.sim.profiles import get_hardware, get_model

        # A name given with --list is checked like anywhere else, not silently ignored.
        if model is not None:
            get_model(model)
        if hardware is not None:
            get_hardware(hardware)
        console.print(render_sim_catalogue(model, hardware))
        return
    missing = [
        flag
        for flag, value in (
            ("--model", model),
            ("--hardware", hardware),
            ("--workload", workload),
            ("--out", out),
        )
        if not value  # an empty --model "" is as missing as none
    ]
    if missing:
        raise UserError(f"servegym sim needs {', '.join(missing)} (or --list)")
    assert model and hardware and workload and out
    request = SimRequest(
        model=model,
        hardware=hardware,
        workload=workload,
        out=out,
        seed=seed,
        config_file=config,
        overrides=set_ or [],
        workload_overrides=workload_set or [],
        requests=requests,
        scale=scale,
        sla=SLA.parse(sla) if sla else None,
        noise=not no_noise,
    )
    try:
        outcome = run_sim(request)
    except LaunchError as e:
        err_console.print(
            f"[bold red]launch failed:[/] {escape(e.message)}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(e.exit_code) from None
    console.print(render_metrics(outcome.metrics, title=outcome.title))
    console.print(render_sim_stats(outcome.stats))
    console.print(f"wrote {outcome.out}/{{run.json,requests.jsonl,metrics.json,sim.json}}")
