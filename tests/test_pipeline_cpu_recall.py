"""Recall@k of the supporting passages: the arithmetic."""

from __future__ import annotations

import pytest

from servegym.pipeline.cpu.recall import mean_recall_at_k, recall_at_k


def test_recall_at_k() -> None:
    assert recall_at_k(["a"], ["a", "b"], 1) == 1.0
    assert recall_at_k(["b"], ["a", "b"], 1) == 0.0
    assert recall_at_k(["a", "c"], ["a", "b", "c"], 2) == 0.5
    assert recall_at_k(["a", "c"], ["a", "b", "c"], 3) == 1.0
    assert recall_at_k(["a"], [], 5) == 0.0
    assert recall_at_k(["a", "a"], ["a"], 1) == 1.0  # support counted as a set


def test_recall_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        recall_at_k(["a"], ["a"], 0)
    with pytest.raises(ValueError):
        recall_at_k([], ["a"], 1)
    with pytest.raises(ValueError):
        mean_recall_at_k([["a"]], [], 1)


def test_mean_recall() -> None:
    assert mean_recall_at_k([["a"], ["b", "c"]], [["a"], ["c", "x"]], 2) == pytest.approx(0.75)
    assert mean_recall_at_k([], [], 3) == 0.0
