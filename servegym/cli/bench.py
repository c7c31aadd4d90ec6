"""``servegym bench``: one workload against one server, with a progress bar."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from servegym.cli.console import console, err_console
from servegym.cli.options import RequestsOption, ScaleOption, SeedOption, SetOption
from servegym.errors import UserError


class RichBenchProgress:
    """A :class:`~servegym.runner.bench.BenchProgress` drawn as a transient Rich bar."""

    def __init__(self, console: Console) -> None:
        self.console = console

    @contextmanager
    def running(
        self, workload: str, base_url: str, total: int
    ) -> Iterator[Callable[[int, int], None]]:
        with Progress(
            TextColumn(f"[bold]{workload}[/] → {base_url}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        ) as progress:
            task = progress.add_task("requests", total=total)

            def on_progress(done: int, of: int) -> None:
                progress.update(task, completed=done, total=of)

            yield on_progress


def bench(
    workload: Annotated[str, typer.Option("--workload", help="workload name or .toml path")],
    out: Annotated[Path, typer.Option("--out", help="folder for metrics.json, requests.jsonl")],
    base_url: Annotated[
        str | None,
        typer.Option("--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000"),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="model name (default: the server's first)")
    ] = None,
    mock: Annotated[
        str | None,
        typer.Option(
            "--mock",
            help="start a local mock server for this run instead of --base-url, "
            "e.g. 'ttft_ms=50,itl_ms=10'",
        ),
    ] = None,
    seed: SeedOption = 0,
    set_: SetOption = None,
    requests: RequestsOption = None,
    scale: ScaleOption = None,
    sla: Annotated[
        str | None, typer.Option("--sla", help="SLOs, e.g. ttft_ms=200,tpot_ms=50,e2e_ms=10000")
    ] = None,
    price_per_hour: Annotated[
        float | None, typer.Option("--price-per-hour", min=0.0, help="$ per GPU-hour")
    ] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs the server uses")] = 1,
    tokenizer: Annotated[
        str | None,
        typer.Option("--tokenizer", help="tokenizer.json (or its folder) for recounts and text"),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.001, help="per-request timeout, seconds")
    ] = 600.0,
    keep_outputs: Annotated[
        bool, typer.Option("--keep-outputs", help="store output text and ids in requests.jsonl")
    ] = False,
) -> None:
    """Run a workload against an OpenAI-compatible server and write its metrics."""
    from servegym.cli.render import render_metrics
    from servegym.runner.bench import BenchRequest, run_bench
    from servegym.scoring.metrics import SLA, Price

    if (base_url is None) == (mock is None):
        raise UserError("give exactly one of --base-url URL or --mock SETTINGS")
    request = BenchRequest(
        workload=workload,
        overrides=set_ or [],
        seed=seed,
        requests=requests,
        scale=scale,
        base_url=base_url,
        mock=mock,
        model=model,
        sla=SLA.parse(sla) if sla else None,
        price=Price(price_per_hour=price_per_hour, gpus=gpus)
        if price_per_hour is not None
        else None,
        tokenizer=tokenizer,
        timeout_s=timeout,
        keep_outputs=keep_outputs,
        out=out,
    )
    outcome = run_bench(request, progress=RichBenchProgress(err_console))
    console.print(render_metrics(outcome.metrics, title=outcome.title))
    for note in outcome.notes:
        err_console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    console.print(f"wrote {outcome.metrics_path} and {outcome.requests_path}")
