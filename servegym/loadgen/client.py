"""One streamed request to an OpenAI-compatible server, measured.

:func:`build_body` makes the JSON body of a turn; :func:`stream_request` sends it and
records, for each read from the socket, its arrival time (``perf_counter_ns``, taken before
any parsing) and the choices' text and token ids of the events it completed;
:func:`finish_record` turns that into a :class:`~servegym.loadgen.records.RequestRecord`,
counting output tokens after the stream ended so counting never delays a timestamp.

Nothing here raises on a failed request: a refused connection, an HTTP error, broken JSON,
an error event mid-stream, a timeout, or a stream that ends without ``[DONE]`` all end in
``error``, a short description.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from servegym.loadgen.http1 import ConnectError, HttpError, HttpPool
from servegym.loadgen.records import RecountSource, RequestRecord
from servegym.loadgen.sse import DONE, SSEParser

if TYPE_CHECKING:
    import tokenizers

    from servegym.loadgen.target import RunOptions

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def build_body(
    *,
    model: str,
    prompt: np.ndarray[Any, Any] | str,
    max_tokens: int,
    options: RunOptions,
    chat: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> bytes:
    """The JSON body of one streamed generation request.

    ``prompt`` is a token-id array (sent as a list to ``/v1/completions``) or text (sent as
    the prompt, or as one user message when ``chat``). The output length is forced:
    ``max_tokens``, plus ``ignore_eos`` and ``min_tokens`` when the options ask for them.
    """
    body: dict[str, Any] = {"model": model}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body["max_tokens"] = max_tokens
    body["temperature"] = 0.0
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if options.ignore_eos:
        body["ignore_eos"] = True
    if options.send_min_tokens:
        body["min_tokens"] = max_tokens
    if options.return_token_ids:
        body["return_token_ids"] = True
    if extra:
        body.update(extra)
    if isinstance(prompt, np.ndarray) and not prompt.flags.c_contiguous:
        body["prompt"] = np.ascontiguousarray(prompt)
    return orjson.dumps(body, option=_NUMPY)


@dataclass(slots=True)
class StreamResult:
    """What came back for one request, before any counting.

    Times are raw ``perf_counter_ns`` values. ``sent_ns`` is when the request was written
    (when it was attempted, if it never was). ``chunks`` holds one ``(arrival_ns, text,
    token_ids)`` per choice-carrying event (``token_ids`` ``None`` when the server sent
    none); ``end_ns`` is when ``[DONE]`` arrived (or the request failed).
    """

    sent_ns: int
    status: int | None = None
    chunks: list[tuple[int, str, list[int] | None]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    end_ns: int | None = None
    error: str | None = None


def _error_message(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        msg = err.get("message") or err.get("type") or orjson.dumps(err).decode()
    elif err is not None:
        msg = str(err)
    else:
        msg = str(obj.get("message", obj)) if isinstance(obj, dict) else str(obj)
    return _short(str(msg))


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _SSESink:
    """Turns one streamed response into a :class:`StreamResult`, read by read.

    Runs inside the connection's ``data_received``: the read's time ``t`` was taken before
    any of this, and every event the read completes gets it.
    """

    __slots__ = ("abandon", "chat", "err_body", "finished", "parser", "result")

    def __init__(self, chat: bool, result: StreamResult) -> None:
        self.chat = chat
        self.result = result
        self.parser = SSEParser()
        self.finished = False
        self.abandon = False
        self.err_body = b""

    def sent(self, t: int) -> None:
        self.result.sent_ns = t

    def head(self, status: int, headers: dict[str, str], t: int) -> None:
        self.result.status = status

    def _fail(self, t: int, error: str) -> bool:
        self.result.end_ns = t
        self.result.error = error
        self.finished = self.abandon = True
        return True

    def data(self, chunk: bytes, t: int) -> bool:
        if self.finished:
            return True
        res = self.result
        if res.status != 200:
            if len(self.err_body) < 4096:
                self.err_body += chunk
            return False
        chunks = res.chunks
        for payload in self.parser.feed(chunk):
            if payload == DONE:
                res.end_ns = t
                self.finished = True
                return True
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                snippet = _short(payload.decode("utf-8", "replace"), 80)
                return self._fail(
                    t, f"malformed JSON in stream after {len(chunks)} chunks: {snippet!r}"
                )
            if not isinstance(obj, dict):
                return self._fail(t, f"unexpected event in stream: {_short(str(obj), 80)}")
            choices = obj.get("choices")
            if choices:
                c = choices[0]
                if self.chat:
                    delta = c.get("delta")
                    text = delta.get("content") if delta else None
                else:
                    text = c.get("text")
                chunks.append((t, text or "", c.get("token_ids")))
            elif "error" in obj or obj.get("object") == "error":
                return self._fail(
                    t, f"server error after {len(chunks)} chunks: {_error_message(obj)}"
                )
            usage = obj.get("usage")
            if usage:
                res.usage = usage
        return False

    def end(self, t: int) -> None:
        if self.finished:
            return
        self.finished = True
        res = self.result
        res.end_ns = t
        if res.status != 200:
            raw = self.err_body
            try:
                detail = _error_message(orjson.loads(raw))
            except orjson.JSONDecodeError:
                detail = _short(raw.decode("utf-8", "replace"))
            res.error = f"HTTP {res.status}: {detail}".rstrip(": ")
        elif DONE not in self.parser.flush():
            res.error = f"stream ended without [DONE] after {len(res.chunks)} chunks"


async def stream_request(
    pool: HttpPool, request: bytes, *, chat: bool, timeout_s: float
) -> StreamResult:
    """Send ``request`` (from :meth:`HttpPool.request_bytes`) and read its SSE stream.

    Never raises (but on cancellation): every failure ends in ``error``.
    """
    result = StreamResult(sent_ns=perf_counter_ns())
    sink = _SSESink(chat, result)
    try:
        await pool.send(request, sink, timeout_s)
        if not sink.finished:  # the sink was satisfied or the body ended; one of them is set
            sink.end(perf_counter_ns())
    except TimeoutError:
        n = len(result.chunks)
        sink._fail(perf_counter_ns(), f"timeout after {timeout_s:g} s ({n} chunks received)")
    except ConnectError as e:
        sink._fail(perf_counter_ns(), f"connect failed: {_short(str(e))}")
    except HttpError as e:
        n = len(result.chunks)
        sink._fail(perf_counter_ns(), f"{_short(str(e))} after {n} chunks")
    except asyncio.CancelledError:
        raise
    except Exception as e:
        sink._fail(perf_counter_ns(), f"{type(e).__name__}: {_short(str(e))}")
    return result


class TokenCounter:
    """Counts output tokens with the served model's tokenizer."""

    def __init__(self, tokenizer: tokenizers.Tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def from_path(cls, path: str) -> TokenCounter:
        try:
            from servegym.workloads.text import load_tokenizer
        except ImportError:  # pragma: no cover - the workloads package always has it
            from tokenizers import Tokenizer

            return cls(Tokenizer.from_file(path))
        return cls(load_tokenizer(path))

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def count_many(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        encs = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encs]


def _hash_ids(ids: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()


def _token_chunks(chunks: Sequence[tuple[int, str, list[int] | None]]) -> tuple[bool, list[bool]]:
    """Whether to trust returned ids, and which chunks carry at least one output token.

    Ids are trusted when every chunk with visible text had them (a role-only or empty chunk
    without ids carries no token either way). Without ids, a chunk carries a token when it
    has text, except whitespace-only text before the first token.
    """
    all_ids = any(ids is not None for _, _, ids in chunks) and all(
        ids is not None for _, text, ids in chunks if text and not text.isspace()
    )
    flags: list[bool] = []
    seen = False
    for _, text, ids in chunks:
        if ids is not None:
            has = len(ids) > 0
        elif all_ids or not text:
            has = False
        else:
            has = seen or not text.isspace()
        seen = seen or has
        flags.append(has)
    return all_ids, flags


def done_time(res: StreamResult) -> int | None:
    """When a finished request's last token arrived (its end when none did); ``None`` if
    it failed. The same instant :func:`finish_record` gives as ``done_ns``, sooner."""
    if res.error is not None:
        return None
    _, flags = _token_chunks(res.chunks)
    for (t, _, _), has in zip(reversed(res.chunks), reversed(flags), strict=True):
        if has:
            return t
    return res.end_ns if res.end_ns is not None else res.sent_ns


def finish_record(
    res: StreamResult,
    *,
    request_id: str,
    session_id: int,
    turn_index: int,
    warmup: bool,
    prompt_tokens: int,
    expected_output_tokens: int,
    scheduled_ns: int,
    origin_ns: int,
    counter: TokenCounter | None = None,
    keep_outputs: bool = False,
) -> RequestRecord:
    """Count output tokens per chunk and build the record (times relative to ``origin_ns``).

    A chunk's tokens are ``len(token_ids)`` when the server returned ids, else the
    tokenizer's count of its text when there is a tokenizer, else 1 when it has text. A
    chunk that carries no token (empty text, or whitespace-only text before the first token,
    with no ids) goes to ``empty_chunk_ns`` and never sets the first-token time. The output
    total is the sum over chunks, or with a tokenizer and no ids the recount of the whole
    text (byte-level tokenizers merge across chunk joins). ``done_ns`` is the arrival of the
    last token-carrying chunk (E2E ends at the last token); ``end_ns`` when the stream ended.
    """
    chunks = res.chunks
    all_ids, has_tokens = _token_chunks(chunks)
    texts = [text for _, text, _ in chunks]
    per_text: list[int] | None = None
    if not all_ids and counter is not None:
        per_text = counter.count_many(texts)
    chunk_ns: list[int] = []
    chunk_tokens: list[int] = []
    empty_ns: list[int] = []
    out_ids: list[int] = []
    for i, (t, _, ids) in enumerate(chunks):
        if ids is not None:
            out_ids.extend(ids)
        if not has_tokens[i]:
            n = 0
        elif ids is not None:
            n = len(ids)
        elif per_text is not None:
            n = max(per_text[i], 1)
        else:
            n = 1
        if n > 0:
            chunk_ns.append(t - origin_ns)
            chunk_tokens.append(n)
        else:
            empty_ns.append(t - origin_ns)
    text_out = "".join(texts)
    source: RecountSource
    if all_ids:
        source = "token_ids"
        output_tokens = len(out_ids)
        output_hash: str | None = _hash_ids(out_ids)
    else:
        source = "tokenizer" if counter is not None else "chunks"
        if counter is not None and text_out:
            output_tokens = counter.count(text_out)
        else:
            output_tokens = sum(chunk_tokens)
        output_hash = hashlib.sha256(text_out.encode()).hexdigest() if chunks else None
    if not chunks:
        source = "none"
    usage = res.usage or {}
    ok = res.error is None
    done_ns: int | None = None
    if ok:
        done_ns = chunk_ns[-1] if chunk_ns else (res.end_ns or res.sent_ns) - origin_ns
    return RequestRecord.model_construct(
        request_id=request_id,
        session_id=session_id,
        turn_index=turn_index,
        warmup=warmup,
        prompt_tokens=prompt_tokens,
        expected_output_tokens=expected_output_tokens,
        scheduled_ns=scheduled_ns - origin_ns,
        sent_ns=res.sent_ns - origin_ns,
        first_token_ns=chunk_ns[0] if chunk_ns else None,
        done_ns=done_ns,
        end_ns=None if res.end_ns is None else res.end_ns - origin_ns,
        chunk_ns=chunk_ns,
        chunk_tokens=chunk_tokens,
        empty_chunk_ns=empty_ns,
        usage_prompt_tokens=usage.get("prompt_tokens"),
        usage_completion_tokens=usage.get("completion_tokens"),
        output_tokens=output_tokens,
        recount_source=source,
        output_hash=output_hash,
        output_text=text_out if keep_outputs else None,
        output_token_ids=out_ids if keep_outputs and all_ids else None,
        http_status=res.status,
        error=res.error,
    )
