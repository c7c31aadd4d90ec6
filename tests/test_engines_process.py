"""A server's lifecycle (:mod:`servegym.engines.process`) and benchmarking a config on a real
server (:mod:`servegym.engines.served`), with stand-in servers instead of vLLM: small Python
scripts that crash, hang, ignore SIGTERM or leave workers behind, and the mock server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from engine_support import StandInEngine

from servegym.engines.base import LaunchSpec, ModelRef
from servegym.engines.config import ServingConfig
from servegym.engines.process import (
    ServerCrashed,
    ServerProcess,
    ServerStartTimeout,
    free_port,
    read_tail,
)
from servegym.engines.served import ServedRun, benchmark_config
from servegym.loadgen.target import RunOptions
from servegym.workloads.model import Workload
from servegym.workloads.spec import ArrivalSpec

MODEL = ModelRef(path="mock", served_name="mock")

STAND_IN = textwrap.dedent(
    """\
    # A stand-in server: answers /health and /v1/models; flags change how it behaves.
    import http.server, json, os, signal, subprocess, sys, time

    args = sys.argv[2:]
    port = int(sys.argv[1])
    if "--ignore-term" in args:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "--child" in args:
        # a worker in the same process group that outlives SIGTERM
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        with open(args[args.index("--child") + 1], "w") as f:
            f.write(str(child.pid))
    if "--crash" in args:
        print("ValueError: unknown flag --bogus", flush=True)
        sys.exit(1)
    if "--oom" in args:
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)
    if "--hang" in args:
        time.sleep(600)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path in ("/health", "/v1/models"):
                body = json.dumps({"data": [{"id": "mock"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_error(404)

        def log_message(self, *a):
            pass

    print("serving", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    path = tmp_path / "stand_in.py"
    path.write_text(STAND_IN)
    return path


def spec_for(argv: list[str], port: int, engine: str = "stand-in") -> LaunchSpec:
    return LaunchSpec(engine=engine, argv=argv, port=port, model=MODEL, env={"X_TEST": "1"})


@pytest.fixture
def make_server(tmp_path: Path, stand_in: Path) -> Iterator[Callable[..., ServerProcess]]:
    """ServerProcesses of the stand-in (``flags``), every one stopped after the test."""
    made: list[ServerProcess] = []

    def make(*flags: str, start_timeout_s: float = 20.0) -> ServerProcess:
        port = free_port()
        argv = [sys.executable, str(stand_in), str(port), *flags]
        server = ServerProcess(
            spec_for(argv, port), tmp_path / f"log{len(made)}.txt", start_timeout_s=start_timeout_s
        )
        made.append(server)
        return server

    yield make
    for s in made:
        s.stop(grace_s=1.0)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def group_members(pgid: int) -> list[int]:
    """Live processes of group ``pgid`` (zombies nobody reaped yet are not counted)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def assert_group_gone(pgid: int) -> None:
    assert group_members(pgid) == []
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return
    # only unreaped zombies (of a reparented worker) may remain
    assert group_members(pgid) == []


# --- ServerProcess --------------------------------------------------------------------------


async def test_start_wait_and_stop_leaves_no_process(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server()
    async with server:
        assert server.running and server.pgid == server.proc.pid  # type: ignore[union-attr]
        assert server.ready_after_s is not None and server.ready_after_s > 0
        assert server.poll() is None
        pgid = server.pgid
    assert pgid is not None
    assert not server.running
    info = server.poll()
    assert info is not None and info.stopped_by_harness
    assert info.describe() == "stopped by the harness"
    assert not pid_alive(pgid)
    assert_group_gone(pgid)
    log = server.log_path.read_text()
    assert log.startswith("$ X_TEST=1 ") and "serving" in log
    assert server.stop() is info  # a second stop is harmless


async def test_exit_at_start_is_a_crash_with_the_log_tail(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server("--crash")
    server.start()
    with pytest.raises(ServerCrashed) as info:
        await server.wait_ready()
    e = info.value
    assert e.exit_info is not None
    assert e.exit_info.phase == "start" and e.exit_info.returncode == 1
    assert e.exit_info.signal is None and not e.exit_info.oom
    assert not e.exit_info.stopped_by_harness
    assert "unknown flag --bogus" in e.exit_info.log_tail
    assert "stand-in" in e.message and "during start-up: exit code 1" in e.message
    assert str(server.log_path) in e.message and e.log_path == server.log_path


async def test_out_of_memory_is_recognised(make_server: Callable[..., ServerProcess]) -> None:
    server = make_server("--oom")
    server.start()
    with pytest.raises(ServerCrashed) as info:
        await server.wait_ready()
    assert info.value.exit_info is not None and info.value.exit_info.oom
    assert "(out of memory)" in info.value.exit_info.describe()


async def test_a_server_that_never_answers_times_out_and_is_stopped(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server("--hang", start_timeout_s=1.0)
    server.start()
    pgid = server.pgid
    assert pgid is not None
    t0 = time.monotonic()
    with pytest.raises(ServerStartTimeout) as info:
        await server.wait_ready()
    assert time.monotonic() - t0 < 30
    assert "did not become ready within 1 s" in info.value.message
    assert_group_gone(pgid)
    assert not server.running


async def test_a_missing_program_fails_to_start(tmp_path: Path) -> None:
    spec = spec_for([str(tmp_path / "no-such-program")], free_port())
    server = ServerProcess(spec, tmp_path / "log.txt")
    with pytest.raises(ServerCrashed) as info:
        server.start()
    assert info.value.exit_info is not None and info.value.exit_info.returncode == 127
    assert "could not be started" in info.value.message


async def test_sigkill_mid_run_is_reported(make_server: Callable[..., ServerProcess]) -> None:
    server = make_server()
    await server.__aenter__()
    try:
        assert server.pgid is not None
        os.killpg(server.pgid, signal.SIGKILL)
        info = await asyncio.wait_for(server.wait_exit(interval_s=0.05), 10)
    finally:
        await server.__aexit__(None, None, None)
    assert info.signal == "SIGKILL" and info.returncode == -signal.SIGKILL
    assert info.phase == "run" and not info.stopped_by_harness
    assert "mid-run" in info.describe() and "SIGKILL" in info.describe()
    assert not info.oom and "not by the harness" in info.describe()  # a guess is not a fact
    assert server.poll() is info


async def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server("--ignore-term")
    await server.__aenter__()
    pgid = server.pgid
    assert pgid is not None
    t0 = time.monotonic()
    info = await asyncio.to_thread(server.stop, 0.5)
    assert time.monotonic() - t0 < 30
    assert info is not None and info.signal == "SIGKILL" and info.stopped_by_harness
    assert_group_gone(pgid)


async def test_stop_kills_workers_that_outlive_the_leader(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    server = make_server("--child", str(pid_file))
    await server.__aenter__()
    pgid = server.pgid
    assert pgid is not None
    child = int(pid_file.read_text())
    try:
        assert os.getpgid(child) == pgid and pid_alive(child)
        assert sorted(group_members(pgid)) == sorted([pgid, child])
        info = await asyncio.to_thread(server.stop, 0.5)
        assert info is not None and info.signal == "SIGTERM" and info.stopped_by_harness
        assert not pid_alive(child)  # it ignored SIGTERM: SIGKILLed once the grace ran out
        assert_group_gone(pgid)
    finally:
        # never leave it behind when a check failed (but only if the pid is still ours)
        with contextlib.suppress(ProcessLookupError):
            if pid_alive(child) and os.getpgid(child) == pgid:
                os.kill(child, signal.SIGKILL)


def test_read_tail(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert read_tail(log, lines=3) == "line 97\nline 98\nline 99"
    assert read_tail(tmp_path / "missing") == ""


# --- benchmark_config -----------------------------------------------------------------------


OPTIONS = RunOptions(model="mock", request_timeout_s=30)


def closed_loop(
    make_single_turn: Callable[..., Workload], n: int, output_len: int = 8, concurrency: int = 4
) -> Workload:
    arrival = ArrivalSpec(kind="concurrency", concurrency=concurrency)
    return make_single_turn(n, output_len=output_len, arrival=arrival)  # type: ignore[no-any-return]


async def test_a_rejected_config_never_launches(
    tmp_path: Path, make_single_turn: Callable[..., Workload]
) -> None:
    engine = StandInEngine(tmp_path / "pid")
    log = tmp_path / "server.log"
    out = await benchmark_config(
        engine, ServingConfig(block_size=16), MODEL, [closed_loop(make_single_turn, 2)],
        OPTIONS, log,
    )  # fmt: skip
    assert out.outcome == "rejected" and not out.ok
    assert out.message.startswith("stand-in cannot run this config: block_size")
    assert engine.launches == 0 and out.command == "" and out.results == []
    assert not log.exists() and not (tmp_path / "pid").exists()


async def test_a_server_that_exits_at_start_is_a_launch_failure(
    tmp_path: Path, make_single_turn: Callable[..., Workload], stand_in: Path
) -> None:
    engine = StandInEngine(tmp_path / "pid", [sys.executable, str(stand_in)])
    engine.render_args = lambda c, m, h, p: [str(p), "--crash"]  # type: ignore[method-assign]
    out = await benchmark_config(
        engine, ServingConfig(), MODEL, [closed_loop(make_single_turn, 2)], OPTIONS,
        tmp_path / "server.log", start_timeout_s=20,
    )  # fmt: skip
    assert out.outcome == "launch_failed"
    assert out.exit is not None and out.exit.phase == "start" and out.exit.returncode == 1
    assert "unknown flag --bogus" in out.exit.log_tail
    assert "--crash" in out.command and out.results == []
    assert engine.launches == 1  # a crash that is not a taken port is not retried


def open_loop(make_single_turn: Callable[..., Workload], n: int, rate: float) -> Workload:
    """``n`` requests at a constant ``rate`` per second, 20 tokens each."""
    offsets = [i / rate for i in range(n)]
    arrival = ArrivalSpec(kind="constant", rate=rate)
    return make_single_turn(n, output_len=20, offsets=offsets, arrival=arrival)  # type: ignore[no-any-return]


async def run_and_kill(
    tmp_path: Path, workload: Workload, name: str, after_done: int = 8
) -> ServedRun:
    """Benchmark ``workload`` on the mock server; SIGKILL the server's process group once
    ``after_done`` requests have finished."""
    pid_file = tmp_path / f"{name}.pid"
    progress: list[int] = []

    async def kill_after_some_finished() -> None:
        while not progress or progress[-1] < after_done:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        os.killpg(int(pid_file.read_text()), signal.SIGKILL)

    killer = asyncio.create_task(kill_after_some_finished())
    try:
        out = await benchmark_config(
            StandInEngine(pid_file), ServingConfig(), MODEL, [workload], OPTIONS,
            tmp_path / f"{name}.log", start_timeout_s=30,
            progress=lambda done, total: progress.append(done),
        )  # fmt: skip
    finally:
        killer.cancel()
    assert killer.done() and not killer.cancelled(), "the run ended before the kill"
    return out


async def test_a_server_killed_mid_run_keeps_what_finished_and_the_harness_goes_on(
    tmp_path: Path, make_single_turn: Callable[..., Workload]
) -> None:
    n = 400  # 40 a second: 10 s if nothing stopped it
    out = await run_and_kill(tmp_path, open_loop(make_single_turn, n, rate=40), "crash")
    assert out.outcome == "crashed" and not out.ok
    assert out.exit is not None and out.exit.signal == "SIGKILL"
    assert not out.exit.stopped_by_harness and out.exit.phase == "run"
    assert "SIGKILL" in out.message and "mid-run" in out.message
    assert str(tmp_path / "crash.log") in out.message
    (result,) = out.results
    assert result.stopped_early is not None and result.stopped_early.startswith("aborted:")
    assert "SIGKILL" in result.stopped_early
    finished = [r for r in result.records if r.ok]
    assert len(finished) >= 8
    assert len(result.records) < n / 2
    assert_group_gone(int((tmp_path / "crash.pid").read_text()))

    # the harness carries on: the next config launches and runs each of its workloads
    pid2 = tmp_path / "again.pid"
    workloads = [closed_loop(make_single_turn, 6), closed_loop(make_single_turn, 4)]
    again = await benchmark_config(
        StandInEngine(pid2), ServingConfig(block_size=32), MODEL, workloads, OPTIONS,
        tmp_path / "again.log", start_timeout_s=30,
    )  # fmt: skip
    assert again.outcome == "ok" and again.ok, again.message
    assert again.engine == "stand-in" and again.exit is None and again.message == ""
    assert again.start_s is not None and again.start_s > 0
    assert "servegym.loadgen.mock_server" in again.command
    assert [len(r.records) for r in again.results] == [6, 4]
    assert all(r.ok for res in again.results for r in res.records)
    assert all(res.stopped_early is None for res in again.results)
    assert any(k.startswith("vllm:") for k in again.results[0].server_metrics_delta)
    assert_group_gone(int(pid2.read_text()))


async def test_a_closed_loop_sends_nothing_after_the_server_died(
    tmp_path: Path, make_single_turn: Callable[..., Workload]
) -> None:
    out = await run_and_kill(tmp_path, closed_loop(make_single_turn, 200, output_len=20), "closed")
    assert out.outcome == "crashed"
    (result,) = out.results
    assert result.stopped_early is not None and result.stopped_early.startswith("aborted:")
    refused = [r for r in result.records if r.error and r.error.startswith("connect failed")]
    assert len(refused) <= 4  # at most one per closed-loop slot


async def test_a_server_dead_before_the_run_gives_an_empty_result_and_its_exit(
    tmp_path: Path, make_single_turn: Callable[..., Workload]
) -> None:
    from servegym.engines.served import ManagedServer, run_watched

    engine = StandInEngine(tmp_path / "pid")
    managed = ManagedServer(engine, ServingConfig(), MODEL, tmp_path / "server.log")
    server = await managed.start()
    try:
        assert server.pgid is not None
        os.killpg(server.pgid, signal.SIGKILL)
        await asyncio.wait_for(server.wait_exit(interval_s=0.02), 10)
        result, info = await run_watched(server, closed_loop(make_single_turn, 4), OPTIONS)
    finally:
        await managed.stop()
    assert info is not None and info.signal == "SIGKILL"
    assert result.records == [] and result.stopped_early is not None
    assert result.stopped_early.startswith("aborted:")
