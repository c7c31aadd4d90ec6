"""A workload's vital statistics: what ``servegym workload show`` prints.

Figures cover the measured sessions only; warm-up sessions are counted apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from servegym.workloads.model import Workload


class Percentiles(BaseModel):
    """Distribution of one quantity (token counts or seconds)."""

    model_config = ConfigDict(extra="forbid")

    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: npt.ArrayLike) -> Percentiles | None:
        arr = np.asarray(values, dtype=np.float64)
        if arr.size == 0:
            return None
        p50, p90, p99 = np.percentile(arr, [50, 90, 99])
        return cls(
            mean=float(arr.mean()),
            p50=float(p50),
            p90=float(p90),
            p99=float(p99),
            max=float(arr.max()),
        )


class WorkloadSummary(BaseModel):
    """Counts and length percentiles of a materialised workload (measured sessions).

    ``prompt_tokens`` is every turn's full prompt length (shared prefix included);
    ``output_tokens`` the forced output lengths. For agentic workloads ``reply_tokens``
    equals ``output_tokens`` and ``tool_result_tokens`` is what each turn's tool result adds;
    ``max_context_tokens`` is the largest prompt + output of any turn.
    ``arrival_span_s`` is the last first-turn send offset minus the first (None in a closed
    loop). ``unique_prompt_tokens`` counts distinct prompt positions: the shared prefixes once
    plus every session's own buffer.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str
    seed: int
    arrival: str
    sessions: int
    turns: int
    warmup_sessions: int
    warmup_turns: int
    prompt_tokens: Percentiles | None
    output_tokens: Percentiles | None
    turns_per_session: Percentiles | None = None
    reply_tokens: Percentiles | None = None
    tool_result_tokens: Percentiles | None = None
    think_s: Percentiles | None = None
    max_context_tokens: int
    total_prompt_tokens: int
    total_output_tokens: int
    unique_prompt_tokens: int
    shared_prefix_tokens: int
    prefixes: int
    arrival_span_s: float | None
    content_hash: str


def _concat(parts: Sequence[npt.NDArray[np.float64]]) -> npt.NDArray[np.float64]:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)


def summarise(workload: Workload) -> WorkloadSummary:
    """Summarise ``workload`` (no loop over tokens: cheap even for 8M prompt tokens)."""
    spec = workload.spec
    warm = workload.sessions[: workload.warmup_sessions]
    measured = workload.sessions[workload.warmup_sessions :]

    prompts: list[npt.NDArray[np.float64]] = []
    outputs: list[npt.NDArray[np.float64]] = []
    tools: list[npt.NDArray[np.float64]] = []
    thinks: list[npt.NDArray[np.float64]] = []
    arrivals: list[float] = []
    for s in measured:
        p = np.array([t.prompt_len for t in s.turns], dtype=np.float64)
        o = np.array([t.output_len for t in s.turns], dtype=np.float64)
        prompts.append(p)
        outputs.append(o)
        tools.append(np.diff(p) - o[:-1])
        thinks.append(np.array([t.think_s for t in s.turns[1:]], dtype=np.float64))
        first = s.turns[0].arrival_s if s.turns else None
        if first is not None:
            arrivals.append(first)
    prompt = _concat(prompts)
    output = _concat(outputs)
    agentic = spec.kind == "agentic"
    per_session = [len(s.turns) for s in measured]
    return WorkloadSummary(
        name=spec.name,
        kind=spec.kind,
        seed=workload.seed,
        arrival=spec.arrival.kind,
        sessions=len(measured),
        turns=int(sum(per_session)),
        warmup_sessions=len(warm),
        warmup_turns=sum(len(s.turns) for s in warm),
        prompt_tokens=Percentiles.of(prompt),
        output_tokens=Percentiles.of(output),
        turns_per_session=Percentiles.of(per_session) if agentic else None,
        reply_tokens=Percentiles.of(output) if agentic else None,
        tool_result_tokens=Percentiles.of(_concat(tools)) if agentic else None,
        think_s=Percentiles.of(_concat(thinks)) if agentic else None,
        max_context_tokens=int((prompt + output).max()) if prompt.size else 0,
        total_prompt_tokens=int(prompt.sum()),
        total_output_tokens=int(output.sum()),
        unique_prompt_tokens=sum(len(p) for p in workload.prefixes)
        + sum(len(s.tokens) for s in measured),
        shared_prefix_tokens=len(workload.prefixes[0]) if workload.prefixes else 0,
        prefixes=len(workload.prefixes),
        arrival_span_s=(max(arrivals) - min(arrivals)) if arrivals else None,
        content_hash=workload.content_hash(),
    )
