"""What a CLI agent's model calls cost, read off the answers as they pass the key proxy.

The CLI's own accounting is out of reach (it runs in its sandbox, and each CLI reports
differently), but every answer passes :class:`~servegym.agents.cli.proxy.KeyProxy`, and
every provider puts the call's usage in it: in the JSON body, or in the stream's events.
:class:`UsageReader` is fed an answer's bytes as they pass and finds it:

- Anthropic Messages: ``usage`` of the body; streamed, ``message_start``'s usage (the input)
  and the last ``message_delta``'s (the output). Anthropic counts cache reads and writes
  beside ``input_tokens``; here they are added in, as :class:`~servegym.providers.types.Usage`
  wants the whole prompt.
- OpenAI Responses (Codex): ``usage`` of the body, or of ``response.completed``'s response.
- OpenAI Chat Completions: ``usage`` (streamed: in the last chunk, when the client asks).
- Gemini: the last ``usageMetadata``.

:class:`CostMeter` adds the calls up per trial as an
:class:`~servegym.agents.llm.agent.AgentCost` (tokens, and dollars from the price table;
``None`` dollars once a model without a price was used). Side calls count too (a title
costs tokens as well); token counting (``count_tokens``) is free and is not a call.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from servegym.agents.llm.agent import AgentCost
from servegym.providers.cost import cost_of
from servegym.providers.types import Usage
from servegym.providers.vendors import Vendor

MAX_JSON_BYTES = 16 * 1024 * 1024
"""A JSON answer larger than this is not parsed for its usage (none is that large)."""
BILLED_SUFFIXES = ("/messages", "/responses", "/chat/completions", "generatecontent")
"""The paths of the calls a provider bills (``count_tokens`` and model lists are free)."""


def billed(path: str) -> bool:
    """Whether a call to ``path`` is billed (Gemini's ``:generateContent`` and
    ``:streamGenerateContent`` alike)."""
    return path.rstrip("/").lower().endswith(BILLED_SUFFIXES)


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _anthropic(usage: dict[str, Any]) -> tuple[int, int, int, int]:
    """(whole prompt, output, cache read, cache write) of an Anthropic usage object."""
    read = _int(usage.get("cache_read_input_tokens"))
    write = _int(usage.get("cache_creation_input_tokens"))
    return (
        _int(usage.get("input_tokens")) + read + write,
        _int(usage.get("output_tokens")),
        read,
        write,
    )


class UsageReader:
    """One answer's usage, from its bytes (fed as they pass)."""

    def __init__(self, provider: Vendor, content_type: str) -> None:
        self.provider = provider
        self.streamed = "event-stream" in content_type.lower()
        self._buffer = b""
        self._too_big = False
        self.input_tokens = 0
        self.output_tokens = 0
        self.cache_read_tokens = 0
        self.cache_write_tokens = 0
        self.found = False

    def feed(self, chunk: bytes) -> None:
        if self._too_big:
            return
        self._buffer += chunk
        if not self.streamed:
            if len(self._buffer) > MAX_JSON_BYTES:
                self._too_big, self._buffer = True, b""
            return
        self._buffer = self._buffer.replace(b"\r\n", b"\n")
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            self._event(event)

    def _event(self, raw: bytes) -> None:
        data = b"\n".join(
            line[5:].lstrip() for line in raw.split(b"\n") if line.startswith(b"data:")
        )
        if not data or data.strip() == b"[DONE]":
            return
        try:
            obj = json.loads(data)
        except ValueError:
            return
        if isinstance(obj, dict):
            self._read(obj)

    def _read(self, obj: dict[str, Any]) -> None:
        """Take the usage from one JSON object: a whole answer or one event."""
        if self.provider == "anthropic":
            kind = obj.get("type")
            if kind == "message_start" and isinstance(obj.get("message"), dict):
                obj = obj["message"]
            usage = obj.get("usage")
            if not isinstance(usage, dict):
                return
            prompt, output, read, write = _anthropic(usage)
            if kind == "message_delta":  # cumulative output; input only on newer APIs
                self.output_tokens = max(self.output_tokens, output)
                if prompt:
                    self.input_tokens = max(self.input_tokens, prompt)
            else:
                self.input_tokens, self.output_tokens = prompt, output
                self.cache_read_tokens, self.cache_write_tokens = read, write
            self.found = True
        elif self.provider == "openai":
            response = obj.get("response")
            usage = response.get("usage") if isinstance(response, dict) else obj.get("usage")
            if not isinstance(usage, dict):
                return
            if "input_tokens" in usage:  # the Responses API
                self.input_tokens = _int(usage.get("input_tokens"))
                self.output_tokens = _int(usage.get("output_tokens"))
                details = usage.get("input_tokens_details") or {}
            else:  # Chat Completions
                self.input_tokens = _int(usage.get("prompt_tokens"))
                self.output_tokens = _int(usage.get("completion_tokens"))
                details = usage.get("prompt_tokens_details") or {}
            self.cache_read_tokens = _int(details.get("cached_tokens"))
            self.found = True
        else:
            usage = obj.get("usageMetadata")
            if not isinstance(usage, dict):
                return
            self.input_tokens = _int(usage.get("promptTokenCount"))
            self.output_tokens = _int(usage.get("candidatesTokenCount")) + _int(
                usage.get("thoughtsTokenCount")
            )
            self.cache_read_tokens = _int(usage.get("cachedContentTokenCount"))
            self.found = True

    def usage(self) -> Usage | None:
        """The answer's usage once it has all passed; None where it carried none."""
        if not self.streamed and self._buffer and not self._too_big:
            try:
                obj = json.loads(self._buffer)
            except ValueError:
                obj = None
            self._buffer = b""
            if isinstance(obj, dict):
                self._read(obj)
        elif self.streamed and self._buffer.strip():
            self._event(self._buffer)
            self._buffer = b""
        if not self.found:
            return None
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cache_read_tokens=self.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens,
        )


def request_model(provider: Vendor, path: str, body: bytes) -> str:
    """The model a request names: its body's ``model``, or (Gemini) its path's."""
    if provider == "gemini" and "/models/" in path:
        return path.split("/models/", 1)[1].split(":", 1)[0]
    try:
        obj = json.loads(body) if body else None
    except ValueError:
        return ""
    model = obj.get("model") if isinstance(obj, dict) else None
    return model if isinstance(model, str) else ""


class CostMeter:
    """A trial's model calls through the proxy, added up (thread-safe)."""

    def __init__(self, model: str | None = None) -> None:
        self.cost = AgentCost(model=model or "")
        self.models: dict[str, int] = {}
        """Calls per model named in the requests (a CLI may use a small model beside)."""
        self._lock = threading.Lock()

    def add(self, model: str, usage: Usage) -> None:
        with self._lock:
            c = self.cost
            c.calls += 1
            c.input_tokens += usage.input_tokens
            c.output_tokens += usage.output_tokens
            self.models[model] = self.models.get(model, 0) + 1
            dollars = cost_of(usage, model) if model else None
            c.dollars = None if dollars is None or c.dollars is None else c.dollars + dollars

    def summary(self) -> dict[str, Any]:
        """The trial's ``agent_cost``: calls, tokens, dollars, and the calls per model."""
        with self._lock:
            data: dict[str, Any] = self.cost.model_dump()
            data["calls_by_model"] = dict(self.models)
            return data
