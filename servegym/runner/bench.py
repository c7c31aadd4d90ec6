"""One workload against one OpenAI-compatible server, written to a run folder
(``servegym bench``).

The run folder holds ``run.json`` (what was run), ``requests.jsonl`` (one
:class:`~servegym.loadgen.records.RequestRecord` a line) and ``metrics.json``
(:class:`~servegym.scoring.metrics.Metrics`). Records are written before metrics are
computed, so a failure in a later step never loses a finished run.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from servegym.engines.process import child_setup, free_port
from servegym.errors import UserError
from servegym.loadgen.target import RunOptions
from servegym.run_folder import prepare_out, write_json, write_records, write_text_atomic
from servegym.scoring.metrics import SLA, Metrics, Price, compute_metrics

if TYPE_CHECKING:
    from servegym.loadgen.records import RequestRecord
    from servegym.loadgen.served_model import ServedModel, Vocabulary
    from servegym.workloads.model import Workload
    from servegym.workloads.spec import WorkloadSpec


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
    notes: list[str] = field(default_factory=list)
    """What the user should know about the run: prompt ids fitted to the model's vocabulary,
    requests beyond its context, requests that failed."""


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


@contextmanager
def mock_server_process(flags: list[str], log_path: Path) -> Iterator[str]:
    """Start ``servegym mock-server`` in its own process; yield its base URL.

    The server dies with this process however it ends (``PR_SET_PDEATHSIG``, as every
    server the harness starts): a SIGKILLed ``bench`` leaves no mock holding its port."""
    port = free_port()
    cmd = [sys.executable, "-m", "servegym.loadgen.mock_server", "--port", str(port), *flags]
    try:
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=child_setup(os.getpid()),
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


def run_bench(request: BenchRequest, progress: BenchProgress | None = None) -> BenchOutcome:
    """Ask the server what it serves, fit the workload's prompt ids to the model's
    vocabulary, drive the workload, and write the run folder.

    Raises :class:`BenchFailed` (after writing the folder) when no request completed."""
    from servegym.loadgen.eventloop import run as run_async
    from servegym.loadgen.http_target import HttpTarget
    from servegym.loadgen.served_model import served_model
    from servegym.workloads.generate import materialise
    from servegym.workloads.registry import load_spec

    spec, base_dir = load_spec(
        request.workload, request.overrides, requests=request.requests, scale=request.scale
    )
    mock_flags = parse_mock_settings(request.mock) if request.mock is not None else None
    tokenizer_vocab = None
    if request.tokenizer is not None:
        from servegym.loadgen.served_model import tokenizer_vocabulary

        tokenizer_vocab = tokenizer_vocabulary(request.tokenizer)  # fails early, naming it
    prepare_out(request.out)

    with _server(request, mock_flags) as base_url:
        served = run_async(served_model(base_url, request.model))
        model = served.name
        vocab = tokenizer_vocab or _folder_vocabulary(served)
        notes: list[str] = []
        if vocab is not None:
            spec, fitted = fit_prompt_ids(spec, vocab)
            notes += [fitted] if fitted else []
        workload = materialise(spec, request.seed, base_dir=base_dir)
        if served.max_model_len is not None:
            notes += [n for n in [context_note(workload, served.max_model_len)] if n]
        options = RunOptions(
            model=model,
            request_timeout_s=request.timeout_s,
            keep_outputs=request.keep_outputs,
            tokenizer=request.tokenizer,
        )
        meta = {
            "workload": spec.name,
            "workload_spec": spec.model_dump(mode="json"),
            "workload_hash": workload.content_hash(),
            "seed": request.seed,
            "base_url": base_url if request.mock is None else f"mock({request.mock})",
            "model": model,
            "vocabulary": {"size": vocab.size, "source": vocab.source} if vocab else None,
            "max_model_len": served.max_model_len,
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
    measured = [r for r in result.records if not r.warmup]
    failed = [r for r in measured if not r.ok]
    if measured and len(failed) == len(measured):
        raise BenchFailed(
            f"bench: 0 of {len(measured)} requests completed on {model} at {base_url}: "
            f"{describe_errors(failed)}{_vocab_hint(failed, vocab)}; records: {requests_path}"
        )
    if failed:
        notes.append(
            f"{len(failed)} of {len(measured)} requests failed (metrics are over the "
            f"{len(measured) - len(failed)} that completed): {describe_errors(failed)}"
        )
    title = f"{spec.name} (seed {request.seed}) on {model}"
    return BenchOutcome(metrics, metrics_path, requests_path, title, notes)


class BenchFailed(UserError):
    """No measured request completed: there is no result, only the errors (exit 2)."""


def _folder_vocabulary(served: ServedModel) -> Vocabulary | None:
    from servegym.loadgen.served_model import folder_vocabulary

    return folder_vocabulary(served.root) if served.root is not None else None


def fit_prompt_ids(spec: WorkloadSpec, vocab: Vocabulary) -> tuple[WorkloadSpec, str | None]:
    """``spec`` with its prompt ids drawn inside ``vocab`` (``token_id_high`` lowered to its
    size), and a note saying so; ``spec`` itself, and no note, when they fit already."""
    prompt = spec.prompt
    if prompt.token_id_high <= vocab.size:
        return spec, None
    if prompt.token_id_low >= vocab.size:
        raise UserError(
            f"prompt.token_id_low ({prompt.token_id_low}) is outside the served model's "
            f"vocabulary of {vocab.size} ids ({vocab.source}); lower it with "
            "--set prompt.token_id_low=N"
        )
    fitted = spec.model_copy(
        update={"prompt": prompt.model_copy(update={"token_id_high": vocab.size})}
    )
    note = (
        f"prompt ids drawn from [{prompt.token_id_low}, {vocab.size}) (not up to "
        f"{prompt.token_id_high}): the model's vocabulary has {vocab.size} ids ({vocab.source})"
    )
    return fitted, note


def context_note(workload: Workload, max_model_len: int) -> str | None:
    """A note when some requests need more than the server's context (they will fail)."""
    over = sum(
        1 for _, _, t in workload.iter_turns() if t.prompt_len + t.output_len > max_model_len
    )
    if not over:
        return None
    return (
        f"{over} of {workload.num_turns} requests need more than the model's context "
        f"(max_model_len {max_model_len}) and will fail; shorten them with --scale or "
        "--set input_tokens.max=N --set output_tokens.max=N"
    )


def describe_errors(failed: list[RequestRecord], most: int = 3) -> str:
    """The distinct errors of ``failed`` requests, commonest first, with their counts; errors
    that differ only in their numbers (each request's own token id, say) count as one, shown
    by their first instance."""
    counts: Counter[str] = Counter()
    example: dict[str, str] = {}
    for record in failed:
        text = _error_text(record)
        key = re.sub(r"\d+", "N", text)
        counts[key] += 1
        example.setdefault(key, text)
    parts = [
        f"{example[key]} ({n} request{'s' if n != 1 else ''})"
        for key, n in counts.most_common(most)
    ]
    if len(counts) > most:
        parts.append(f"{len(counts) - most} more kinds")
    return "; ".join(parts)


def _error_text(record: RequestRecord) -> str:
    text = " ".join((record.error or "no output").split())[:300]
    if record.http_status is not None and f"HTTP {record.http_status}" not in text:
        text = f"HTTP {record.http_status}: {text}"
    return text


def _vocab_hint(failed: list[RequestRecord], vocab: Vocabulary | None) -> str:
    if vocab is not None or not any("vocabulary" in (r.error or "") for r in failed):
        return ""
    return (
        " (prompt ids beyond the model's vocabulary: pass --tokenizer MODEL_FOLDER or "
        "--set prompt.token_id_high=VOCAB_SIZE)"
    )


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
    "BenchFailed",
    "BenchOutcome",
    "BenchProgress",
    "BenchRequest",
    "context_note",
    "describe_errors",
    "fit_prompt_ids",
    "parse_mock_settings",
    "run_bench",
]
