"""An incremental Server-Sent Events parser over raw bytes.

Feed it bytes as they arrive; it returns the ``data`` payload of every event completed by
them. Events end at a blank line (``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``); an event's
``data:`` lines are joined with ``\\n``; comments (``: keep-alive``) and other fields
(``event:``, ``id:``, ``retry:``) are ignored, and an event with no data yields nothing.
A partial event is kept until the bytes that complete it arrive.

The parser does no timing and no JSON: the caller takes the arrival time of a read before
feeding it, and every event completed by that read shares that time.
"""

from __future__ import annotations

DONE = b"[DONE]"


def _event_data(event: bytes) -> bytes | None:
    # Fast path: one "data:" line, the shape every OpenAI-compatible server sends.
    if event.startswith(b"data:") and b"\n" not in event:
        data = event[5:]
        return data[1:] if data[:1] == b" " else data
    lines: list[bytes] = []
    for line in event.split(b"\n"):
        if line.startswith(b"data"):
            if line == b"data":
                lines.append(b"")
            elif line[4:5] == b":":
                value = line[5:]
                lines.append(value[1:] if value[:1] == b" " else value)
    if not lines:
        return None
    return b"\n".join(lines)


class SSEParser:
    """Splits a byte stream into SSE data payloads; see the module docstring."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return the data payloads of the events they complete, in order."""
        buf = self._buf + data if self._buf else data
        tail = b""
        if b"\r" in buf:
            if buf.endswith(b"\r"):
                # Might be the first half of "\r\n": decide when the next byte comes.
                buf, tail = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n\n" not in buf:
            self._buf = buf + tail
            return []
        events = buf.split(b"\n\n")
        self._buf = events.pop() + tail
        out: list[bytes] = []
        for event in events:
            if event:
                payload = _event_data(event)
                if payload is not None:
                    out.append(payload)
        return out

    def flush(self) -> list[bytes]:
        """End of stream: return the data of a last event that lacked its blank line."""
        buf, self._buf = self._buf, b""
        buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n").strip(b"\n")
        if not buf:
            return []
        payload = _event_data(buf)
        return [] if payload is None else [payload]

    @property
    def pending(self) -> int:
        """Bytes held back as an incomplete event."""
        return len(self._buf)
