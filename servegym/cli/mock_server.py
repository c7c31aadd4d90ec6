"""``servegym mock-server``: a local OpenAI-compatible server with exact timing."""

from __future__ import annotations

from typing import Annotated

import typer


def mock_server(
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="0 picks a free port")
    ] = 8000,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    ttft_ms: Annotated[float, typer.Option("--ttft-ms", min=0.0)] = 50.0,
    itl_ms: Annotated[float, typer.Option("--itl-ms", min=0.0)] = 10.0,
    tokens_per_chunk: Annotated[int, typer.Option("--tokens-per-chunk", min=1)] = 1,
    model: Annotated[str, typer.Option("--model", help="model name served")] = "mock",
    any_model: Annotated[
        bool, typer.Option("--any-model", help="accept any model name in requests")
    ] = False,
    fault: Annotated[
        list[str] | None,
        typer.Option(
            "--fault",
            help="fault for every request, e.g. error_after=3 or empty_first_chunk (repeatable)",
        ),
    ] = None,
) -> None:
    """Run a local OpenAI-compatible streaming server with known, exact timing."""
    from servegym.loadgen.mock_server import main as mock_main

    argv = [
        "--host", host, "--port", str(port), "--ttft-ms", str(ttft_ms),
        "--itl-ms", str(itl_ms), "--tokens-per-chunk", str(tokens_per_chunk), "--model", model,
    ]  # fmt: skip
    if any_model:
        argv.append("--any-model")
    for f in fault or []:
        argv += ["--fault", f]
    raise typer.Exit(mock_main(argv))
