"""Aborting a run (``HttpTarget.abort``, as the harness does when the server dies): no new
request is sent, every finished one keeps its record, and the result says why it stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from servegym.loadgen.http_target import HttpTarget
from servegym.loadgen.records import RunResult
from servegym.loadgen.target import RunOptions
from servegym.workloads.model import Workload
from servegym.workloads.spec import ArrivalSpec

if TYPE_CHECKING:
    from tests.conftest import MockFactory

OPTIONS = RunOptions(model="mock")


async def run_and_abort(
    target: HttpTarget, workload: Workload, after_done: int, reason: str
) -> RunResult:
    """Run ``workload``; abort once ``after_done`` requests have finished."""
    done: list[int] = []

    async def abort_later() -> None:
        while not done or done[-1] < after_done:
            await asyncio.sleep(0.01)
        target.abort(reason)

    aborter = asyncio.create_task(abort_later())
    try:
        result = await target.run(workload, OPTIONS, lambda d, total: done.append(d))
    finally:
        aborter.cancel()
    assert aborter.done() and not aborter.cancelled(), "the run ended before the abort"
    return result


async def test_abort_in_a_closed_loop(
    mock_factory: MockFactory, make_single_turn: Callable[..., Workload]
) -> None:
    server = await mock_factory(ttft_ms=5.0, itl_ms=2.0)
    n = 300  # 2 at a time, 45 ms each: about 7 s unaborted
    wl = make_single_turn(n, output_len=20, arrival=ArrivalSpec(kind="concurrency", concurrency=2))
    target = HttpTarget(server.url)
    res = await run_and_abort(target, wl, after_done=6, reason="server died")
    assert res.stopped_early == "aborted: server died"
    assert 6 <= len(res.records) < n / 2
    # the requests in flight when it aborted finished on their own and kept their records
    assert all(r.ok and r.output_tokens == 20 for r in res.records)
    assert server.state.requests == len(res.records)


async def test_abort_in_an_open_loop(
    mock_factory: MockFactory, make_single_turn: Callable[..., Workload]
) -> None:
    server = await mock_factory(ttft_ms=5.0, itl_ms=2.0)
    n = 200  # one every 25 ms: 5 s unaborted
    wl = make_single_turn(
        n,
        output_len=10,
        offsets=[i * 0.025 for i in range(n)],
        arrival=ArrivalSpec(kind="constant", rate=40),
    )
    target = HttpTarget(server.url)
    res = await run_and_abort(target, wl, after_done=5, reason="killed by SIGKILL")
    assert res.stopped_early == "aborted: killed by SIGKILL"
    assert 5 <= len(res.records) < n / 2
    assert all(r.ok for r in res.records)
    assert server.state.requests == len(res.records)


async def test_abort_stops_the_next_turns_of_sessions(
    mock_factory: MockFactory, make_workload: Callable[..., Workload]
) -> None:
    server = await mock_factory(ttft_ms=5.0, itl_ms=2.0)
    turns = [(16 * (k + 1), 10, 0.0 if k == 0 else None, 0.05) for k in range(20)]
    wl = make_workload(
        [turns] * 3, arrival=ArrivalSpec(kind="concurrency", concurrency=3)
    )  # 3 sessions of 20 turns: about 3 s unaborted
    target = HttpTarget(server.url)
    res = await run_and_abort(target, wl, after_done=6, reason="stop")
    assert res.stopped_early == "aborted: stop"
    assert 6 <= len(res.records) < 30
    assert all(r.ok for r in res.records)


async def test_abort_before_the_run_sends_nothing(
    mock_factory: MockFactory, make_single_turn: Callable[..., Workload]
) -> None:
    server = await mock_factory(ttft_ms=5.0, itl_ms=2.0)
    target = HttpTarget(server.url)
    target.abort("too late")
    res = await target.run(make_single_turn(10), OPTIONS)
    assert res.stopped_early == "aborted: too late"
    assert res.records == [] and server.state.requests == 0


async def test_a_run_that_is_not_aborted_says_nothing(
    mock_factory: MockFactory, make_single_turn: Callable[..., Workload]
) -> None:
    server = await mock_factory(ttft_ms=1.0, itl_ms=0.0)
    res = await HttpTarget(server.url).run(make_single_turn(5), OPTIONS)
    assert res.stopped_early is None and len(res.records) == 5
