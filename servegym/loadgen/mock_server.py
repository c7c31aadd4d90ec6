"""A local OpenAI-compatible streaming server with known, exact timing.

It stands in for a real LLM server in tests, benchmarks and quick runs: ``POST
/v1/completions`` and ``/v1/chat/completions`` (streaming and not), ``GET /v1/models``,
``/health`` and ``/metrics`` (vLLM-style Prometheus counters). Every request produces exactly
``max_tokens`` tokens, derived from a hash of the prompt (the same prompt always gives the
same output, and a shorter output is a prefix of a longer one).

Timing is exact and absolute from the request's receipt ``t`` (when its last byte was read
from the socket, before any parsing): chunk ``i`` (``i = 0, 1, ...``), carrying
``tokens_per_chunk`` tokens, is due at ``t + ttft + i * tokens_per_chunk * itl``. One
:class:`~servegym.loadgen.timing.PreciseScheduler` runs every stream's next chunk at its
deadline (a coarse sleep to 1.5 ms before it, then a yield-spin), so the server stays
sub-0.2 ms accurate with many streams. Chunks that are already due when the server gets to
them (it fell behind) go out in one write.

Why not aiohttp's web server: it costs about 0.1 ms of CPU to take in each request, so a
burst of 64 requests (a closed loop at concurrency 64 restarts in waves) queues the last
one for several milliseconds before its handler (and its clock) starts, and the mock would
no longer have the timing it promises. :mod:`servegym.loadgen.mock_http` (HTTP/1.1 over a
bare :class:`asyncio.Protocol`) takes a request in a few microseconds and stamps it as it
arrives, and each due chunk goes out in one ``write`` (the response head with the first):
the mock is also the target of the load generator's capacity benchmark, so it must be much
faster than any client.

Fault injection, for tests of clients: every field of
:class:`~servegym.loadgen.mock_openai.MockOptions` can be set for one request by an
``x-mock`` header (``ttft_ms=5,error_after=3``) or a ``mock`` object in the request body
(``{"mock": {"ttft_ms": 5}}``), and for every request by the command line.

Debug endpoints: ``GET /debug/arrivals`` lists each generation request's receipt time
(``time.perf_counter_ns()``, a monotonic clock shared by the processes of one Linux
machine; the latest two million are kept); ``GET /debug/stats`` reports requests, running,
the most running at once, and how late the server ran its chunk emissions (p50/p99/max, in
microseconds: the server's own check that it kept its timing); ``POST /debug/reset`` clears
them.

Run it with ``python -m servegym.loadgen.mock_server --port 8000 --ttft-ms 50 --itl-ms 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns

import orjson

from servegym.loadgen.mock_http import HttpConnection, HttpRequest
from servegym.loadgen.mock_openai import (
    DONE_EVENT,
    GenRequest,
    MockOptions,
    MockState,
    error_body,
    models_body,
    output_token_ids,
    parse_overrides,
    parse_request,
    render_metrics,
)
from servegym.loadgen.timing import PreciseScheduler

__all__ = [
    "MockOptions",
    "MockServer",
    "MockState",
    "build_arg_parser",
    "main",
    "options_from_args",
    "output_token_ids",
    "parse_overrides",
    "render_metrics",
    "run_mock_server",
    "start_mock_server",
]

_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n"
)
_CHUNKED_END = b"0\r\n\r\n"
_MALFORMED = b'data: {"choices": [{"text": "broken\n\n'
_KEEPALIVE = b": keep-alive\n\n"


@dataclass(slots=True)
class _Core:
    """The mock's application: its state, its clock, its connections."""

    state: MockState
    scheduler: PreciseScheduler
    conns: set[HttpConnection] = field(default_factory=set)

    def handle(self, conn: HttpConnection, req: HttpRequest) -> None:
        _route(self, conn, req)

    def error_body(self, status: int, message: str) -> bytes:
        return error_body(status, message)


# -- routes ----------------------------------------------------------------------------------


def _route(core: _Core, conn: HttpConnection, req: HttpRequest) -> None:
    path = req.path.split("?", 1)[0]
    method = req.method
    state = core.state
    if path in ("/v1/completions", "/v1/chat/completions"):
        if method != "POST":
            conn.respond(405, error_body(405, "use POST", "MethodNotAllowedError"))
        else:
            _generate(core, conn, req, chat=path.endswith("chat/completions"))
    elif method == "GET" and path == "/v1/models":
        conn.respond(200, models_body(state.options))
    elif method == "GET" and path in ("/health", "/ping"):
        conn.respond(200, b"", "text/plain")
    elif method == "GET" and path == "/metrics":
        body = render_metrics(state).encode()
        conn.respond(200, body, "text/plain; version=0.0.4; charset=utf-8")
    elif method == "GET" and path == "/debug/arrivals":
        conn.respond(200, orjson.dumps(list(state.arrivals)))
    elif method == "GET" and path == "/debug/stats":
        conn.respond(200, orjson.dumps(state.stats()))
    elif method == "POST" and path == "/debug/reset":
        state.reset()
        conn.respond(204, b"")
    else:
        conn.respond(404, error_body(404, f"no route {method} {path}", "NotFoundError"))


def _generate(core: _Core, conn: HttpConnection, r: HttpRequest, chat: bool) -> None:
    state = core.state
    state.arrivals.append(r.t_recv)
    state.requests += 1
    parsed = parse_request(state.options, r.t_recv, chat, r.body, r.headers.get("x-mock"))
    if isinstance(parsed, tuple):
        state.failed += 1
        status, message = parsed
        kind = "NotFoundError" if status == 404 else "BadRequestError"
        conn.respond(status, error_body(status, message, kind))
        return
    if parsed.opts.http_status:
        state.failed += 1
        status = parsed.opts.http_status
        conn.respond(status, error_body(status, "mock injected error", "InternalServerError"))
        return
    if parsed.prompt_logprobs:
        state.rescored += 1
    state.running += 1
    if state.running > state.max_running:
        state.max_running = state.running
    if parsed.stream:
        _Stream(core, conn, parsed).start()
    else:
        _whole(core, conn, parsed)


def _finish(state: MockState, req: GenRequest, ok: bool) -> None:
    state.running -= 1
    if ok:
        state.success += 1
        state.prompt_tokens += req.prompt_tokens
        state.generation_tokens += req.max_tokens
        state.ttft_hist.observe(req.opts.ttft_ms / 1000.0)
        state.e2e_hist.observe((perf_counter_ns() - req.t_recv) / 1e9)
    else:
        state.failed += 1


def _whole(core: _Core, conn: HttpConnection, req: GenRequest) -> None:
    opts = req.opts
    k = opts.tokens_per_chunk
    n_chunks = -(-req.max_tokens // k)
    done_ns = req.t_recv + round(opts.ttft_ms * 1e6)
    done_ns += round(opts.itl_ms * 1e6) * k * max(n_chunks - 1, 0)

    def reply() -> None:
        if conn.closed:
            _finish(core.state, req, False)
            return
        ids = output_token_ids(req.prompt, req.max_tokens, opts.vocab_size)
        words = core.state.words
        scripted = core.state.scripted_reply(req)
        text = scripted if scripted is not None else "".join([words[t] for t in ids])
        body = req.whole(text, ids)
        _finish(core.state, req, True)
        conn.respond(200, body)

    core.scheduler.call_at(done_ns, reply)


class _Stream:
    """One streamed response: emits every chunk that is due, then waits for the next."""

    __slots__ = (
        "c",
        "conn",
        "core",
        "first_ns",
        "headers_sent",
        "ids",
        "k",
        "n_chunks",
        "pending",
        "req",
        "step_ns",
    )

    def __init__(self, core: _Core, conn: HttpConnection, req: GenRequest) -> None:
        opts = req.opts
        self.core = core
        self.conn = conn
        self.req = req
        self.k = opts.tokens_per_chunk
        self.ids = output_token_ids(req.prompt, req.max_tokens, opts.vocab_size)
        self.first_ns = req.t_recv + round(opts.ttft_ms * 1e6)
        self.step_ns = round(opts.itl_ms * 1e6) * self.k
        self.n_chunks = -(-req.max_tokens // self.k)
        self.c = 0
        self.headers_sent = False
        self.pending = b""

    def start(self) -> None:
        req, opts = self.req, self.req.opts
        pre = b""
        if opts.empty_first_chunk:
            pre += req.chunk("", None, None)
        if opts.whitespace_first_chunk:
            pre += req.chunk(" ", None, None)
        if pre:  # these go out at once, before "prefill"
            self._write(pre, end=False)
        if req.chat:
            self.pending = req.role_chunk()
        self.core.scheduler.call_at(self.first_ns, self.emit)

    def emit(self) -> None:
        conn, req, opts = self.conn, self.req, self.req.opts
        if conn.closed:
            _finish(self.core.state, req, False)
            return
        now = perf_counter_ns()
        self.core.state.lateness_ns.append(now - (self.first_ns + self.c * self.step_ns))
        out = self.pending
        self.pending = b""
        end = ok = False
        k, n_chunks, words = self.k, self.n_chunks, self.core.state.words
        if n_chunks == 0:
            out += req.chunk("", [], "length")
        while True:
            c = self.c
            if c >= n_chunks:
                if req.include_usage and not opts.no_usage:
                    out += req.usage_chunk()
                out += DONE_EVENT
                end = ok = True
                break
            if self.first_ns + c * self.step_ns > now:
                break
            if c == opts.error_after:
                out += req.error_event(f"mock error after {c} chunks") + DONE_EVENT
                end = True
                break
            if c == opts.drop_after:
                end = True
                break
            if c == opts.hang_after:
                self._write(out, False)
                return  # never scheduled again: the stream hangs, the connection stays open
            if c == opts.stop_after:
                out += req.chunk("", [], "stop")
                if req.include_usage and not opts.no_usage:
                    out += req.usage_chunk()
                out += DONE_EVENT
                end = ok = True
                break
            if opts.keepalive:
                out += _KEEPALIVE
            if c == opts.malformed_after:
                out += _MALFORMED
            toks = self.ids[c * k : (c + 1) * k]
            text = "".join([words[t] for t in toks])
            out += req.chunk(text, toks, "length" if c == n_chunks - 1 else None)
            self.c = c + 1
        self._write(out, end)
        if end:
            _finish(self.core.state, req, ok)
            conn.finish()
        else:
            self.core.scheduler.call_at(self.first_ns + self.c * self.step_ns, self.emit)

    def _write(self, out: bytes, end: bool) -> None:
        parts: list[bytes] = []
        if not self.headers_sent:
            self.headers_sent = True
            parts.append(
                _SSE_HEAD + (b"Connection: close\r\n\r\n" if self.conn.close_after else b"\r\n")
            )
        if out:
            parts.append(b"%x\r\n" % len(out))
            parts.append(out)
            parts.append(b"\r\n")
        if end:
            parts.append(_CHUNKED_END)
        self.conn.send(b"".join(parts))


# -- running it ------------------------------------------------------------------------------


@dataclass(slots=True)
class MockServer:
    """A running in-process mock server."""

    server: asyncio.Server
    core: _Core
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def state(self) -> MockState:
        return self.core.state

    async def close(self) -> None:
        self.server.close()
        for conn in list(self.core.conns):
            conn.closed = True
            if conn.transport is not None:
                conn.transport.close()
        await self.server.wait_closed()
        await self.core.scheduler.close()


async def start_mock_server(
    host: str = "127.0.0.1", port: int = 0, options: MockOptions | None = None
) -> MockServer:
    """Start the mock server on the running loop; ``port=0`` picks a free port."""
    options = options or MockOptions()
    core = _Core(
        state=MockState(options=options), scheduler=PreciseScheduler(int(options.spin_us * 1000))
    )
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: HttpConnection(core), host, port, backlog=4096, reuse_address=True
    )
    bound = int(server.sockets[0].getsockname()[1]) if server.sockets else port
    return MockServer(server=server, core=core, host=host, port=bound)


async def _serve_forever(host: str, port: int, options: MockOptions) -> None:
    server = await start_mock_server(host, port, options)
    print(f"mock server listening on {server.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.close()


def run_mock_server(
    host: str = "127.0.0.1", port: int = 8000, options: MockOptions | None = None
) -> None:
    """Serve until interrupted (SIGINT/SIGTERM), on uvloop when installed.

    Prints ``mock server listening on http://HOST:PORT`` once listening (with ``port=0``,
    the port picked).
    """
    from servegym.loadgen.eventloop import run

    run(_serve_forever(host, port, options or MockOptions()))


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="servegym mock-server",
        description="An OpenAI-compatible streaming server with exact, known timing.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--ttft-ms", type=float, default=50.0, help="time to first token")
    p.add_argument("--itl-ms", type=float, default=10.0, help="time between tokens")
    p.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens per streamed chunk")
    p.add_argument("--model", default="mock", help="model name served")
    p.add_argument("--any-model", action="store_true", help="accept any model name in requests")
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="refuse prompt token ids at or above this (as vLLM does); default: accept any",
    )
    p.add_argument("--root", default=None, help="model folder /v1/models names (vLLM's root)")
    p.add_argument(
        "--replies",
        default="",
        help="JSON file of scripted chat answers, keyed by the last message's content",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fault for every request, e.g. error_after=3, empty_first_chunk (repeatable)",
    )
    return p


def options_from_args(args: argparse.Namespace) -> MockOptions:
    base = MockOptions(
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        tokens_per_chunk=args.tokens_per_chunk,
        model=args.model,
        check_model=not args.any_model,
        max_model_len=args.max_model_len,
        root=args.root,
        replies=args.replies,
        **(
            {"vocab_size": args.vocab_size, "check_vocab": True}
            if args.vocab_size is not None
            else {}
        ),
    )
    overrides: dict[str, str] = {}
    for f in args.fault:
        overrides.update(parse_overrides(f))
    return base.with_overrides(overrides) if overrides else base


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    try:
        options = options_from_args(args)
    except ValueError as e:
        parser.error(str(e))
    try:
        run_mock_server(args.host, args.port, options)
    except OSError as e:
        print(
            f"error: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
