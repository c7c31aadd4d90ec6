"""A small HTTP/1.1 server connection over :class:`asyncio.Protocol`, for the mock server.

It takes a request in a few microseconds and stamps it (``perf_counter_ns``) when its last
byte is read, before any parsing: see :mod:`servegym.loadgen.mock_server` for why the mock
does not use aiohttp's server. It speaks the subset of HTTP/1.1 that clients use here:
keep-alive, pipelining (answered in order), ``Content-Length`` or chunked request bodies,
``Expect: 100-continue``. Responses are written by the application through :meth:`send`
and :meth:`respond`, whole or streamed.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from time import perf_counter_ns
from typing import Protocol

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 256 * 1024 * 1024


class BadRequest(Exception):
    pass


class App(Protocol):
    """What a connection serves."""

    conns: set[HttpConnection]

    def handle(self, conn: HttpConnection, req: HttpRequest) -> None:
        """Answer ``req`` (now or later); call ``conn.respond`` or ``conn.finish`` once."""
        ...

    def error_body(self, status: int, message: str) -> bytes: ...


def response_bytes(status: int, body: bytes, content_type: str, close: bool) -> bytes:
    """A whole response with ``Content-Length``."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    conn = "Connection: close\r\n" if close else ""
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n{conn}\r\n"
    )
    return head.encode("latin-1") + body


class HttpRequest:
    __slots__ = ("body", "close", "headers", "method", "path", "t_recv")

    def __init__(
        self, method: str, path: str, headers: dict[str, str], body: bytes, t_recv: int
    ) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.t_recv = t_recv
        self.close = "close" in headers.get("connection", "").lower()


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests and answers them one at a time, in order."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False
        self.closed = False
        self.close_after = False
        # the request whose head is parsed but whose body is still arriving
        self._head: tuple[str, str, dict[str, str], int] | None = None
        self._continued = False
        self._queued = False
        self.t_data = 0

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.app.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.app.conns.discard(self)

    def data_received(self, data: bytes) -> None:
        # Stamp now, parse later: when many requests arrive at once, the loop calls this for
        # each of them first, so each gets its own arrival time, not the time the server
        # finished taking in the ones before it.
        self.t_data = perf_counter_ns()
        self.buf += data
        if not self.busy and not self._queued:
            self._queued = True
            asyncio.get_running_loop().call_soon(self._take_in)

    def _take_in(self) -> None:
        self._queued = False
        self._next(self.t_data)

    # -- requests --------------------------------------------------------------------------

    def _next(self, t: int) -> None:
        """Take in the next complete request in the buffer, if any."""
        if self.closed or self.busy:
            return
        try:
            req = self._parse(t)
        except BadRequest as e:
            self.close_after = True
            self.busy = True
            body = self.app.error_body(400, str(e))
            self.send(response_bytes(400, body, "application/json", True))
            self.finish()
            return
        if req is None:
            return
        self.busy = True
        self.close_after = req.close
        self.app.handle(self, req)

    def _parse(self, t: int) -> HttpRequest | None:
        buf = self.buf
        if self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise BadRequest("request head too large")
                return None
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            try:
                method, target, version = lines[0].split(" ", 2)
            except ValueError:
                raise BadRequest("malformed request line") from None
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    raise BadRequest("malformed header line")
                headers[name.strip().lower()] = value.strip()
            if version == "HTTP/1.0" and "keep-alive" not in headers.get("connection", ""):
                headers["connection"] = "close"
            self._head = (method, target, headers, end + 4)
            self._continued = False
        method, target, headers, start = self._head
        if "chunked" in headers.get("transfer-encoding", "").lower():
            decoded = dechunk(buf, start)
            if decoded is None:
                self._maybe_continue(headers)
                return None
            body, consumed = decoded
        else:
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                raise BadRequest("bad Content-Length") from None
            if length < 0 or length > MAX_BODY_BYTES:
                raise BadRequest("bad Content-Length")
            if len(buf) - start < length:
                self._maybe_continue(headers)
                return None
            body = bytes(buf[start : start + length])
            consumed = start + length
        del buf[:consumed]
        self._head = None
        return HttpRequest(method, target, headers, body, t)

    def _maybe_continue(self, headers: dict[str, str]) -> None:
        if not self._continued and headers.get("expect", "").lower() == "100-continue":
            self._continued = True
            self.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    # -- responses -------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def respond(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send(response_bytes(status, body, content_type, self.close_after))
        self.finish()

    def finish(self) -> None:
        """The current response is complete: close, or take the next pipelined request."""
        self.busy = False
        if self.close_after:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        elif self.buf:
            self._next(perf_counter_ns())


def dechunk(buf: bytearray, start: int) -> tuple[bytes, int] | None:
    """Decode a chunked body from ``buf[start:]``; ``None`` until it is complete."""
    out = bytearray()
    pos = start
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        try:
            size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        except ValueError:
            raise BadRequest("bad chunk size") from None
        pos = eol + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", pos - 2)
            if end < 0:
                return None
            return bytes(out), end + 4
        if len(buf) < pos + size + 2:
            return None
        out += buf[pos : pos + size]
        pos += size + 2
        if len(out) > MAX_BODY_BYTES:
            raise BadRequest("request body too large")
