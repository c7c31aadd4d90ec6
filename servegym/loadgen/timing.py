"""Precise waits on an asyncio loop.

asyncio timers are about 1 ms coarse (libuv's, and so uvloop's, are whole milliseconds), far
too coarse to send a request at its scheduled time or to emit a chunk at its deadline to
within 0.1 ms. :class:`PreciseScheduler` waits coarsely until ``spin_ns`` before a deadline,
then yield-spins (``await asyncio.sleep(0)``) until it. One scheduler task does the spinning
for every waiter, so a thousand concurrent waiters cost one spinner, not a thousand.

The spin window adapts: a coarse wake that comes late (on a virtual machine an idle CPU can
take several milliseconds to wake) widens the window to cover the lateness seen lately (a
slowly decaying maximum), so low request rates keep their schedule as well as high ones.

Deadlines are absolute ``time.perf_counter_ns()`` values: callers compute each deadline
from a fixed origin, never by accumulating sleeps, so errors never add up.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Callable
from time import perf_counter_ns

DEFAULT_SPIN_NS = 1_500_000
MAX_SPIN_NS = 20_000_000


def _release(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class PreciseScheduler:
    """Runs callbacks and wakes waiters at absolute ``perf_counter_ns`` deadlines.

    Bound to the running loop on first use; one scheduler per loop. Callbacks run in the
    scheduler's task, in deadline order, and must be quick and must not raise.
    """

    def __init__(self, spin_ns: int = DEFAULT_SPIN_NS) -> None:
        self.spin_ns = spin_ns
        self._late_ns = 0.0  # decaying maximum of coarse-wake lateness
        self._heap: list[tuple[int, int, Callable[[], object]]] = []
        self._seq = itertools.count()
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    def call_at(self, deadline_ns: int, callback: Callable[[], object]) -> None:
        """Call ``callback()`` at ``deadline_ns`` (from the scheduler's task, never inline)."""
        heapq.heappush(self._heap, (deadline_ns, next(self._seq), callback))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        elif self._heap[0][2] is callback and self._wake is not None:
            _release(self._wake)  # a new earliest deadline: re-plan the coarse wait

    async def sleep_until(self, deadline_ns: int) -> None:
        """Return at (just after) ``deadline_ns``; at once if it has passed."""
        if perf_counter_ns() >= deadline_ns:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.call_at(deadline_ns, lambda: _release(fut))
        await fut

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._heap.clear()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        heap = self._heap
        while True:
            spin = max(self.spin_ns, min(int(self._late_ns * 1.5) + 200_000, MAX_SPIN_NS))
            if not heap:
                self._wake = loop.create_future()
                await self._wake
                self._wake = None
                continue
            now = perf_counter_ns()
            remaining = heap[0][0] - now
            if remaining <= 0:
                while heap and heap[0][0] <= now:
                    callback = heapq.heappop(heap)[2]
                    try:
                        callback()
                    except Exception as exc:
                        loop.call_exception_handler(
                            {"message": "PreciseScheduler callback failed", "exception": exc}
                        )
            elif remaining > spin:
                wake = self._wake = loop.create_future()
                planned = now + remaining - spin
                handle = loop.call_later((remaining - spin) / 1e9, _release, wake)
                await wake
                handle.cancel()
                self._wake = None
                late = perf_counter_ns() - planned  # < 0 when a new deadline re-planned it
                self._late_ns = max(float(late), self._late_ns * 0.98)
            else:
                await asyncio.sleep(0)
