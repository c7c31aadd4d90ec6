"""How much memory a workload takes once materialised, and the cap on it.

A workload is materialised whole (every prompt token id, every request as a Python object),
so its size is bounded before anything is drawn: past
:data:`~servegym.workloads.spec.MAX_MATERIALISED_BYTES` it is refused in one line naming
what to lower, rather than failing with ``MemoryError`` (or taking the machine's memory)
tens of seconds later.
"""

from __future__ import annotations

from servegym.errors import UserError
from servegym.workloads.spec import (
    BYTES_PER_TOKEN,
    BYTES_PER_TURN,
    MAX_MATERIALISED_BYTES,
    WorkloadSpec,
)


def footprint_bytes(tokens: int, turns: int) -> int:
    """The memory ``tokens`` prompt token ids and ``turns`` requests take, materialised."""
    return tokens * BYTES_PER_TOKEN + turns * BYTES_PER_TURN


def check_footprint(spec: WorkloadSpec, tokens: int, turns: int) -> None:
    """Refuse a workload whose ``tokens`` prompt token ids and ``turns`` requests would take
    more than :data:`MAX_MATERIALISED_BYTES`."""
    need = footprint_bytes(tokens, turns)
    if need <= MAX_MATERIALISED_BYTES:
        return
    gib = 2**30
    raise UserError(
        f"workload '{spec.name}': {tokens:,} prompt tokens and {turns:,} requests would "
        f"take about {need / gib:,.1f} GiB of memory (at most {MAX_MATERIALISED_BYTES / gib:g} "
        "GiB); ask for fewer requests (--requests, num_requests) or shorter ones (--scale)"
    )
