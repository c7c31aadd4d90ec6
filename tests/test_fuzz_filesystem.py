"""The run folder fuzzed: concurrency and the file system, through the real command.

Four kinds of case, each drawn from a seeded ``random.Random`` (the same cases every run;
``SERVEGYM_FUZZ_RANDOM=1`` draws new ones):

- **kill**: a sim ``run``, ``run --force`` over a finished trial, or ``sweep``, SIGKILLed at
  a random moment, then resumed with the same command;
- **drivers**: two of those started on one folder at random offsets, then the sweep resumed;
- **disk**: ``run``, ``sim``, ``sweep`` or ``bench --mock`` on a real tmpfs of a random size
  (root only: skipped with the reason otherwise), then resumed on a larger one;
- **readonly**: those commands (and ``leaderboard``) on a read-only folder holding a
  finished trial.

Every case is checked for: a traceback anywhere in the output (counted); an exit code other
than the documented ones, or a refusal that is not one line (problems); and **data losses**
(counted): a finished ``trial.json`` gone, unreadable or rewritten without ``--force``, a
torn line in ``experiments.jsonl``, a temporary file left after a resume, a trial never
finished by its resume, an honest trial flagged for tampering. The targets are 0 and 0.

The default run draws a few cases of each kind; ``-m slow`` draws the rest in three parts
(:data:`SLOW_PARTS`, each its own test, for ``pytest -n``; the counts are
:data:`CASES`). Each kind prints ``fuzz KIND: N cases, T tracebacks, L data losses`` (run
with ``-s`` to see them; ``SERVEGYM_FUZZ_REPORT=FILE`` appends them to FILE).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from servegym.runner.results import read_trial

TESTS = Path(__file__).resolve().parent
TASK = str(TESTS / "data" / "tasks" / "tiny-latency")
SWEEP_TASKS = "voice-stream-h100,balanced-l40s-poisson"  # shipped: no --root

CASES = {  # kind: (default run, under -m slow)
    "kill": (1, 24),
    "drivers": (1, 8),
    "disk": (1, 24),
    "readonly": (2, 12),
}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "servegym", *args]


SLOW_PARTS = 3
"""Under ``-m slow`` each kind's cases come in this many tests, each with its own seeded draw,
so that ``pytest -n`` spreads a kind's cases over its workers."""


def rng_for(kind: str, part: int | None) -> random.Random:
    """The draw of the default run (``part`` None) or of one slow part."""
    if os.environ.get("SERVEGYM_FUZZ_RANDOM"):
        return random.Random()
    return random.Random(f"{kind}-default" if part is None else f"{kind}-slow-{part}")


def case_count(kind: str, part: int | None) -> int:
    """The default run's cases of ``kind``, or slow part ``part``'s share of the slow count."""
    default, slow = CASES[kind]
    if part is None:
        return default
    return slow // SLOW_PARTS + (1 if part < slow % SLOW_PARTS else 0)


def tally_name(kind: str, part: int | None) -> str:
    return kind if part is None else f"{kind} (slow part {part + 1} of {SLOW_PARTS})"


@dataclass
class Tally:
    """What a kind's cases found."""

    kind: str
    cases: int = 0
    tracebacks: int = 0
    losses: int = 0
    problems: list[str] = field(default_factory=list)

    def saw(self, case: str, *texts: str) -> None:
        if any("Traceback (most recent call last)" in t for t in texts):
            self.tracebacks += 1
            self.problems.append(f"{case}: traceback: {' '.join(texts)[-600:]}")

    def lost(self, case: str, what: str) -> None:
        self.losses += 1
        self.problems.append(f"{case}: data loss: {what}")

    def wrong(self, case: str, what: str) -> None:
        self.problems.append(f"{case}: {what}")

    def close(self) -> None:
        line = (
            f"fuzz {self.kind}: {self.cases} cases, {self.tracebacks} tracebacks, "
            f"{self.losses} data losses"
        )
        print(line)
        report = os.environ.get("SERVEGYM_FUZZ_REPORT")
        if report:
            with open(report, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        assert self.tracebacks == 0 and self.losses == 0 and not self.problems, "\n".join(
            self.problems
        )


def finished(out: Path) -> dict[Path, bytes]:
    """Every finished trial's ``trial.json`` bytes (readable ones only)."""
    found = {}
    for path in out.glob("*/trial.json"):
        if path.parent.name.startswith("."):
            continue
        try:
            read_trial(path)
        except (OSError, ValueError):
            continue
        found[path] = path.read_bytes()
    return found


def check_files(tally: Tally, case: str, out: Path, *, after_resume: bool) -> None:
    """Whole lines, readable results; after a resume, no temporary file either."""
    if not out.exists():
        return
    for log in out.rglob("experiments.jsonl"):
        text = log.read_text(errors="replace")
        if text and not text.endswith("\n"):
            tally.lost(case, f"{log} ends in a torn line")
        for row in text.splitlines():
            try:
                json.loads(row)
            except ValueError:
                tally.lost(case, f"{log} holds a torn line")
                break
    for path in out.glob("*/trial.json"):
        if path.parent.name.startswith("."):
            continue
        try:
            read_trial(path)
        except (OSError, ValueError) as e:
            tally.lost(case, f"{path} unreadable: {e}")
    if after_resume:
        left = [p for p in out.rglob("*") if p.name.endswith(".tmp")]
        left += [p for p in out.iterdir() if p.name.endswith((".new", ".old"))]
        if left:
            tally.lost(case, f"left behind: {[p.name for p in left]}")


def one_line_refusal(tally: Tally, case: str, proc: subprocess.CompletedProcess[str]) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if len(lines) != 1:
        tally.wrong(case, f"exit 2 without one line: {proc.stderr[-400:]!r}")


def settle_workers(out: Path, timeout: float = 30.0) -> None:
    """Wait until no killed sweep's worker holds a trial's lock (PR_SET_PDEATHSIG)."""
    import fcntl

    deadline = time.monotonic() + timeout
    for lock in out.glob(".*.lock") if out.exists() else []:
        while time.monotonic() < deadline:
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:
                break
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.05)
            finally:
                os.close(fd)


def command(kind: str, out: Path, *, force: bool = False) -> list[str]:
    if kind == "run":
        return cli("run", "--task", TASK, "--agent", "random", "--out", str(out),
                   *(["--force"] if force else []))  # fmt: skip
    if kind == "sweep":
        return cli("sweep", "--tasks", SWEEP_TASKS, "--agents", "default,random",
                   "--max-concurrent", "2", "--out", str(out))  # fmt: skip
    if kind == "sim":
        return cli("sim", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--workload",
                   "balanced", "--requests", "200", "--out", str(out))  # fmt: skip
    if kind == "bench":
        return cli("bench", "--mock", "ttft_ms=1", "--workload", "balanced", "--requests", "5",
                   "--out", str(out))  # fmt: skip
    assert kind == "leaderboard"
    return cli("leaderboard", str(out))


def run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def finished_trial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder holding one finished sim trial, copied into cases that need one."""
    out = tmp_path_factory.mktemp("template") / "runs"
    done = run(command("run", out))
    assert done.returncode == 0, done.stdout + done.stderr
    return out


# ------------------------------------------------------------------------------ kill


# A traceback's own lines are indented; this one passes through spawn.py's _main and ends so.
ORPHANED_SPAWN = re.compile(
    r"Traceback \(most recent call last\):\n(?: .*\n)*?"
    r'  File ".*multiprocessing/spawn\.py", line \d+, in _main\n(?: .*\n)*?'
    r"EOFError: Ran out of input\n"
)


def orphaned_spawn_removed(stderr: str) -> str:
    """``stderr`` without the traceback of a worker that was being spawned when its parent
    was killed: the child reads its start-up data from the dead parent's pipe and Python's
    own bootstrap (``multiprocessing/spawn.py``) reports the end of input. That is SIGKILL
    seen from a child still starting, not a failure of ServeGym's code; every other
    traceback still counts."""
    return ORPHANED_SPAWN.sub("", stderr)


def kill_case(tally: Tally, rng: random.Random, tmp: Path, template: Path, i: int) -> None:
    what = rng.choice(["run", "force", "sweep"])
    delay = rng.uniform(0.2, 6.0 if what == "sweep" else 4.0)
    case = f"kill#{i} {what} after {delay:.2f} s"
    out = tmp / f"kill{i}"
    if what == "force":
        shutil.copytree(template, out)
    before = finished(out) if out.exists() else {}
    args = command("sweep" if what == "sweep" else "run", out, force=what == "force")
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    try:  # a process that outlives the driver keeps its pipes open: an orphan, not a hang
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        tally.wrong(case, "a process of the killed driver outlived it by 60 s")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    tally.saw(case, stdout, orphaned_spawn_removed(stderr))
    settle_workers(out)
    check_files(tally, case, out, after_resume=False)
    for path in before:  # --force: the old result, or a complete new one
        if not path.exists():
            tally.lost(case, f"{path} gone after the kill")
    kept = finished(out)
    resume = run(args[:-1] if what == "force" else args)
    tally.saw(case, resume.stdout, resume.stderr)
    if resume.returncode != 0:
        tally.wrong(case, f"resume exited {resume.returncode}: {resume.stderr[-400:]}")
    for path, data in kept.items():
        if not path.exists() or path.read_bytes() != data:
            tally.lost(case, f"{path.parent.name}: finished before the resume, then re-run")
    expected = 4 if what == "sweep" else 1
    if len(finished(out)) != expected:
        tally.lost(case, f"{len(finished(out))} of {expected} trials finished after the resume")
    check_files(tally, case, out, after_resume=True)
    tally.cases += 1


def _kills(tmp_path: Path, template: Path, part: int | None) -> None:
    rng = rng_for("kill", part)
    tally = Tally(tally_name("kill", part))
    for i in range(case_count("kill", part)):
        kill_case(tally, rng, tmp_path, template, i)
    tally.close()


def test_kills_then_resume(tmp_path: Path, finished_trial: Path) -> None:
    _kills(tmp_path, finished_trial, part=None)


@pytest.mark.slow
@pytest.mark.parametrize("part", range(SLOW_PARTS))
def test_kills_then_resume_many(tmp_path: Path, finished_trial: Path, part: int) -> None:
    _kills(tmp_path, finished_trial, part=part)


# --------------------------------------------------------------------------- drivers


def drivers_case(tally: Tally, rng: random.Random, tmp: Path, i: int) -> None:
    kinds = [rng.choice(["sweep", "run", "force"]) for _ in range(2)]
    delay = rng.uniform(0.0, 3.0)
    case = f"drivers#{i} {kinds[0]} then {kinds[1]} after {delay:.2f} s"
    out = tmp / f"drivers{i}"
    sweep = command("sweep", out)
    single = cli("run", "--task", "voice-stream-h100", "--agent", "default", "--out",
                 str(out))  # fmt: skip
    args = [sweep if k == "sweep" else [*single, *(["--force"] if k == "force" else [])]
            for k in kinds]  # fmt: skip
    first = subprocess.Popen(args[0], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    second = run(args[1])
    out0, err0 = first.communicate(timeout=600)
    results = [
        subprocess.CompletedProcess(args[0], first.returncode, out0, err0),
        second,
    ]
    for kind, res in zip(kinds, results, strict=True):
        tally.saw(case, res.stdout, res.stderr)
        if res.returncode == 2:
            one_line_refusal(tally, case, res)
            if "in use" not in res.stderr:
                tally.wrong(case, f"{kind} refused for another reason: {res.stderr[-300:]}")
        elif res.returncode != 0:
            tally.wrong(case, f"{kind} exited {res.returncode}: {res.stdout[-300:]}")
    check_files(tally, case, out, after_resume=False)
    kept = finished(out)
    resume = run(sweep)
    tally.saw(case, resume.stdout, resume.stderr)
    if resume.returncode != 0:
        tally.wrong(case, f"resume exited {resume.returncode}: {resume.stderr[-300:]}")
    for path, data in kept.items():
        if path.read_bytes() != data:
            tally.lost(case, f"{path.parent.name}: finished, then re-run by the resume")
    results_now = finished(out)
    if len(results_now) != 4:
        tally.lost(case, f"{len(results_now)} of 4 trials finished after the resume")
    for path in results_now:
        outcome = read_trial(path).outcome
        if outcome != "scored":  # honest agents: a sibling's write seen as tampering
            tally.lost(case, f"{path.parent.name} ended {outcome}")
    check_files(tally, case, out, after_resume=True)
    tally.cases += 1


def _drivers(tmp_path: Path, part: int | None) -> None:
    rng = rng_for("drivers", part)
    tally = Tally(tally_name("drivers", part))
    for i in range(case_count("drivers", part)):
        drivers_case(tally, rng, tmp_path, i)
    tally.close()


def test_two_drivers_on_one_folder(tmp_path: Path) -> None:
    _drivers(tmp_path, part=None)


@pytest.mark.slow
@pytest.mark.parametrize("part", range(SLOW_PARTS))
def test_two_drivers_on_one_folder_many(tmp_path: Path, part: int) -> None:
    _drivers(tmp_path, part=part)


# ------------------------------------------------------------------------------ disk


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    mounted = run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], 30)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("a real small or read-only file system needs root (CI runs as root)")


def disk_case(tally: Tally, rng: random.Random, tmp: Path, template: Path, i: int) -> None:
    what = rng.choices(["run", "sim", "sweep", "bench"], weights=[4, 3, 2, 1])[0]
    size = rng.randrange(4, 400)
    case = f"disk#{i} {what} on {size} KiB"
    with tmpfs(tmp / f"disk{i}", f"{size}k") as disk:
        out = disk / "out"
        if what == "run" and rng.random() < 0.5:  # a finished trial already there
            try:
                shutil.copytree(template, out)
            except OSError:  # it does not fit: no half copy (the copy's tear, not ours)
                shutil.rmtree(out, ignore_errors=True)
        before = finished(out) if out.exists() else {}
        full = run(command(what, out, force=what == "run" and bool(before)))
        tally.saw(case, full.stdout, full.stderr)
        allowed = {0, 1, 2} if what == "sweep" else {0, 2}
        if full.returncode not in allowed:
            tally.wrong(case, f"exit {full.returncode}: {full.stderr[-300:]}")
        if full.returncode == 2:
            one_line_refusal(tally, case, full)
        left = [p.name for p in disk.rglob("*") if p.name.endswith(".tmp")]
        if left:
            tally.lost(case, f"temporary files left: {left}")
        check_files(tally, case, out, after_resume=False)
        for path in before:
            if not path.exists():
                tally.lost(case, f"{path.parent.name}: a finished trial gone")
        if what in ("run", "sweep"):
            subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
            kept = finished(out)
            resume = run(command(what, out))
            tally.saw(case, resume.stdout, resume.stderr)
            if resume.returncode != 0:
                tally.wrong(case, f"resume exited {resume.returncode}: {resume.stderr[-300:]}")
            for path, data in kept.items():
                if path.read_bytes() != data:
                    tally.lost(case, f"{path.parent.name}: finished, then re-run")
            expected = 4 if what == "sweep" else 1
            if len(finished(out)) != expected:
                tally.lost(case, f"{len(finished(out))} of {expected} finished after resume")
            check_files(tally, case, out, after_resume=True)
    tally.cases += 1


def _disks(tmp_path: Path, template: Path, part: int | None) -> None:
    needs_root()
    rng = rng_for("disk", part)
    tally = Tally(tally_name("disk", part))
    for i in range(case_count("disk", part)):
        disk_case(tally, rng, tmp_path, template, i)
    tally.close()


def test_full_disks(tmp_path: Path, finished_trial: Path) -> None:
    _disks(tmp_path, finished_trial, part=None)


@pytest.mark.slow
@pytest.mark.parametrize("part", range(SLOW_PARTS))
def test_full_disks_many(tmp_path: Path, finished_trial: Path, part: int) -> None:
    _disks(tmp_path, finished_trial, part=part)


# -------------------------------------------------------------------------- readonly


def readonly_case(tally: Tally, rng: random.Random, tmp: Path, template: Path, i: int) -> None:
    what = rng.choice(["run", "force", "sweep", "sim", "bench", "leaderboard"])
    nested = rng.random() < 0.5  # the read-only folder itself, or a folder to create in it
    case = f"readonly#{i} {what}{' (nested)' if nested else ''}"
    with tmpfs(tmp / f"ro{i}", "16m") as disk:
        shutil.copytree(template, disk / "runs")
        before = finished(disk / "runs")
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        out = disk / "runs" / "deeper" if nested else disk / "runs"
        if what in ("run", "force"):
            args = command("run", out, force=what == "force")
        else:
            args = command(what, out)
        res = run(args)
        tally.saw(case, res.stdout, res.stderr)
        # what may succeed: showing the finished trial, the leaderboard of it
        ok = {0} if (what in ("run", "leaderboard") and not nested) else set()
        if res.returncode not in ok | {2}:
            tally.wrong(case, f"exit {res.returncode}: {res.stderr[-300:]}")
        if res.returncode == 2:
            one_line_refusal(tally, case, res)
        if finished(disk / "runs") != before:
            tally.lost(case, "the finished trial changed")
    tally.cases += 1


def _readonly(tmp_path: Path, template: Path, part: int | None) -> None:
    needs_root()
    rng = rng_for("readonly", part)
    tally = Tally(tally_name("readonly", part))
    for i in range(case_count("readonly", part)):
        readonly_case(tally, rng, tmp_path, template, i)
    tally.close()


def test_read_only_folders(tmp_path: Path, finished_trial: Path) -> None:
    _readonly(tmp_path, finished_trial, part=None)


@pytest.mark.slow
@pytest.mark.parametrize("part", range(SLOW_PARTS))
def test_read_only_folders_many(tmp_path: Path, finished_trial: Path, part: int) -> None:
    _readonly(tmp_path, finished_trial, part=part)
