"""``servegym bench`` end to end, as a user runs it (``python -m servegym bench``): the mock
server's lifetime, exit codes when nothing completes, and prompt ids that fit the served
model's vocabulary."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SMALL = ["--workload", "balanced", "--requests", "4", "--scale", "0.02"]


def servegym(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servegym", *args], capture_output=True, text=True, timeout=timeout
    )


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (read from /proc's per-thread children lists)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for k in map(int, kids):
                if k not in found:
                    found.add(k)
                    todo.append(k)
    return found


def _alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's zombie may wait for an init that never reaps)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_bench_takes_its_mock_server_with_it(tmp_path: Path) -> None:
    """SIGKILL gives the harness no chance to stop anything: the mock must go by itself."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "servegym", "bench", "--mock", "ttft_ms=0,itl_ms=500"]
    cmd += [*SMALL, "--out", str(out)]
    bench = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while not (out / "run.json").exists():  # the mock is up and the run has begun
            assert bench.poll() is None, "bench ended before its run began"
            assert time.monotonic() < deadline, "bench never began its run"
            time.sleep(0.05)
        servers = _children(bench.pid)
        assert servers, "bench --mock started no server process"
        log = (out / "mock-server.log").read_text()
        port = int(re.search(r"listening on http://127.0.0.1:(\d+)", log)[1])  # type: ignore[index]
        assert _listening(port)
        bench.send_signal(signal.SIGKILL)
        bench.wait(10)
        deadline = time.monotonic() + 10
        while any(map(_alive, servers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in servers if _alive(p)]
        assert left == [], f"the mock server outlived bench: {left}"
        assert not _listening(port), f"port {port} is still held"
    finally:
        if bench.poll() is None:
            bench.kill()
        for p in servers:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_bench_with_nothing_completed_fails_and_names_the_error(tmp_path: Path) -> None:
    """0 of N completed is not a result: exit 2, the server's error in one line; the records
    are still written for a look."""
    out = tmp_path / "out"
    proc = servegym("bench", "--mock", "ttft_ms=0,itl_ms=0", "--model", "nosuch", *SMALL,
                    "--out", str(out))  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0, err
    assert "0 of 4 requests completed" in err
    assert "HTTP 404" in err and "nosuch" in err and "(4 requests)" in err
    assert str(out / "requests.jsonl") in err
    assert len((out / "requests.jsonl").read_text().splitlines()) >= 4
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["completed"] == 0 and metrics["failed"] == 4


@contextmanager
def mock_server(*flags: str) -> Iterator[str]:
    """``servegym mock-server`` on a free port, with ``flags``; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "servegym.loadgen.mock_server", "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, line
        yield line.split("listening on", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(10)


def _model_folder(root: Path, vocab: int) -> Path:
    """A model folder as a local vLLM server's ``/v1/models`` names it (``root``)."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"vocab_size": vocab, "model_type": "llama"}))
    return root


def test_bench_with_some_failures_succeeds_and_says_how_many(tmp_path: Path) -> None:
    """Requests longer than the server's context fail; the others are a result."""
    with mock_server("--model", "m", "--max-model-len", "43") as url:
        out = tmp_path / "out"
        proc = servegym("bench", "--base-url", url, *SMALL, "--out", str(out))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        metrics = json.loads((out / "metrics.json").read_text())
        assert 0 < metrics["failed"] < 4 and metrics["completed"] == 4 - metrics["failed"]
        assert f"{metrics['failed']} of 4 requests failed" in proc.stdout + proc.stderr
        assert "max_model_len 43" in proc.stdout + proc.stderr


def test_prompt_ids_fit_the_served_models_vocabulary_out_of_the_box(tmp_path: Path) -> None:
    """The README's CPU-track path, on a stand-in: a server of a 4,096-token model that
    refuses ids outside it (as vLLM does) and names its model folder in ``/v1/models``."""
    folder = _model_folder(tmp_path / "tiny", 4096)
    with mock_server("--model", "tiny", "--vocab-size", "4096", "--root", str(folder)) as url:
        out = tmp_path / "out"
        proc = servegym("bench", "--base-url", url, "--model", "tiny", *SMALL, "--out", str(out))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["completed"] == 4 and metrics["failed"] == 0
        run = json.loads((out / "run.json").read_text())
        assert run["workload_spec"]["prompt"]["token_id_high"] == 4096
        assert "[1000, 4096)" in proc.stderr and "config.json" in proc.stderr  # said, not silent


def test_the_tokenizer_flag_fits_prompt_ids_to_its_vocabulary(tmp_path: Path) -> None:
    """A server that does not name a local model folder: ``--tokenizer`` gives the size."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(500)}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    with mock_server("--model", "m", "--vocab-size", "500") as url:
        out = tmp_path / "out"
        flags = ["--tokenizer", str(tmp_path), "--set", "prompt.token_id_low=10"]
        proc = servegym("bench", "--base-url", url, *SMALL, "--out", str(out), *flags)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads((out / "metrics.json").read_text())["completed"] == 4
        run = json.loads((out / "run.json").read_text())
        assert run["workload_spec"]["prompt"]["token_id_high"] == 500


def test_ids_beyond_the_vocabulary_are_refused_with_the_fix(tmp_path: Path) -> None:
    """No folder, no tokenizer: the server's refusal is named, with the flag that fits."""
    with mock_server("--model", "m", "--vocab-size", "4096") as url:
        out = tmp_path / "out"
        proc = servegym("bench", "--base-url", url, *SMALL, "--out", str(out))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "out of vocabulary" in proc.stderr
        assert "--tokenizer" in proc.stderr and "prompt.token_id_high" in proc.stderr


def test_errors_differing_only_in_numbers_are_one_kind() -> None:
    """vLLM names each request's own token id; eight requests are one error, not eight."""
    from servegym.loadgen.records import RequestRecord
    from servegym.runner.bench import describe_errors

    def failed(error: str, status: int | None = None) -> RequestRecord:
        return RequestRecord(request_id="r", session_id=0, turn_index=0, prompt_tokens=1,
                             expected_output_tokens=1, scheduled_ns=0, error=error,
                             http_status=status)  # fmt: skip

    records = [failed(f"server error after 0 chunks: Token id {29000 + i} is out of vocabulary")
               for i in range(7)]  # fmt: skip
    records.append(failed("The model `x` does not exist.", 404))
    text = describe_errors(records)
    assert text == (
        "server error after 0 chunks: Token id 29000 is out of vocabulary (7 requests); "
        "HTTP 404: The model `x` does not exist. (1 request)"
    )
