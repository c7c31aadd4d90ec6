"""Each run of a real evaluation starts with the other side's servers quiet, and one that
will not go quiet is paused for the run (servegym.sandbox.quiet), on real processes."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import servegym.sandbox.quiet as quiet
from servegym.engines.base import LaunchSpec, ModelRef
from servegym.engines.process import ServerProcess, free_port
from servegym.sandbox.quiet import QuietRuns, tree_cpu_seconds, wait_until_quiet

MODEL = ModelRef(path="/nonexistent", served_name="stand-in")
SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"
"""Python that keeps a core busy for ``s`` seconds (then sleeps, as an idle server does)."""


@pytest.fixture
def spinner(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Started processes of ``SPIN`` in their own groups, each stopped after the test."""
    made: list[ServerProcess] = []
    yield made
    for proc in made:
        proc.stop(grace_s=2.0)


def start_spinner(made: list[ServerProcess], tmp_path: Path, busy_s: float) -> ServerProcess:
    code = SPIN.format(s=busy_s) + "time.sleep(3600)\n"
    spec = LaunchSpec(
        engine="spinner", argv=[sys.executable, "-c", code], port=free_port(), model=MODEL
    )
    proc = ServerProcess(spec, tmp_path / f"spinner-{len(made)}.log")
    proc.start()
    made.append(proc)
    return proc


def leader(proc: ServerProcess) -> int:
    pid = proc.leader_pid()
    assert pid is not None
    return pid


async def test_a_server_that_stops_spinning_is_waited_for(
    spinner: list[ServerProcess], tmp_path: Path
) -> None:
    """vLLM's worker spins for a second after its run; the wait ends soon after it does."""
    proc = start_spinner(spinner, tmp_path, busy_s=1.0)
    start = time.monotonic()
    assert await wait_until_quiet([leader(proc)], timeout_s=5.0)
    assert 0.6 <= time.monotonic() - start < 3.0
    assert await wait_until_quiet([])  # nothing else up: quiet at once


async def test_a_server_that_never_goes_quiet_is_paused_for_the_run_and_resumed(
    spinner: list[ServerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server spinning while idle (by design, or to slow the side it is compared with)
    takes no CPU time during the other side's run."""
    monkeypatch.setattr(quiet, "QUIET_TIMEOUT_S", 0.5)
    busy = start_spinner(spinner, tmp_path, busy_s=3600)
    idle = start_spinner(spinner, tmp_path, busy_s=0)
    runs = QuietRuns()
    await asyncio.sleep(0.3)
    async with runs.alone([busy, idle]):
        assert busy.paused and idle.paused  # the others of the run, all of them
        before = tree_cpu_seconds([leader(busy)])
        await asyncio.sleep(0.5)
        assert tree_cpu_seconds([leader(busy)]) - before < 0.05  # stopped: no CPU time
    assert not busy.paused and not idle.paused
    before = tree_cpu_seconds([leader(busy)])
    await asyncio.sleep(0.5)
    assert tree_cpu_seconds([leader(busy)]) - before > 0.2  # running again
    assert runs.runs == 1 and runs.paused_runs == 1 and runs.waited_s >= 0.5


async def test_a_quiet_neighbour_is_not_paused_and_a_paused_server_still_stops(
    spinner: list[ServerProcess], tmp_path: Path
) -> None:
    idle = start_spinner(spinner, tmp_path, busy_s=0)
    runs = QuietRuns()
    await asyncio.sleep(0.3)
    async with runs.alone([idle]):
        assert not idle.paused
    assert runs.paused_runs == 0 and runs.waited_s < 1.0
    idle.pause()
    assert idle.paused
    info = idle.stop(grace_s=2.0)  # SIGTERM reaches it: stop continues it first
    assert info is not None and not idle.running
