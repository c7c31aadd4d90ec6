"""One request against the real mock server: how each SSE shape becomes a record."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servegym.loadgen.client import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    TokenCounter,
    build_body,
    finish_record,
    stream_request,
)
from servegym.loadgen.http1 import HttpPool
from servegym.loadgen.mock_server import MockServer, output_token_ids
from servegym.loadgen.records import RequestRecord
from servegym.loadgen.target import RunOptions

PROMPT = np.arange(100, 132, dtype=np.int32)


async def send(
    url: str,
    *,
    mock: str = "",
    max_tokens: int = 8,
    chat: bool = False,
    timeout_s: float = 10.0,
    counter: TokenCounter | None = None,
    keep_outputs: bool = True,
    **opts: Any,
) -> RequestRecord:
    options = RunOptions(model="mock", **opts)
    prompt: np.ndarray[Any, Any] | str = "hello there world" if chat else PROMPT
    body = build_body(
        model="mock", prompt=prompt, max_tokens=max_tokens, options=options, chat=chat
    )
    pool = HttpPool(url, {"x-mock": mock} if mock else None)
    try:
        request = pool.request_bytes(CHAT_PATH if chat else COMPLETIONS_PATH, body)
        res = await stream_request(pool, request, chat=chat, timeout_s=timeout_s)
    finally:
        await pool.close()
    return finish_record(
        res,
        request_id="r",
        session_id=0,
        turn_index=0,
        warmup=False,
        prompt_tokens=len(PROMPT),
        expected_output_tokens=max_tokens,
        scheduled_ns=res.sent_ns,
        origin_ns=res.sent_ns,
        counter=counter,
        keep_outputs=keep_outputs,
    )


def ms(ns: int | None) -> float:
    assert ns is not None
    return ns / 1e6


async def test_normal_stream_with_token_ids(mock_server: MockServer) -> None:
    rec = await send(mock_server.url, max_tokens=8)
    assert rec.ok, rec.error
    assert rec.http_status == 200
    assert rec.recount_source == "token_ids"
    assert rec.output_tokens == 8
    assert rec.chunk_tokens == [1] * 8
    assert len(rec.chunk_ns) == 8 and rec.empty_chunk_ns == []
    assert rec.usage_prompt_tokens == len(PROMPT)
    assert rec.usage_completion_tokens == 8
    expected_ids = output_token_ids(PROMPT.tolist(), 8, 32000)
    assert rec.output_token_ids == expected_ids
    assert rec.output_hash == hashlib.sha256(np.array(expected_ids, "<i4").tobytes()).hexdigest()
    # TTFT 5 ms, ITL 1 ms (in-process server: loose bounds)
    assert 4.9 < ms(rec.ttft_ns) < 30
    assert rec.first_token_ns == rec.chunk_ns[0]
    assert rec.done_ns == rec.chunk_ns[-1]
    assert rec.end_ns is not None and rec.end_ns >= rec.done_ns
    assert 4 < ms(rec.done_ns - rec.chunk_ns[0]) < 30  # 7 ms nominal; in-process, so loose
    assert rec.sent_ns == 0 and rec.scheduled_ns == 0


async def test_outputs_are_deterministic(mock_server: MockServer) -> None:
    a = await send(mock_server.url, max_tokens=6)
    b = await send(mock_server.url, max_tokens=6)
    c = await send(mock_server.url, max_tokens=10)
    assert a.output_hash == b.output_hash
    assert a.output_token_ids is not None and c.output_token_ids is not None
    assert c.output_token_ids[:6] == a.output_token_ids


async def test_empty_first_chunk_does_not_count_for_ttft(mock_server: MockServer) -> None:
    rec = await send(mock_server.url, mock="empty_first_chunk,ttft_ms=20")
    assert rec.ok, rec.error
    assert len(rec.empty_chunk_ns) == 1
    assert ms(rec.empty_chunk_ns[0]) < 10
    assert ms(rec.first_token_ns) >= 20
    assert rec.output_tokens == 8


@pytest.mark.parametrize("ids", [True, False])
async def test_whitespace_first_chunk_does_not_count_for_ttft(
    mock_server: MockServer, ids: bool
) -> None:
    rec = await send(
        mock_server.url, mock="whitespace_first_chunk,ttft_ms=20", return_token_ids=ids
    )
    assert rec.ok, rec.error
    assert len(rec.empty_chunk_ns) == 1
    assert ms(rec.first_token_ns) >= 20
    assert rec.output_tokens == 8
    assert rec.recount_source == ("token_ids" if ids else "chunks")


async def test_usage_only_final_chunk(mock_server: MockServer) -> None:
    rec = await send(mock_server.url)
    assert rec.usage_completion_tokens == 8
    # the usage chunk is neither a token chunk nor an empty one
    assert len(rec.chunk_ns) + len(rec.empty_chunk_ns) == 8


async def test_no_usage_when_the_server_sends_none(mock_server: MockServer) -> None:
    rec = await send(mock_server.url, mock="no_usage")
    assert rec.ok and rec.usage_completion_tokens is None and rec.output_tokens == 8


@pytest.mark.parametrize(("k", "n"), [(4, 16), (4, 10), (3, 1)])
async def test_several_tokens_in_one_chunk(mock_server: MockServer, k: int, n: int) -> None:
    rec = await send(mock_server.url, mock=f"tokens_per_chunk={k}", max_tokens=n)
    assert rec.ok, rec.error
    expected = [k] * (n // k) + ([n % k] if n % k else [])
    assert rec.chunk_tokens == expected
    assert rec.output_tokens == n
    assert rec.recount_source == "token_ids"


async def test_several_tokens_per_chunk_without_ids_count_chunks(mock_server: MockServer) -> None:
    rec = await send(
        mock_server.url, mock="tokens_per_chunk=4", max_tokens=16, return_token_ids=False
    )
    assert rec.recount_source == "chunks"
    assert rec.chunk_tokens == [1, 1, 1, 1]
    assert rec.usage_completion_tokens == 16


def word_tokenizer(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(32000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


async def test_tokenizer_recount_when_no_ids(mock_server: MockServer, tmp_path: Path) -> None:
    counter = TokenCounter.from_path(str(word_tokenizer(tmp_path)))
    rec = await send(
        mock_server.url,
        mock="tokens_per_chunk=3",
        max_tokens=10,
        return_token_ids=False,
        counter=counter,
    )
    assert rec.ok, rec.error
    assert rec.recount_source == "tokenizer"
    assert rec.chunk_tokens == [3, 3, 3, 1]
    assert rec.output_tokens == 10
    assert rec.output_text is not None and rec.output_text.count(" w") == 10
    assert rec.output_hash == hashlib.sha256(rec.output_text.encode()).hexdigest()


async def test_chat_stream(mock_server: MockServer) -> None:
    rec = await send(mock_server.url, chat=True, max_tokens=5)
    assert rec.ok, rec.error
    assert rec.output_tokens == 5
    assert len(rec.empty_chunk_ns) == 1  # the role-only chunk
    assert rec.usage_prompt_tokens == 3


async def test_error_mid_stream(mock_server: MockServer) -> None:
    rec = await send(mock_server.url, mock="error_after=3")
    assert not rec.ok
    assert rec.error is not None and rec.error.startswith("server error after 3 chunks")
    assert "mock error" in rec.error
    assert len(rec.chunk_ns) == 3
    assert rec.done_ns is None and rec.end_ns is not None


async def test_http_500(mock_server: MockServer) -> None:
    rec = await send(mock_server.url, mock="http_status=500")
    assert rec.http_status == 500
    assert rec.error == "HTTP 500: mock injected error"
    assert rec.chunk_ns == [] and rec.first_token_ns is None


async def test_http_404_unknown_model(mock_server: MockServer) -> None:
    options = RunOptions(model="nope")
    body = build_body(model="nope", prompt=PROMPT, max_tokens=2, options=options)
    pool = HttpPool(mock_server.url)
    res = await stream_request(
        pool, pool.request_bytes(COMPLETIONS_PATH, body), chat=False, timeout_s=5
    )
    await pool.close()
    assert res.status == 404
    assert res.error is not None and "does not exist" in res.error


async def test_malformed_json(mock_server: MockServer) -> None:
    rec = await send(mock_server.url, mock="malformed_after=2")
    assert rec.error is not None and rec.error.startswith("malformed JSON in stream after 2 chunks")
    assert len(rec.chunk_ns) == 2


async def test_stream_ending_without_done(mock_server: MockServer) -> None:
    rec = await send(mock_server.url, mock="drop_after=4")
    assert rec.error == "stream ended without [DONE] after 4 chunks"


async def test_keepalive_comments_are_ignored(mock_server: MockServer) -> None:
    rec = await send(mock_server.url, mock="keepalive")
    assert rec.ok and rec.output_tokens == 8 and rec.empty_chunk_ns == []


async def test_timeout(mock_server: MockServer) -> None:
    rec = await send(mock_server.url, mock="ttft_ms=3000", timeout_s=0.2)
    assert rec.error is not None and rec.error.startswith("timeout after 0.2 s")
    assert rec.end_ns is not None and 190 < ms(rec.end_ns) < 1000


async def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rec = await send(f"http://127.0.0.1:{port}")
    assert rec.error is not None and rec.error.startswith("connect failed")
    assert rec.http_status is None


def test_body_forces_the_output_length() -> None:
    import orjson

    opts = RunOptions(model="m")
    body = orjson.loads(build_body(model="m", prompt=PROMPT, max_tokens=7, options=opts))
    assert body["prompt"] == PROMPT.tolist()
    assert body["max_tokens"] == 7 and body["min_tokens"] == 7 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0 and body["return_token_ids"] is True
    opts = RunOptions(model="m", ignore_eos=False, send_min_tokens=False, return_token_ids=False)
    chat = orjson.loads(
        build_body(model="m", prompt="hi", max_tokens=3, options=opts, chat=True, extra={"x": 1})
    )
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert "ignore_eos" not in chat and "min_tokens" not in chat and "return_token_ids" not in chat
    assert chat["x"] == 1
    strided = np.arange(20, dtype=np.int32)[::2]
    assert (
        orjson.loads(build_body(model="m", prompt=strided, max_tokens=1, options=opts))["prompt"]
        == strided.tolist()
    )
