"""Agentic sessions: growing buffers, the shipped default's shape, stopping, rescaling."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.errors import UserError
from servegym.workloads import Workload, load_spec, materialise, summarise
from servegym.workloads.agentic import rescale_counts
from servegym.workloads.spec import AgenticSpec, WorkloadSpec


@pytest.fixture(scope="module")
def default() -> Workload:
    spec, base = load_spec("agentic")
    return materialise(spec, 0, base_dir=base)


def small(**agentic: object) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {"name": "a", "kind": "agentic", "num_requests": 4, "agentic": agentic}
    )


def test_default_matches_the_mlperf_shape(default: Workload) -> None:
    s = summarise(default)
    assert s.sessions == 20
    assert abs(s.turns - 1000) <= 100
    assert s.max_context_tokens >= 20_000
    assert s.tool_result_tokens is not None
    assert s.tool_result_tokens.p99 >= 5 * s.tool_result_tokens.p50
    assert s.turns_per_session is not None and s.turns_per_session.max > 2 * s.turns_per_session.p50
    assert s.shared_prefix_tokens == 3700 and s.prefixes == 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_default_shape_holds_across_seeds(seed: int) -> None:
    spec, base = load_spec("agentic")
    s = summarise(materialise(spec, seed, base_dir=base))
    assert abs(s.turns - 1000) <= 100
    assert s.max_context_tokens >= 20_000
    assert s.tool_result_tokens is not None
    assert s.tool_result_tokens.p99 >= 5 * s.tool_result_tokens.p50


def test_spec_defaults_equal_the_shipped_file() -> None:
    spec, _ = load_spec("agentic")
    assert spec.agentic == AgenticSpec()


def test_each_prompt_is_an_exact_prefix_of_the_next(default: Workload) -> None:
    prefix = default.prefixes[0]
    for sess in default.sessions[:6]:
        assert sess.prefix_id == 0
        prev = default.prompt_ids(sess, 0)
        assert np.array_equal(prev[: len(prefix)], prefix)
        for k in range(1, len(sess.turns)):
            cur = default.prompt_ids(sess, k)
            assert np.array_equal(cur[: len(prev)], prev)
            tool = len(cur) - len(prev) - sess.turns[k - 1].output_len
            assert tool >= 1
            prev = cur
        # the buffer is exactly what the last prompt needs
        assert len(sess.tokens) + len(prefix) == sess.turns[-1].prompt_len


def test_times_arrivals_and_warmup(default: Workload) -> None:
    assert default.warmup_sessions == 1
    assert len(default.sessions[0].turns) <= 2
    for sess in default.sessions:
        first, *rest = sess.turns
        assert first.arrival_s == 0.0 and first.think_s == 0.0
        assert all(t.arrival_s is None and 0.05 <= t.think_s <= 30.0 for t in rest)


def test_session_starts_follow_the_arrival_process() -> None:
    spec = WorkloadSpec.model_validate(
        {
            "name": "a",
            "kind": "agentic",
            "num_requests": 4,
            "agentic": {},
            "arrival": {"kind": "constant", "rate": 2},
        }
    )
    w = materialise(spec, 0)
    assert [s.turns[0].arrival_s for s in w.sessions] == [0.0, 0.5, 1.0, 1.5]


def test_total_turns_rescales_drawn_counts() -> None:
    w = materialise(small(total_turns=200), 0)
    assert w.num_turns == 200
    w = materialise(small(total_turns=None, turns={"dist": "fixed", "value": 7}), 0)
    assert [len(s.turns) for s in w.sessions] == [7, 7, 7, 7]


def test_rescale_counts_largest_remainder() -> None:
    c = np.array([10, 20, 30, 40], dtype=np.int64)
    assert rescale_counts(c, 200).tolist() == [20, 40, 60, 80]
    r = rescale_counts(c, 11)
    assert r.sum() == 11 and r.tolist() in ([1, 2, 3, 5], [1, 2, 4, 4])
    r = rescale_counts(np.array([1, 1, 1000], dtype=np.int64), 10)
    assert r.tolist() == [1, 1, 8]
    x = np.random.default_rng(0).integers(1, 300, size=50)
    for total in (50, 51, 999, 1000, 12345):
        r = rescale_counts(x, total)
        assert r.sum() == total and r.min() >= 1
        order = np.lexsort((-np.arange(len(x)), x))  # ties: the earlier index gets more
        assert np.all(np.diff(r[order]) >= 0)  # keeps the shape: more drawn, more kept
    r = rescale_counts(x, 12345)  # every share >= 1: plain largest remainder
    assert np.all(np.abs(r - x * 12345 / x.sum()) < 1.0)
    with pytest.raises(ValueError):
        rescale_counts(x, 49)


def test_total_turns_below_sessions_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"total_turns \(3\)"):
        materialise(small(total_turns=3), 0)


def test_sessions_stop_before_the_context_limit() -> None:
    w = materialise(small(total_turns=400, max_context_tokens=12_000), 0)
    assert w.num_turns < 400
    for sess in w.sessions:
        assert all(t.prompt_len + t.output_len <= 12_000 for t in sess.turns)
        assert len(sess.tokens) + len(w.prefixes[0]) == sess.turns[-1].prompt_len


def test_first_turn_kept_with_a_short_reply_or_error() -> None:
    w = materialise(
        small(
            system_prompt_tokens=100,
            tool_schema_tokens=0,
            task_tokens={"dist": "fixed", "value": 100},
            reply_tokens={"dist": "fixed", "value": 500},
            max_context_tokens=300,
        ),
        0,
    )
    assert all(len(s.turns) == 1 and s.turns[0].output_len == 100 for s in w.sessions)
    with pytest.raises(UserError, match="max_context_tokens"):
        materialise(small(max_context_tokens=100), 0)


def test_no_prefix_when_system_prompt_and_schema_are_empty() -> None:
    w = materialise(small(system_prompt_tokens=0, tool_schema_tokens=0, total_turns=20), 0)
    assert w.prefixes == [] and all(s.prefix_id is None for s in w.sessions)
    s = w.sessions[0]
    assert np.array_equal(w.prompt_ids(s, len(s.turns) - 1), s.tokens)


def test_requests_flag_scales_sessions_and_turns() -> None:
    spec, base = load_spec("agentic", requests=2)
    assert spec.num_requests == 2 and spec.agentic is not None
    assert spec.agentic.total_turns == 100
    w = materialise(spec, 0, base_dir=base)
    assert len(w.sessions) - w.warmup_sessions == 2
    assert 90 <= w.num_turns - len(w.sessions[0].turns) <= 100


def test_scale_shrinks_agentic_tokens() -> None:
    spec, base = load_spec("agentic", scale=0.1)
    w = materialise(spec, 0, base_dir=base)
    assert len(w.prefixes[0]) == 370
    full = summarise(materialise(load_spec("agentic")[0], 0))
    assert summarise(w).max_context_tokens < 0.2 * full.max_context_tokens


def test_agentic_determinism() -> None:
    spec = small(total_turns=60)
    assert materialise(spec, 1).content_hash() == materialise(spec, 1).content_hash()
    assert materialise(spec, 1).content_hash() != materialise(spec, 2).content_hash()
