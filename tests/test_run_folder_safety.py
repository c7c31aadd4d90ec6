"""Nothing lost, one clear line: the run folder under concurrency, kills, a full disk and
an interrupt (issue 19, items 1, 3, 4, 5 and 13), each through the real command.

- two sweep drivers (or two runs of one trial) on one folder: the second is refused in one
  line, exit 2; a lock left by a killed driver is taken over;
- ``run --force`` killed mid-run keeps the finished trial, byte for byte;
- a sweep's resume re-runs a trial whose ``trial.json`` is unreadable, and the leaderboard
  leaves such trials (and unfinished ones) out, saying how many and why;
- a full disk (a real small tmpfs: root only, skipped with the reason otherwise) ends
  ``run``, ``sim`` and ``bench --mock`` in one line, exit 2, with no torn line and no
  temporary file;
- ``task list`` at 80 columns, SIGINT / SIGTERM with their one line, private trial files.

Trials are held mid-agent-phase by :class:`safety_agents.GateAgent` (it waits for a file),
so no test depends on timing guesses.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.console import Console
from safety_agents import GATE_AGENT, GATE_ENV

from servegym.cli.sweep import run_sweep_command
from servegym.runner.results import read_trial

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data" / "tasks"
TASK = str(DATA / "tiny-latency")
SWEEP_TASK = "voice-stream-h100"  # a shipped sim task: the sweep command has no --root


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "servegym", *args]


def gate_env(gate: Path) -> dict[str, str]:
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, GATE_ENV: str(gate), "COLUMNS": "120"}


def wait_for(what: str, done: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def experimenting(out: Path) -> bool:
    """Whether some trial under ``out`` (a re-run's hidden folder included) logged an
    experiment: its agent is then past its first experiment, waiting at the gate."""
    return any(p.stat().st_size > 0 for p in out.rglob("experiments.jsonl"))


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def finish(proc: subprocess.Popen[str], gate: Path) -> tuple[int, str, str]:
    gate.touch()
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def lock_free(path: Path) -> bool:
    """Whether nobody holds the kernel lock on ``path`` (true when there is no such file)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


# ------------------------------------------------------------------ item 1: two drivers


def test_a_second_sweep_into_a_busy_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    out, gate = tmp_path / "run", tmp_path / "gate"
    args = cli("sweep", "--tasks", SWEEP_TASK, "--agents", GATE_AGENT, "--seeds", "2",
               "--max-concurrent", "1", "--out", str(out))  # fmt: skip
    first = subprocess.Popen(args, env=gate_env(gate), text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_for("the first sweep's first experiment", lambda: experimenting(out))
        second = subprocess.run(args, env=gate_env(gate), capture_output=True, text=True,
                                timeout=90)  # fmt: skip
        line = one_line(second.stderr)
        assert second.returncode == 2, second.stdout + second.stderr
        assert "--out" in line and "in use" in line and f"pid {first.pid}" in line
        # a standalone run into the sweep's folder (here: re-running a trial of its grid)
        # would replace a result the sweep's other trials watch: refused as well
        run = subprocess.run(cli("run", "--task", SWEEP_TASK, "--agent", "default", "--out",
                                 str(out)), capture_output=True, text=True, timeout=90)  # fmt: skip
        assert run.returncode == 2 and "a sweep" in one_line(run.stderr), run.stderr
    finally:
        code, stdout, stderr = finish(first, gate)
    assert code == 0, stdout + stderr
    trials = [read_trial(p) for p in sorted(out.glob("*/trial.json"))]
    assert [t.outcome for t in trials] == ["scored", "scored"]  # no sibling's tampering seen
    assert not (out / ".sweep-driver.lock").exists()  # released on the way out


def test_a_killed_drivers_lock_is_taken_over(tmp_path: Path) -> None:
    out, gate = tmp_path / "run", tmp_path / "gate"
    args = cli("sweep", "--tasks", SWEEP_TASK, "--agents", GATE_AGENT, "--seeds", "2",
               "--max-concurrent", "1", "--out", str(out))  # fmt: skip
    first = subprocess.Popen(args, env=gate_env(gate), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
    wait_for("the first sweep's first experiment", lambda: experimenting(out))
    first.kill()
    first.wait()
    left = out / ".sweep-driver.lock"
    assert left.exists()  # the killed driver's lock file stays, holding nothing
    trial_locks = list(out.glob(".*__s*.lock"))
    wait_for("the killed worker's end", lambda: all(lock_free(p) for p in trial_locks), 30)
    gate.touch()
    again = subprocess.run(args, env=gate_env(gate), capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming" in again.stdout
    assert [read_trial(p).outcome for p in sorted(out.glob("*/trial.json"))] == ["scored"] * 2


def test_a_second_run_of_a_running_trial_is_refused_in_one_line(tmp_path: Path) -> None:
    out, gate = tmp_path / "runs", tmp_path / "gate"
    args = cli("run", "--task", TASK, "--agent", GATE_AGENT, "--out", str(out))
    first = subprocess.Popen(args, env=gate_env(gate), text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_for("the first run's first experiment", lambda: experimenting(out))
        for extra in ([], ["--force"]):
            second = subprocess.run([*args, *extra], env=gate_env(gate), capture_output=True,
                                    text=True, timeout=90)  # fmt: skip
            line = one_line(second.stderr)
            assert second.returncode == 2, second.stdout + second.stderr
            assert "in use" in line and "tiny-latency__" in line
    finally:
        code, stdout, stderr = finish(first, gate)
    assert code == 0, stdout + stderr
    assert read_trial(next(out.glob("*/trial.json"))).outcome == "scored"


def test_runs_share_a_folder_but_a_re_run_of_a_result_waits_for_it_alone(
    tmp_path: Path,
) -> None:
    out, gate = tmp_path / "runs", tmp_path / "gate"
    base = ["run", "--task", TASK, "--out", str(out)]
    gate.touch()
    done = subprocess.run(cli(*base, "--agent", "default"), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    gate.unlink()
    held = subprocess.Popen(cli(*base, "--agent", GATE_AGENT), env=gate_env(gate), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_for("the held run's first experiment",
                 lambda: experimenting(out / f"tiny-latency__{GATE_AGENT}__s0"))  # fmt: skip
        # replacing a finished result would change a file the held trial watches: refused
        again = subprocess.run(cli(*base, "--agent", "default", "--force"), capture_output=True,
                               text=True, timeout=90)  # fmt: skip
        assert again.returncode == 2 and "in use" in one_line(again.stderr), again.stderr
        # a new trial beside it is fine
        other = subprocess.run(cli(*base, "--agent", "default", "--seed", "1"),
                               capture_output=True, text=True, timeout=300)  # fmt: skip
        assert other.returncode == 0, other.stderr
    finally:
        code, stdout, stderr = finish(held, gate)
    assert code == 0, stdout + stderr
    outcomes = {p.parent.name: read_trial(p).outcome for p in out.glob("*/trial.json")}
    assert sorted(outcomes.values()) == ["scored"] * 3, outcomes


# ------------------------------------------------------------ item 3: run --force killed


def test_run_force_killed_mid_run_keeps_the_finished_trial(tmp_path: Path) -> None:
    out, gate = tmp_path / "runs", tmp_path / "gate"
    args = cli("run", "--task", TASK, "--agent", GATE_AGENT, "--out", str(out))
    gate.touch()
    done = subprocess.run(args, env=gate_env(gate), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (folder,) = out.glob("*/trial.json")
    folder = folder.parent
    kept = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert {"trial.json", "latencies.json", "experiments.jsonl"} <= set(kept)

    gate.unlink()
    rerun = subprocess.Popen([*args, "--force"], env=gate_env(gate), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip

    first_log = folder / "experiments.jsonl"
    first_written = first_log.stat().st_mtime_ns

    def started() -> bool:  # the re-run logged its first experiment (wherever it works)
        if rerun.poll() is not None or not (folder / "trial.json").exists():
            return True
        return any(
            p.stat().st_size > 0 and (p != first_log or p.stat().st_mtime_ns != first_written)
            for p in out.rglob("experiments.jsonl")
        )

    wait_for("the re-run's first experiment", started)
    assert rerun.poll() is None, "the re-run ended by itself"
    rerun.kill()
    rerun.wait()
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == kept

    shown = subprocess.run(args, env=gate_env(gate), capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "already finished" in shown.stdout
    assert [p.name for p in out.iterdir()] == [folder.name]  # the killed re-run is tidied away

    gate.touch()
    forced = subprocess.run([*args, "--force"], env=gate_env(gate), capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert forced.returncode == 0, forced.stdout + forced.stderr
    new = read_trial(folder / "trial.json")
    assert (
        new.outcome == "scored" and new.started_at != json.loads(kept["trial.json"])["started_at"]
    )
    assert sorted(p.name for p in out.iterdir()) == [folder.name]  # no aside folder, no lock


def test_a_swap_cut_short_settles_to_a_complete_result(tmp_path: Path) -> None:
    from servegym.runner.folders import aside, settle, staged

    final = tmp_path / "t__a__s0"
    for complete_new in (True, False):
        new, old = staged(final), aside(final)
        new.mkdir()
        old.mkdir()
        (old / "trial.json").write_text("old")
        if complete_new:
            (new / "trial.json").write_text("new")
        settle(final)  # killed between the two renames: `final` is missing
        assert (final / "trial.json").read_text() == ("new" if complete_new else "old")
        assert not new.exists() and not old.exists()
        (final / "trial.json").unlink()
        final.rmdir()


# ------------------------------------------------- items 4 and 13: unreadable, unfinished


def test_a_sweep_reruns_an_unreadable_trial_and_the_leaderboard_counts_what_it_left_out(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    console = Console(record=True, width=120)
    assert run_sweep_command("tiny-latency", "default", 2, out, console, tasks_root=DATA) == 0
    corrupt = out / "tiny-latency__default__s1" / "trial.json"
    good = corrupt.read_bytes()
    corrupt.write_text('{"task": "tiny-lat')  # a torn write by some other tool
    (out / "tiny-throughput__default__s0").mkdir()  # a trial never finished

    from typer.testing import CliRunner

    from servegym.cli import app

    board = CliRunner().invoke(app, ["leaderboard", str(out)])
    assert board.exit_code == 0, board.output
    text = " ".join(board.stdout.split())
    assert "1 unfinished trial(s) left out" in text and "tiny-throughput__default__s0" in text
    assert "1 trial(s) left out whose trial.json is unreadable" in text
    assert "tiny-latency__default__s1" in text
    csv = CliRunner().invoke(app, ["leaderboard", str(out), "--format", "csv"])
    assert csv.exit_code == 0 and "left out" in csv.stderr and "left out" not in csv.stdout

    again = Console(record=True, width=120)
    assert run_sweep_command("tiny-latency", "default", 2, out, again, tasks_root=DATA) == 0
    assert "resuming, 1 finished already" in again.export_text()
    rerun = read_trial(corrupt)  # re-run, not skipped
    assert rerun.outcome == "scored"
    assert json.loads(good)["score"] == rerun.score  # the same trial, run again


# ------------------------------------------------------------------- item 5: a full disk


@contextlib.contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """A real file system of ``size`` (tmpfs) at ``where``; root only."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def no_temporary_files(folder: Path) -> None:
    assert [p.name for p in folder.rglob("*") if p.name.endswith(".tmp")] == []


def test_run_on_a_full_disk_ends_in_one_line_with_whole_lines(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "64k") as disk:
        out = disk / "runs"
        args = cli("run", "--task", TASK, "--agent", "random", "--out", str(out))
        full = subprocess.run(args, capture_output=True, text=True, timeout=300)
        line = one_line(full.stderr)
        assert full.returncode == 2, full.stdout + full.stderr
        assert "No space left on device" in line and "experiments.jsonl" in line
        (log,) = out.glob("*/experiments.jsonl")
        text = log.read_text()
        assert text and text.endswith("\n")
        for row in text.splitlines():
            json.loads(row)  # no torn last line
        assert not list(out.glob("*/trial.json"))
        no_temporary_files(out)
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        again = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
        assert read_trial(next(out.glob("*/trial.json"))).outcome == "scored"


def test_sim_on_a_full_disk_leaves_no_temporary_file(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "32k") as disk:
        args = cli("sim", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--workload",
                   "balanced", "--out", str(disk / "sim"))  # fmt: skip
        full = subprocess.run(args, capture_output=True, text=True, timeout=300)
        line = one_line(full.stderr)
        assert full.returncode == 2 and "No space left on device" in line, full.stderr
        no_temporary_files(disk)


def test_bench_mock_on_a_full_disk_says_why_the_server_exited(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "32k") as disk:
        (disk / "out").mkdir()
        with contextlib.suppress(OSError), (disk / "filler").open("wb") as f:
            f.write(b"\0" * 64 * 1024)  # fill it to the last byte
        args = cli("bench", "--mock", "ttft_ms=1", "--workload", "balanced", "--requests", "3",
                   "--out", str(disk / "out"))  # fmt: skip
        full = subprocess.run(args, capture_output=True, text=True, timeout=120)
        line = one_line(full.stderr)
        assert full.returncode == 2, full.stderr
        assert "--mock" in line and "exit code" in line and "full" in line


def test_a_line_log_cut_short_keeps_its_whole_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without root: a write that stops half-way (what a full disk does) is cut back."""
    from servegym.run_folder import LineLog

    log = LineLog(tmp_path / "x.jsonl")
    log.append('{"a": 1}')
    real_write = os.write

    def half(fd: int, data: bytes | memoryview) -> int:
        if len(data) > 4:
            real_write(fd, bytes(data[:4]))
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half)
    with pytest.raises(OSError):
        log.append('{"b": 2}')
    monkeypatch.undo()
    log.append('{"c": 3}')
    log.close()
    assert (tmp_path / "x.jsonl").read_text() == '{"a": 1}\n{"c": 3}\n'


# ------------------------------------------------------- item 13: 80 columns, signals


def test_task_list_is_readable_at_80_columns() -> None:
    from servegym.tasks.loader import list_tasks

    shown = subprocess.run(cli("task", "list"), capture_output=True, text=True, timeout=120,
                           env={**os.environ, "COLUMNS": "80"})  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    words = " ".join(shown.stdout.split())  # a long label may wrap, between words only
    for info in list_tasks():
        assert info.task is not None
        label = f"{'max' if info.task.objective.higher_is_better else 'min'} "
        label += info.task.objective.label()
        assert any(info.id in line for line in lines), info.id  # whole, on one line
        assert label in words and info.task.model in words, label


@pytest.mark.parametrize(
    ("sig", "code", "words"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_a_signal_ends_a_sweep_with_one_line(
    tmp_path: Path, sig: signal.Signals, code: int, words: str
) -> None:
    out, gate = tmp_path / "run", tmp_path / "gate"
    args = cli("sweep", "--tasks", SWEEP_TASK, "--agents", GATE_AGENT, "--out", str(out))
    proc = subprocess.Popen(args, env=gate_env(gate), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    wait_for("the sweep's first experiment", lambda: experimenting(out))
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert words in one_line(err)
    assert not (out / ".sweep-driver.lock").exists()


def test_trial_files_are_private(tmp_path: Path) -> None:
    from servegym.runner.trial import run_trial

    run_trial(TASK, "default", 0, tmp_path)
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert folder.stat().st_mode & 0o777 == 0o700
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.rglob("*") if p.is_file()}
    assert modes and set(modes.values()) == {0o600}, modes


def test_judge_of_an_unreadable_trial_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from servegym.cli import app

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # never used: the file fails first

    folder = tmp_path / "t__a__s0"
    folder.mkdir()
    (folder / "trial.json").write_text('{"task": "t"')
    judged = CliRunner().invoke(app, ["judge", str(folder), "--model", "openai:gpt-x"])
    assert judged.exit_code == 2, judged.output
    assert "trial.json" in one_line(judged.stderr) and "unreadable" in judged.stderr
