"""Materialisation: a spec and a seed become a :class:`~servegym.workloads.model.Workload`.

All randomness comes from the seed through named, independent streams
(:mod:`servegym.workloads.rng`): input lengths, output lengths, arrivals, prefix tokens and
prompt tokens each have their own, and warm-up sessions have their own set ("warmup/...")
apart from the measured ones ("measured/..."). So changing the warm-up count, or drawing
more of one part, never shifts another part.

Warm-up sessions come first in ``workload.sessions`` (``workload.warmup_sessions`` of them).
They are drawn from the same distributions and use the same shared prefixes (warming the
prefix cache is part of warming up). Their ``arrival_s`` is a schedule of its own starting
at 0, like the measured sessions': the load generator sends the warm-up as a phase of its
own, waits for it to finish, then starts the measured clock.

``spec.scale`` multiplies every token length after it is drawn (rounded half up, at least
1): input, output, shared-prefix, system prompt, tool schema, task, reply, tool result and
trace lengths; not times or turn counts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from servegym.paths import data_dir
from servegym.workloads.agentic import agentic_prefixes, agentic_sessions
from servegym.workloads.arrivals import arrival_offsets
from servegym.workloads.distributions import (
    IntArray,
    sample_token_lengths,
    scale_length,
    scale_lengths,
)
from servegym.workloads.footprint import check_footprint
from servegym.workloads.model import Session, TokenArray, Turn, Workload
from servegym.workloads.rng import check_seed, stream
from servegym.workloads.spec import WorkloadSpec
from servegym.workloads.trace import load_trace

FloatArray = npt.NDArray[np.float64]


def materialise(spec: WorkloadSpec, seed: int, *, base_dir: Path | None = None) -> Workload:
    """Draw the workload of ``spec`` for ``seed``; the same arguments give the same bytes.

    ``base_dir`` is the folder a relative ``trace.path`` is read from (the workload file's
    folder, as :func:`servegym.workloads.registry.load_spec` returns it); by default the
    shipped ``workloads/`` folder.
    """
    seed = check_seed(seed)
    if spec.kind == "agentic":
        return _agentic_workload(spec, seed)
    return _single_turn_workload(spec, seed, base_dir)


def _agentic_workload(spec: WorkloadSpec, seed: int) -> Workload:
    a = spec.agentic
    assert a is not None
    warmup = spec.warmup_requests
    sessions = agentic_sessions(
        spec,
        seed,
        block="warmup",
        n=warmup,
        first_id=0,
        total_turns=None,
        max_turns=a.warmup_turns,
    )
    sessions += agentic_sessions(
        spec,
        seed,
        block="measured",
        n=spec.num_requests,
        first_id=warmup,
        total_turns=a.total_turns,
    )
    return Workload(
        spec=spec,
        seed=seed,
        sessions=sessions,
        prefixes=agentic_prefixes(spec, seed),
        warmup_sessions=warmup,
    )


def _single_turn_workload(spec: WorkloadSpec, seed: int, base_dir: Path | None) -> Workload:
    prefixes = _shared_prefixes(spec, seed)
    if spec.kind == "trace":
        blocks = _trace_blocks(
            spec, seed, base_dir if base_dir is not None else data_dir("workloads")
        )
    else:
        blocks = []
        for block, n in (("warmup", spec.warmup_requests), ("measured", spec.num_requests)):
            ins = sample_token_lengths(
                spec.input_tokens, n, stream(seed, f"{block}/input"), spec.scale
            )
            outs = sample_token_lengths(
                spec.output_tokens, n, stream(seed, f"{block}/output"), spec.scale
            )
            offsets = arrival_offsets(spec.arrival, n, stream(seed, f"{block}/arrivals"))
            blocks.append((block, ins, outs, offsets))

    prefix_len = len(prefixes[0]) if prefixes else 0
    check_footprint(
        spec,
        sum(len(p) for p in prefixes)
        + sum(
            int(np.maximum(ins, prefix_len).sum()) - prefix_len * len(ins)
            for _, ins, _, _ in blocks
        ),
        sum(len(ins) for _, ins, _, _ in blocks),
    )
    sessions: list[Session] = []
    for block, ins, outs, offsets in blocks:
        sessions += _single_turn_sessions(
            spec, seed, block, ins, outs, offsets, prefixes, len(sessions)
        )
    return Workload(
        spec=spec,
        seed=seed,
        sessions=sessions,
        prefixes=prefixes,
        warmup_sessions=len(blocks[0][1]),
    )


def _shared_prefixes(spec: WorkloadSpec, seed: int) -> list[TokenArray]:
    sp = spec.shared_prefix
    length = scale_length(sp.tokens, spec.scale)
    if length == 0:
        return []
    check_footprint(spec, sp.groups * length, 0)
    p = spec.prompt
    rng = stream(seed, "shared_prefix")
    block = rng.integers(p.token_id_low, p.token_id_high, size=(sp.groups, length), dtype=np.int32)
    return list(block)


_Block = tuple[str, IntArray, IntArray, FloatArray | None]


def _trace_blocks(spec: WorkloadSpec, seed: int, base_dir: Path) -> list[_Block]:
    """Measured requests replay the trace window; warm-up requests replay its first rows
    (cyclically when the window is shorter than the warm-up), with fresh prompt tokens."""
    assert spec.trace is not None
    rows = load_trace(spec.trace, base_dir, limit=spec.num_requests)
    ins = scale_lengths(np.maximum(rows.input_tokens, 1), spec.scale)
    outs = scale_lengths(np.maximum(rows.output_tokens, 1), spec.scale)
    n = len(rows)
    w = spec.warmup_requests
    pick = np.arange(w) % n
    if spec.arrival.kind == "trace":
        scaled = rows.offsets_s * spec.arrival.time_scale
        measured_offsets: FloatArray | None = scaled
        warm = scaled[pick]
        warm_offsets: FloatArray | None = warm - warm[0] if w else warm
    else:
        measured_offsets = arrival_offsets(spec.arrival, n, stream(seed, "measured/arrivals"))
        warm_offsets = arrival_offsets(spec.arrival, w, stream(seed, "warmup/arrivals"))
    if warm_offsets is not None and w:
        # Cyclic repeats restart the trace clock; keep the warm-up schedule non-decreasing.
        warm_offsets = np.maximum.accumulate(warm_offsets)
    return [
        ("warmup", ins[pick], outs[pick], warm_offsets),
        ("measured", ins, outs, measured_offsets),
    ]


def _single_turn_sessions(
    spec: WorkloadSpec,
    seed: int,
    block: str,
    input_lens: IntArray,
    output_lens: IntArray,
    offsets: FloatArray | None,
    prefixes: list[TokenArray],
    first_id: int,
) -> list[Session]:
    """One session of one turn per request; request ``i`` of a block uses prefix
    ``i % groups``. A prompt is never shorter than its prefix (input lengths clamp up)."""
    n = len(input_lens)
    if n == 0:
        return []
    groups = len(prefixes)
    prefix_len = len(prefixes[0]) if groups else 0
    prompt_lens = np.maximum(input_lens, prefix_len)
    own = prompt_lens - prefix_len
    p = spec.prompt
    pool = stream(seed, f"{block}/tokens").integers(
        p.token_id_low, p.token_id_high, size=int(own.sum()), dtype=np.int32
    )
    buffers = np.split(pool, np.cumsum(own)[:-1])
    prompt_list = prompt_lens.tolist()
    output_list = output_lens.tolist()
    offset_list: list[float] | None = None if offsets is None else offsets.tolist()
    return [
        Session(
            id=first_id + i,
            tokens=buffers[i],
            turns=[
                Turn(
                    prompt_len=prompt_list[i],
                    output_len=output_list[i],
                    arrival_s=None if offset_list is None else offset_list[i],
                )
            ],
            prefix_id=i % groups if groups else None,
        )
        for i in range(n)
    ]
