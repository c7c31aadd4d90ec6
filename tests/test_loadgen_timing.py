"""Precise waits and the event-loop helper."""

from __future__ import annotations

import asyncio
import statistics
from time import perf_counter_ns

import pytest

from servegym.loadgen.eventloop import run, uvloop_available
from servegym.loadgen.timing import PreciseScheduler

# measures this machine's timer as well as the code: run alone (-m timing), never under xdist
pytestmark = pytest.mark.timing


async def test_callbacks_run_in_deadline_order_never_early() -> None:
    sched = PreciseScheduler()
    now = perf_counter_ns()
    deadlines = [now + d * 1_000_000 for d in (9, 3, 6, 3, 12, 1)]
    fired: list[tuple[int, int]] = []
    done = asyncio.Event()

    def make(deadline: int):  # type: ignore[no-untyped-def]
        def cb() -> None:
            fired.append((deadline, perf_counter_ns()))
            if len(fired) == len(deadlines):
                done.set()

        return cb

    for d in deadlines:
        sched.call_at(d, make(d))
    await asyncio.wait_for(done.wait(), 2)
    assert [d for d, _ in fired] == sorted(deadlines)
    assert all(t >= d for d, t in fired)
    await sched.close()


async def test_sleep_until_is_precise() -> None:
    sched = PreciseScheduler()
    late = []
    for i in range(40):
        deadline = perf_counter_ns() + 2_000_000 + i * 10_000
        await sched.sleep_until(deadline)
        late.append(perf_counter_ns() - deadline)
    assert min(late) >= 0
    # a busy shared test machine can preempt us now and then; the median tells the design
    assert statistics.median(late) < 200_000
    await sched.sleep_until(perf_counter_ns() - 1)  # past deadlines return at once
    await sched.close()


async def test_an_earlier_deadline_interrupts_a_coarse_wait() -> None:
    sched = PreciseScheduler()
    far = asyncio.create_task(sched.sleep_until(perf_counter_ns() + 500_000_000))
    await asyncio.sleep(0.01)
    t0 = perf_counter_ns()
    await sched.sleep_until(t0 + 5_000_000)
    assert perf_counter_ns() - t0 < 100_000_000
    far.cancel()
    await sched.close()


def test_run_uses_uvloop_when_available() -> None:
    async def loop_name() -> str:
        return type(asyncio.get_running_loop()).__module__

    name = run(loop_name())
    assert ("uvloop" in name) == uvloop_available()
    assert "uvloop" not in run(loop_name(), use_uvloop=False)
