"""One workload against one OpenAI-compatible server, written to a run folder
(``servegym bench``).

The run folder holds ``run.json`` (what was run), ``requests.jsonl`` (one
:class:`~servegym.loadgen.records.RequestRecord` a line) and ``metrics.json``
(:class:`~servegym.scoring.metrics.Metrics`). Records are written before metrics are
computed, so a failure in a later step never loses a finished run.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from pydantic import BaseModel, ConfigDict, Field

from servegym.errors import UserError
from servegym.loadgen.target import RunOptions
from servegym.run_folder import prepare_out, write_json, write_records, write_text_atomic
from servegym.scoring.metrics import SLA, Metrics, Price, compute_metrics


class BenchRequest(BaseModel):
    """Everything ``servegym bench`` was asked to do."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    workload: str
    overrides: list[str] = Field(default_factory=list)
    seed: int = 0
    requests: int | None = None
    scale: float | None = None
    base_url: str | None = None
    mock: str | None = None
    model: str | None = None
    sla: SLA | None = None
    price: Price | None = None
    tokenizer: str | None = None
    timeout_s: float = 600.0
    keep_outputs: bool = False
    out: Path


@dataclass
class BenchOutcome:
    metrics: Metrics
    metrics_path: Path
    requests_path: Path
    title: str


class BenchProgress(Protocol):
    """How :func:`run_bench` reports progress (the command line draws it as a bar)."""

    def running(
        self, workload: str, base_url: str, total: int
    ) -> AbstractContextManager[Callable[[int, int], None]]:
        """Entered for the run of ``total`` requests (turns) of ``workload`` against
        ``base_url``; yields the callback told ``(done, total)`` as requests finish."""
        ...


_MOCK_KEYS = {"ttft_ms": float, "itl_ms": float, "tokens_per_chunk": int, "model": str}


def parse_mock_settings(text: str) -> list[str]:
    """Turn ``--mock 'ttft_ms=50,itl_ms=10'`` into mock-server command-line flags."""
    from servegym.loadgen.mock_openai import MockOptions

    flags: list[str] = []
    settings: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in _MOCK_KEYS:
            raise UserError(
                f"--mock: '{part}' is not key=value with key one of {', '.join(_MOCK_KEYS)}"
            )
        try:
            settings[key] = _MOCK_KEYS[key](value)
        except ValueError:
            raise UserError(
                f"--mock: {key} needs a {_MOCK_KEYS[key].__name__}, got '{value}'"
            ) from None
        flags += [f"--{key.replace('_', '-')}", value.strip()]
    try:  # the server's own checks (NaN or negative times), before it is started
        MockOptions(**settings)
    except ValueError as e:
        raise UserError(f"--mock: {e}") from None
    return flags


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def mock_server_process(flags: list[str], log_path: Path) -> Iterator[str]:
    """Start ``servegym mock-server`` in its own process; yield its base URL."""
    port = _free_port()
    cmd = [sys.executable, "-m", "servegym.loadgen.mock_server", "--port", str(port), *flags]
    try:
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
    except OSError as e:
        raise UserError(f"--mock: cannot write {log_path}: {e.strerror or e}") from None
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                why = exit_reason(proc.returncode, log_path)
                raise UserError(f"--mock: the mock server exited at start: {why}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise UserError("--mock: the mock server did not start within 30 s") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def exit_reason(code: int, log_path: Path) -> str:
    """Why a server that wrote its output to ``log_path`` exited: the log's tail, or, when
    the log is empty (a full disk takes the server's own output with it), its exit code and
    what is known of its disk."""
    try:
        tail = log_path.read_text(errors="replace")[-500:].strip()
    except OSError:
        tail = ""
    if tail:
        return tail
    why = f"exit code {code}, and nothing in its log {log_path}"
    try:
        disk = os.statvfs(log_path.parent)
    except OSError:
        return why
    if disk.f_bavail * disk.f_frsize < 64 * 1024:
        why += f" (the disk of {log_path.parent} is full)"
    return why


async def _first_model(base_url: str) -> str:
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(url) as resp,
        ):
            if resp.status != 200:
                raise UserError(f"--base-url: GET {url} answered HTTP {resp.status}")
            body = await resp.json(content_type=None)
    except aiohttp.ClientError as e:
        raise UserError(f"--base-url: cannot reach {base_url}: {e}") from None
    except TimeoutError:
        raise UserError(f"--base-url: {url} did not answer within 10 s") from None
    try:
        return str(body["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise UserError(f"--model: {url} lists no model; pass --model NAME") from None


def run_bench(request: BenchRequest, progress: BenchProgress | None = None) -> BenchOutcome:
    """Materialise the workload, drive it, and write the run folder."""
    from servegym.loadgen.eventloop import run as run_async
    from servegym.loadgen.http_target import HttpTarget
    from servegym.workloads.generate import materialise
    from servegym.workloads.registry import load_spec

    spec, base_dir = load_spec(
        request.workload, request.overrides, requests=request.requests, scale=request.scale
    )
    mock_flags = parse_mock_settings(request.mock) if request.mock is not None else None
    if request.tokenizer is not None:
        from servegym.workloads.text import load_tokenizer

        load_tokenizer(request.tokenizer)  # fail early, naming --tokenizer
    prepare_out(request.out)
    workload = materialise(spec, request.seed, base_dir=base_dir)
    workload_hash = workload.content_hash()

    with _server(request, mock_flags) as base_url:
        model = request.model or run_async(_first_model(base_url))
        options = RunOptions(
            model=model,
            request_timeout_s=request.timeout_s,
            keep_outputs=request.keep_outputs,
            tokenizer=request.tokenizer,
        )
        meta = {
            "workload": spec.name,
            "workload_spec": spec.model_dump(mode="json"),
            "workload_hash": workload_hash,
            "seed": request.seed,
            "base_url": base_url if request.mock is None else f"mock({request.mock})",
            "model": model,
            "sla": request.sla.model_dump() if request.sla else None,
            "price": request.price.model_dump() if request.price else None,
            "argv": sys.argv[1:],
        }
        write_json(request.out / "run.json", meta)
        total = workload.num_turns
        running = (
            progress.running(spec.name, base_url, total)
            if progress is not None
            else nullcontext(_no_progress)
        )
        with running as on_progress:
            result = run_async(HttpTarget(base_url).run(workload, options, on_progress))

    requests_path = request.out / "requests.jsonl"
    write_records(result, requests_path)
    metrics = compute_metrics(result, sla=request.sla, price=request.price)
    metrics_path = request.out / "metrics.json"
    write_text_atomic(metrics_path, metrics.model_dump_json(indent=2) + "\n")
    title = f"{spec.name} (seed {request.seed}) on {model}"
    return BenchOutcome(metrics, metrics_path, requests_path, title)


def _no_progress(done: int, total: int) -> None:
    pass


@contextmanager
def _server(request: BenchRequest, mock_flags: list[str] | None) -> Iterator[str]:
    if mock_flags is not None:
        with mock_server_process(mock_flags, request.out / "mock-server.log") as url:
            yield url
    else:
        assert request.base_url is not None
        url = request.base_url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise UserError(f"--base-url: '{request.base_url}' is not an http(s) URL")
        yield url


__all__ = [
    "BenchOutcome",
    "BenchProgress",
    "BenchRequest",
    "parse_mock_settings",
    "run_bench",
]
