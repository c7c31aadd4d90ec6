"""Engine profiles (``profiles/engines/``): what a serving engine pays beyond the GPU kernels,
and how a sim task chooses the engine it simulates."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from sim_support import hardware, metrics, model, run, simple_workload

from servegym.engines.config import ServingConfig
from servegym.engines.sim.launch import launch
from servegym.engines.sim.profiles import EngineProfile, engine_profiles, get_engine
from servegym.errors import UserError
from servegym.tasks.loader import load_task_folder

ROOT = Path(__file__).resolve().parents[1]


def _engine(**fields: float | bool) -> EngineProfile:
    """The shipped vLLM profile with some fields replaced."""
    return get_engine("vllm").model_copy(update=fields)


def _launch(eng: EngineProfile, **knobs: object) -> object:
    return launch(
        model("llama-3.1-8b"),
        hardware("h100-sxm"),
        ServingConfig(**knobs),  # type: ignore[arg-type]
        engine=eng,
    )


def test_shipped_engine_profiles_are_fitted_and_plausible() -> None:
    profiles = engine_profiles()
    assert {"vllm", "tensorrt-llm"} <= set(profiles)
    for p in profiles.values():
        assert p.fitted_on, f"{p.id}: every engine profile says what it was fitted to"
        assert 0.2 <= p.step_overhead_ms <= 8.0
        assert p.per_seq_overhead_us < 500
    vllm, trt = profiles["vllm"], profiles["tensorrt-llm"]
    assert vllm.gemm_scale == 1.0, "hardware efficiencies are defined as what vLLM reaches"
    assert trt.gemm_scale >= vllm.gemm_scale, "TensorRT-LLM's kernels are not slower"


def test_unknown_engine_is_a_user_error_naming_the_field() -> None:
    with pytest.raises(UserError, match="sim_engine: unknown simulated engine 'tgi'"):
        get_engine("tgi", "sim_engine")


def test_api_server_serialises_a_burst() -> None:
    """Every request passes through the API server one at a time: in a burst of n, the k-th
    reaches the scheduler k x api_request_ms after it was sent and gets its first token a
    step later; with no API cost all n are prefilled together."""
    n, api_ms = 64, 25.0
    wl = simple_workload([100] * n, [8] * n)

    def ttfts_ms(eng: object) -> list[float]:
        recs = run(eng, wl, noise=False).records  # type: ignore[arg-type]
        return sorted((r.first_token_ns - r.sent_ns) / 1e6 for r in recs if r.first_token_ns)

    free = ttfts_ms(_launch(_engine(api_request_ms=0.0, api_per_token_us=0.0, api_latency_ms=0.0)))
    slow = ttfts_ms(
        _launch(_engine(api_request_ms=api_ms, api_per_token_us=0.0, api_latency_ms=0.0))
    )
    assert max(free) - min(free) < 1e-6, "without an API cost the burst is one prefill step"
    for k, t in enumerate(slow, start=1):
        assert k * api_ms <= t <= k * api_ms + 20.0


def test_api_latency_is_paid_once_by_every_request() -> None:
    """``api_latency_ms`` delays every request by the same time outside the serialised server:
    a lone request's TTFT grows by exactly it, and a burst keeps its spread."""
    n, lat = 16, 30.0
    wl = simple_workload([100] * n, [8] * n)
    base = _engine(api_request_ms=1.0, api_per_token_us=0.0, api_latency_ms=0.0)
    slow = _engine(api_request_ms=1.0, api_per_token_us=0.0, api_latency_ms=lat)

    def ttfts_ms(eng: EngineProfile) -> list[float]:
        recs = run(_launch(eng), wl, noise=False).records  # type: ignore[arg-type]
        return sorted((r.first_token_ns - r.sent_ns) / 1e6 for r in recs if r.first_token_ns)

    a, b = ttfts_ms(base), ttfts_ms(slow)
    assert [y - x for x, y in zip(a, b, strict=True)] == pytest.approx([lat] * n, abs=1e-3)


def test_a_server_that_holds_a_burst_hands_it_over_whole() -> None:
    """``api_holds_burst`` (a chat endpoint rendering templates on its event loop): a burst of
    n reaches the scheduler only once the server has taken all n, so no first token comes
    before n x api_request_ms; one by one, the first comes after about one request's cost."""
    n, api_ms = 32, 20.0
    wl = simple_workload([100] * n, [8] * n)

    def ttfts_ms(hold: bool) -> list[float]:
        eng = _engine(
            api_request_ms=api_ms, api_per_token_us=0.0, api_latency_ms=0.0, api_holds_burst=hold
        )
        recs = run(_launch(eng), wl, noise=False).records  # type: ignore[arg-type]
        return sorted((r.first_token_ns - r.sent_ns) / 1e6 for r in recs if r.first_token_ns)

    trickle, held = ttfts_ms(False), ttfts_ms(True)
    assert trickle[0] < 2 * api_ms + 20.0
    assert held[0] >= n * api_ms
    assert held[-1] - held[0] < 50.0, "the held burst is prefilled together"


def test_api_server_charges_prompt_tokens() -> None:
    """``api_per_token_us`` prices tokenisation: a lone 4,000-token prompt waits 4,000 x it
    before its prefill starts."""
    wl = simple_workload([4000], [4])
    base = metrics(_launch(_engine(api_request_ms=0.0, api_per_token_us=0.0)), wl, noise=False)  # type: ignore[arg-type]
    tok = metrics(_launch(_engine(api_request_ms=0.0, api_per_token_us=5.0)), wl, noise=False)  # type: ignore[arg-type]
    assert tok.ttft_ms.mean - base.ttft_ms.mean == pytest.approx(4000 * 5.0 / 1000, rel=0.02)


def test_api_server_keeps_a_closed_loop_going() -> None:
    """A closed loop's next request arrives when one finishes and still passes the API server
    before the scheduler: nothing stalls and every request is served."""
    wl = simple_workload([200] * 40, [16] * 40, concurrency=8)
    eng = _launch(_engine(api_request_ms=3.0, api_per_token_us=1.0))
    sim = run(eng, wl, noise=False)  # type: ignore[arg-type]
    assert all(r.http_status == 200 and r.output_tokens == 16 for r in sim.records)


def test_per_sequence_cost_grows_with_the_batch() -> None:
    eng = _launch(_engine(per_seq_overhead_us=50.0))
    c = eng.cost  # type: ignore[attr-defined]
    one = c.step_time(1.0, 1.0, 100.0, 100.0, 0.0, 1.0)
    many = c.step_time(1.0, 1.0, 100.0, 100.0, 0.0, 201.0)
    assert many - one == pytest.approx(200 * 50e-6, rel=1e-6)


def test_tp_sync_is_paid_per_step_only_under_tensor_parallel() -> None:
    eng = _engine(tp_step_overhead_ms=1.0)
    tp1 = _launch(eng)
    tp2 = _launch(eng, tensor_parallel_size=2)
    tp2_free = _launch(_engine(tp_step_overhead_ms=0.0), tensor_parallel_size=2)
    assert tp1.cost.c_step == pytest.approx(eng.step_overhead_ms * 1e-3)  # type: ignore[attr-defined]
    assert tp2.cost.c_step - tp2_free.cost.c_step == pytest.approx(1e-3)  # type: ignore[attr-defined]


def test_attention_scale_prices_attention_only() -> None:
    half = _launch(_engine(attention_scale=0.5)).cost  # type: ignore[attr-defined]
    full = _launch(_engine(attention_scale=1.0)).cost  # type: ignore[attr-defined]
    assert half.a_attn == pytest.approx(2 * full.a_attn)
    assert half.a_lin == pytest.approx(full.a_lin)


def test_float32_weights_take_four_bytes_per_parameter() -> None:
    """dtype = float32 stores and streams the whole model in 4 bytes per parameter (it was
    priced as 2 for the body)."""
    bf16 = _launch(get_engine("vllm"))
    fp32 = _launch(get_engine("vllm"), dtype="float32")
    assert fp32.cost.memory.weight_bytes_total == pytest.approx(  # type: ignore[attr-defined]
        model("llama-3.1-8b").num_parameters * 4.0
    )
    assert fp32.cost.c_weights == pytest.approx(2 * bf16.cost.c_weights)  # type: ignore[attr-defined]


def test_a_task_chooses_its_engine(tmp_path: Path) -> None:
    """``sim_engine`` in a sim task selects the engine profile; an unknown one is refused
    at load time naming the field; a real-track task cannot set it."""
    src = ROOT / "tasks" / "voice-stream-h100"
    folder = tmp_path / "voice-stream-h100"
    folder.mkdir()
    for f in src.iterdir():
        (folder / f.name).write_text(f.read_text())
    task_file = folder / "task.toml"
    text = task_file.read_text()
    assert load_task_folder(folder).task.sim_engine == "vllm"
    task_file.write_text(
        text.replace('engines = ["sim"]', 'engines = ["sim"]\nsim_engine = "tensorrt-llm"')
    )
    assert load_task_folder(folder).task.sim_engine == "tensorrt-llm"
    task_file.write_text(text.replace('engines = ["sim"]', 'engines = ["sim"]\nsim_engine = "tgi"'))
    with pytest.raises(UserError, match="sim_engine"):
        load_task_folder(folder)


def _streaming(chunk_us: float, **fields: float | bool) -> EngineProfile:
    """The shipped vLLM profile with a given streaming cost and no other API-server cost."""
    base: dict[str, float | bool] = {
        "api_request_ms": 0.0,
        "api_per_token_us": 0.0,
        "api_latency_ms": 0.0,
        "api_chunk_us": chunk_us,
    }
    return _engine(**(base | fields))


def test_streaming_bounds_open_streams_by_the_api_server() -> None:
    """``api_chunk_us``: with n streams open on a fast model, every step's n chunks take the
    API server n x chunk_us to send, so each stream's time per output token is at least that
    (Little's law), whatever the GPU's step time; at no streaming cost it is the step's."""
    n, chunk_us = 128, 200.0
    wl = simple_workload([64] * n, [256] * n)
    free = metrics(_launch(_streaming(0.0)), wl, noise=False)  # type: ignore[arg-type]
    slow = metrics(_launch(_streaming(chunk_us)), wl, noise=False)  # type: ignore[arg-type]
    assert free.tpot_ms.p50 < n * chunk_us / 1000 / 2, "the test's GPU steps must be faster"
    assert slow.tpot_ms.p50 == pytest.approx(n * chunk_us / 1000, rel=0.05)
    # the engine finished long before the last chunk was sent: the run ends at the sends
    sent = n * 256 * chunk_us / 1e6
    assert slow.duration_s == pytest.approx(sent, rel=0.05)


def test_a_new_request_waits_behind_the_chunks_queued_before_it() -> None:
    """The chunks go out in the order the work arrived: a request sent while 64 streams are
    open gets its first token only after the chunks queued ahead of it (its TTFT grows with
    the streaming cost), and one sent to an idle server pays its own chunk alone. (That
    the intake waits on the same queue is not asserted here: it moves when the engine
    admits a request, which a request's own timestamps do not show.)"""
    n = 64
    prompts, outputs = [64] * n + [64], [400] * n + [8]
    arrivals = [0.0] * n + [1.0]
    wl = simple_workload(prompts, outputs, arrivals=arrivals)

    def late_ttft_ms(chunk_us: float) -> float:
        sim = run(_launch(_streaming(chunk_us)), wl, noise=False)  # type: ignore[arg-type]
        late = [r for r in sim.records if r.request_id == f"{n}-0"]
        return (late[0].first_token_ns - late[0].sent_ns) / 1e6

    lone = simple_workload([64], [8])
    lone_ttft = {
        c: (lambda r: (r.first_token_ns - r.sent_ns) / 1e6)(
            run(_launch(_streaming(c)), lone, noise=False).records[0]  # type: ignore[arg-type]
        )
        for c in (0.0, 300.0)
    }
    assert lone_ttft[300.0] - lone_ttft[0.0] == pytest.approx(0.3, abs=0.01), "one chunk"
    # 64 chunks of 300 us are sent per step: the backlog a newcomer waits behind is ~19 ms
    assert late_ttft_ms(300.0) - late_ttft_ms(0.0) > 10.0


def test_streaming_cost_keeps_event_skipping_exact() -> None:
    """The fast path sends a run of steps' chunks as one vector, with the requests that
    arrive in between taken in order: the records match the step-by-step path's."""
    eng = _launch(_streaming(150.0, api_request_ms=2.0, api_per_token_us=1.0), max_num_seqs=24)
    wl = simple_workload(
        [200 + (97 * i) % 900 for i in range(60)],
        [100 + (61 * i) % 400 for i in range(60)],
        arrivals=[0.03 * i for i in range(60)],
    )
    fast = run(eng, wl)  # type: ignore[arg-type]
    slow = run(eng, wl, event_skipping=False)  # type: ignore[arg-type]
    assert fast.stats.steps == slow.stats.steps
    for a, b in zip(fast.records, slow.records, strict=True):
        assert a.chunk_tokens == b.chunk_tokens
        np.testing.assert_allclose(a.chunk_ns, b.chunk_ns, rtol=0, atol=2)


def test_a_closed_loop_sends_its_next_request_when_the_last_chunk_arrives() -> None:
    """The client of a closed loop sees a request end when its last chunk is sent, not when
    the engine's step ended: each next request is sent at or after the previous one's end in
    the records."""
    wl = simple_workload([100] * 30, [32] * 30, concurrency=1)
    sim = run(_launch(_streaming(2000.0)), wl, noise=False)  # type: ignore[arg-type]
    recs = sorted(sim.records, key=lambda r: r.sent_ns)
    for prev, nxt in itertools.pairwise(recs):
        assert prev.done_ns is not None
        assert nxt.sent_ns >= prev.done_ns
