"""How long a workspace's ``start_server.sh`` takes to start beside the harness's own start
of the same config, in each kind of workspace a trial has.

Writes a task's baseline as ``start_server.sh`` (as the agent's first workspace holds it) and
starts it, each round, in three ways beside the harness's own start of the baseline config
(**harness**: the environment and compile cache every harness server gets):

- **launcher**: a new agent workspace (seeded as a trial seeds it);
- **again**: a second start in that same workspace, which finds what the first compiled in
  the workspace's own ``.cache``;
- **evaluation**: the final evaluation's fresh workspace from a snapshot of those files,
  seeded with the harness's compile cache and nothing of the agent's.

Each start is timed from launch to ``/health`` and ``/v1/models`` answering, as every
trial's server is, one at a time; the script prints each start and each setting's median
over the harness's. The order rotates each round, so drift in the machine's speed falls on
all alike.

    .venv/bin/python benchmarks/launcher_start.py [--task cpu-prefill-ttft] [--rounds 2]

Needs ``servegym setup cpu``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
from pathlib import Path

from servegym.engines.base import LaunchSpec, get_engine
from servegym.engines.cpu_home import TINY_MODEL
from servegym.engines.models import resolve_model
from servegym.engines.process import ServerProcess, free_port
from servegym.tasks.loader import load_task
from servegym.tracks.sandbox import fresh_workspace, seed_workspace, workspace_sandbox

SETTINGS = ("harness", "launcher", "again", "evaluation")


def _spec(setting: str, task_id: str, work: Path, r: int) -> LaunchSpec:
    loaded = load_task(task_id)
    engine = get_engine("vllm-cpu")
    model = resolve_model(TINY_MODEL)
    if setting == "harness":
        return engine.launch_spec(loaded.task.baseline, model, free_port())
    agent = work / f"workspace-{r}"
    if setting == "evaluation":
        snapshot = work / f"snapshot-{r}"
        if not snapshot.exists():
            seed_workspace(workspace_sandbox(loaded.task, engine, model, snapshot), engine,
                           loaded.task.baseline)  # fmt: skip
            shutil.rmtree(snapshot / ".cache", ignore_errors=True)  # a snapshot leaves it out
        root = fresh_workspace(snapshot, work / f"evaluation-{r}", engine)
        return workspace_sandbox(loaded.task, engine, model, root).launch_spec(
            "start_server.sh", free_port()
        )
    sandbox = workspace_sandbox(loaded.task, engine, model, agent)
    if setting == "launcher":
        seed_workspace(sandbox, engine, loaded.task.baseline)
    return sandbox.launch_spec("start_server.sh", free_port())


async def start_once(spec: LaunchSpec, log: Path) -> float:
    async with ServerProcess(spec, log, start_timeout_s=1200) as server:
        assert server.ready_after_s is not None
        return server.ready_after_s


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--task", default="cpu-prefill-ttft", help="a cpu task (its baseline)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of one start of each setting")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="servegym-launcher-start-"))
    times: dict[str, list[float]] = {s: [] for s in SETTINGS}
    for r in range(args.rounds):
        # "again" must follow "launcher"; the harness and the evaluation rotate around them
        k = r % 3
        order = [("harness",), ("launcher", "again"), ("evaluation",)]
        for group in order[k:] + order[:k]:
            for setting in group:
                spec = _spec(setting, args.task, work, r)
                t = asyncio.run(start_once(spec, work / f"{setting}-{r}.log"))
                times[setting].append(t)
                print(f"round {r + 1} {setting:>10}: {t:6.1f} s", flush=True)
    h = statistics.median(times["harness"])
    print(f"\nmedian harness {h:.1f} s")
    for s in SETTINGS[1:]:
        m = statistics.median(times[s])
        print(f"median {s:>10} {m:.1f} s: {m / h:.2f}x the harness's")
    print(f"(logs: {work})")


if __name__ == "__main__":
    main()
