"""What a cpu evaluation's run pays for following the other side's run: the switch cost.

The final evaluation keeps the baseline's and the submission's servers up side by side and
measures them in turn. A run that follows the *other* server's run (a switch) may start on
a machine that other server has just left: its caches, the cores' clocks, threads still
winding down. A run that follows its *own* server's run does not. This starts both sides of
a cpu task's evaluation (the baseline, and the oracle or the baseline again with ``--nop``)
and measures them in the order ``B, S, S, B`` over ``--cycles`` cycles, so every side has
runs after a switch and runs after itself, then prints per side and kind of run:

- the objective's value (the mean over such runs),
- each request's TTFT by position in the run (the warm-up request first, marked ``w``),

and the pair ratios the two orders would give (``B, S`` pairs: the baseline after itself,
the submission after a switch; ``S, B`` pairs the other way round). Each run waits, as an
evaluation's do, until the other side is quiet (:mod:`servegym.sandbox.quiet`);
``--no-quiet`` starts it at once instead (the harness before that wait), and ``--settle S``
sleeps S seconds before a run that follows a switch (a cost that passes with time, or one
only the side's own work removes?).

    .venv/bin/python benchmarks/cpu_pair_order.py cpu-prefill-ttft [--cycles 4] [--nop]
                                                  [--no-quiet] [--settle 0]

Needs ``servegym setup cpu``; the machine's other load moves the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import statistics
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from servegym.engines.process import ServerProcess
from servegym.sandbox.quiet import QuietRuns
from servegym.scoring.objectives import measurement_improvement
from servegym.tasks.loader import load_task
from servegym.tasks.secrets import scoring_seed
from servegym.tracks import track_for
from servegym.tracks.base import Role, StartedSide


class NotQuiet(QuietRuns):
    """Runs that start at once, beside whatever the other side is doing."""

    @contextlib.asynccontextmanager
    async def alone(self, others: Sequence[ServerProcess]) -> AsyncIterator[None]:
        yield


async def measure_orders(
    task_id: str, cycles: int, nop: bool, settle: float, no_quiet: bool
) -> None:
    loaded = load_task(task_id)
    logs = Path(tempfile.mkdtemp(prefix="servegym-pair-order-"))
    track: Any = track_for(loaded, server_logs=logs)
    session = track.evaluation(
        loaded, scoring_seed(task_id, 0, avoid=loaded.task.workload.dev_seed)
    )
    if no_quiet:
        session.quiet = NotQuiet()
    submission = loaded.task.baseline if nop else loaded.oracle
    values: dict[tuple[Role, str], list[float]] = {}
    ttfts: dict[tuple[Role, str], list[list[float]]] = {}
    pairs: dict[str, list[float]] = {"B, S": [], "S, B": []}
    try:
        base = await session.start_baseline()
        sub = await session.start_submission(submission)
        assert sub.up, sub.error
        await session.warm_up(base, sub)
        sides: dict[Role, StartedSide] = {"baseline": base, "submission": sub}
        last: Role | None = None
        order: list[Role] = ["baseline", "submission", "submission", "baseline"]
        for c in range(cycles):
            got: dict[str, Any] = {}
            for k, role in enumerate(order):
                kind = "after itself" if last == role else "after a switch"
                if kind == "after a switch" and last is not None and settle > 0:
                    await asyncio.sleep(settle)
                m = await session.measure(sides[role], role, 2 * c + k // 2)
                run = sides[role].runs[-1]  # type: ignore[attr-defined]
                values.setdefault((role, kind), []).append(m.value)
                ttfts.setdefault((role, kind), []).append(
                    [(r.ttft_ns or 0) / 1e6 for r in run.records]
                )
                got[f"{role} {k // 2}"] = m
                last = role
            # pair 0 of the cycle ran B then S, pair 1 ran S then B
            objective = loaded.task.objective
            pairs["B, S"].append(
                measurement_improvement(objective, got["baseline 0"], got["submission 0"])
            )
            pairs["S, B"].append(
                measurement_improvement(objective, got["baseline 1"], got["submission 1"])
            )
    finally:
        await session.close()
    label = loaded.task.objective.label()
    wait = "no wait for quiet" if no_quiet else "each run once the other is quiet"
    print(f"{task_id}: baseline against {'itself' if nop else 'the oracle'}, {cycles} cycles "
          f"of B, S, S, B; {wait}; settle {settle:g} s before a run after a switch")  # fmt: skip
    for (role, kind), vs in sorted(values.items()):
        print(f"  {role:<10} {kind:<15} {label} {statistics.mean(vs):9.1f}  "
              f"({', '.join(f'{v:.1f}' for v in vs)})")  # fmt: skip
        per_position = list(zip(*ttfts[(role, kind)], strict=False))
        cells = [f"{statistics.mean(p):.0f}" for p in per_position]
        print(f"  {'':<10} {'':<15} TTFT ms by request: w {' '.join(cells)}")
    for order_name, rs in pairs.items():
        gm = math.exp(statistics.mean(math.log(r) for r in rs))
        print(f"  pairs {order_name}: {' '.join(f'{r:.3f}' for r in rs)}  (geomean {gm:.3f})")
    print(f"(server logs: {logs})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task")
    p.add_argument("--cycles", type=int, default=4)
    p.add_argument("--nop", action="store_true", help="the baseline against itself")
    p.add_argument("--settle", type=float, default=0.0, help="seconds before a run after a switch")
    p.add_argument("--no-quiet", action="store_true", help="start each run at once")
    args = p.parse_args()
    asyncio.run(measure_orders(args.task, args.cycles, args.nop, args.settle, args.no_quiet))


if __name__ == "__main__":
    main()
