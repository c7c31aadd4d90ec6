"""Recall@k of the supporting passages, computed by the harness from the ids returned."""

from __future__ import annotations

from collections.abc import Sequence


def recall_at_k(support: Sequence[str], retrieved: Sequence[str], k: int) -> float:
    """The fraction of ``support`` among the first ``k`` of ``retrieved`` (duplicates count
    once)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    wanted = set(support)
    if not wanted:
        raise ValueError("a question needs at least one supporting passage")
    return len(wanted & set(retrieved[:k])) / len(wanted)


def mean_recall_at_k(
    supports: Sequence[Sequence[str]], retrieved: Sequence[Sequence[str]], k: int
) -> float:
    """Mean of :func:`recall_at_k` over questions (0 when there are none)."""
    if len(supports) != len(retrieved):
        raise ValueError(f"{len(supports)} questions but {len(retrieved)} retrieval results")
    if not supports:
        return 0.0
    return sum(recall_at_k(s, r, k) for s, r in zip(supports, retrieved, strict=True)) / len(
        supports
    )
