"""The incremental SSE parser: event framing, partial reads, comments, line endings."""

from __future__ import annotations

import pytest

from servegym.loadgen.sse import DONE, SSEParser

STREAM = (
    b'data: {"a": 1}\n\n'
    b": keep-alive\n\n"
    b'data: {"b": 2}\n\n'
    b'event: message\nid: 7\ndata: {"c": 3}\n\n'
    b"data: [DONE]\n\n"
)
EXPECTED = [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}', DONE]


def feed_all(parser: SSEParser, pieces: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for p in pieces:
        out.extend(parser.feed(p))
    return out + parser.flush()


def test_whole_stream_in_one_read() -> None:
    assert SSEParser().feed(STREAM) == EXPECTED


@pytest.mark.parametrize("split", range(1, len(STREAM)))
def test_stream_split_at_every_byte(split: int) -> None:
    assert feed_all(SSEParser(), [STREAM[:split], STREAM[split:]]) == EXPECTED


def test_stream_fed_one_byte_at_a_time() -> None:
    pieces = [STREAM[i : i + 1] for i in range(len(STREAM))]
    assert feed_all(SSEParser(), pieces) == EXPECTED


def test_events_arrive_only_when_complete() -> None:
    p = SSEParser()
    assert p.feed(b'data: {"x"') == []
    assert p.pending > 0
    assert p.feed(b": 1}\n") == []
    assert p.feed(b"\n") == [b'{"x": 1}']
    assert p.pending == 0


@pytest.mark.parametrize("split", range(1, 40))
def test_crlf_line_endings(split: int) -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    assert feed_all(SSEParser(), [crlf[:split], crlf[split:]]) == EXPECTED


def test_cr_split_from_its_lf() -> None:
    p = SSEParser()
    assert p.feed(b"data: 1\r\n\r") == []
    assert p.feed(b"\ndata: 2\r\n\r\n") == [b"1", b"2"]


def test_comments_and_data_free_events_yield_nothing() -> None:
    assert SSEParser().feed(b": ping\n\n:\n\nevent: x\n\nid: 3\nretry: 10\n\n") == []


def test_multi_line_data_is_joined_with_newlines() -> None:
    assert SSEParser().feed(b"data: one\ndata:two\ndata\n\n") == [b"one\ntwo\n"]


def test_only_one_leading_space_is_stripped() -> None:
    assert SSEParser().feed(b"data:  x\n\ndata:y\n\n") == [b" x", b"y"]


def test_extra_blank_lines_between_events() -> None:
    assert SSEParser().feed(b"data: a\n\n\n\ndata: b\n\n") == [b"a", b"b"]


def test_flush_returns_an_unterminated_last_event() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\n\ndata: [DONE]\n") == [b"a"]
    assert p.flush() == [DONE]
    assert p.flush() == []
