"""Agentic sessions: coding-agent trajectories shaped like SWE-bench agent runs.

Every session starts with one shared prefix (system prompt + tool schema, the same tokens
for all sessions, ``workload.prefixes[0]``), then its task statement. Turn ``k``'s reply (its
forced output) and the tool result that answers it are appended to the session's buffer, so
turn ``k+1``'s prompt is exactly turn ``k``'s prompt + reply ``k`` + tool result ``k``. The
reply's tokens in the buffer are the recorded reply drawn here, not what the server actually
generates, so the workload stays the same whatever the server answers (as a trajectory
replay does).

Layout of a session's buffer (the prefix is stored once, not per session)::

    task | reply 0 | tool 0 | reply 1 | tool 1 | ... | reply K-2 | tool K-2

and turn ``k``'s ``prompt_len = len(prefix) + len(task) + sum(reply j + tool j for j < k)``.
Only what some turn's prompt needs is drawn: the last reply lives only in ``output_len``.

A session stops early, before the first turn whose prompt plus reply would exceed
``agentic.max_context_tokens`` (nothing after it is recorded). Its first turn is always kept,
its reply shortened to fit if needed; a first prompt that alone does not fit is an error.
``max_context_tokens`` is a model limit and is not multiplied by ``scale``.
"""

from __future__ import annotations

import numpy as np

from servegym.errors import UserError
from servegym.workloads.arrivals import arrival_offsets
from servegym.workloads.distributions import (
    IntArray,
    sample_lengths,
    sample_token_lengths,
    scale_length,
)
from servegym.workloads.footprint import check_footprint
from servegym.workloads.model import Session, TokenArray, Turn
from servegym.workloads.rng import stream
from servegym.workloads.spec import AgenticSpec, WorkloadSpec


def rescale_counts(counts: IntArray, total: int) -> IntArray:
    """Rescale positive integer ``counts`` so they sum to ``total`` exactly, keeping shape.

    Counts whose share ``counts * total / sum(counts)`` is below 1 become 1; the rest share
    what is left in proportion to their counts, rounded by the largest-remainder method
    (ties to the earlier index), so each is within 1 of its proportional share. Needs
    ``total >= len(counts)``.
    """
    n = len(counts)
    if n == 0:
        return counts.copy()
    if total < n:
        raise ValueError(f"cannot spread {total} over {n} counts of at least 1")
    weights = counts.astype(np.float64)
    ones = np.zeros(n, dtype=bool)
    while True:
        free = ~ones
        share = np.where(free, weights * ((total - ones.sum()) / weights[free].sum()), 1.0)
        newly = free & (share < 1.0)
        if not newly.any():
            break
        ones |= newly
    base = np.floor(share).astype(np.int64)
    left = total - int(base.sum())
    if left > 0:
        # Largest fractional parts first; a stable sort breaks ties by index.
        frac = np.where(ones, -1.0, share - base)
        order = np.argsort(-frac, kind="stable")
        base[order[:left]] += 1
    return base


def _prefix_len(a: AgenticSpec, scale: float) -> int:
    return scale_length(a.system_prompt_tokens, scale) + scale_length(a.tool_schema_tokens, scale)


def agentic_prefixes(spec: WorkloadSpec, seed: int) -> list[TokenArray]:
    """The one shared prefix (system prompt + tool schema), or none when it is empty."""
    assert spec.agentic is not None
    n = _prefix_len(spec.agentic, spec.scale)
    if n == 0:
        return []
    p = spec.prompt
    rng = stream(seed, "agentic/prefix")
    return [rng.integers(p.token_id_low, p.token_id_high, size=n, dtype=np.int32)]


def agentic_sessions(
    spec: WorkloadSpec,
    seed: int,
    *,
    block: str,
    n: int,
    first_id: int,
    total_turns: int | None,
    max_turns: int | None = None,
) -> list[Session]:
    """Draw ``n`` sessions of one block ("measured" or "warmup", each its own streams).

    ``total_turns`` rescales the drawn turn counts to that sum; ``max_turns`` caps each
    session (warm-up sessions are cut short).
    """
    a = spec.agentic
    assert a is not None
    if n == 0:
        return []
    scale = spec.scale
    prefix_len = _prefix_len(a, scale)

    turns = sample_lengths(a.turns, n, stream(seed, f"{block}/agentic/turns"))
    if total_turns is not None:
        if total_turns < n:
            raise UserError(
                f"agentic.total_turns ({total_turns}) must be at least the number of "
                f"sessions (num_requests = {n})"
            )
        turns = rescale_counts(turns, total_turns)
    if max_turns is not None:
        turns = np.minimum(turns, max_turns)
    n_turns = int(turns.sum())
    check_footprint(spec, 0, n_turns)
    task = sample_token_lengths(a.task_tokens, n, stream(seed, f"{block}/agentic/task"), scale)
    reply = sample_token_lengths(
        a.reply_tokens, n_turns, stream(seed, f"{block}/agentic/reply"), scale
    )
    tool = sample_token_lengths(
        a.tool_result_tokens, n_turns, stream(seed, f"{block}/agentic/tool"), scale
    )
    think = sample_lengths(
        a.think_time_s, n_turns, stream(seed, f"{block}/agentic/think"), integer=False
    )
    starts = arrival_offsets(spec.arrival, n, stream(seed, f"{block}/arrivals"))

    limit = a.max_context_tokens
    ends = np.cumsum(turns)
    plans: list[tuple[IntArray, IntArray, int]] = []  # prompt lens, reply lens, buffer len
    for i in range(n):
        lo, hi = int(ends[i] - turns[i]), int(ends[i])
        r = reply[lo:hi].copy()
        growth = r[:-1] + tool[lo : hi - 1]
        prompt = np.empty(len(r), dtype=np.int64)
        prompt[0] = prefix_len + int(task[i])
        np.cumsum(growth, out=prompt[1:])
        prompt[1:] += prompt[0]
        keep = int(np.searchsorted(prompt + r, limit, side="right"))
        if keep == 0:
            room = limit - int(prompt[0])
            if room < 1:
                raise UserError(
                    f"agentic.max_context_tokens ({limit}) is too small: session {first_id + i}"
                    f"'s first prompt alone is {int(prompt[0])} tokens (system prompt + tool "
                    "schema + task)"
                )
            r[0] = room
            keep = 1
        plans.append((prompt[:keep], r[:keep], int(prompt[keep - 1]) - prefix_len))

    p = spec.prompt
    sizes = np.array([b for _, _, b in plans], dtype=np.int64)
    check_footprint(spec, int(sizes.sum()) + prefix_len, n_turns)
    pool = stream(seed, f"{block}/tokens").integers(
        p.token_id_low, p.token_id_high, size=int(sizes.sum()), dtype=np.int32
    )
    buffers = np.split(pool, np.cumsum(sizes)[:-1])

    sessions: list[Session] = []
    for i, ((prompt, r, _), buf) in enumerate(zip(plans, buffers, strict=True)):
        lo = int(ends[i] - turns[i])
        arrival = None if starts is None else float(starts[i])
        session_turns = [
            Turn(
                prompt_len=int(prompt[k]),
                output_len=int(r[k]),
                arrival_s=arrival if k == 0 else None,
                think_s=0.0 if k == 0 else float(think[lo + k]),
            )
            for k in range(len(prompt))
        ]
        sessions.append(
            Session(
                id=first_id + i,
                tokens=buf,
                turns=session_turns,
                prefix_id=0 if prefix_len > 0 else None,
            )
        )
    return sessions
