"""Benchmarking a real server: launch it for a config, run workloads against it, stop it.

This is what the cpu and gpu tracks do for every experiment and for the final evaluation:
check the config (a rejected one never launches), start the server on a free port, wait
until it is ready, run each workload through the ``http`` target while watching the process,
and stop it. Each step's failure is an outcome with a one-line message, never an exception
that loses what was measured: a server that dies mid-run is reported as ``crashed`` with the
records of every request that had finished.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import urlsplit

import aiohttp
from pydantic import BaseModel, Field

from servegym.engines.base import Engine, LaunchSpec, ModelRef, sampled_gauges
from servegym.engines.capabilities import ConfigRejected
from servegym.engines.compile_cache import discard_named
from servegym.engines.config import ServingConfig
from servegym.engines.process import (
    ExitInfo,
    Phase,
    ServerCrashed,
    ServerError,
    ServerProcess,
    ServerUnresponsive,
    free_port,
    read_tail,
)
from servegym.errors import UserError
from servegym.loadgen.http_target import HttpTarget
from servegym.loadgen.records import RunResult
from servegym.loadgen.target import ProgressFn, RunOptions
from servegym.workloads.model import Workload

Outcome = Literal["ok", "rejected", "launch_failed", "crashed"]
DEATH_CONFIRM_S = 0.1
"""How long a request that got no HTTP answer waits for the server's exit to show."""
_log = logging.getLogger(__name__)
PORT_RETRIES = 3
"""New ports to try when another process took the free port before the server bound it."""


class ServedRun(BaseModel):
    """What happened to one config: its outcome, and each workload's result."""

    outcome: Outcome
    message: str = ""
    engine: str
    config: ServingConfig
    command: str = Field(default="", description="the launch command line, for the record")
    start_s: float | None = Field(default=None, description="seconds until the server was ready")
    results: list[RunResult] = Field(default_factory=list)
    exit: ExitInfo | None = None
    log_path: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


class ManagedServer:
    """A server for one config on a free port: ``async with ManagedServer(...) as s``."""

    runs_launcher = False
    """Whether a workspace's launcher, not the harness, chose the server's command (its
    processes are then checked for the pinned environment)."""

    def __init__(
        self,
        engine: Engine,
        config: ServingConfig,
        model: ModelRef,
        log_path: Path,
        *,
        port: int | None = None,
        start_timeout_s: float = 300.0,
    ) -> None:
        self.engine = engine
        self.config = config
        self.model = model
        self.log_path = log_path
        self.port = port
        self.start_timeout_s = start_timeout_s
        self.process: ServerProcess | None = None

    def spec(self, port: int) -> LaunchSpec:
        return self.engine.launch_spec(self.config, self.model, port)

    def check(self) -> None:
        """Raise ConfigRejected for a config the engine's table refuses."""
        self.engine.check(self.config)

    def new_process(self, spec: LaunchSpec) -> ServerProcess:
        """The process that runs ``spec`` (a container's, in the Docker sandbox's subclass)."""
        return ServerProcess(spec, self.log_path, start_timeout_s=self.start_timeout_s)

    @property
    def label(self) -> str:
        return self.engine.name

    async def start(self) -> ServerProcess:
        """Check, launch and wait for readiness; raises ConfigRejected or ServerError.

        A start is tried again on another free port when its port was taken, and once more
        when it failed on a binary of its compile cache (discarded first, see
        :func:`~servegym.engines.compile_cache.discard_named`)."""
        self.check()
        tries = 1 if self.port is not None else PORT_RETRIES
        attempt, rebuilt = 0, False
        while True:
            port = self.port if self.port is not None else free_port()
            spec = self.spec(port)
            proc = self.new_process(spec)
            self.process = proc
            proc.start()
            try:
                await proc.wait_ready()
                return proc
            except ServerError as e:
                await asyncio.to_thread(proc.stop)
                log_text = read_tail(self.log_path, 400)
                if not rebuilt and (gone := discard_named(spec.compile_caches, log_text)):
                    rebuilt = True
                    with self.log_path.open("a") as log:
                        for d in gone:
                            _log.warning("%s", d.describe())
                            log.write(f"servegym: {d.describe()}; starting again\n")
                    continue
                attempt += 1
                taken = "Address already in use" in (e.exit_info.log_tail if e.exit_info else "")
                if not taken or attempt >= tries:
                    raise

    async def stop(self) -> ExitInfo | None:
        if self.process is None:
            return None
        return await asyncio.to_thread(self.process.stop)

    async def __aenter__(self) -> ServerProcess:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class ScriptServer(ManagedServer):
    """A server started by a workspace's launcher script in a sandbox (the real tracks'
    submissions): the same lifecycle as a config's server, with no table to check (what
    the script runs is the agent's business; whether it serves honestly is measured)."""

    runs_launcher = True

    def __init__(
        self,
        sandbox: LauncherSandbox,
        script: str,
        model: ModelRef,
        log_path: Path,
        *,
        port: int | None = None,
        start_timeout_s: float = 300.0,
    ) -> None:
        self.sandbox = sandbox
        self.script = script
        self.model = model
        self.log_path = log_path
        self.port = port
        self.start_timeout_s = start_timeout_s
        self.process = None
        self.config = ServingConfig()

    @property
    def label(self) -> str:
        return self.script

    def spec(self, port: int) -> LaunchSpec:
        return self.sandbox.launch_spec(self.script, port)

    def check(self) -> None:
        return None


class AttachedProcess(ServerProcess):
    """A server the harness did not start: it never exits as far as the harness can tell
    (a dead one shows as a server that stops answering), and stopping it does nothing."""

    def __init__(self, spec: LaunchSpec, log_path: Path) -> None:
        super().__init__(spec, log_path)
        self.ready_after_s = 0.0

    def poll(self, phase: Phase = "run") -> ExitInfo | None:
        return None

    async def wait_exit(self, interval_s: float = 0.2) -> ExitInfo:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    def stop(self, grace_s: float = 15.0) -> ExitInfo | None:
        return None


class AttachedServer(ManagedServer):
    """An already running server at ``base_url`` (``http://HOST:PORT``): "starting" it
    checks that it answers ``/v1/models`` and serves the model's name."""

    def __init__(self, base_url: str, model: ModelRef, log_path: Path) -> None:
        parsed = urlsplit(base_url)
        if parsed.scheme != "http" or not parsed.hostname or parsed.port is None:
            raise UserError(f"--base-url: '{base_url}' is not http://HOST:PORT")
        self.host, self.attached_port = parsed.hostname, parsed.port
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.log_path = log_path
        self.port = parsed.port
        self.start_timeout_s = 0.0
        self.process = None
        self.config = ServingConfig()

    @property
    def label(self) -> str:
        return "external"

    def spec(self, port: int) -> LaunchSpec:
        return LaunchSpec(engine="external", argv=[], host=self.host, port=port, model=self.model)

    def check(self) -> None:
        return None

    async def start(self) -> ServerProcess:
        spec = self.spec(self.attached_port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(f"attached to {self.base_url} (not started by the harness)\n")
        timeout = aiohttp.ClientTimeout(total=10)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.get(spec.base_url + "/v1/models") as resp,
            ):
                body = await resp.json(content_type=None) if resp.status == 200 else None
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            raise ServerCrashed(
                f"{self.base_url} does not answer: {type(e).__name__}", None, self.log_path
            ) from None
        if status != 200:
            raise ServerCrashed(
                f"{self.base_url}/v1/models answered HTTP {status}", None, self.log_path
            )
        names = [m.get("id") for m in (body or {}).get("data", []) if isinstance(m, dict)]
        if self.model.served_name not in names:
            raise ServerCrashed(
                f"{self.base_url} does not serve '{self.model.served_name}' "
                f"(it serves: {', '.join(map(str, names)) or 'nothing'})",
                None,
                self.log_path,
            )
        proc = AttachedProcess(spec, self.log_path)
        self.process = proc
        return proc

    async def stop(self) -> ExitInfo | None:
        return None


class LauncherSandbox(Protocol):
    def launch_spec(self, script: str, port: int, *, engine: str = ...) -> LaunchSpec: ...


async def run_watched(
    server: ServerProcess,
    workload: Workload,
    options: RunOptions,
    progress: ProgressFn | None = None,
) -> tuple[RunResult, ExitInfo | None]:
    """Run ``workload`` against ``server``; if the process exits meanwhile, stop sending,
    let the requests in flight fail, and return the result with how the server ended.

    A server that is dead before the run starts gives an empty result and its exit; one
    that is alive but does not answer raises :class:`ServerUnresponsive`.
    """

    async def server_died(status: int | None) -> str | None:
        info = server.poll()
        if info is None and status is None:
            # No HTTP answer: a killed server closes its sockets a moment before the kernel
            # reports its exit; wait that moment out rather than fire more requests at it.
            deadline = time.monotonic() + DEATH_CONFIRM_S
            while info is None and time.monotonic() < deadline:
                await asyncio.sleep(0.002)
                info = server.poll()
        return info.describe() if info is not None else None

    if (info := server.poll()) is not None:
        return _empty_result(server, workload, options, info.describe()), info
    target = HttpTarget(server.spec.base_url, on_failure=server_died, gauges=sampled_gauges())
    run = asyncio.create_task(target.run(workload, options, progress))
    watch = asyncio.create_task(server.wait_exit())
    try:
        done, _ = await asyncio.wait({run, watch}, return_when=asyncio.FIRST_COMPLETED)
        if watch in done:
            target.abort(watch.result().describe())
        try:
            result = await run
        except UserError as e:  # the reachability check before the first request
            info = server.poll()
            if info is None:
                raise ServerUnresponsive(
                    f"{server.spec.engine}: {e.message}", None, server.log_path
                ) from None
            return _empty_result(server, workload, options, info.describe()), info
    finally:
        watch.cancel()
        if not run.done():
            run.cancel()
    return result, server.poll()


def _empty_result(
    server: ServerProcess, workload: Workload, options: RunOptions, why: str
) -> RunResult:
    """The result of a run that could not start: no request was sent."""
    from datetime import UTC, datetime

    return RunResult(
        target=server.spec.base_url,
        model=options.model,
        workload=workload.spec.name,
        workload_hash=workload.content_hash(),
        seed=workload.seed,
        started_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        duration_s=0.0,
        records=[],
        stopped_early=f"aborted: {why}",
    )


async def benchmark_config(
    engine: Engine,
    config: ServingConfig,
    model: ModelRef,
    workloads: Sequence[Workload],
    options: RunOptions,
    log_path: Path,
    *,
    start_timeout_s: float = 300.0,
    progress: ProgressFn | None = None,
    on_ready: Callable[[ServerProcess], None] | None = None,
) -> ServedRun:
    """Launch ``config`` once and run each workload in turn; see the module docstring.

    ``on_ready`` is called with the running server before the first workload (to print its
    address, or in tests to reach its process)."""
    managed = ManagedServer(engine, config, model, log_path, start_timeout_s=start_timeout_s)
    return await benchmark_server(managed, workloads, options, progress=progress, on_ready=on_ready)


async def benchmark_server(
    managed: ManagedServer,
    workloads: Sequence[Workload],
    options: RunOptions,
    *,
    progress: ProgressFn | None = None,
    on_ready: Callable[[ServerProcess], None] | None = None,
) -> ServedRun:
    """:func:`benchmark_config` for any managed server (a config's, or a launcher's)."""
    log_path = managed.log_path
    base = {"engine": managed.label, "config": managed.config, "log_path": str(log_path)}
    try:
        server = await managed.start()
    except ConfigRejected as e:
        return ServedRun(outcome="rejected", message=e.message, **base)  # type: ignore[arg-type]
    except ServerError as e:
        command = managed.process.spec.shell_line() if managed.process else ""
        return ServedRun(
            outcome="launch_failed",
            message=e.message,
            exit=e.exit_info,
            command=command,
            **base,  # type: ignore[arg-type]
        )
    out = ServedRun(
        outcome="ok",
        start_s=server.ready_after_s,
        command=server.spec.shell_line(),
        **base,  # type: ignore[arg-type]
    )
    try:
        if on_ready is not None:
            on_ready(server)
        for workload in workloads:
            try:
                result, exit_info = await run_watched(server, workload, options, progress)
            except ServerUnresponsive as e:
                out.outcome, out.message = "crashed", f"{e.message}; log: {log_path}"
                break
            out.results.append(result)
            if exit_info is not None:
                out.outcome = "crashed"
                out.exit = exit_info
                out.message = f"{exit_info.describe()}; log: {log_path}"
                break
    finally:
        stopped = await managed.stop()
        if out.outcome == "ok" and stopped is not None and not stopped.stopped_by_harness:
            out.outcome, out.exit = "crashed", stopped
            out.message = f"{stopped.describe()}; log: {log_path}"
    return out
