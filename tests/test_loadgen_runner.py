"""The runner against the real (in-process) mock server: every arrival path and bound."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from servegym.errors import UserError
from servegym.loadgen.http_target import HttpTarget
from servegym.loadgen.mock_server import MockServer
from servegym.loadgen.records import RunResult
from servegym.loadgen.target import RunOptions, make_target
from servegym.workloads.model import Workload
from servegym.workloads.spec import ArrivalSpec

if TYPE_CHECKING:
    from tests.conftest import MockFactory

MS = 1_000_000
TOL = 10 * MS
"""Timing tolerance here: the server shares the test's loop, on a shared machine. The
precise checks (a server in its own process) are in test_loadgen_accuracy.py."""


async def run(
    server: MockServer,
    workload: Workload,
    mock: str = "ttft_ms=2,itl_ms=1",
    progress: Callable[[int, int], None] | None = None,
    **opts: Any,
) -> RunResult:
    await reset(server)
    target = HttpTarget(server.url, headers={"x-mock": mock} if mock else None)
    return await target.run(workload, RunOptions(model="mock", **opts), progress)


async def reset(server: MockServer) -> None:
    server.state.reset()


def arrival(kind: str, **kw: Any) -> ArrivalSpec:
    return ArrivalSpec(kind=kind, **kw)  # type: ignore[arg-type]


@pytest.mark.timing  # 10 ms of send lag: run alone, never beside other tests
async def test_open_loop_offsets_are_kept(
    mock_server: MockServer, make_single_turn: Callable[..., Workload]
) -> None:
    offsets = [0.0, 0.03, 0.06, 0.1, 0.15, 0.2]
    wl = make_single_turn(len(offsets), offsets=offsets, arrival=arrival("constant", rate=30))
    res = await run(mock_server, wl)
    assert all(r.ok for r in res.records)
    t0 = res.records[0].scheduled_ns
    assert [r.scheduled_ns - t0 for r in res.records] == [round(o * 1e9) for o in offsets]
    for r in res.records:
        assert r.send_lag_ns is not None and 0 <= r.send_lag_ns < TOL
    arrivals = mock_server.state.arrivals
    assert len(arrivals) == len(offsets)
    for a, o in zip(arrivals, offsets, strict=True):
        assert abs((a - arrivals[0]) - o * 1e9) < TOL
    assert res.stopped_early is None
    assert res.loadgen.send_lag_ms_p99 < TOL / MS


@pytest.mark.parametrize("cap", [1, 4])
async def test_closed_loop_cap_is_never_exceeded(
    mock_server: MockServer, make_single_turn: Callable[..., Workload], cap: int
) -> None:
    kind = "single_stream" if cap == 1 else "concurrency"
    wl = make_single_turn(16, arrival=arrival(kind, concurrency=None if cap == 1 else cap))
    res = await run(mock_server, wl, mock="ttft_ms=5,itl_ms=1")
    assert len(res.records) == 16 and all(r.ok for r in res.records)
    assert mock_server.state.max_running == cap
    # a slot's next request is scheduled when the slot freed, and sent right after
    by_sent = sorted(res.records, key=lambda r: r.sent_ns or 0)
    ends = sorted(r.end_ns or 0 for r in res.records)
    for i, r in enumerate(by_sent[cap:]):
        assert r.scheduled_ns >= ends[i]
        assert r.send_lag_ns is not None and r.send_lag_ns < TOL
    if cap == 1:
        for a, b in itertools.pairwise(by_sent):
            assert b.sent_ns is not None and a.end_ns is not None and b.sent_ns >= a.end_ns


THINK_S = 0.05


async def think_time_gaps(
    mock_server: MockServer, make_workload: Callable[..., Workload]
) -> list[int]:
    """Two sessions of three turns, ``THINK_S`` apart: each later turn is scheduled its
    think time after the previous turn's end, and sent no earlier; the gaps (ns) between a
    turn's end and the next one's send."""
    sessions = [
        [(16, 4, 0.0, 0.0), (24, 4, None, THINK_S), (32, 4, None, THINK_S)],
        [(16, 4, 0.01, 0.0), (24, 4, None, THINK_S), (32, 4, None, THINK_S)],
    ]
    wl = make_workload(sessions, arrival=arrival("constant", rate=100))
    res = await run(mock_server, wl)
    assert len(res.records) == 6 and all(r.ok for r in res.records)
    by_session: dict[int, list[Any]] = {}
    for r in res.records:
        by_session.setdefault(r.session_id, []).append(r)
    gaps = []
    for recs in by_session.values():
        recs.sort(key=lambda r: r.turn_index)
        assert [r.prompt_tokens for r in recs] == [16, 24, 32]
        for prev, nxt in itertools.pairwise(recs):
            assert nxt.scheduled_ns == prev.done_ns + round(THINK_S * 1e9)
            gap = nxt.sent_ns - prev.done_ns
            assert gap >= THINK_S * 1e9 and gap - THINK_S * 1e9 == nxt.send_lag_ns
            gaps.append(gap)
    return gaps


async def test_multi_turn_think_time_is_honoured(
    mock_server: MockServer, make_workload: Callable[..., Workload]
) -> None:
    """Scheduling only: how soon after its time a turn is sent is the timing tier's (a
    loaded CI machine sent one 22 ms late beside the cold installs)."""
    assert len(await think_time_gaps(mock_server, make_workload)) == 4


@pytest.mark.timing  # 10 ms of send lag: run alone, never beside other tests
async def test_multi_turn_think_time_is_kept_to_the_millisecond(
    mock_server: MockServer, make_workload: Callable[..., Workload]
) -> None:
    for gap in await think_time_gaps(mock_server, make_workload):
        assert gap < THINK_S * 1e9 + TOL


async def test_multi_turn_closed_loop_caps_sessions(
    mock_server: MockServer, make_workload: Callable[..., Workload]
) -> None:
    turns = [(16, 3, None, 0.0), (20, 3, None, 0.005), (24, 3, None, 0.0)]
    wl = make_workload([turns] * 5, arrival=arrival("concurrency", concurrency=2))
    res = await run(mock_server, wl)
    assert len(res.records) == 15 and all(r.ok for r in res.records)
    assert mock_server.state.max_running == 2


async def test_warmup_runs_first_and_is_flagged(
    mock_server: MockServer, make_single_turn: Callable[..., Workload]
) -> None:
    wl = make_single_turn(6, warmup_sessions=2)
    res = await run(mock_server, wl)
    warm = [r for r in res.records if r.warmup]
    meas = [r for r in res.records if not r.warmup]
    assert len(warm) == 2 and len(meas) == 4
    assert {r.session_id for r in warm} == {0, 1}
    assert max(r.end_ns or 0 for r in warm) < min(r.sent_ns or 0 for r in meas)
    first = min(r.sent_ns or 0 for r in meas)
    last = max(r.done_ns or 0 for r in meas)
    assert res.duration_s == pytest.approx((last - first) / 1e9)


async def test_duration_bound_open_loop(
    mock_server: MockServer, make_single_turn: Callable[..., Workload]
) -> None:
    offsets = [i * 0.05 for i in range(40)]
    wl = make_single_turn(40, offsets=offsets, duration_s=0.3, arrival=arrival("constant", rate=20))
    done: list[tuple[int, int]] = []
    res = await run(
        mock_server, wl, mock="ttft_ms=2,itl_ms=20", progress=lambda d, t: done.append((d, t))
    )
    assert len(res.records) == 6  # offsets 0 .. 0.25
    assert all(r.ok for r in res.records)  # those in flight finished
    assert res.stopped_early is not None and "duration_s 0.3" in res.stopped_early
    assert "6 of 40" in res.stopped_early
    assert done[-1] == (40, 40)


async def test_duration_bound_closed_loop(
    mock_server: MockServer, make_single_turn: Callable[..., Workload]
) -> None:
    wl = make_single_turn(100, duration_s=0.2, arrival=arrival("concurrency", concurrency=2))
    res = await run(mock_server, wl, mock="ttft_ms=40,itl_ms=1")
    assert 4 <= len(res.records) <= 12
    assert res.stopped_early is not None
    assert all(r.ok for r in res.records)
    t0 = min(r.scheduled_ns for r in res.records)
    assert all(r.scheduled_ns - t0 < 0.2e9 for r in res.records)


async def test_failed_turn_ends_its_session(
    mock_server: MockServer, make_workload: Callable[..., Workload]
) -> None:
    turns = [(16, 3, 0.0, 0.0), (20, 3, None, 0.0), (24, 3, None, 0.0)]
    wl = make_workload([turns] * 3)
    calls: list[tuple[int, int]] = []
    res = await run(
        mock_server, wl, mock="http_status=500", progress=lambda d, t: calls.append((d, t))
    )
    assert len(res.records) == 3
    assert all(r.error == "HTTP 500: mock injected error" for r in res.records)
    assert all(r.turn_index == 0 for r in res.records)
    assert calls[-1] == (9, 9)
    assert res.duration_s >= 0


async def test_errors_mid_stream_are_recorded_not_raised(
    mock_server: MockServer, make_single_turn: Callable[..., Workload]
) -> None:
    res = await run(mock_server, make_single_turn(4), mock="ttft_ms=1,itl_ms=1,error_after=2")
    assert len(res.records) == 4
    assert all(r.error and r.error.startswith("server error after 2") for r in res.records)


async def test_unreachable_server_is_a_user_error(
    make_single_turn: Callable[..., Workload],
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = HttpTarget(f"http://127.0.0.1:{port}")
    with pytest.raises(UserError, match=rf"cannot reach http://127.0.0.1:{port}: "):
        await target.run(make_single_turn(1), RunOptions(model="mock"))


async def test_server_metrics_delta_covers_the_measured_run(
    mock_server: MockServer, make_single_turn: Callable[..., Workload]
) -> None:
    # a request before the run must not count
    async with aiohttp.ClientSession() as http:
        await http.post(
            mock_server.url + "/v1/completions",
            json={"model": "mock", "prompt": [1], "max_tokens": 3},
        )
    wl = make_single_turn(4, output_len=5, prompt_len=10, warmup_sessions=1)
    res = await run(mock_server, wl)
    d = res.server_metrics_delta
    lbl = '{model_name="mock"}'
    assert d[f"vllm:generation_tokens_total{lbl}"] == 15
    assert d[f"vllm:prompt_tokens_total{lbl}"] == 30
    assert d['vllm:request_success_total{finished_reason="length",model_name="mock"}'] == 3
    assert d[f"vllm:time_to_first_token_seconds_count{lbl}"] == 3
    assert d[f"vllm:time_to_first_token_seconds_sum{lbl}"] == pytest.approx(0.006)
    assert not any("running" in k or "_bucket" in k for k in d)
    res = await run(mock_server, wl, scrape_metrics=False)
    assert res.server_metrics_delta == {}


@pytest.mark.parametrize("fmt", ["text", "chat"])
async def test_text_and_chat_prompts(
    mock_server: MockServer, make_single_turn: Callable[..., Workload], fmt: str
) -> None:
    wl = make_single_turn(3, prompt_len=20, output_len=4, prompt_format=fmt)
    res = await run(mock_server, wl)
    assert all(r.ok for r in res.records), [r.error for r in res.records]
    assert all(r.output_tokens == 4 for r in res.records)
    # the mock counts words; the prompt text decodes one word per token id
    assert all(r.usage_prompt_tokens == 20 for r in res.records)


async def test_result_fields_and_round_trip(
    mock_server: MockServer, make_single_turn: Callable[..., Workload]
) -> None:
    wl = make_single_turn(3)
    res = await run(mock_server, wl, keep_outputs=True)
    assert res.target == mock_server.url and res.model == "mock" and res.workload == "test"
    assert res.workload_hash == wl.content_hash() and res.seed == 0
    assert "T" in res.started_at and res.clock_origin_ns > 0
    assert res.duration_s > 0
    assert 0 < res.loadgen.cpu_fraction <= 1.5
    assert {r.request_id for r in res.records} == {"0-0", "1-0", "2-0"}
    again = RunResult.model_validate_json(res.model_dump_json())
    assert again == res


async def test_client_bound_is_reported(
    mock_server: MockServer, make_single_turn: Callable[..., Workload]
) -> None:
    paced = make_single_turn(20, offsets=[i * 0.002 for i in range(20)])
    res = await run(mock_server, paced, max_send_lag_ms=1e-6)
    assert res.loadgen.client_bound
    assert res.loadgen.reason is not None and "p99 send lag" in res.loadgen.reason
    assert res.loadgen.burst_requests == 0


async def test_offline_burst_is_reported_apart_and_not_client_bound(
    mock_server: MockServer, make_single_turn: Callable[..., Workload]
) -> None:
    """All requests at t=0 cannot leave at once: their lag is burst send time, not lag."""
    res = await run(mock_server, make_single_turn(50), max_send_lag_ms=1e-6)
    assert res.loadgen.burst_requests == 50
    assert res.loadgen.burst_send_ms_max > 0
    assert not res.loadgen.client_bound


async def test_registered_as_http_target(mock_factory: MockFactory) -> None:
    target = make_target("http", base_url="http://127.0.0.1:1")
    assert isinstance(target, HttpTarget)
