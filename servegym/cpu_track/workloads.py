"""Workloads sized for the CPU track's model.

``servegym-tiny`` has a 4,096-token vocabulary and a 4,096-token context, so a workload
meant for it draws prompt ids below 4,096 (above the special tokens) and keeps prompt plus
output inside the context.
"""

from __future__ import annotations

from collections.abc import Sequence

from servegym.workloads.generate import materialise
from servegym.workloads.model import Workload
from servegym.workloads.registry import load_spec

TINY_PROMPT_OVERRIDES = ("prompt.token_id_low=16", "prompt.token_id_high=4096")
"""Prompt ids inside servegym-tiny's vocabulary, clear of its special tokens (0-4)."""


def tiny_workload(
    name: str,
    overrides: Sequence[str] = (),
    *,
    requests: int | None = None,
    scale: float | None = None,
    seed: int = 0,
) -> Workload:
    """Workload ``name`` with ``overrides``, its prompt ids inside servegym-tiny's vocab."""
    spec, base = load_spec(
        name, [*TINY_PROMPT_OVERRIDES, *overrides], requests=requests, scale=scale
    )
    return materialise(spec, seed, base_dir=base)


def _fixed(field: str, n: int) -> list[str]:
    return [f"{field}.dist=fixed", f"{field}.value={n}", f"{field}.min={n}", f"{field}.max={n}"]


def probe_workloads() -> dict[str, Workload]:
    """Four small workloads, each showing one knob's effect on this track within seconds:

    - ``balanced``: 16 requests of ~80 in / 80 out at t=0 (outputs for the accuracy check);
    - ``prefill``: 8 prompts of ~2,400 tokens one at a time (TTFT is prefill time: dtype);
    - ``conc8``: 24 requests of ~80 / 80 with 8 in flight (batching: ``max_num_seqs``);
    - ``prefix``: 8 prompts of 2,500 tokens sharing 2,400, one at a time (prefix caching).
    """
    return {
        "balanced": tiny_workload("balanced", ["warmup_requests=2"], requests=16, scale=0.08),
        "prefill": tiny_workload(
            "prefill-heavy",
            ["arrival.kind=single_stream", "warmup_requests=1", *_fixed("output_tokens", 4)],
            requests=8,
            scale=0.3,
        ),
        "conc8": tiny_workload(
            "balanced",
            ["arrival.kind=concurrency", "arrival.concurrency=8", "warmup_requests=0"],
            requests=24,
            scale=0.08,
        ),
        "prefix": tiny_workload(
            "balanced",
            [
                "arrival.kind=single_stream",
                "warmup_requests=1",
                "shared_prefix.tokens=2400",
                *_fixed("input_tokens", 2500),
                *_fixed("output_tokens", 4),
            ],
            requests=8,
        ),
    }
