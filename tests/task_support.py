"""Shared helpers of the tests that run tasks: a shipped task with test-sized settings."""

from __future__ import annotations

import dataclasses

from servegym.tasks.loader import LoadedTask

PLUMBING_PAIRS = 3
"""Pairs for a real-server test that checks what an evaluation does, not how precisely it
scores: the shipped cpu tasks run 5 to 10 pairs (up to 4 minutes of them) to narrow the
interval, which only the precision measurement needs (``benchmarks/cpu_eval_precision.py``;
the adaptive plan itself is tested on the mock)."""


def with_evaluation(loaded: LoadedTask, **fields: object) -> LoadedTask:
    """``loaded`` with its ``[evaluation]`` fields replaced by ``fields``."""
    spec = loaded.task.evaluation.model_copy(update=fields)
    return dataclasses.replace(loaded, task=loaded.task.model_copy(update={"evaluation": spec}))


def with_fixed_pairs(loaded: LoadedTask, pairs: int = PLUMBING_PAIRS) -> LoadedTask:
    """``loaded`` scored with exactly ``pairs`` pairs (no adaptive pairs) and no warm-up
    runs: the warm-up, like the adaptive plan, is tested on the mock
    (``test_runner_real.py``), and on a real server it would add two runs to each of these
    evaluations in CI."""
    return with_evaluation(loaded, repeats=pairs, max_repeats=None, warmup_runs=0)
