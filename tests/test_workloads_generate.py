"""Materialisation of synthetic workloads: determinism, prefixes, warm-up, scale, speed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from servegym.errors import UserError
from servegym.workloads import load_spec, materialise, summarise
from servegym.workloads.spec import (
    ArrivalSpec,
    LengthDistribution,
    SharedPrefixSpec,
    WorkloadSpec,
)


def spec(**kw: object) -> WorkloadSpec:
    base: dict[str, object] = {
        "name": "t",
        "num_requests": 50,
        "input_tokens": {"dist": "normal", "mean": 300, "std": 50, "min": 100, "max": 500},
        "output_tokens": {"dist": "uniform", "low": 10, "high": 90},
    }
    base.update(kw)
    return WorkloadSpec.model_validate(base)


def test_same_seed_same_hash_different_seed_different_hash() -> None:
    s = spec(arrival={"kind": "poisson", "rate": 3}, warmup_requests=2)
    a, b, c = materialise(s, 1), materialise(s, 1), materialise(s, 2)
    assert a.content_hash() == b.content_hash()
    assert a.content_hash() != c.content_hash()
    for sa, sb in zip(a.sessions, b.sessions, strict=True):
        assert np.array_equal(sa.tokens, sb.tokens)
        assert sa.turns == sb.turns


def test_hash_is_stable_in_a_fresh_process() -> None:
    spec_, base = load_spec("balanced", requests=20, scale=0.1)
    here = materialise(spec_, 11, base_dir=base).content_hash()
    code = (
        "from servegym.workloads import load_spec, materialise\n"
        "s, b = load_spec('balanced', requests=20, scale=0.1)\n"
        "print(materialise(s, 11, base_dir=b).content_hash())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == here


def test_a_spec_change_changes_the_hash() -> None:
    assert materialise(spec(), 0).content_hash() != materialise(spec(scale=0.5), 0).content_hash()


def test_lengths_tokens_and_turn_layout() -> None:
    w = materialise(spec(), 3)
    assert len(w.sessions) == 50 and w.num_turns == 50 and w.warmup_sessions == 0
    for s in w.sessions:
        (t,) = s.turns
        assert 100 <= t.prompt_len <= 500 and 10 <= t.output_len <= 90
        assert len(s.tokens) == t.prompt_len and s.tokens.dtype == np.int32
        assert s.tokens.min() >= 1000 and s.tokens.max() < 30000
        assert t.arrival_s == 0.0 and t.think_s == 0.0
        ids = w.prompt_ids(s, 0)
        assert np.array_equal(ids, s.tokens)


def test_token_id_range_is_respected() -> None:
    w = materialise(spec(prompt={"token_id_low": 5, "token_id_high": 8}), 0)
    allt = np.concatenate([s.tokens for s in w.sessions])
    assert set(np.unique(allt).tolist()) == {5, 6, 7}


def test_shared_prefix_groups_are_exact() -> None:
    s = spec(shared_prefix={"tokens": 200, "groups": 3}, warmup_requests=2)
    w = materialise(s, 5)
    assert len(w.prefixes) == 3
    assert all(len(p) == 200 for p in w.prefixes)
    assert not np.array_equal(w.prefixes[0], w.prefixes[1])
    measured = w.sessions[w.warmup_sessions :]
    for i, sess in enumerate(measured):
        assert sess.prefix_id == i % 3
        ids = w.prompt_ids(sess, 0)
        assert len(ids) == sess.turns[0].prompt_len
        assert np.array_equal(ids[:200], w.prefixes[i % 3])
    # requests of one group share exactly the prefix and then differ
    a, b = w.prompt_ids(measured[0], 0), w.prompt_ids(measured[3], 0)
    assert np.array_equal(a[:200], b[:200]) and not np.array_equal(a[200:210], b[200:210])


def test_prompt_is_clamped_up_to_the_prefix() -> None:
    s = spec(
        input_tokens={"dist": "fixed", "value": 50}, shared_prefix={"tokens": 100, "groups": 1}
    )
    w = materialise(s, 0)
    assert all(x.turns[0].prompt_len == 100 and len(x.tokens) == 0 for x in w.sessions)
    assert np.array_equal(w.prompt_ids(w.sessions[0], 0), w.prefixes[0])


def test_warmup_comes_first_and_does_not_shift_measured() -> None:
    s0 = spec(arrival={"kind": "poisson", "rate": 2})
    s4 = spec(arrival={"kind": "poisson", "rate": 2}, warmup_requests=4)
    w0, w4 = materialise(s0, 9), materialise(s4, 9)
    assert w4.warmup_sessions == 4 and len(w4.sessions) == 54
    assert [s.id for s in w4.sessions] == list(range(54))
    for a, b in zip(w0.sessions, w4.sessions[4:], strict=True):
        assert a.turns == b.turns and np.array_equal(a.tokens, b.tokens)
    warm = [s.turns[0].arrival_s or 0.0 for s in w4.sessions[:4]]
    assert w4.sessions[0].turns[0].arrival_s == 0.0 and warm == sorted(warm)


def test_open_loop_arrivals_on_turns_closed_loop_none() -> None:
    w = materialise(spec(arrival={"kind": "constant", "rate": 10}), 0)
    assert [s.turns[0].arrival_s for s in w.sessions[:3]] == pytest.approx([0.0, 0.1, 0.2])
    w = materialise(spec(arrival={"kind": "concurrency", "concurrency": 4}), 0)
    assert all(s.turns[0].arrival_s is None for s in w.sessions)


def test_parts_draw_from_independent_streams() -> None:
    a = materialise(spec(), 4)
    b = materialise(spec(arrival={"kind": "poisson", "rate": 1}), 4)
    c = materialise(spec(output_tokens={"dist": "fixed", "value": 7}), 4)
    for x, y, z in zip(a.sessions, b.sessions, c.sessions, strict=True):
        assert np.array_equal(x.tokens, y.tokens) and np.array_equal(x.tokens, z.tokens)
        assert x.turns[0].output_len == y.turns[0].output_len
        assert x.turns[0].prompt_len == z.turns[0].prompt_len


def test_scale_multiplies_every_token_length() -> None:
    s = WorkloadSpec(
        name="t",
        num_requests=20,
        scale=0.05,
        input_tokens=LengthDistribution(dist="fixed", value=1000),
        output_tokens=LengthDistribution(dist="fixed", value=1000),
        shared_prefix=SharedPrefixSpec(tokens=400, groups=2),
        arrival=ArrivalSpec(kind="offline"),
    )
    w = materialise(s, 0)
    assert len(w.prefixes[0]) == 20
    assert {(x.turns[0].prompt_len, x.turns[0].output_len) for x in w.sessions} == {(50, 50)}


def test_bad_seed_is_a_user_error() -> None:
    with pytest.raises(UserError, match="seed"):
        materialise(spec(), -1)


def test_prefill_heavy_is_fast() -> None:
    s, base = load_spec("prefill-heavy", requests=1000)
    t0 = time.perf_counter()
    w = materialise(s, 0, base_dir=base)
    summary = summarise(w)
    elapsed = time.perf_counter() - t0
    assert summary.sessions == 1000
    assert 6400 <= summary.prompt_tokens.p50 <= 9600  # type: ignore[union-attr]
    assert summary.total_prompt_tokens > 7_000_000
    assert elapsed < 1.5, f"materialise + summarise took {elapsed:.2f} s"


@pytest.mark.parametrize("name", ["balanced", "decode-heavy", "prefill-heavy"])
def test_shipped_synthetic_shapes(name: str) -> None:
    s, base = load_spec(name)
    summary = summarise(materialise(s, 0, base_dir=base))
    want_in, want_out = {
        "balanced": (1000, 1000),
        "decode-heavy": (1000, 8000),
        "prefill-heavy": (8000, 1000),
    }[name]
    assert summary.prompt_tokens is not None and summary.output_tokens is not None
    assert abs(summary.prompt_tokens.mean / want_in - 1) < 0.02
    assert abs(summary.output_tokens.mean / want_out - 1) < 0.02
    assert summary.prompt_tokens.max <= 1.2 * want_in
    assert summary.warmup_sessions > 0


def test_summary_fields() -> None:
    s = spec(arrival={"kind": "constant", "rate": 10}, warmup_requests=3)
    w = materialise(s, 0)
    sm = summarise(w)
    assert (sm.sessions, sm.turns, sm.warmup_sessions, sm.warmup_turns) == (50, 50, 3, 3)
    assert sm.arrival_span_s == pytest.approx(4.9)
    assert sm.content_hash == w.content_hash()
    measured = w.sessions[3:]
    assert sm.total_prompt_tokens == sum(x.turns[0].prompt_len for x in measured)
    assert sm.total_output_tokens == sum(x.turns[0].output_len for x in measured)
    assert sm.tool_result_tokens is None
    assert sm.model_dump_json()


def test_trace_path_is_not_resolved_into_the_spec(tmp_path: Path) -> None:
    s, base = load_spec("trace")
    w = materialise(s, 0, base_dir=base)
    assert w.spec.trace is not None and w.spec.trace.path == "traces/azure-sample.csv"
