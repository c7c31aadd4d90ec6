"""The sim suite's table: every sim task x nop, default, random, tpe, checklist, oracle x seeds.

``nop`` and ``oracle`` are the task's baseline and expert configs submitted as they are (the
final evaluation alone, as ``servegym task validate`` runs it); the other columns are whole
trials (:func:`servegym.runner.trial.run_trial`, the agent phase and the final evaluation),
scored as the leaderboard scores them (a trial that is not scored counts 1.0). A cell is the
geometric mean over the seeds. Below the table: the suite geomean per agent, the share of
the oracle's log-gain the checklist captures (sum over tasks of log(checklist) / sum of
log(oracle), per seed and over all seeds), and the tasks where the checklist reaches 95%
(and 90%, ``task validate``'s limit) of the oracle.

Every result is kept under ``OUT`` (trials as ``servegym sweep`` lays them out, nop and
oracle scores as ``<task>__<nop|oracle>__s<seed>.json``), so re-running the command
resumes: only what is missing runs. ``-j N`` runs N processes at once. The columns the
suite figures need run first (oracle, checklist; then nop, default and the searches), so an
interrupted run already has them; ``--report`` prints the table from what is there without
running anything (a cell not yet run shows ``-``).

    .venv/bin/python benchmarks/suite_table.py OUT [-j N] [--seeds 0,1] [--task ID ...]
                                               [--agents A,B,...] [--markdown] [--report]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from servegym.run_folder import write_text_atomic
from servegym.runner.evaluation import evaluate
from servegym.runner.trial import run_trial
from servegym.tasks.loader import load_task, task_folders
from servegym.tasks.secrets import scoring_seed

AGENTS = ("nop", "default", "random", "tpe", "checklist", "oracle")
CONFIG_SIDES = ("nop", "oracle")
"""Columns that submit a fixed config (no agent phase)."""
SHOW = {"nop": "nop", "default": "default", "random": "random", "tpe": "tpe",
        "checklist": "checklst", "oracle": "oracle"}  # fmt: skip
NEAR = 0.95
VALIDATE_LIMIT = 0.90


def sim_tasks() -> list[str]:
    """Every shipped task on the simulator, sorted."""
    out = []
    for folder in task_folders(None):
        if load_task(folder.name).task.traits.simulated:
            out.append(folder.name)
    return sorted(out)


def _config_file(out: Path, task: str, side: str, seed: int) -> Path:
    return out / f"{task}__{side}__s{seed}.json"


def _done(out: Path, task: str, agent: str, seed: int) -> float | None:
    """The recorded score of one cell, if it has run."""
    if agent in CONFIG_SIDES:
        path = _config_file(out, task, agent, seed)
    else:
        path = out / f"{task}__{agent}__s{seed}" / "trial.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    value = data.get("leaderboard_score")
    return float(value) if isinstance(value, int | float) else None


Cell = tuple[str, str, int]
"""(task, agent, seed)."""


def cells(
    out: Path, tasks: list[str], agents: tuple[str, ...], seeds: list[int]
) -> tuple[dict[Cell, float], list[Cell]]:
    """The scores of the cells already run under ``out``, and the cells still to run."""
    scores: dict[Cell, float] = {}
    todo: list[Cell] = []
    for t in tasks:
        for a in agents:
            for s in seeds:
                done = _done(out, t, a, s)
                if done is None:
                    todo.append((t, a, s))
                else:
                    scores[(t, a, s)] = done
    return scores, todo


def run_cell(out: Path, task: str, agent: str, seed: int) -> tuple[str, str, int, float, float]:
    """Run one cell (in a worker process): its score and wall seconds."""
    start = time.perf_counter()
    if agent in CONFIG_SIDES:
        loaded = load_task(task)
        config = loaded.task.baseline if agent == "nop" else loaded.oracle
        assert config is not None, f"{task}: no oracle"
        hidden = scoring_seed(task, seed, avoid=loaded.task.workload.dev_seed)
        ev = evaluate(loaded, config.model_copy(deep=True), hidden)
        score = ev.score if ev.outcome == "scored" and ev.score is not None else 1.0
        record = {"task": task, "side": agent, "seed": seed, "outcome": ev.outcome,
                  "score": ev.score, "leaderboard_score": score}  # fmt: skip
        write_text_atomic(_config_file(out, task, agent, seed), json.dumps(record) + "\n")
    else:
        score = run_trial(task, agent, seed, out).leaderboard_score
    return task, agent, seed, score, time.perf_counter() - start


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


def log_share(scores: dict[tuple[str, str, int], float], tasks: list[str], seed: int) -> float:
    """Sum over tasks of log(checklist) / sum of log(oracle), on one seed."""
    num = sum(math.log(scores[(t, "checklist", seed)]) for t in tasks)
    den = sum(math.log(scores[(t, "oracle", seed)]) for t in tasks)
    return num / den if den > 0 else float("nan")


def render(
    scores: dict[tuple[str, str, int], float],
    tasks: list[str],
    seeds: list[int],
    markdown: bool,
    agents: tuple[str, ...] = AGENTS,
) -> str:
    """The table and the suite figures (``agents`` must include checklist and oracle)."""
    cell: dict[tuple[str, str], float] = {
        (t, a): geomean([scores[(t, a, s)] for s in seeds])
        for t in tasks
        for a in agents
        if all((t, a, s) in scores for s in seeds)
    }

    def show(t: str, a: str, fmt: str) -> str:
        return format(cell[(t, a)], fmt) if (t, a) in cell else "-"

    def suite_of(a: str) -> str:
        got = [cell[(t, a)] for t in tasks if (t, a) in cell]
        if not got:
            return "-"
        return f"{geomean(got):.3f}" + ("" if len(got) == len(tasks) else f" ({len(got)})")

    lines: list[str] = []
    width = max(26, *(len(t) for t in tasks))
    if markdown:
        lines.append("| task | " + " | ".join(agents) + " | checklist / oracle |")
        lines.append("| --- | " + " | ".join("---:" for _ in agents) + " | ---: |")
        for t in tasks:
            per_seed = [
                f"{cell[(t, a)]:.2f} ({', '.join(f'{scores[(t, a, s)]:.2f}' for s in seeds)})"
                if (t, a) in cell
                else "-"
                for a in agents
            ]
            ratio = (
                f"{cell[(t, 'checklist')] / cell[(t, 'oracle')]:.0%}"
                if (t, "checklist") in cell and (t, "oracle") in cell
                else "-"
            )
            lines.append(f"| {t} | " + " | ".join(per_seed) + f" | {ratio} |")
        lines.append(
            "| **suite geomean** | " + " | ".join(f"**{suite_of(a)}**" for a in agents) + " | |"
        )
    else:
        head = f"{'task':{width}}" + "".join(f"{SHOW[a]:>8}" for a in agents)
        lines.append(head)
        lines.append("-" * len(head))
        for t in tasks:
            lines.append(f"{t:{width}}" + "".join(f"{show(t, a, '.3f'):>8}" for a in agents))
        lines.append("-" * len(head))
        lines.append(
            f"{'suite geomean':{width}}" + "".join(f"{suite_of(a).split()[0]:>8}" for a in agents)
        )
    complete = all((t, a) in cell for t in tasks for a in ("checklist", "oracle"))
    if not complete:
        lines.append("\n(checklist or oracle cells missing: no suite figures yet)")
        return "\n".join(lines)
    shares = [log_share(scores, tasks, s) for s in seeds]
    num = sum(math.log(cell[(t, "checklist")]) for t in tasks)
    den = sum(math.log(cell[(t, "oracle")]) for t in tasks)
    ratios = {t: cell[(t, "checklist")] / cell[(t, "oracle")] for t in tasks}
    near = [t for t in tasks if ratios[t] >= NEAR]
    over = [t for t in tasks if ratios[t] >= VALIDATE_LIMIT]
    lines.append("")
    lines.append(
        "checklist's share of the oracle's log-gain: "
        + ", ".join(f"seed {s} {v:.1%}" for s, v in zip(seeds, shares, strict=True))
        + f"; over seeds {num / den:.1%}"
    )
    lines.append(
        f"tasks where checklist >= {NEAR:.0%} of oracle: {len(near)} of {len(tasks)}"
        + (f" ({', '.join(near)})" if near else "")
    )
    lines.append(
        f"tasks where checklist >= {VALIDATE_LIMIT:.0%} of oracle: {len(over)}"
        + (f" ({', '.join(over)})" if over else "")
    )
    worse = [t for t in tasks if cell[(t, "oracle")] <= 1.0]
    if worse:
        lines.append(f"tasks where the oracle does not beat the baseline: {', '.join(worse)}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="results folder (re-running resumes)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seeds", default="0,1", help="comma-separated trial seeds")
    ap.add_argument("--task", action="append", default=[], help="only these tasks")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument(
        "--agents", default=",".join(AGENTS), help="columns (checklist and oracle always)"
    )
    ap.add_argument("--report", action="store_true", help="print what has run; run nothing")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    tasks = sorted(args.task) if args.task else sim_tasks()
    wanted = {a.strip() for a in args.agents.split(",")} | {"checklist", "oracle"}
    agents = tuple(a for a in AGENTS if a in wanted)
    args.out.mkdir(parents=True, exist_ok=True)
    scores, todo = cells(args.out, tasks, agents, seeds)
    # the suite figures' columns first: an interrupted run already has them
    order = {"oracle": 0, "checklist": 1, "nop": 2, "default": 3, "random": 4, "tpe": 5}
    todo.sort(key=lambda c: order[c[1]])
    if args.report:
        todo = []
    start = time.perf_counter()
    if todo:
        total = len(tasks) * len(agents) * len(seeds)
        print(f"{len(todo)} of {total} cells to run, -j {args.jobs}")
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_cell, args.out, t, a, s) for t, a, s in todo]
        for n, fut in enumerate(as_completed(futures), 1):
            t, a, s, score, wall = fut.result()
            scores[(t, a, s)] = score
            print(f"[{n}/{len(todo)}] {t} {a} s{s}: {score:.3f} ({wall:.0f} s)", flush=True)
    if todo:
        print(f"ran in {time.perf_counter() - start:.0f} s wall\n")
    print(render(scores, tasks, seeds, args.markdown, agents))


if __name__ == "__main__":
    main()
