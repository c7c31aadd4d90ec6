"""Check that a change leaves sim-track results identical, file for file.

``record DIR`` runs a fixed grid of sim-track trials (tasks x agents x seeds, one pipeline
task among them) with ``servegym run`` into ``DIR``; ``compare A B`` compares every file of
every trial folder in ``A`` with its namesake in ``B``, after dropping what is allowed to
differ between runs of the same code (timestamps, wall-clock timings, versions). Run
``record`` on the commit before a refactor and again after it, then ``compare`` the two:
it prints the number of files compared and every difference, and exits 1 on any.

    python benchmarks/identical_results.py record runs/before
    python benchmarks/identical_results.py record runs/after
    python benchmarks/identical_results.py compare runs/before runs/after
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

TASKS = (
    "voice-stream-h100",
    "agentic-concurrent",
    "chat-h100-cost-sla",
    "balanced-l40s-poisson",
    "rag-pipeline-throughput",
)
AGENTS = ("default", "random", "tpe")
SEEDS = (0, 1)

VOLATILE = {"started_at", "finished_at", "timing", "versions", "wall_s", "wall_seconds_used"}
"""Keys whose values depend on the clock or the installed versions, not on the code's
results."""


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _load(path: Path) -> list[Any]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [_strip(json.loads(line)) for line in text.splitlines() if line.strip()]
    if path.suffix == ".json":
        return [_strip(json.loads(text))]
    return [text]


def record(out: Path) -> int:
    servegym = Path(sys.executable).with_name("servegym")
    for task in TASKS:
        for agent in AGENTS:
            for seed in SEEDS:
                cmd = [str(servegym), "run", "--task", task, "--agent", agent]
                cmd += ["--seed", str(seed), "--out", str(out), "--force"]
                print("$", " ".join(cmd[1:]), flush=True)
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return 0


def _diff(a: Any, b: Any, where: str) -> str | None:
    if type(a) is not type(b):
        return f"{where}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{where}.{k}: only in {'after' if k not in a else 'before'}"
            d = _diff(a[k], b[k], f"{where}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = _diff(x, y, f"{where}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{where}: {a!r} != {b!r}"


def compare(before: Path, after: Path) -> int:
    files = sorted(p.relative_to(before) for p in before.rglob("*") if p.is_file())
    others = sorted(p.relative_to(after) for p in after.rglob("*") if p.is_file())
    problems = [f"{p}: only in {after}" for p in sorted(set(others) - set(files))]
    compared = 0
    for rel in files:
        if not (after / rel).is_file():
            problems.append(f"{rel}: only in {before}")
            continue
        compared += 1
        d = _diff(_load(before / rel), _load(after / rel), str(rel))
        if d:
            problems.append(d)
    for p in problems:
        print("differs:", p)
    print(f"{compared} files compared, {len(problems)} differ")
    return 1 if problems else 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "record":
        return record(Path(argv[1]))
    if len(argv) == 3 and argv[0] == "compare":
        return compare(Path(argv[1]), Path(argv[2]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
