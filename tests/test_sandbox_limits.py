"""The Docker sandbox's limits, checked from inside a real container: no network, the memory
limit (and the OOM killer past it), the CPU quota (and throttling under it); and containers
removed when their owner ends, by SIGTERM or killed outright (SIGKILL: the next run removes
them). Marked ``docker``: they skip, saying why, where no engine answers. Each is seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from servegym.sandbox.docker_runner import (
    ContainerSpec,
    DockerRunner,
    RunningContainer,
    owner_alive,
)
from servegym.sandbox.images import LOCAL_BASE

pytestmark = pytest.mark.docker

CANDIDATES = (LOCAL_BASE, "servegym/cli-agents", "busybox:1.36", "debian:bookworm-slim")
LABELS = {"test": "test_sandbox_limits"}


@pytest.fixture(scope="module")
def engine() -> DockerRunner:
    runner = DockerRunner()
    reason = runner.available()
    if reason is not None:
        pytest.skip(reason)
    return runner


@pytest.fixture(scope="module")
def image(engine: DockerRunner) -> str:
    """An image with a POSIX shell already on the engine (none is pulled here)."""
    client = engine.client()
    for tag in CANDIDATES:
        try:
            client.images.get(tag)
        except Exception:
            continue
        return tag
    pytest.skip(f"none of {', '.join(CANDIDATES)} is on the engine (servegym setup images)")


@pytest.fixture
def started(engine: DockerRunner) -> Iterator[list[RunningContainer]]:
    out: list[RunningContainer] = []
    yield out
    for running in out:
        running.stop(timeout_s=1)


def run_to_end(
    engine: DockerRunner, spec: ContainerSpec, started: list[RunningContainer], limit_s: float = 60
) -> tuple[int, bool, str]:
    """Start ``spec``, wait for its end; (exit code, OOM-killed, output)."""
    running = engine.start(spec)
    started.append(running)
    deadline = time.monotonic() + limit_s
    while (status := running.exit_status()) is None:
        assert time.monotonic() < deadline, "the container did not end"
        time.sleep(0.2)
    return status.exit_code, status.oom_killed, running.logs_tail(200)


def shell(image: str, script: str, **limits: object) -> ContainerSpec:
    return ContainerSpec(
        image=image,
        entrypoint=["sh", "-c", script],
        labels=LABELS,
        **limits,  # type: ignore[arg-type]
    )


def test_no_network_inside(
    engine: DockerRunner, image: str, started: list[RunningContainer]
) -> None:
    script = "ls /sys/class/net; cat /etc/resolv.conf 2>/dev/null | grep -c nameserver || true"
    code, _, out = run_to_end(engine, shell(image, script), started)
    assert code == 0
    interfaces = out.split()[:-1]
    assert interfaces == ["lo"]  # loopback alone: no route anywhere


def test_memory_limit_holds_and_the_oom_killer_acts_past_it(
    engine: DockerRunner, image: str, started: list[RunningContainer]
) -> None:
    read = (
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null "
        "|| cat /sys/fs/cgroup/memory.max"
    )
    code, _, out = run_to_end(engine, shell(image, read, mem_limit="64m"), started)
    assert code == 0 and out.split()[-1] == str(64 * 1024 * 1024)
    # tail holds its whole (newline-free) input in memory: 512 MiB of it cannot fit.
    hog = "head -c 536870912 /dev/zero | tail > /dev/null; echo survived"
    code, oom, out = run_to_end(engine, shell(image, hog, mem_limit="64m"), started)
    assert oom or code == 137 or "survived" not in out, out


def test_cpu_quota_holds_and_throttles(
    engine: DockerRunner, image: str, started: list[RunningContainer]
) -> None:
    script = (
        "end=$(($(date +%s) + 2)); while [ $(date +%s) -lt $end ]; do :; done; "
        "cd /sys/fs/cgroup; if [ -f cpu.max ]; then cat cpu.max cpu.stat; "
        "else cat cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us cpu/cpu.stat; fi"
    )
    code, _, out = run_to_end(engine, shell(image, script, cpus=0.25), started)
    assert code == 0, out
    words = out.split()
    quota, period = int(words[0]), int(words[1])
    assert quota / period == pytest.approx(0.25)
    throttled = int(words[words.index("nr_throttled") + 1])
    assert throttled > 0  # the busy loop ran into the quota


def test_a_paused_container_takes_no_cpu_until_it_is_resumed(
    engine: DockerRunner, image: str, started: list[RunningContainer]
) -> None:
    """What the final evaluation does to a side that will not go quiet while the other side
    is measured (servegym.sandbox.quiet): ``docker pause`` freezes it, ``unpause`` lets it
    run on, and a paused container still stops."""
    from servegym.sandbox.quiet import tree_cpu_seconds

    running = engine.start(shell(image, "while :; do :; done"))
    started.append(running)
    pid = running.host_pid()
    assert pid is not None

    def used_over(seconds: float) -> float:
        before = tree_cpu_seconds([pid])
        time.sleep(seconds)
        return tree_cpu_seconds([pid]) - before

    assert used_over(0.5) > 0.2  # spinning
    running.pause()
    assert used_over(0.5) < 0.05
    running.unpause()
    assert used_over(0.5) > 0.2
    running.pause()
    assert running.stop(timeout_s=1).exit_code is not None  # paused, it still stops


HOLDER = """
import signal, sys, time
from servegym.sandbox.docker_runner import ContainerSpec, DockerRunner

def stop(*_):
    raise KeyboardInterrupt

signal.signal(signal.SIGTERM, stop)
spec = ContainerSpec(image=sys.argv[1], entrypoint=["sleep", "300"], labels={"test": "limits"})
with DockerRunner().start(spec) as running:
    try:  # from the print on: the test signals as soon as it reads the id
        print(running.id, flush=True)
        if sys.argv[2] == "sigkill":
            import os
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
    except KeyboardInterrupt:
        pass
"""


def hold(image: str, how: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, image, how], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def gone(engine: DockerRunner, container_id: str) -> bool:
    return engine.client().containers.list(all=True, filters={"id": container_id}) == []


def test_a_container_is_removed_when_its_owner_is_terminated(
    engine: DockerRunner, image: str
) -> None:
    proc, container_id = hold(image, "sigterm")
    assert container_id and not gone(engine, container_id)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert gone(engine, container_id)


def test_a_killed_owners_container_is_removed_as_an_orphan(
    engine: DockerRunner, image: str
) -> None:
    proc, container_id = hold(image, "sigkill")
    assert proc.wait(30) == -signal.SIGKILL
    assert container_id and not gone(engine, container_id)  # nothing could stop it
    removed = engine.cleanup_orphans()
    assert gone(engine, container_id) and removed


def test_owner_alive() -> None:
    import socket

    assert owner_alive(f"{socket.gethostname()}:{os.getpid()}")
    assert not owner_alive(f"{socket.gethostname()}:999999999")
    assert owner_alive("another-host:1")
