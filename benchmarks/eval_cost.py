"""What a final evaluation costs: wall and CPU seconds of the oracle's final evaluation, per task.

For each named task (default: every sim task with a rate objective) it runs the final
evaluation of the task's oracle against its baseline on trial seed 0's scoring workload,
as ``servegym task validate``'s oracle check does, and prints the wall and CPU seconds, the
virtual seconds simulated and the score. Run it on two checkouts to compare a change (CPU
seconds are the figure to compare on a shared machine).

    .venv/bin/python benchmarks/eval_cost.py [--task ID ...]
"""

from __future__ import annotations

import argparse
import time

from servegym.runner.evaluation import evaluate
from servegym.tasks.loader import load_task, task_folders
from servegym.tasks.secrets import scoring_seed
from servegym.tasks.spec import ObjectiveSpec

RATE_KINDS = ("max_rate_at_sla", "cost_at_sla")


def _has_rate(o: ObjectiveSpec) -> bool:
    return o.kind in RATE_KINDS or any(_has_rate(c) for c in o.components)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", action="append", default=[])
    args = ap.parse_args()
    ids = args.task
    if not ids:
        for folder in task_folders(None):
            t = load_task(folder.name).task
            if t.traits.simulated and _has_rate(t.objective):
                ids.append(folder.name)
    print(f"{'task':28} {'wall_s':>7} {'cpu_s':>7} {'sim_s':>8} {'score':>6}")
    for tid in ids:
        loaded = load_task(tid)
        assert loaded.oracle is not None
        seed = scoring_seed(tid, 0, avoid=loaded.task.workload.dev_seed)
        w, c = time.perf_counter(), time.process_time()
        ev = evaluate(loaded, loaded.oracle, seed)
        wall, cpu = time.perf_counter() - w, time.process_time() - c
        score = f"{ev.score:.3f}" if ev.score is not None else ev.outcome
        print(f"{tid:28} {wall:7.1f} {cpu:7.1f} {ev.info.sim_seconds:8.0f} {score:>6}", flush=True)


if __name__ == "__main__":
    main()
