"""How long a workspace's ``start_server.sh`` takes to start beside the harness's own start
of the same config.

Writes a task's baseline as ``start_server.sh`` (as the agent's first workspace holds it) and
starts it in a fresh workspace sandbox (**launcher**), alternating with the harness's own
start of the baseline config (**harness**: the environment and compile cache every harness
server gets). Each start is timed from launch to ``/health`` and ``/v1/models`` answering,
as every trial's server is; the script prints each start and the launcher/harness ratio of
the medians. Alternating lets drift in the machine's speed fall on both alike.

    .venv/bin/python benchmarks/launcher_start.py [--task cpu-prefill-ttft] [--rounds 2]

Needs ``servegym setup cpu``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from servegym.engines.base import LaunchSpec, get_engine
from servegym.engines.cpu_home import TINY_MODEL
from servegym.engines.models import resolve_model
from servegym.engines.process import ServerProcess, free_port
from servegym.tasks.loader import load_task
from servegym.tracks.sandbox import seed_workspace, workspace_sandbox


def _spec(setting: str, task_id: str, root: Path) -> LaunchSpec:
    loaded = load_task(task_id)
    engine = get_engine("vllm-cpu")
    model = resolve_model(TINY_MODEL)
    if setting == "harness":
        return engine.launch_spec(loaded.task.baseline, model, free_port())
    sandbox = workspace_sandbox(loaded.task, engine, model, root)
    seed_workspace(sandbox, engine, loaded.task.baseline)
    return sandbox.launch_spec("start_server.sh", free_port())


async def start_once(spec: LaunchSpec, log: Path) -> float:
    async with ServerProcess(spec, log, start_timeout_s=1200) as server:
        assert server.ready_after_s is not None
        return server.ready_after_s


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--task", default="cpu-prefill-ttft", help="a cpu task (its baseline)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of one start each")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="servegym-launcher-start-"))
    times: dict[str, list[float]] = {"harness": [], "launcher": []}
    for r in range(args.rounds):
        order = ("harness", "launcher") if r % 2 == 0 else ("launcher", "harness")
        for setting in order:
            spec = _spec(setting, args.task, work / f"{setting}-{r}")
            t = asyncio.run(start_once(spec, work / f"{setting}-{r}.log"))
            times[setting].append(t)
            print(f"round {r + 1} {setting:>8}: {t:6.1f} s", flush=True)
    h, la = statistics.median(times["harness"]), statistics.median(times["launcher"])
    print(f"\nmedian harness {h:.1f} s, launcher {la:.1f} s: launcher/harness {la / h:.2f}")
    print(f"(logs: {work})")


if __name__ == "__main__":
    main()
