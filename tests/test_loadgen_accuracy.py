"""Measurement accuracy against the mock server (TTFT 50 ms, ITL 10 ms) in its own process.

TTFT and TPOT are computed from the records directly (TTFT = first token - sent; TPOT =
(last token - first token) / (output tokens - 1)). The client runs on uvloop, as
``servegym bench`` does. Also here: p99 send lag at a few hundred (and, slow, a thousand)
requests per second. Each check takes several attempts on a shared machine (see ATTEMPTS).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from servegym.loadgen.eventloop import run
from servegym.loadgen.http_target import HttpTarget
from servegym.loadgen.records import RunResult
from servegym.loadgen.target import RunOptions
from servegym.workloads.model import Workload
from servegym.workloads.spec import ArrivalSpec

if TYPE_CHECKING:
    from tests.conftest import MockProcess

# timing tests: run alone (-m timing), never beside other tests under xdist
pytestmark = pytest.mark.timing

TTFT_MS = 50.0
ITL_MS = 10.0


def measure(
    make: Callable[..., Workload], url: str, concurrency: int, requests: int, output_len: int
) -> tuple[float, float, RunResult]:
    arrival = (
        ArrivalSpec(kind="single_stream")
        if concurrency == 1
        else ArrivalSpec(kind="concurrency", concurrency=concurrency)
    )
    wl = make(
        requests + concurrency,
        prompt_len=64,
        output_len=output_len,
        arrival=arrival,
        warmup_sessions=concurrency,
    )
    res = run(HttpTarget(url).run(wl, RunOptions(model="mock")))
    meas = [r for r in res.records if not r.warmup]
    assert len(meas) == requests and all(r.ok for r in meas), [r.error for r in meas if r.error]
    ttft = [(r.first_token_ns - r.sent_ns) / 1e6 for r in meas]  # type: ignore[operator]
    tpot = [
        (r.done_ns - r.first_token_ns) / 1e6 / (r.output_tokens - 1)  # type: ignore[operator]
        for r in meas
    ]
    assert all(r.output_tokens == output_len for r in meas)
    return statistics.median(ttft), statistics.median(tpot), res


ATTEMPTS = 5
"""A timing test on a shared machine can be preempted by other work; it passes when one of
these attempts meets the bounds (each attempt is printed). When none does, it fails if this
process had a CPU to itself, and is skipped, with the numbers, if it did not."""


def cpu_share(seconds: float = 0.3) -> float:
    """The fraction of one CPU this process gets when it wants all of it."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < seconds:
        pass
    return (time.process_time() - cpu0) / (time.perf_counter() - wall0)


def fail_unless_busy(message: str) -> None:
    """Fail, unless other work was competing for the CPUs (then skip, saying so)."""
    share = cpu_share()
    load = os.getloadavg()[0]
    cpus = os.cpu_count() or 1
    if share < 0.9 or load >= cpus:
        pytest.skip(
            f"machine too busy to judge timing (load {load:.1f} on {cpus} CPUs; this process "
            f"got {share:.0%} of a CPU): {message}"
        )
    pytest.fail(message)


def within(ttft_p50: float, tpot_p50: float) -> bool:
    return abs(ttft_p50 - TTFT_MS) < 1.0 and abs(tpot_p50 - ITL_MS) < 0.2


def check_accuracy(
    make: Callable[..., Workload], url: str, concurrency: int, requests: int, output_len: int
) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs: the server and the load generator each need one")
    seen = []
    for _ in range(ATTEMPTS):
        ttft, tpot, res = measure(make, url, concurrency, requests, output_len)
        line = (
            f"c={concurrency}: TTFT p50 {ttft:.3f} ms, TPOT p50 {tpot:.4f} ms, "
            f"send lag p99 {res.loadgen.send_lag_ms_p99:.3f} ms"
        )
        print(line)
        seen.append(line)
        if within(ttft, tpot):
            return
    fail_unless_busy(
        "TTFT p50 not within 1 ms of 50 or TPOT p50 not within 0.2 ms of 10:\n" + "\n".join(seen)
    )


# Timing tests measure this virtual machine as well as the code: a burst of load from
# elsewhere can push one run out of bounds. Each test already takes several attempts; a
# rerun after a pause gives a transient stall time to pass. A systematic error still fails.
TIMING_RERUNS = pytest.mark.flaky(reruns=2, reruns_delay=5)


@TIMING_RERUNS
@pytest.mark.parametrize(("concurrency", "requests"), [(1, 6), (64, 192)])
def test_accuracy_quick(
    timed_mock: MockProcess,
    make_single_turn: Callable[..., Workload],
    concurrency: int,
    requests: int,
) -> None:
    check_accuracy(make_single_turn, timed_mock.url, concurrency, requests, output_len=32)


@TIMING_RERUNS
@pytest.mark.slow
@pytest.mark.parametrize(("concurrency", "requests"), [(1, 30), (64, 640)])
def test_accuracy_full(
    timed_mock: MockProcess,
    make_single_turn: Callable[..., Workload],
    concurrency: int,
    requests: int,
) -> None:
    check_accuracy(make_single_turn, timed_mock.url, concurrency, requests, output_len=64)


def send_lag_p99(make: Callable[..., Workload], url: str, rate: float, seconds: float) -> float:
    n = int(rate * seconds)
    wl = make(
        n,
        prompt_len=32,
        output_len=4,
        offsets=[i / rate for i in range(n)],
        arrival=ArrivalSpec(kind="constant", rate=rate),
    )
    res = run(HttpTarget(url).run(wl, RunOptions(model="mock")))
    assert all(r.ok for r in res.records)
    p99 = res.loadgen.send_lag_ms_p99
    print(f"{rate:g} req/s: send lag p50 {res.loadgen.send_lag_ms_p50:.3f} p99 {p99:.3f} ms")
    return p99


@TIMING_RERUNS
@pytest.mark.parametrize(
    ("rate", "seconds"), [(300, 1.0), pytest.param(1000, 4.0, marks=pytest.mark.slow)]
)
def test_send_lag_stays_under_a_millisecond(
    fast_mock: MockProcess, make_single_turn: Callable[..., Workload], rate: float, seconds: float
) -> None:
    seen = []
    for _ in range(ATTEMPTS):
        p99 = send_lag_p99(make_single_turn, fast_mock.url, rate, seconds)
        seen.append(p99)
        if p99 < 1.0:
            return
    fail_unless_busy(f"p99 send lag over 1 ms at {rate:g} req/s in every attempt: {seen}")
