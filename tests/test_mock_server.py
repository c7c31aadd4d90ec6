"""The mock OpenAI-compatible server: endpoints, determinism, counters, debug endpoints."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from servegym.loadgen.mock_server import (
    MockOptions,
    build_arg_parser,
    options_from_args,
    output_token_ids,
    parse_overrides,
)

if TYPE_CHECKING:
    from tests.conftest import MockFactory, MockProcess


async def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as r:
        return r.status, await r.read()


async def test_models_and_health(mock_factory: MockFactory) -> None:
    server = await mock_factory(model="my-model", ttft_ms=0, itl_ms=0)
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "/v1/models") as r:
            data = await r.json()
        assert data["data"][0]["id"] == "my-model"
        async with http.get(server.url + "/health") as r:
            assert r.status == 200


async def test_non_streaming_completion_and_chat(mock_factory: MockFactory) -> None:
    server = await mock_factory(ttft_ms=1, itl_ms=0.5)
    status, raw = await post(
        server.url + "/v1/completions",
        {"model": "mock", "prompt": [1, 2, 3], "max_tokens": 5, "return_token_ids": True},
    )
    assert status == 200
    body = orjson.loads(raw)
    choice = body["choices"][0]
    assert choice["token_ids"] == output_token_ids([1, 2, 3], 5, 32000)
    assert choice["text"].count(" w") == 5 and choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    status, raw = await post(
        server.url + "/v1/chat/completions",
        {"model": "mock", "messages": [{"role": "user", "content": "a b"}], "max_tokens": 4},
    )
    body = orjson.loads(raw)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"].count(" w") == 4
    assert body["usage"]["prompt_tokens"] == 2


async def test_default_max_tokens_and_zero(mock_factory: MockFactory) -> None:
    server = await mock_factory(ttft_ms=0, itl_ms=0)
    _, raw = await post(server.url + "/v1/completions", {"model": "mock", "prompt": "x"})
    assert orjson.loads(raw)["usage"]["completion_tokens"] == 16
    _, raw = await post(
        server.url + "/v1/completions",
        {"model": "mock", "prompt": "x", "max_tokens": 0, "stream": True},
    )
    assert raw.endswith(b"data: [DONE]\n\n")


async def test_streaming_chunks_usage_and_done(mock_factory: MockFactory) -> None:
    server = await mock_factory(ttft_ms=0, itl_ms=0, tokens_per_chunk=2)
    body = {
        "model": "mock",
        "prompt": [5, 6],
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    _, raw = await post(server.url + "/v1/completions", body)
    events = [e[6:] for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert [len(c["choices"][0]["token_ids"]) for c in chunks[:-1]] == [2, 2, 1]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    # without include_usage: no usage chunk
    body["stream_options"] = {}
    _, raw = await post(server.url + "/v1/completions", body)
    assert b'"usage"' not in raw


async def test_bad_requests(mock_factory: MockFactory) -> None:
    server = await mock_factory(ttft_ms=0, itl_ms=0)
    url = server.url + "/v1/completions"
    async with aiohttp.ClientSession() as http, http.post(url, data=b"{nope") as r:
        assert r.status == 400
    status, raw = await post(url, {"model": "other", "prompt": "x"})
    assert status == 404 and b"does not exist" in raw
    status, _ = await post(url, {"model": "mock"})
    assert status == 400
    status, _ = await post(url, {"model": "mock", "prompt": "x", "max_tokens": -1})
    assert status == 400
    status, raw = await post(url, {"model": "mock", "prompt": "x"}, {"x-mock": "bogus=1"})
    assert status == 400 and b"unknown mock option" in raw
    status, _ = await post(url, {"model": "mock", "prompt": "x", "mock": {"http_status": 503}})
    assert status == 503


async def test_metrics_are_prometheus_text(mock_factory: MockFactory) -> None:
    server = await mock_factory(ttft_ms=0, itl_ms=0)
    for _ in range(3):
        await post(
            server.url + "/v1/completions", {"model": "mock", "prompt": [1], "max_tokens": 4}
        )
    async with aiohttp.ClientSession() as http, http.get(server.url + "/metrics") as r:
        text = await r.text()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["vllm:generation_tokens_total"] == 12
    assert samples["vllm:prompt_tokens_total"] == 3
    assert samples["vllm:request_success_total"] == 3
    assert samples["vllm:time_to_first_token_seconds_count"] == 3
    assert samples["vllm:num_requests_running"] == 0


async def test_debug_arrivals_stats_and_reset(mock_factory: MockFactory) -> None:
    import time

    server = await mock_factory(ttft_ms=0, itl_ms=0)
    t0 = time.perf_counter_ns()
    for _ in range(2):
        await post(
            server.url + "/v1/completions", {"model": "mock", "prompt": [1], "max_tokens": 1}
        )
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "/debug/arrivals") as r:
            arrivals = await r.json()
        assert len(arrivals) == 2 and t0 < arrivals[0] < arrivals[1] < time.perf_counter_ns()
        async with http.get(server.url + "/debug/stats") as r:
            stats = await r.json()
        assert stats["requests"] == 2 and stats["max_running"] == 1 and stats["running"] == 0
        async with http.post(server.url + "/debug/reset") as r:
            assert r.status == 204
        async with http.get(server.url + "/debug/arrivals") as r:
            assert await r.json() == []


def test_options_and_overrides() -> None:
    assert parse_overrides("ttft_ms=5, keepalive,error_after=3") == {
        "ttft_ms": "5",
        "keepalive": "",
        "error_after": "3",
    }
    o = MockOptions().with_overrides({"ttft_ms": "5", "keepalive": "", "error_after": 3})
    assert o.ttft_ms == 5.0 and o.keepalive is True and o.error_after == 3
    with pytest.raises(ValueError):
        MockOptions().with_overrides({"model": "x"})
    with pytest.raises(ValueError):
        MockOptions(tokens_per_chunk=0)
    args = build_arg_parser().parse_args(
        ["--ttft-ms", "7", "--itl-ms", "2", "--tokens-per-chunk", "3", "--fault", "no_usage"]
    )
    o = options_from_args(args)
    assert (o.ttft_ms, o.itl_ms, o.tokens_per_chunk, o.no_usage) == (7.0, 2.0, 3, True)


def test_output_ids_are_a_prefix_family() -> None:
    a = output_token_ids([1, 2, 3], 10, 32000)
    assert a[:4] == output_token_ids([1, 2, 3], 4, 32000)
    assert a != output_token_ids([1, 2, 4], 10, 32000)
    assert all(100 <= t < 32000 for t in a)


def test_command_line_server(mock_process: Callable[..., MockProcess]) -> None:
    import urllib.request

    mp = mock_process("--ttft-ms", "1", "--itl-ms", "1", "--model", "m2")
    with urllib.request.urlopen(f"{mp.url}/v1/models", timeout=10) as r:
        assert b'"id":"m2"' in r.read()


def test_command_line_reports_a_busy_port(mock_process: Callable[..., MockProcess]) -> None:
    mp = mock_process()
    port = mp.url.rsplit(":", 1)[-1]
    out = subprocess.run(
        [sys.executable, "-m", "servegym.loadgen.mock_server", "--port", port],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "cannot listen" in out.stderr


async def raw_exchange(server_url: str, data: bytes, until: bytes, n: int = 1) -> bytes:
    """Send raw bytes; read until ``until`` has been seen ``n`` times (or the peer closes)."""
    host, port = server_url[7:].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    out = b""
    while out.count(until) < n:
        piece = await asyncio.wait_for(reader.read(65536), 5)
        if not piece:
            break
        out += piece
    writer.close()
    return out


def gen_request(body: dict[str, Any], extra: bytes = b"") -> bytes:
    raw = orjson.dumps(body)
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(raw)
        + raw
    )


async def test_pipelined_requests_are_answered_in_order(mock_factory: MockFactory) -> None:
    server = await mock_factory(ttft_ms=0, itl_ms=0)
    a = gen_request({"model": "mock", "prompt": [1], "max_tokens": 1, "stream": True})
    b = gen_request({"model": "mock", "prompt": [2], "max_tokens": 2})
    out = await raw_exchange(server.url, a + b, b"HTTP/1.1 200", 2)
    first, second = out.split(b"HTTP/1.1 200")[1:]
    assert b"data: [DONE]" in first and first.endswith(b"0\r\n\r\n")
    assert b'"completion_tokens":2' in second


async def test_chunked_request_body_and_expect_continue(mock_factory: MockFactory) -> None:
    server = await mock_factory(ttft_ms=0, itl_ms=0)
    raw = orjson.dumps({"model": "mock", "prompt": [1, 2], "max_tokens": 3})
    host, port = server.url[7:].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == (
        b"HTTP/1.1 100 Continue\r\n\r\n"
    )
    half = len(raw) // 2
    writer.write(b"%x\r\n%s\r\n" % (half, raw[:half]))
    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(raw) - half, raw[half:]))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200 OK")
    writer.close()


async def test_http_1_0_connection_is_closed(mock_factory: MockFactory) -> None:
    server = await mock_factory(ttft_ms=0, itl_ms=0)
    out = await raw_exchange(server.url, b"GET /health HTTP/1.0\r\n\r\n", b"never")
    assert out.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in out


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"garbage\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
        (b"POST /x HTTP/1.1\r\nContent-Length: zz\r\n\r\n", b"400"),
        (b"GET /v1/completions HTTP/1.1\r\n\r\n", b"405"),
        (b"GET /nowhere HTTP/1.1\r\n\r\n", b"404"),
        (b"GET /x HTTP/1.1\r\n" + b"X: " + b"a" * 70000, b"400"),
    ],
)
async def test_bad_http(mock_factory: MockFactory, request_bytes: bytes, status: bytes) -> None:
    server = await mock_factory(ttft_ms=0, itl_ms=0)
    out = await raw_exchange(server.url, request_bytes, b"}")
    assert out.startswith(b"HTTP/1.1 " + status)


async def test_client_disconnect_mid_stream_is_counted(mock_factory: MockFactory) -> None:
    server = await mock_factory(ttft_ms=0, itl_ms=20)
    req = gen_request({"model": "mock", "prompt": [1], "max_tokens": 50, "stream": True})
    out = await raw_exchange(server.url, req, b"data:")
    assert b"data:" in out
    await asyncio.sleep(0.1)
    assert server.state.running == 0 and server.state.failed == 1
