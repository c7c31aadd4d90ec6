"""``servegym serve``: one real server in the foreground until interrupted."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from rich.console import Console

from servegym.engines.base import LaunchSpec, get_engine
from servegym.engines.config_file import load_serving_config
from servegym.engines.models import resolve_model
from servegym.engines.process import ServerError, ServerProcess, free_port


def serve_spec(
    engine_name: str,
    model: str,
    config_file: Path | None,
    overrides: list[str],
    port: int | None,
    host_addr: str = "127.0.0.1",
) -> LaunchSpec:
    """The checked launch spec ``serve`` would run (``--dry-run`` prints it)."""
    engine = get_engine(engine_name)
    config = load_serving_config(config_file, overrides)
    ref = resolve_model(model)
    return engine.launch_spec(config, ref, port or free_port(host_addr), host_addr=host_addr)


async def _serve(spec: LaunchSpec, log: Path, timeout_s: float, console: Console) -> int:
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


def serve(spec: LaunchSpec, log: Path | None, timeout_s: float, console: Console) -> int:
    """Run the server until Ctrl-C (exit 0 then) or until it dies (exit 3)."""
    if log is None:
        log = Path(tempfile.mkdtemp(prefix="servegym-serve-")) / "server.log"
    console.print(f"$ {spec.shell_line()}", highlight=False, soft_wrap=True)
    try:
        return asyncio.run(_serve(spec, log, timeout_s, console))
    except KeyboardInterrupt:
        console.print("stopped")
        return 0
