"""Does a credited rate hold? Credited vs delivered rate for every rate task's baseline and oracle.

For each sim task whose objective searches the arrival rate (``max_rate_at_sla``,
``cost_at_sla``, or a composite holding one), it measures the baseline and the oracle as the
final evaluation's first pair does (trial seed 0's scoring workload): that is the *credited*
rate ``R``. Then it serves long steady runs at ``R``: ``--requests`` (default 4,800)
Poisson arrivals of the same workload, on ``--seeds`` other samples (default 3), and
reports (means over the samples; ``min`` is the lowest ``delivered / offered``; the
long runs are offered ``R`` times ``--scale``, default 1)

- ``delivered``: requests completed during the second half of the arrival span, per second
  of it. The first half lets the system fill: a continuous-batching server's batch, and with
  it every request's time in the system, grows for tens of seconds before it levels off, so
  counting from early on undercounts a config that keeps up. One that keeps up delivers
  about ``R``; an overloaded one its capacity;
- ``attain``: the SLA attainment of the requests of that second half;
- ``wall``: the wall seconds the credited measurement took (the rate search alone).

    .venv/bin/python benchmarks/rate_delivery.py [--requests 4800] [--task ID ...]
                                                 [--rate-requests N] [--rate-warmup F]
                                                 [--scale F]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time

from servegym.engines.config import ServingConfig
from servegym.engines.sim.engine import simulate
from servegym.engines.sim.launch import LaunchedEngine
from servegym.loadgen.records import RequestRecord
from servegym.scoring.objectives import RATE_KIND_SET
from servegym.scoring.sla import SLA
from servegym.scoring.steady import served_rate
from servegym.tasks.loader import LoadedTask, load_task, task_folders, workload_spec
from servegym.tasks.secrets import scoring_seed
from servegym.tasks.spec import ObjectiveSpec
from servegym.tracks.base import TrackSetup
from servegym.tracks.sim import SimSide, SimTrack, first_rate
from servegym.tracks.sim_measure import at_rate
from servegym.workloads.generate import materialise


def _has_rate(o: ObjectiveSpec) -> bool:
    return o.kind in RATE_KIND_SET or any(_has_rate(c) for c in o.components)


def _override(o: ObjectiveSpec, update: dict[str, object]) -> ObjectiveSpec:
    """``o`` with ``update`` applied to it and every rate component (for trying settings)."""
    if o.kind == "composite":
        return o.model_copy(update={"components": [_override(c, update) for c in o.components]})
    return o.model_copy(update=update) if o.kind in RATE_KIND_SET else o


def _meets(r: RequestRecord, sla: SLA) -> bool:
    if not r.ok or r.sent_ns is None or r.done_ns is None or r.first_token_ns is None:
        return False
    ok = True
    if sla.ttft_ms is not None:
        ok &= (r.first_token_ns - r.sent_ns) / 1e6 <= sla.ttft_ms
    if sla.tpot_ms is not None and r.output_tokens > 1:
        ok &= (r.done_ns - r.first_token_ns) / (r.output_tokens - 1) / 1e6 <= sla.tpot_ms
    if sla.e2e_ms is not None:
        ok &= (r.done_ns - r.sent_ns) / 1e6 <= sla.e2e_ms
    return bool(ok)


def delivered(
    loaded: LoadedTask, engine: LaunchedEngine, rate: float, requests: int, seed: int
) -> tuple[float, float]:
    """(delivered req/s, SLA attainment) of a steady run of ``requests`` arrivals at ``rate``."""
    spec, base_dir = workload_spec(loaded)
    long = at_rate(spec, rate).model_copy(update={"num_requests": requests, "warmup_requests": 0})
    wl = materialise(long, seed, base_dir=base_dir)
    run = simulate(engine, wl, noise=True, noise_seed=seed)
    recs = sorted((r for r in run.records if not r.warmup), key=lambda r: r.scheduled_ns)
    steady = recs[len(recs) // 2 :]
    sla = loaded.task.sla or SLA()
    attain = sum(_meets(r, sla) for r in steady) / len(steady)
    return served_rate(recs), attain


async def _credited(loaded: LoadedTask, config: ServingConfig) -> tuple[float | None, object]:
    seed = scoring_seed(loaded.id, 0, avoid=loaded.task.workload.dev_seed)
    ev = SimTrack.for_task(loaded, TrackSetup()).evaluation(loaded, seed)
    base = await ev.start_baseline()
    side = base if config == loaded.task.baseline else await ev.start_submission(config)
    assert isinstance(side, SimSide)
    m = await ev.measure(side, "baseline" if side is base else "submission", 0)
    return first_rate(m), side.engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4800)
    ap.add_argument("--seeds", type=int, default=3, help="samples of the long run")
    ap.add_argument("--task", action="append", default=[])
    ap.add_argument("--scale", type=float, default=1.0, help="run the long runs at this share of R")
    ap.add_argument("--rate-requests", type=int, help="override the objective's rate_requests")
    ap.add_argument("--rate-warmup", type=float, help="override the objective's rate_warmup")
    args = ap.parse_args()
    update: dict[str, object] = {}
    if args.rate_requests is not None:
        update["rate_requests"] = args.rate_requests
    if args.rate_warmup is not None:
        update["rate_warmup"] = args.rate_warmup
    ids = args.task or [f.name for f in task_folders(None)]
    print(f"{'task':28} {'side':8} {'credited':>9} {'delivered':>9} {'ratio':>6} {'min':>6} "
          f"{'attain':>6} {'wall':>6}")  # fmt: skip
    for tid in ids:
        loaded = load_task(tid)
        if not loaded.task.traits.simulated or not _has_rate(loaded.task.objective):
            continue
        if update:
            task = loaded.task.model_copy(
                update={"objective": _override(loaded.task.objective, update)}
            )
            loaded = dataclasses.replace(loaded, task=task)
        sides = [("baseline", loaded.task.baseline)]
        if loaded.oracle is not None:
            sides.append(("oracle", loaded.oracle))
        for name, config in sides:
            t0 = time.perf_counter()
            rate, engine = asyncio.run(_credited(loaded, config))
            wall = time.perf_counter() - t0
            if rate is None or not isinstance(engine, LaunchedEngine):
                print(f"{tid:28} {name:8} {'-':>9}")
                continue
            offered = rate * args.scale
            runs = [delivered(loaded, engine, offered, args.requests, 12345 + k)
                    for k in range(args.seeds)]  # fmt: skip
            got = sum(d for d, _ in runs) / len(runs)
            low = min(d for d, _ in runs) / offered
            attain = sum(a for _, a in runs) / len(runs)
            print(
                f"{tid:28} {name:8} {rate:9.2f} {got:9.2f} {got / offered:6.3f} {low:6.3f} "
                f"{attain:6.3f} {wall:6.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
