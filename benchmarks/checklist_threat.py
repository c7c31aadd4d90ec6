"""How much of the suite a checklist with one more generic move would take.

``checklist-budget`` is the ``checklist`` baseline (:mod:`servegym.agents.checklist`) with one
more move, tried after the others and combined greedily like them: a *smaller* step budget,
``max_num_batched_tokens`` at each of :data:`BUDGETS` below the baseline's (with
``max_num_seqs`` lowered to the budget where it would exceed it, since the engine refuses a
budget that cannot hold one token of every running sequence). It still reads nothing of the
workload or the objective: it is "lower the budget when streams stall", the lever eight
streaming tasks turn on. It is not a shipped agent; ``checklist`` keeps its meaning.

The script runs it on every sim task x seed (trials laid out as ``suite_table.py`` lays out
its cells, in the same ``OUT``, so the oracle cells of a suite-table run are reused and only
what is missing runs) and prints, beside the table's checklist and oracle columns, the
variant's score, its share of the oracle's log-gain per seed, and the tasks where it reaches
95% (and 90%) of the oracle.

    .venv/bin/python benchmarks/checklist_threat.py OUT [-j N] [--seeds 0,1] [--task ID ...]
                                                    [--report]
"""

from __future__ import annotations

import argparse
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from suite_table import cells, geomean, run_cell, sim_tasks

from servegym.agents.checklist import ChecklistAgent, Move
from servegym.agents.search_space import Params, SearchSpace
from servegym.runner.trial import run_trial

VARIANT = "checklist-budget"
BUDGETS = (2048, 1024, 512, 256)
"""The smaller step budgets the variant tries (those below the baseline's)."""
NEAR = 0.95
VALIDATE_LIMIT = 0.90


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


class BudgetChecklist(ChecklistAgent):
    """The checklist, plus "lower the step budget" as one more generic move."""

    name = VARIANT

    def checklist_moves(self, space: SearchSpace) -> list[Move]:
        listed = super().checklist_moves(space)
        spec = space.knobs.get("max_num_batched_tokens")
        if spec is None or spec.low is None:
            return listed
        base_budget = _int(self.base.get("max_num_batched_tokens"), 8192)
        seqs = _int(self.base.get("max_num_seqs"), 256)
        options: list[Params] = []
        for b in BUDGETS:
            if spec.low <= b < base_budget:
                option: Params = {"max_num_batched_tokens": b, "enable_chunked_prefill": True}
                if seqs > b:
                    option["max_num_seqs"] = b
                options.append(option)
        return [*listed, Move("smaller step budget", tuple(options))] if options else listed


def run_variant(out: Path, task: str, seed: int) -> tuple[str, str, int, float, float]:
    start = time.perf_counter()
    score = run_trial(task, VARIANT, seed, out, agent=BudgetChecklist()).leaderboard_score
    return task, VARIANT, seed, score, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="results folder (a suite_table.py OUT; resumes)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--task", action="append", default=[])
    ap.add_argument("--report", action="store_true", help="print what has run; run nothing")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    tasks = sorted(args.task) if args.task else sim_tasks()
    args.out.mkdir(parents=True, exist_ok=True)
    cols = ("checklist", "oracle", VARIANT)
    scores, todo = cells(args.out, tasks, cols, seeds)
    todo = [c for c in todo if c[1] != "checklist"]  # the suite table runs the checklist
    todo.sort(key=lambda c: c[1] != "oracle")
    if args.report:
        todo = []
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [
            pool.submit(run_variant, args.out, t, s)
            if a == VARIANT
            else pool.submit(run_cell, args.out, t, a, s)
            for t, a, s in todo
        ]
        for n, fut in enumerate(as_completed(futures), 1):
            t, a, s, score, wall = fut.result()
            scores[(t, a, s)] = score
            print(f"[{n}/{len(todo)}] {t} {a} s{s}: {score:.3f} ({wall:.0f} s)", flush=True)
    if todo:
        print(f"ran in {time.perf_counter() - start:.0f} s wall\n")

    def cell(t: str, a: str) -> float | None:
        got = [scores.get((t, a, s)) for s in seeds]
        return geomean([g for g in got if g is not None]) if all(got) else None

    print(f"| task | checklist | oracle | {VARIANT} | {VARIANT} / oracle |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for t in tasks:
        c, o, v = (cell(t, a) for a in cols)
        shown = [f"{x:.2f}" if x is not None else "-" for x in (c, o, v)]
        ratio = f"{v / o:.0%}" if v is not None and o is not None else "-"
        print(f"| {t} | " + " | ".join(shown) + f" | {ratio} |")
    have = [t for t in tasks if all((t, a, s) in scores for a in cols[1:] for s in seeds)]
    if len(have) < len(tasks):
        print(f"\n({len(tasks) - len(have)} tasks incomplete: figures over {len(have)} tasks)")
    if not have:
        return
    for s in seeds:
        num = sum(math.log(scores[(t, VARIANT, s)]) for t in have)
        den = sum(math.log(scores[(t, "oracle", s)]) for t in have)
        ratios = {t: scores[(t, VARIANT, s)] / scores[(t, "oracle", s)] for t in have}
        near = sorted(t for t, r in ratios.items() if r >= NEAR)
        over = sorted(t for t, r in ratios.items() if r >= VALIDATE_LIMIT)
        print(
            f"seed {s}: {VARIANT}'s share of the oracle's log-gain {num / den:.1%}; "
            f">= {NEAR:.0%} of oracle on {len(near)} ({', '.join(near) or '-'}); "
            f">= {VALIDATE_LIMIT:.0%} on {len(over)}"
        )


if __name__ == "__main__":
    main()
