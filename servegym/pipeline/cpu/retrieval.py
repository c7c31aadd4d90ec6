"""The harness's side of the retrieval worker (:mod:`servegym.pipeline.cpu.worker`).

:class:`WorkerRetriever` starts the worker with the CPU track's Python (or any Python, for the
numpy-only ``hash`` backend), speaks its JSON-lines protocol one request at a time, and turns
its answers into :class:`BuildStats` and :class:`QueryBatch`. Nothing here imports torch or
faiss. :class:`Retriever` is what the pipeline runner needs, so a test can hand it a fake.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from servegym.engines.cpu_isa import CPU_ISA_ENV
from servegym.errors import UserError

WORKER = Path(__file__).with_name("worker.py")
READY_TIMEOUT_S = 300.0
"""Loading torch and the model the first time from a cold disk can take a minute or more."""
REQUEST_TIMEOUT_S = 900.0
LINE_LIMIT = 64 * 1024 * 1024

BackendName = Literal["minilm", "hash"]


class BuildStats(BaseModel):
    """What building the index measured."""

    model_config = ConfigDict(extra="forbid")

    docs: int = Field(ge=1)
    dim: int = Field(ge=1)
    embed_s: float = Field(ge=0)
    index_s: float = Field(ge=0)
    docs_per_s: float = Field(ge=0, description="index build rate: documents / (embed + index)")


class Hit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[int]
    scores: list[float]


class QueryBatch(BaseModel):
    """One batch of queries: per query its hits (best first), and the batch's stage seconds."""

    model_config = ConfigDict(extra="forbid")

    results: list[Hit]
    embed_s: float = Field(ge=0)
    retrieve_s: float = Field(ge=0)
    rerank_s: float = Field(ge=0)


class Retriever(Protocol):
    async def build(
        self, texts: Sequence[str], *, batch_size: int, hnsw_m: int, ef_construction: int
    ) -> BuildStats: ...

    async def query(
        self,
        queries: Sequence[str],
        *,
        batch_size: int,
        ef_search: int,
        top_k: int,
        rerank_depth: int,
        keep: int,
    ) -> QueryBatch:
        """Per query: ``top_k`` candidates from the index, the first ``rerank_depth``
        re-scored exactly and re-ordered, the first ``keep`` returned."""
        ...


class WorkerError(UserError):
    """The retrieval worker failed, would not start, or answered nonsense."""


class WorkerRetriever:
    """A running retrieval worker; use as ``async with WorkerRetriever.start(...) as r``."""

    def __init__(self, proc: asyncio.subprocess.Process, hello: dict[str, Any], log: Path) -> None:
        self._proc = proc
        self._log = log
        self._owns_log = False
        self._lock = asyncio.Lock()
        self.hello = hello

    @classmethod
    async def start(
        cls,
        python: Path | str | None = None,
        *,
        backend: BackendName = "minilm",
        threads: int = 0,
        stderr: Path | None = None,
    ) -> WorkerRetriever:
        """Start the worker with ``python`` (default: the CPU track's) and wait until ready.

        Its stderr goes to ``stderr`` (default: a temporary file); a worker that dies is
        reported with that file's last line."""
        if python is None:
            from servegym.cpu_track.setup import require_cpu_track

            python = require_cpu_track().python
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            **CPU_ISA_ENV,
        }
        owns_log = stderr is None
        if stderr is None:
            fd, name = tempfile.mkstemp(prefix="servegym-retrieval-", suffix=".log")
            os.close(fd)
            stderr = Path(name)
        err = stderr.open("ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                str(python),
                str(WORKER),
                "--backend",
                backend,
                "--threads",
                str(threads),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env=env,
                limit=LINE_LIMIT,
            )
        except OSError as exc:
            if owns_log:
                stderr.unlink(missing_ok=True)
            raise WorkerError(f"retrieval worker: cannot start {python}: {exc}") from None
        finally:
            err.close()
        self = cls(proc, {}, stderr)
        self._owns_log = owns_log
        try:
            ready = await self._read(READY_TIMEOUT_S)
            if not ready.get("ready"):
                raise WorkerError(f"retrieval worker: unexpected first line {ready!r}")
            self.hello = await self._call({"op": "hello"})
        except BaseException:
            await self.close()
            raise
        return self

    async def __aenter__(self) -> WorkerRetriever:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _read(self, timeout: float) -> dict[str, Any]:
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), timeout)
        except TimeoutError:
            raise WorkerError(f"retrieval worker: no answer within {timeout:.0f} s") from None
        if not line:
            code = await self._proc.wait()
            raise WorkerError(
                f"retrieval worker exited (code {code}): {self._last_log_line()} (log: {self._log})"
            )
        try:
            data = json.loads(line)
        except ValueError:
            raise WorkerError(f"retrieval worker: not JSON: {line[:200]!r}") from None
        if not isinstance(data, dict):
            raise WorkerError(f"retrieval worker: not an object: {line[:200]!r}")
        if not data.get("ok"):
            raise WorkerError(f"retrieval worker: {data.get('error', 'failed')}")
        return data

    def _last_log_line(self) -> str:
        try:
            lines = self._log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return lines[-1][:200] if lines else "nothing on stderr"

    async def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            assert self._proc.stdin is not None
            if self._proc.returncode is not None:
                raise WorkerError(f"retrieval worker exited (code {self._proc.returncode})")
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")
            try:
                await self._proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                raise WorkerError("retrieval worker: its stdin closed") from None
            return await self._read(REQUEST_TIMEOUT_S)

    async def build(
        self, texts: Sequence[str], *, batch_size: int, hnsw_m: int, ef_construction: int
    ) -> BuildStats:
        answer = await self._call(
            {
                "op": "build",
                "texts": list(texts),
                "batch_size": batch_size,
                "hnsw_m": hnsw_m,
                "ef_construction": ef_construction,
            }
        )
        answer.pop("ok", None)
        return BuildStats.model_validate(answer)

    async def query(
        self,
        queries: Sequence[str],
        *,
        batch_size: int,
        ef_search: int,
        top_k: int,
        rerank_depth: int,
        keep: int,
    ) -> QueryBatch:
        answer = await self._call(
            {
                "op": "query",
                "queries": list(queries),
                "batch_size": batch_size,
                "ef_search": ef_search,
                "top_k": top_k,
                "rerank_depth": rerank_depth,
                "keep": keep,
            }
        )
        answer.pop("ok", None)
        batch = QueryBatch.model_validate(answer)
        if len(batch.results) != len(queries):
            raise WorkerError(
                f"retrieval worker: {len(batch.results)} results for {len(queries)} queries"
            )
        return batch

    async def close(self) -> None:
        proc = self._proc
        if proc.returncode is None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(b'{"op": "quit"}\n')
                await proc.stdin.drain()
                proc.stdin.close()
                await asyncio.wait_for(proc.wait(), 10.0)
            except (OSError, TimeoutError):
                proc.kill()
                await proc.wait()
        if self._owns_log and proc.returncode == 0:
            self._log.unlink(missing_ok=True)


def project_python() -> str:
    """This interpreter: enough for the ``hash`` backend (numpy only)."""
    return sys.executable
