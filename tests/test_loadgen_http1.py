"""The streaming HTTP/1.1 client: response framing, keep-alive, retries, failures.

Scripted servers (plain asyncio sockets) answer with exact bytes, so every framing case is
covered, split into reads of every size.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from servegym.loadgen.http1 import ConnectError, ConnectionLost, HttpPool, ProtocolError


class Sink:
    """Collects a response."""

    def __init__(self, stop_at: bytes | None = None) -> None:
        self.abandon = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.reads: list[int] = []
        self.ended = False
        self.sent_ns = 0
        self.stop_at = stop_at

    def sent(self, t: int) -> None:
        self.sent_ns = t

    def head(self, status: int, headers: dict[str, str], t: int) -> None:
        self.status, self.headers = status, headers

    def data(self, chunk: bytes, t: int) -> bool:
        self.body += chunk
        self.reads.append(t)
        return self.stop_at is not None and self.stop_at in self.body

    def end(self, t: int) -> None:
        self.ended = True


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Scripted:
    """A server that answers each request with the next scripted response."""

    def __init__(self, responses: list[list[bytes] | None], close_after: bool = False) -> None:
        self.responses = responses
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.responses:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                response = self.responses.pop(0)
                if response is None:  # hang up without answering
                    break
                for piece in response:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.001)
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Scripted], Awaitable[str]]]:
    servers: list[asyncio.Server] = []

    async def start(script: Scripted) -> str:
        server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for s in servers:
        s.close()


def split_every(data: bytes, n: int) -> list[bytes]:
    return [data[i : i + n] for i in range(0, len(data), n)]


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n"
    b"7;ext=1\r\n, world\r\n"
    b"0\r\nX-Trailer: 1\r\n\r\n"
)


@pytest.mark.parametrize("piece", [1, 3, 7, 1000])
async def test_chunked_response_in_pieces(
    serve: Callable[[Scripted], Awaitable[str]], piece: int
) -> None:
    script = Scripted([split_every(CHUNKED, piece)])
    pool = HttpPool(await serve(script))
    sink = Sink()
    await pool.send(pool.request_bytes("/x", b"{}"), sink, 10)
    assert sink.status == 200 and sink.body == b"hello, world" and sink.ended
    assert sink.headers["content-type"] == "text/event-stream"
    assert sink.sent_ns > 0 and all(t >= sink.sent_ns for t in sink.reads)
    await pool.close()


async def test_request_bytes_and_keep_alive_reuse(
    serve: Callable[[Scripted], Awaitable[str]],
) -> None:
    script = Scripted([[CHUNKED]] * 3)
    pool = HttpPool(await serve(script) + "/prefix/", {"Authorization": "Bearer k"})
    for _ in range(3):
        sink = Sink()
        await pool.send(pool.request_bytes("/v1/completions", b'{"a":1}'), sink, 10)
        assert sink.body == b"hello, world"
    assert script.connections == 1
    req = script.requests[0]
    assert req.startswith(b"POST /prefix/v1/completions HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer k\r\n" in req and b"\r\nContent-Length: 7\r\n" in req
    assert req.endswith(b'\r\n\r\n{"a":1}')
    await pool.close()


async def test_content_length_and_until_close_framing(
    serve: Callable[[Scripted], Awaitable[str]],
) -> None:
    sized = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops"
    script = Scripted([split_every(sized, 2)])
    pool = HttpPool(await serve(script))
    sink = Sink()
    await pool.send(pool.request_bytes("/", b""), sink, 10)
    assert (sink.status, sink.body, sink.ended) == (500, b"oops", True)
    await pool.close()

    unframed = b"HTTP/1.0 200 OK\r\n\r\nall of it"
    script = Scripted([[unframed]], close_after=True)
    pool = HttpPool(await serve(script))
    sink = Sink()
    await pool.send(pool.request_bytes("/", b""), sink, 10)
    assert (sink.status, sink.body, sink.ended) == (200, b"all of it", True)
    await pool.close()


async def test_interim_response_is_skipped(serve: Callable[[Scripted], Awaitable[str]]) -> None:
    script = Scripted([[b"HTTP/1.1 100 Continue\r\n\r\n", CHUNKED]])
    pool = HttpPool(await serve(script))
    sink = Sink()
    await pool.send(pool.request_bytes("/", b""), sink, 10)
    assert sink.status == 200 and sink.body == b"hello, world"
    await pool.close()


async def test_stale_idle_connection_is_retried(
    serve: Callable[[Scripted], Awaitable[str]],
) -> None:
    script = Scripted([[CHUNKED], [CHUNKED]], close_after=True)  # closes after each response
    pool = HttpPool(await serve(script))
    for _ in range(2):
        sink = Sink()
        await pool.send(pool.request_bytes("/", b""), sink, 10)
        assert sink.body == b"hello, world"
        await asyncio.sleep(0.05)  # let the server's close land while the connection idles
    assert script.connections == 2
    await pool.close()


async def test_request_on_a_connection_the_server_dropped_is_sent_again(
    serve: Callable[[Scripted], Awaitable[str]],
) -> None:
    script = Scripted([[CHUNKED], None, [CHUNKED]])
    pool = HttpPool(await serve(script))
    for _ in range(2):
        sink = Sink()
        await pool.send(pool.request_bytes("/", b""), sink, 10)
        assert sink.body == b"hello, world"
    assert script.connections == 2 and len(script.requests) == 3
    await pool.close()


async def test_satisfied_sink_lets_the_tail_drain(
    serve: Callable[[Scripted], Awaitable[str]],
) -> None:
    script = Scripted([split_every(CHUNKED, 4), [CHUNKED]])
    pool = HttpPool(await serve(script))
    sink = Sink(stop_at=b"hello")
    await pool.send(pool.request_bytes("/", b""), sink, 10)
    assert sink.body.startswith(b"hello")
    await asyncio.sleep(0.1)  # the rest drains; the connection goes back to the pool
    sink = Sink()
    await pool.send(pool.request_bytes("/", b""), sink, 10)
    assert sink.body == b"hello, world" and script.connections == 1
    await pool.close()


async def test_connection_lost_mid_body(serve: Callable[[Scripted], Awaitable[str]]) -> None:
    partial = CHUNKED[: CHUNKED.index(b"7;ext")]
    script = Scripted([[partial]], close_after=True)
    pool = HttpPool(await serve(script))
    sink = Sink()
    with pytest.raises(ConnectionLost):
        await pool.send(pool.request_bytes("/", b""), sink, 10)
    assert sink.body == b"hello"
    await pool.close()


@pytest.mark.parametrize(
    "response",
    [
        b"NOT HTTP\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
    ],
)
async def test_protocol_errors(
    serve: Callable[[Scripted], Awaitable[str]], response: bytes
) -> None:
    pool = HttpPool(await serve(Scripted([[response]])))
    with pytest.raises(ProtocolError):
        await pool.send(pool.request_bytes("/", b""), Sink(), 10)
    await pool.close()


async def test_connect_refused() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pool = HttpPool(f"http://127.0.0.1:{port}")
    with pytest.raises(ConnectError):
        await pool.send(pool.request_bytes("/", b""), Sink(), 10)


async def test_prewarm_opens_connections(serve: Callable[[Scripted], Awaitable[str]]) -> None:
    script = Scripted([[CHUNKED]])
    pool = HttpPool(await serve(script))
    await pool.prewarm(3)
    await asyncio.sleep(0.05)
    assert script.connections == 3
    await pool.close()


def test_bad_url() -> None:
    with pytest.raises(ValueError):
        HttpPool("ftp://x")
    pool = HttpPool("https://example.com/api")
    assert (pool.host, pool.port, pool.prefix) == ("example.com", 443, "/api")
    assert b"Host: example.com\r\n" in pool.request_bytes("/v1", b"")


async def test_timeout_closes_the_connection(serve: Callable[[Scripted], Awaitable[str]]) -> None:
    slow = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"]
    script = Scripted([slow, [CHUNKED]])
    pool = HttpPool(await serve(script))
    sink = Sink()
    with pytest.raises(TimeoutError):
        await pool.send(pool.request_bytes("/", b""), sink, 0.2)
    assert sink.body == b"hello"
    sink = Sink()
    await pool.send(pool.request_bytes("/", b""), sink, 10)  # a new connection
    assert sink.body == b"hello, world" and script.connections == 2
    await pool.close()


def sse_response(*events: bytes) -> bytes:
    body = b"".join(b"data: " + e + b"\n\n" for e in events)
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % len(body)
        + body
        + b"\r\n0\r\n\r\n"
    )


async def test_odd_events_end_in_an_error_not_an_exception(
    serve: Callable[[Scripted], Awaitable[str]],
) -> None:
    from servegym.loadgen.client import stream_request

    script = Scripted(
        [
            [sse_response(b'{"choices": [{"text": "a"}]}', b'{"choices": ["odd"]}')],
            [sse_response(b"[1, 2]")],
            [sse_response(b'{"object": "error", "message": "overloaded"}')],
        ]
    )
    pool = HttpPool(await serve(script))
    odd = await stream_request(pool, pool.request_bytes("/", b""), chat=False, timeout_s=5)
    assert odd.error is not None and "unreadable response: AttributeError" in odd.error
    assert odd.error.endswith("after 1 chunks")
    listed = await stream_request(pool, pool.request_bytes("/", b""), chat=False, timeout_s=5)
    assert listed.error == "unexpected event in stream: [1, 2]"
    err = await stream_request(pool, pool.request_bytes("/", b""), chat=False, timeout_s=5)
    assert err.error == "server error after 0 chunks: overloaded"
    await pool.close()
