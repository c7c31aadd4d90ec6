"""The time Inspect AI adds to a sim trial: the same scripted tool calls as
``servegym run --agent scripted`` and as ``inspect eval servegym/<task>`` with Inspect's
scripted mock model, side by side (needs ``pip install -e '.[inspect]'``).

Two measurements, each the median of ``--repeats`` runs after one unmeasured warm-up:

- **warm** (in one process): ``run_trial`` with the scripted agent against
  ``inspect_ai.eval`` of the task, which runs the same trial (its folder and score are the
  same); the trial's own ``timing.wall_s`` is printed too, so what is Inspect's is seen;
- **cold** (a fresh interpreter each run): what a user waits for from the command line,
  imports included: this script run with ``--one servegym`` or ``--one inspect``.

Wall and CPU seconds are both printed: on a busy machine the CPU seconds are the steadier
measure of the work Inspect adds.

    .venv/bin/python benchmarks/inspect_overhead.py [--task voice-stream-h100]
        [--repeats 5]

It also checks that both give the same score, and says so.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CALLS: list[dict[str, Any]] = [
    {"tool": "describe_task", "arguments": {}},
    {"tool": "run_experiment", "arguments": {"config": {"max_num_seqs": 512}}},
    {"tool": "submit", "arguments": {"config": {"max_num_seqs": 512}}},
]
MODEL = "mockllm/model"


def run_servegym(task: str, out: Path) -> tuple[float, float | None, float]:
    """One scripted trial through ``run_trial``: (wall seconds, score, trial wall_s)."""
    from servegym.runner.trial import run_trial

    script = out / "calls.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    script.write_text("".join(json.dumps(c) + "\n" for c in CALLS))
    t0 = time.perf_counter()
    result = run_trial(task, "scripted", 0, out, force=True, agent_options={"script": script})
    wall = time.perf_counter() - t0
    return wall, result.score, result.timing.wall_s if result.timing else float("nan")


def run_inspect(task: str, out: Path) -> tuple[float, float | None, float]:
    """The same calls through ``inspect eval servegym/<task>`` with the mock model."""
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import ModelOutput, ModelUsage, get_model

    from servegym.runner.results import read_trial

    outputs = [ModelOutput.for_tool_call(MODEL, c["tool"], c["arguments"]) for c in CALLS]
    outputs.append(ModelOutput.from_content(MODEL, "done"))
    for o in outputs:  # token counts given: Inspect would otherwise fetch a tokenizer
        o.usage = ModelUsage(input_tokens=100, output_tokens=10, total_tokens=110)
    t0 = time.perf_counter()
    (log,) = inspect_eval(
        f"servegym/{task}",
        model=get_model(MODEL, custom_outputs=outputs),
        task_args={"out": str(out), "force": True},
        log_dir=str(out / "logs"),
        display="none",
    )
    wall = time.perf_counter() - t0
    if not log.samples or not log.samples[0].scores:
        raise RuntimeError(f"inspect eval of {task} logged no scored sample ({log.status})")
    score = log.samples[0].scores["final_evaluation"]
    meta = score.metadata or {}
    trial = read_trial(Path(meta["trial_folder"]) / "trial.json")
    return wall, meta["score"], trial.timing.wall_s if trial.timing else float("nan")


RUNNERS = {"servegym": run_servegym, "inspect": run_inspect}


def cold(kind: str, task: str, out: Path) -> tuple[float, float]:
    """One trial in a fresh interpreter: (wall seconds, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, __file__, "--one", kind, "--task", task, "--out", str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="voice-stream-h100")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--one", choices=sorted(RUNNERS), help="run one trial and exit (cold runs)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.one:
        RUNNERS[args.one](args.task, args.out)
        return 0

    with tempfile.TemporaryDirectory(prefix="inspect-overhead-") as tmp:
        root = Path(tmp)
        warm: dict[str, list[float]] = {k: [] for k in RUNNERS}
        warm_cpu: dict[str, list[float]] = {k: [] for k in RUNNERS}
        trial_wall: dict[str, list[float]] = {k: [] for k in RUNNERS}
        scores: dict[str, set[float | None]] = {k: set() for k in RUNNERS}
        for kind, runner in RUNNERS.items():
            runner(args.task, root / f"warmup-{kind}")  # imports, first sim compile
        for i in range(args.repeats):
            for kind, runner in RUNNERS.items():
                cpu0 = time.process_time()
                wall, score, inner = runner(args.task, root / f"{kind}-{i}")
                warm_cpu[kind].append(time.process_time() - cpu0)
                warm[kind].append(wall)
                trial_wall[kind].append(inner)
                scores[kind].add(score)
        colds = {
            kind: [cold(kind, args.task, root / f"cold-{kind}-{i}") for i in range(args.repeats)]
            for kind in RUNNERS
        }

    med = {k: statistics.median(v) for k, v in warm.items()}
    cold_med = {k: statistics.median(w for w, _ in v) for k, v in colds.items()}
    cold_cpu = {k: statistics.median(c for _, c in v) for k, v in colds.items()}
    warm_cpu_med = {k: statistics.median(v) for k, v in warm_cpu.items()}
    trial_med = {k: statistics.median(v) for k, v in trial_wall.items()}
    print(f"task {args.task}, {len(CALLS)} scripted calls, median of {args.repeats} runs")
    print(f"{'':28}{'servegym run':>14}{'inspect eval':>14}{'ratio':>8}{'added':>9}")
    rows: list[tuple[str, dict[str, float]]] = [
        ("warm, whole call (wall)", med),
        ("warm, whole call (CPU)", warm_cpu_med),
        ("warm, the trial's wall_s", trial_med),
        ("cold, fresh process (wall)", cold_med),
        ("cold, fresh process (CPU)", cold_cpu),
    ]
    for label, m in rows:
        a, b = m["servegym"], m["inspect"]
        print(f"{label:28}{a:>13.2f}s{b:>13.2f}s{b / a:>7.2f}x{b - a:>+8.2f}s")
    same = scores["servegym"] == scores["inspect"] and len(scores["servegym"]) == 1
    print(
        f"scores: servegym {sorted(scores['servegym'], key=str)}, inspect "
        f"{sorted(scores['inspect'], key=str)}: {'the same' if same else 'DIFFERENT'}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
