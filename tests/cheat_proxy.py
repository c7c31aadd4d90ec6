"""Cheating servers for the integrity catalogue: an OpenAI-compatible proxy in front of a
real engine that answers some or all requests dishonestly, fast.

Each mode is one reward hack of the catalogue (issue 8, docs/integrity.md):

- ``honest``: forwards everything unchanged (the control);
- ``replay``: forwards the first request, then replays earlier replies to new prompts
  ("a cache of prompts seen earlier": the scoring prompts are fresh, so a cache keyed on
  anything but the exact prompt must serve another prompt's answer);
- ``route:N``: forwards the first ``N`` requests (what a cheat would guess the quality
  prompts are, e.g. the first run of an evaluation) and fakes the rest;
- ``constant``: never forwards; streams one token repeated at full speed;
- ``sampling``: forwards with ``temperature`` 1.0 (sampling parameters ignored).

Fakes are well formed: the forced length, token ids and text that match, usage that
matches, so only a check of *which* tokens came back can catch them.

Run as a script (``python tests/cheat_proxy.py --upstream URL --mode MODE --port P
--tokenizer DIR``) or in-process with :func:`make_app`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from tokenizers import Tokenizer

CONSTANT_TOKEN = 1860


class Cheat:
    def __init__(self, upstream: str | None, mode: str, tokenizer: Path) -> None:
        self.upstream = upstream.rstrip("/") if upstream else None
        self.mode, _, arg = mode.partition(":")
        self.route_first = int(arg) if arg else 0
        tok_file = tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer
        self.tokenizer = Tokenizer.from_file(str(tok_file))
        self.seen = 0
        self.replies: list[list[int]] = []
        self.rng = random.Random(0)
        self.http: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self.http is None:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900))
        return self.http

    def fake_ids(self, n: int) -> list[int]:
        if self.mode == "constant":
            return [CONSTANT_TOKEN] * n
        if self.mode == "replay" and self.replies:
            reply = self.replies[self.seen % len(self.replies)]
            return list(itertools.islice(itertools.cycle(reply), n))
        return [self.rng.randrange(16, 4096) for _ in range(n)]

    def forwards(self, index: int) -> bool:
        if self.mode in ("honest", "sampling"):
            return True
        if self.mode == "replay":
            return not self.replies
        if self.mode == "route":
            return index < self.route_first
        return False


async def _fake_stream(
    request: web.Request, cheat: Cheat, body: dict[str, Any]
) -> web.StreamResponse:
    n = int(body.get("max_tokens") or 16)
    ids = cheat.fake_ids(n)
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    chat = "messages" in body
    for i, t in enumerate(ids):
        text = cheat.tokenizer.decode([t])
        choice: dict[str, Any] = {"index": 0, "token_ids": [t]}
        choice["finish_reason"] = "length" if i == n - 1 else None
        if chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        event = {"id": "cheat", "created": int(time.time()), "choices": [choice]}
        await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    prompt = body.get("prompt")
    prompt_tokens = len(prompt) if isinstance(prompt, list) else 0
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n}
    usage["total_tokens"] = prompt_tokens + n
    await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _forward_stream(
    request: web.Request, cheat: Cheat, body: dict[str, Any]
) -> web.StreamResponse:
    assert cheat.upstream is not None
    if cheat.mode == "sampling":
        body = {**body, "temperature": 1.0}
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    got: list[int] = []
    async with cheat.session().post(cheat.upstream + request.path, json=body) as up:
        if up.status != 200:
            return web.Response(status=up.status, body=await up.read())
        await resp.prepare(request)
        buffer = b""
        async for chunk in up.content.iter_any():
            await resp.write(chunk)
            buffer += chunk
        for line in buffer.split(b"\n"):
            if line.startswith(b"data: {"):
                for c in json.loads(line[6:]).get("choices") or []:
                    got.extend(c.get("token_ids") or [])
    if cheat.mode == "replay" and got:
        cheat.replies.append(got)
    await resp.write_eof()
    return resp


def make_app(upstream: str | None, mode: str, tokenizer: Path) -> web.Application:
    cheat = Cheat(upstream, mode, tokenizer)

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        index = cheat.seen
        cheat.seen += 1
        if cheat.forwards(index):
            return await _forward_stream(request, cheat, body)
        return await _fake_stream(request, cheat, body)

    async def passthrough(request: web.Request) -> web.Response:
        if cheat.upstream is None:
            if request.path == "/v1/models":
                return web.json_response({"data": [{"id": "servegym-tiny"}]})
            return web.Response(text="ok" if request.path == "/health" else "")
        async with cheat.session().get(cheat.upstream + request.path) as up:
            return web.Response(status=up.status, body=await up.read())

    async def close(_: web.Application) -> AsyncIterator[None]:
        yield
        if cheat.http is not None:
            await cheat.http.close()

    app = web.Application()
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    for path in ("/health", "/v1/models", "/metrics"):
        app.router.add_get(path, passthrough)
    app.cleanup_ctx.append(close)
    return app


@contextlib.contextmanager
def serving(upstream: str | None, mode: str, tokenizer: Path) -> Iterator[str]:
    """The proxy on a free port in a background thread, for a ``with`` block: its URL."""
    with serve_app(make_app(upstream, mode, tokenizer)) as url:
        yield url


@contextlib.contextmanager
def serve_app(app: web.Application) -> Iterator[str]:
    """``app`` on a free port in a background thread, for a ``with`` block: its URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def build_impostor(folder: Path) -> Any:
    """Catalogue item 5's model: servegym-tiny's builder with two layers and other random
    weights (seed 7) over the same tokenizer, written to ``folder``; its ``ModelRef``, served
    under servegym-tiny's name."""
    import subprocess

    from servegym.cpu_track.setup import BUILDER
    from servegym.engines.base import ModelRef
    from servegym.engines.cpu_home import TINY_MODEL, track_paths

    subprocess.run(
        [str(track_paths().python), str(BUILDER), str(folder), "--seed", "7", "--layers", "2"],
        check=True, capture_output=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                              "TOKENIZERS_PARALLELISM": "false"},
    )  # fmt: skip
    return ModelRef(path=str(folder), served_name=TINY_MODEL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", default=None)
    parser.add_argument("--mode", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    args = parser.parse_args()
    web.run_app(
        make_app(args.upstream, args.mode, args.tokenizer),
        host="127.0.0.1",
        port=args.port,
        print=None,
    )


if __name__ == "__main__":
    main()
