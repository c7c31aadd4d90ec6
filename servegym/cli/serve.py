"""``servegym serve``: one real server in the foreground until interrupted."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from servegym.cli.console import console as stdout_console
from servegym.cli.console import err_console
from servegym.cli.options import ConfigOption, KnobSetOption

if TYPE_CHECKING:
    from servegym.engines.base import LaunchSpec


def serve_spec(
    engine_name: str,
    model: str,
    config_file: Path | None,
    overrides: list[str],
    port: int | None,
    host_addr: str = "127.0.0.1",
) -> LaunchSpec:
    """The checked launch spec ``serve`` would run (``--dry-run`` prints it)."""
    from servegym.engines.base import get_engine
    from servegym.engines.config_file import load_serving_config
    from servegym.engines.models import resolve_model
    from servegym.engines.process import free_port

    engine = get_engine(engine_name)
    config = load_serving_config(config_file, overrides)
    ref = resolve_model(model)
    return engine.launch_spec(config, ref, port or free_port(host_addr), host_addr=host_addr)


async def _serve(spec: LaunchSpec, log: Path, timeout_s: float, console: Console) -> int:
    from servegym.engines.process import ServerError, ServerProcess

    server = ServerProcess(spec, log, start_timeout_s=timeout_s)
    server.start()
    try:
        with console.status(f"starting {spec.engine} (log: {log})"):
            took = await server.wait_ready()
        console.print(
            f"[bold green]ready[/] in {took:.1f} s: {spec.base_url}/v1 "
            f"serving [bold]{spec.model.served_name}[/] (log: {log}); Ctrl-C stops it"
        )
        info = await server.wait_exit(interval_s=0.5)
        console.print(f"[bold red]{info.describe()}[/]\n{info.log_tail}", highlight=False)
        return 3
    except ServerError as e:
        tail = e.exit_info.log_tail if e.exit_info else server.log_tail()
        console.print(f"[bold red]{e.message}[/]\n{tail}", highlight=False)
        return 3
    finally:
        await asyncio.to_thread(server.stop)


def run_server(spec: LaunchSpec, log: Path | None, timeout_s: float, console: Console) -> int:
    """Run the server until Ctrl-C (exit 0 then) or until it dies (exit 3)."""
    if log is None:
        log = Path(tempfile.mkdtemp(prefix="servegym-serve-")) / "server.log"
    console.print(f"$ {spec.shell_line()}", highlight=False, soft_wrap=True)
    try:
        return asyncio.run(_serve(spec, log, timeout_s, console))
    except KeyboardInterrupt:
        console.print("stopped")
        return 0


def serve(
    engine: Annotated[str, typer.Option("--engine", help="vllm, vllm-cpu or sglang")],
    model: Annotated[str, typer.Option("--model", help="model folder, hub id, or servegym-tiny")],
    config: ConfigOption = None,
    set_: KnobSetOption = None,
    port: Annotated[
        int | None, typer.Option("--port", min=1, max=65535, help="port (default: a free one)")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
    log: Annotated[
        Path | None, typer.Option("--log", help="server log file (default: a temp folder)")
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1.0, help="start-up timeout, seconds")
    ] = 600.0,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="check the config and print the command only")
    ] = False,
) -> None:
    """Run one real server in the foreground until interrupted."""
    spec = serve_spec(engine, model, config, set_ or [], port, host)
    if dry_run:
        stdout_console.print(spec.shell_line(), highlight=False, soft_wrap=True)
        return
    code = run_server(spec, log, timeout, err_console)
    if code:
        raise typer.Exit(code)
