"""Does a trial's interval cover another seed's score? Seed 1's score against seed 0's interval.

For every task with trials ``<task>__<agent>__s0`` and ``__s1`` in a runs folder, it prints
seed 0's score and 95% interval, seed 1's score, and whether that score falls inside the
interval; then how often it did. ``--reevaluate`` scores each trial's submission again with
the current code's final evaluation (same task, submission and scoring seed; the agent phase
is not rerun), which isolates what the evaluation changed: e.g. run it on trials recorded
before a change to the evaluation to see the change's effect alone.

    .venv/bin/python benchmarks/interval_coverage.py RUNS [--agent tpe] [--reevaluate]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from servegym.engines.config import ServingConfig
from servegym.runner.evaluation import evaluate
from servegym.tasks.loader import load_task


def _trial(folder: Path) -> dict[str, Any] | None:
    path = folder / "trial.json"
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _scored(data: dict[str, Any], again: bool) -> tuple[float, tuple[float, float]] | None:
    """(score, interval) as recorded, or from a fresh final evaluation of the submission."""
    if not again:
        if data.get("score") is None or data.get("score_ci") is None:
            return None
        lo, hi = data["score_ci"]
        return float(data["score"]), (float(lo), float(hi))
    loaded = load_task(data["task"])
    config = ServingConfig.model_validate(data["submission"]["config"])
    ev = evaluate(loaded, config, int(data["scoring_seed"]))
    if ev.score is None or ev.paired is None:
        return None
    return ev.score, ev.paired.ci


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--agent", default="tpe")
    ap.add_argument("--reevaluate", action="store_true")
    args = ap.parse_args()
    inside = total = 0
    for first in sorted(args.runs.glob(f"*__{args.agent}__s0")):
        task = first.name.split("__")[0]
        a, b = _trial(first), _trial(first.with_name(f"{task}__{args.agent}__s1"))
        if a is None or b is None:
            continue
        sa, sb = _scored(a, args.reevaluate), _scored(b, args.reevaluate)
        if sa is None or sb is None:
            print(f"{task:30} not scored")
            continue
        (score0, (lo, hi)), (score1, _) = sa, sb
        hit = lo <= score1 <= hi
        inside += hit
        total += 1
        print(
            f"{task:30} s0 {score0:.3f} [{lo:.3f}, {hi:.3f}] width {hi / lo - 1:5.1%}  "
            f"s1 {score1:.3f}  {'inside' if hit else 'OUTSIDE'}",
            flush=True,
        )
    print(f"seed 1 inside seed 0's interval: {inside} of {total}")


if __name__ == "__main__":
    main()
