"""Faults, each ending in a named outcome with nothing finished lost, and no process left
behind: a submission server that dies at start, mid-evaluation, never gets ready, runs out
of memory, or hangs mid-stream; a full disk when results are written; the harness killed
(SIGKILL) or interrupted (SIGINT) during an evaluation, then run again. The agent's provider
failing (429, 500, timeouts) is in test_llm_agent.py and test_llm_providers.py."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from engine_support import StandInEngine
from task_support import with_evaluation

from servegym.engines.base import ModelRef
from servegym.engines.config import ServingConfig
from servegym.errors import UserError
from servegym.runner import results as results_module
from servegym.runner.evaluation import evaluate as final_evaluation
from servegym.runner.trial import run_trial
from servegym.tasks.loader import LoadedTask, load_task_folder
from servegym.tracks import track_for

DATA = Path(__file__).parent / "data" / "tasks"
MODEL = ModelRef(path="mock", served_name="mock")
MOCK = "from servegym.loadgen.mock_server import main; main(sys.argv[1:])"


@pytest.fixture
def loaded() -> LoadedTask:
    return with_evaluation(
        load_task_folder(DATA / "tiny-cpu"), start_timeout_s=4.0, request_timeout_s=3.0
    )


def submission(program: str) -> ServingConfig:
    """A submission whose server is the stand-in engine's mock server, started by
    ``program`` (python code run before the mock server's main, which gets the args)."""
    return ServingConfig(block_size=32, extra_args=["--program", program])


class FaultyEngine(StandInEngine):
    """The stand-in engine, except that a config carrying ``--program CODE`` runs CODE
    (then, if it returns, the mock server) in place of the plain mock server."""

    def render_args(self, config, model, host_addr, port):  # type: ignore[no-untyped-def]
        args = [a for a in config.extra_args]
        code = None
        if "--program" in args:
            i = args.index("--program")
            code = args[i + 1]
            del args[i : i + 2]
        base = super().render_args(
            config.model_copy(update={"extra_args": args}), model, host_addr, port
        )
        if code is None:
            return base
        return ["--", code, *base]

    def command(self):  # type: ignore[no-untyped-def]
        self.launches += 1
        runner = (
            "import os, sys\n"
            "if sys.argv[1:2] == ['--']:\n"
            "    code = sys.argv[2]; sys.argv = [sys.argv[0], *sys.argv[3:]]\n"
            "    exec(code)\n"
            f"{MOCK}\n"
        )
        return [sys.executable, "-c", runner]


def evaluate(loaded: LoadedTask, tmp_path: Path, config: ServingConfig):  # type: ignore[no-untyped-def]
    return final_evaluation(
        loaded,
        config,
        7,
        track=track_for(
            loaded,
            server_logs=tmp_path / "servers",
            engine=FaultyEngine(tmp_path / "pid"),
            model=MODEL,
        ),
    )


def test_a_server_that_exits_at_start_is_a_launch_failure(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    ev = evaluate(loaded, tmp_path, submission("print('boom at start'); sys.exit(3)"))
    assert ev.outcome == "launch_failed"
    assert "crashed during start-up: exit code 3" in ev.gates["launch"].detail


def test_a_server_that_never_gets_ready_is_a_launch_failure(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    ev = evaluate(loaded, tmp_path, submission("import time; time.sleep(600)"))
    assert ev.outcome == "launch_failed"
    assert "did not become ready within 4 s" in ev.gates["launch"].detail


def test_out_of_memory_at_launch_is_named(loaded: LoadedTask, tmp_path: Path) -> None:
    code = "print('RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB'); sys.exit(1)"
    ev = evaluate(loaded, tmp_path, submission(code))
    assert ev.outcome == "launch_failed"
    # recognised from the log (the exit code alone says nothing of memory)
    assert "exit code 1 (out of memory)" in ev.gates["launch"].detail


def test_a_server_that_dies_mid_evaluation_is_crashed_and_keeps_what_finished(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    # dies at its 30th generation request: in the third of five pairs
    code = textwrap.dedent(
        """
        import servegym.loadgen.mock_server as ms
        real, seen = ms.parse_request, [0]
        def counting(*args):
            seen[0] += 1
            if seen[0] >= 30:
                os._exit(9)
            return real(*args)
        ms.parse_request = counting
        """
    )
    ev = evaluate(loaded, tmp_path, submission(code))
    assert ev.outcome == "crashed", ev.gates
    assert ev.error is not None and "9" in ev.error
    assert ev.measurements and ev.measurements[-1][1] is None  # the pair it died in
    assert ev.baseline.objective_values  # the baseline's runs are kept


def test_a_stream_that_hangs_fails_its_requests_and_is_flagged(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    config = ServingConfig(block_size=32, extra_args=["--fault", "hang_after=2"])
    started = time.monotonic()
    ev = evaluate(loaded, tmp_path, config)
    assert ev.outcome == "integrity_flagged", ev.gates
    assert "did not complete" in ev.gates["integrity"].detail
    assert time.monotonic() - started < 120  # the request timeout, not forever


def test_a_full_disk_is_one_line_and_the_trial_reruns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results_module, "write_atomic", full)
    with pytest.raises(UserError) as e:
        run_trial(DATA / "tiny-latency", "default", 0, tmp_path)
    assert "No space left on device" in e.value.message and "runs again" in e.value.message
    assert "scored" in e.value.message and "\n" not in e.value.message
    assert not list(tmp_path.glob("*/trial.json"))
    monkeypatch.undo()
    assert run_trial(DATA / "tiny-latency", "default", 0, tmp_path).outcome == "scored"


DRIVER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from test_faults import FaultyEngine, MODEL, submission
    from servegym.engines.config import ServingConfig
    from servegym.runner.evaluation import evaluate
    from servegym.tasks.loader import load_task_folder
    from servegym.tracks import track_for
    out = Path({out!r})
    loaded = load_task_folder(Path({task!r}))
    track = track_for(
        loaded, server_logs=out / "servers", engine=FaultyEngine(out / "pid"), model=MODEL
    )
    ev = evaluate(
        loaded,
        ServingConfig(block_size=32, extra_args=["--itl-ms", "100"]),  # a 30 s evaluation
        7,
        track=track,
    )
    (out / "done.json").write_text('{{"outcome": "%s"}}' % ev.outcome)
    """
)


def _mock_pids() -> set[int]:
    out = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True).stdout
    return {
        int(line.split()[0]) for line in out.splitlines()[1:] if "mock_server import main" in line
    }


def _descendants(root: int) -> set[int]:
    """Every live process descended from ``root`` (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_the_harness_killed_mid_evaluation_leaves_no_server_and_no_half_result(
    tmp_path: Path, sig: signal.Signals
) -> None:
    code = DRIVER.format(
        tests=str(Path(__file__).parent), out=str(tmp_path), task=str(DATA / "tiny-cpu")
    )
    # SIGINT as a terminal's Ctrl-C delivers it: a pytest-xdist worker ignores SIGINT, and a
    # child would inherit that (Python then installs no KeyboardInterrupt handler)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while len(_mock_pids() & _descendants(proc.pid)) < 2:
        assert time.monotonic() < deadline, "the evaluation never started its servers"
        time.sleep(0.1)
    time.sleep(3.0)  # mid-evaluation: both servers up, pairs running
    # this harness's servers only: other runs on the machine may start mock servers too
    ours = _mock_pids() & _descendants(proc.pid)
    os.kill(proc.pid, sig)
    proc.wait(30)
    time.sleep(2.0)  # PR_SET_PDEATHSIG (SIGKILL) or the unwinding stop (SIGINT) lands
    assert ours & _mock_pids() == set(), "a server outlived the harness"
    assert not (tmp_path / "done.json").exists()
    for path in tmp_path.rglob("*.json"):
        json.loads(path.read_text())  # nothing half-written
