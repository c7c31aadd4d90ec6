"""Fake LLM provider servers, scripted: Anthropic Messages, OpenAI Chat Completions and
Responses, and the Gemini API.

Each server listens on 127.0.0.1 (a free port unless given one), answers the real SDKs (and
the coding CLIs) pointed at its ``base_url`` with JSON, or server-sent events where the
request asks to stream, and replays a script: the n-th answered request gets the n-th
:class:`ScriptStep` (text and/or tool calls, with usage). They need no key and no network,
so agent loops can be tested end to end, and a researcher can replay a run's tool calls
through the real clients.

- :class:`FakeAnthropic`: ``POST /v1/messages`` (content blocks ``text`` / ``tool_use``,
  ``usage``, ``stop_reason``); ``base_url`` is ``http://127.0.0.1:PORT``.
- :class:`FakeOpenAI`: ``POST /v1/chat/completions`` (``choices[0].message.tool_calls``,
  ``finish_reason``, ``usage``) and ``GET /v1/models``; ``base_url`` ends in ``/v1``.
- :class:`FakeOpenAIResponses`: ``POST /v1/responses`` (Codex CLI's API); it polls a
  command Codex left running (``write_stdin``) before the script's next step, as a model does.
- :class:`FakeGemini`: ``POST /v1beta/models/MODEL:generateContent`` and
  ``:streamGenerateContent?alt=sse`` (``functionCall`` parts, ``usageMetadata``; Gemini
  CLI's API); ``base_url`` is ``http://127.0.0.1:PORT``.

Fault injection (:class:`Fault`), consumed in order: ``Fault.rate_limited(2)`` answers the
next two requests with 429 and ``retry-after``, ``Fault.server_error()`` answers every later
request with 500, ``Fault.slow(5.0, count=1)`` delays one request's answer (to provoke a
client timeout), ``Fault.hung()`` never answers, ``Fault.garbage('"a string"')`` answers 200
with a body that is no API response (not JSON, the wrong shape, missing fields).
``api_key=`` makes the server answer other keys with 401, as the real API does.

Like the real APIs, each server checks the request's shape and answers a malformed one with
400 naming the problem: in particular every tool call of an assistant turn must be answered
by a tool result in the next turn (so a client that drops tool results fails here as it would
there), and a request after the script's last step is a 400 saying the script is exhausted.

Every request is recorded (:attr:`FakeServer.requests`: path, headers, parsed body, the key
it carried, the status answered), so tests can check what a client sent.

Use it as an async context manager::

    async with FakeAnthropic([tool_call("run_experiment", {"config": {}}), final_text("done")])
        as fake:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=fake.base_url)

or from the command line: ``python -m servegym.providers.fakes --api openai --script
steps.json --port 8001`` (the script: a JSON list of steps as :class:`ScriptStep` fields).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from servegym.aio_serve import serve_app
from servegym.errors import UserError

__all__ = [
    "SIDE_TEXT",
    "FakeAnthropic",
    "FakeGemini",
    "FakeOpenAI",
    "FakeOpenAIResponses",
    "FakeServer",
    "Fault",
    "RecordedRequest",
    "ScriptStep",
    "ScriptedToolCall",
    "final_text",
    "load_script",
    "main",
    "tool_call",
]


class ScriptedToolCall(BaseModel):
    """A tool call the fake model makes. ``arguments`` as a string is sent verbatim (OpenAI
    sends arguments as a string anyway; use it to send malformed JSON)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    id: str | None = None


class ScriptStep(BaseModel):
    """One answer of the fake model: text, tool calls, or both.

    Token counts default to a rough estimate (a token per 4 bytes of request and of answer);
    ``stop_reason`` defaults to ``tool_use`` / ``tool_calls`` with tool calls, else
    ``end_turn`` / ``stop`` (give the API's own word to override, e.g. ``max_tokens``).
    """

    model_config = ConfigDict(extra="forbid")

    text: str = ""
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int = 0
    stop_reason: str | None = None


def tool_call(
    name: str,
    arguments: dict[str, Any] | str | None = None,
    *,
    id: str | None = None,
    text: str = "",
    input_tokens: int | None = None,
    output_tokens: int | None = None,
) -> ScriptStep:
    """A step that calls one tool (with optional text before the call)."""
    return ScriptStep(
        text=text,
        tool_calls=[ScriptedToolCall(name=name, arguments=arguments or {}, id=id)],
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )


def final_text(
    text: str, *, input_tokens: int | None = None, output_tokens: int | None = None
) -> ScriptStep:
    """A step that answers with text and no tool call (the model is done)."""
    return ScriptStep(text=text, input_tokens=input_tokens, output_tokens=output_tokens)


_SCRIPT = TypeAdapter(list[ScriptStep])


def load_script(path: Path | str) -> list[ScriptStep]:
    """Read a script: a JSON list of steps (objects with :class:`ScriptStep`'s fields)."""
    p = Path(path)
    try:
        return _SCRIPT.validate_json(p.read_bytes())
    except OSError as exc:
        raise UserError(f"{p}: cannot read the script ({exc.strerror})") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise UserError(f"{p}: {where}: {first['msg']}") from exc


class Fault(BaseModel):
    """A misbehaviour for the next ``count`` requests (``None``: every request from then on).

    ``status`` answers with that HTTP error (and ``retry-after`` when ``retry_after_s`` is
    set); ``delay_s`` waits before answering (before the error, or before the normal answer
    when ``status`` is ``None``).
    """

    model_config = ConfigDict(extra="forbid")

    status: int | None = None
    count: int | None = Field(default=1, ge=1)
    retry_after_s: float | None = None
    delay_s: float = Field(default=0.0, ge=0.0)
    message: str = ""
    body: str | None = None
    """Answer 200 with this body verbatim (``content_type``) instead of the script's step:
    a garbage reply (not JSON, a JSON string, the wrong shape, missing fields)."""
    content_type: str = "application/json"

    @classmethod
    def rate_limited(cls, count: int | None = 1, retry_after_s: float = 1.0) -> Fault:
        return cls(status=429, count=count, retry_after_s=retry_after_s)

    @classmethod
    def server_error(cls, count: int | None = None, status: int = 500) -> Fault:
        return cls(status=status, count=count)

    @classmethod
    def slow(cls, delay_s: float, count: int | None = 1) -> Fault:
        return cls(delay_s=delay_s, count=count)

    @classmethod
    def hung(cls) -> Fault:
        """Never answer (until the server closes): every request from then on."""
        return cls(delay_s=10**6, count=None)

    @classmethod
    def garbage(
        cls, body: str, count: int | None = None, content_type: str = "application/json"
    ) -> Fault:
        """Answer 200 with ``body`` verbatim (every request from then on by default)."""
        return cls(body=body, count=count, content_type=content_type)


@dataclass
class RecordedRequest:
    """A request the fake received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    api_key: str | None
    received_at: float
    status: int = 0
    text: str = field(default="", repr=False)


class FakeServer:
    """What both fakes share: the HTTP server, the script, faults and recording."""

    api: ClassVar[str] = ""
    endpoint: ClassVar[str] = ""
    base_path: ClassVar[str] = ""

    def __init__(
        self,
        script: Sequence[ScriptStep],
        *,
        faults: Sequence[Fault] = (),
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        side_requests: bool = False,
    ) -> None:
        self.script = list(script)
        self.side_requests = side_requests
        """Answer a request that offers no tools (a CLI's title, topic or quota check) with a
        short text, leaving the script alone: a coding CLI makes such calls beside its
        agent loop, and they must not eat the scripted steps."""
        self.side_answers = 0
        self.follow_ups = 0
        """Steps answered by :meth:`follow_up` instead of the script."""
        self.faults = list(faults)
        self.expected_api_key = api_key
        self.host = host
        self.port = port
        self.requests: list[RecordedRequest] = []
        self.steps_served = 0
        self._fault_index = 0
        self._fault_used = 0
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (once started)."""
        if self._runner is None:
            raise RuntimeError("the fake server is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What to pass as the SDK client's ``base_url``."""
        return self.url + self.base_path

    async def start(self) -> Self:
        self._closing.clear()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner, self.port = await serve_app(app, self.host, self.port)
        return self

    async def close(self) -> None:
        self._closing.set()  # ends injected delays at once
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ inspection

    def bodies(self) -> list[Any]:
        """The parsed bodies of the requests to the API endpoint, in order."""
        return [r.body for r in self.requests if self.is_endpoint(r.path)]

    @property
    def exhausted(self) -> bool:
        return self.steps_served >= len(self.script)

    # ------------------------------------------------------------------ handling

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        text = (await request.read()).decode("utf-8", errors="replace")
        try:
            body: Any = json.loads(text) if text else None
        except json.JSONDecodeError:
            body = None
        record = RecordedRequest(
            method=request.method,
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            api_key=self._key_of(request),
            received_at=time.time(),
            text=text,
        )
        self.requests.append(record)
        response = await self._answer(request, record, text)
        record.status = response.status
        return response

    async def _answer(
        self, request: web.Request, record: RecordedRequest, text: str
    ) -> web.StreamResponse:
        extra = self._other_route(request)
        if extra is not None:
            return extra
        if not self.is_endpoint(request.path) or request.method != "POST":
            return self._error(404, f"no route {request.method} {request.path}")
        if self.expected_api_key is not None and record.api_key != self.expected_api_key:
            return self._error(401, "invalid API key")
        fault = self._next_fault()
        if fault is not None:
            if fault.delay_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), fault.delay_s)
            if fault.status is not None:
                headers = {}
                if fault.retry_after_s is not None:
                    headers["retry-after"] = f"{fault.retry_after_s:g}"
                message = fault.message or f"injected fault: HTTP {fault.status}"
                return self._error(fault.status, message, headers)
            if fault.body is not None:
                return web.Response(
                    status=200, text=fault.body, headers={"content-type": fault.content_type}
                )
        if not isinstance(record.body, dict):
            return self._error(400, "the request body must be a JSON object")
        problem = self.validate(record.body)
        if problem is not None:
            return self._error(400, problem)
        if self.is_side_request(record.body):
            self.side_answers += 1
            side = self.side_step(record.body)
            return await self._reply(request, side, 900 + self.side_answers, record.body, len(text))
        follow_up = self.follow_up(record.body)
        if follow_up is not None:
            self.follow_ups += 1
            index = 800 + self.follow_ups
            return await self._reply(request, follow_up, index, record.body, len(text))
        if self.exhausted:
            return self._error(
                400,
                f"fake {self.api} server: the script is exhausted after {len(self.script)} step(s)",
            )
        index = self.steps_served
        step = self.script[index]
        offered = self.tool_names(record.body)
        unknown = [c.name for c in step.tool_calls if c.name not in offered]
        if record.body.get("tools") and unknown:
            return self._error(
                400,
                f"fake {self.api} server: script step {index} calls tool '{unknown[0]}', which "
                f"the request does not offer (it offers: {', '.join(sorted(offered))})",
            )
        self.steps_served += 1
        return await self._reply(request, step, index, record.body, len(text))

    async def _reply(
        self,
        request: web.Request,
        step: ScriptStep,
        index: int,
        body: dict[str, Any],
        request_bytes: int,
    ) -> web.StreamResponse:
        """The step as JSON, or as server-sent events when the request asked to stream."""
        if self.streams(request, body):
            response = web.StreamResponse(
                status=200,
                headers={"content-type": "text/event-stream", "cache-control": "no-cache"},
            )
            await response.prepare(request)
            for event, data in self.events(step, index, body, request_bytes):
                line = f"event: {event}\n" if event else ""
                await response.write(f"{line}data: {json.dumps(data)}\n\n".encode())
            await response.write_eof()
            return response
        return web.json_response(self.render(step, index, body, request_bytes))

    def is_endpoint(self, path: str) -> bool:
        """Whether ``path`` is the API's scripted endpoint."""
        return path == self.endpoint

    def streams(self, request: web.Request, body: dict[str, Any]) -> bool:
        """Whether the request asked for server-sent events."""
        return body.get("stream") is True

    def tool_names(self, body: dict[str, Any]) -> set[str]:
        """The names of the tools a request offers."""
        return {str(t.get("name")) for t in body.get("tools") or [] if isinstance(t, dict)}

    def is_side_request(self, body: dict[str, Any]) -> bool:
        """A request beside the agent loop (see :attr:`side_requests`): it offers no tools."""
        return self.side_requests and not body.get("tools")

    def side_step(self, body: dict[str, Any]) -> ScriptStep:
        """The answer to a side request: a short text."""
        return ScriptStep(text=SIDE_TEXT)

    def follow_up(self, body: dict[str, Any]) -> ScriptStep | None:
        """A step the model takes because of what the last tool call returned, whatever the
        script says next (e.g. polling a command the CLI left running), leaving the script
        alone; ``None`` to go on with the script."""
        return None

    def _next_fault(self) -> Fault | None:
        while self._fault_index < len(self.faults):
            fault = self.faults[self._fault_index]
            if fault.count is None or self._fault_used < fault.count:
                self._fault_used += 1
                return fault
            self._fault_index += 1
            self._fault_used = 0
        return None

    def _other_route(self, request: web.Request) -> web.StreamResponse | None:
        return None

    # ------------------------------------------------------------------ per API

    def _key_of(self, request: web.Request) -> str | None:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return None

    def _error(
        self, status: int, message: str, headers: dict[str, str] | None = None
    ) -> web.Response:
        raise NotImplementedError

    def validate(self, body: dict[str, Any]) -> str | None:
        """What is wrong with a request body, as the real API would say; ``None`` if nothing."""
        raise NotImplementedError

    def render(
        self, step: ScriptStep, index: int, body: dict[str, Any], request_bytes: int
    ) -> dict[str, Any]:
        raise NotImplementedError

    def events(
        self, step: ScriptStep, index: int, body: dict[str, Any], request_bytes: int
    ) -> list[tuple[str | None, dict[str, Any]]]:
        """The step as the API's server-sent events: ``(event name or None, data)``."""
        raise web.HTTPBadRequest(
            text=json.dumps({"error": {"message": f"fake {self.api}: streaming not supported"}}),
            content_type="application/json",
        )


SIDE_TEXT = "ServeGym scripted session"
"""What a side request (see :attr:`FakeServer.side_requests`) is answered."""


def _arguments_text(call: ScriptedToolCall) -> str:
    return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)


def _estimate_tokens(step: ScriptStep, request_bytes: int) -> tuple[int, int]:
    answer = step.text + "".join(
        c.name + (c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments))
        for c in step.tool_calls
    )
    input_tokens = step.input_tokens if step.input_tokens is not None else request_bytes // 4 + 1
    output_tokens = step.output_tokens if step.output_tokens is not None else len(answer) // 4 + 1
    return input_tokens, output_tokens


# --------------------------------------------------------------------------- Anthropic

_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class FakeAnthropic(FakeServer):
    """A scripted Anthropic Messages API (``POST /v1/messages``, non-streaming)."""

    api = "anthropic"
    endpoint = "/v1/messages"
    base_path = ""

    def _key_of(self, request: web.Request) -> str | None:
        return request.headers.get("x-api-key") or super()._key_of(request)

    def _other_route(self, request: web.Request) -> web.StreamResponse | None:
        if request.method == "POST" and request.path == "/v1/messages/count_tokens":
            length = request.content_length or 0
            return web.json_response({"input_tokens": length // 4 + 1})
        return None

    def _error(
        self, status: int, message: str, headers: dict[str, str] | None = None
    ) -> web.Response:
        kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": message}}
        return web.json_response(body, status=status, headers=headers)

    def validate(self, body: dict[str, Any]) -> str | None:
        if not isinstance(body.get("model"), str) or not body["model"]:
            return "model: field required"
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            return "max_tokens: field required (a non-negative integer)"
        for i, tool in enumerate(body.get("tools") or []):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                return f"tools.{i}.name: field required"
            if not isinstance(tool.get("input_schema"), dict):
                return f"tools.{i}.input_schema: field required"
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages: at least one message is required"
        pending: list[str] = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                return f"messages.{i}.role: must be 'user' or 'assistant'"
            content = message.get("content")
            if isinstance(content, str):
                content = [{"type": "text", "text": content}]
            if not isinstance(content, list):
                return f"messages.{i}.content: must be a string or a list of blocks"
            blocks: list[Any] = content
            if i == 0 and message["role"] != "user":
                return "messages.0.role: the first message must use the 'user' role"
            kinds = [b.get("type") if isinstance(b, dict) else None for b in blocks]
            for j, (block, kind) in enumerate(zip(blocks, kinds, strict=True)):
                if kind == "text" and not block.get("text"):
                    return f"messages.{i}.content.{j}.text: text content blocks must be non-empty"
            if message["role"] == "user":
                results = [
                    b.get("tool_use_id")
                    for b, k in zip(blocks, kinds, strict=True)
                    if k == "tool_result"
                ]
                if pending:
                    missing = [t for t in pending if t not in results]
                    if missing:
                        return (
                            f"messages.{i}: tool_use ids were found without tool_result blocks "
                            f"immediately after: {', '.join(missing)}. Each tool_use block must "
                            "have a corresponding tool_result block in the next message."
                        )
                stray = [r for r in results if r not in pending]
                if stray:
                    return (
                        f"messages.{i}.content: unexpected tool_use_id found in tool_result "
                        f"blocks: {stray[0]}. Each tool_result block must have a corresponding "
                        "tool_use block in the previous message."
                    )
                first_other = next(
                    (j for j, k in enumerate(kinds) if k != "tool_result"), len(kinds)
                )
                if "tool_result" in kinds[first_other:]:
                    return f"messages.{i}.content: tool_result blocks must come first"
                pending = []
            else:
                if pending:
                    return (
                        f"messages.{i}: tool_use ids were found without tool_result blocks "
                        f"immediately after: {', '.join(pending)}"
                    )
                pending = [
                    str(b.get("id")) for b, k in zip(blocks, kinds, strict=True) if k == "tool_use"
                ]
        return None

    def render(
        self, step: ScriptStep, index: int, body: dict[str, Any], request_bytes: int
    ) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if step.text:
            content.append({"type": "text", "text": step.text})
        for j, call in enumerate(step.tool_calls):
            arguments: Any = call.arguments
            if isinstance(arguments, str):
                with contextlib.suppress(json.JSONDecodeError):
                    arguments = json.loads(arguments)
            content.append(
                {
                    "type": "tool_use",
                    "id": call.id or f"toolu_fake_{index:03d}_{j}",
                    "name": call.name,
                    "input": arguments,
                }
            )
        input_tokens, output_tokens = _estimate_tokens(step, request_bytes)
        stop = step.stop_reason or ("tool_use" if step.tool_calls else "end_turn")
        return {
            "id": f"msg_fake_{index:03d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", ""),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": max(0, input_tokens - step.cache_read_tokens),
                "output_tokens": output_tokens,
                "cache_read_input_tokens": step.cache_read_tokens,
                "cache_creation_input_tokens": 0,
            },
        }

    def events(
        self, step: ScriptStep, index: int, body: dict[str, Any], request_bytes: int
    ) -> list[tuple[str | None, dict[str, Any]]]:
        """Messages streaming: ``message_start``, each block's start, deltas and stop,
        ``message_delta`` (stop reason, output tokens), ``message_stop``."""
        message = self.render(step, index, body, request_bytes)
        usage = message["usage"]
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {**usage, "output_tokens": 1},
        }
        out: list[tuple[str | None, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": start}),
            ("ping", {"type": "ping"}),
        ]
        for i, block in enumerate(message["content"]):
            first: dict[str, Any]
            if block["type"] == "text":
                first = {"type": "text", "text": ""}
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                first = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            out.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": i, "content_block": first},
                )
            )
            out.append(
                ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
            )
            out.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        out.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
        )
        out.append(("message_stop", {"type": "message_stop"}))
        return out


# --------------------------------------------------------------------------- OpenAI

_OPENAI_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


class FakeOpenAI(FakeServer):
    """A scripted OpenAI Chat Completions API (``POST /v1/chat/completions``, non-streaming)."""

    api = "openai"
    endpoint = "/v1/chat/completions"
    base_path = "/v1"

    def tool_names(self, body: dict[str, Any]) -> set[str]:
        return {
            str((t.get("function") or {}).get("name"))
            for t in body.get("tools") or []
            if isinstance(t, dict)
        }

    def _other_route(self, request: web.Request) -> web.StreamResponse | None:
        if request.method == "GET" and request.path == "/v1/models":
            return web.json_response(
                {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "fake"}]}
            )
        return None

    def _error(
        self, status: int, message: str, headers: dict[str, str] | None = None
    ) -> web.Response:
        kind, code = _OPENAI_ERROR_TYPES.get(status, ("server_error", None))
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        return web.json_response(body, status=status, headers=headers)

    def validate(self, body: dict[str, Any]) -> str | None:
        if not isinstance(body.get("model"), str) or not body["model"]:
            return "you must provide a model parameter"
        for i, tool in enumerate(body.get("tools") or []):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                return f"Invalid value for 'tools[{i}].type': expected 'function'"
            function = tool.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                return f"Missing required parameter: 'tools[{i}].function.name'"
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "Invalid 'messages': empty array. Expected an array with minimum length 1"
        pending: list[str] = []
        for i, message in enumerate(messages):
            role = message.get("role") if isinstance(message, dict) else None
            if role not in ("system", "developer", "user", "assistant", "tool"):
                return f"Invalid value for 'messages[{i}].role'"
            if role == "tool":
                call_id = message.get("tool_call_id")
                if call_id not in pending:
                    return (
                        f"Invalid parameter: messages with role 'tool' must be a response to a "
                        f"preceeding message with 'tool_calls' (messages[{i}], "
                        f"tool_call_id {call_id!r})"
                    )
                pending.remove(call_id)
                if not isinstance(message.get("content"), str):
                    return f"Invalid type for 'messages[{i}].content': expected a string"
                continue
            if pending:
                return (
                    "An assistant message with 'tool_calls' must be followed by tool messages "
                    f"responding to each 'tool_call_id'. The following tool_call_ids did not "
                    f"have response messages: {', '.join(pending)}"
                )
            if role == "assistant":
                for j, call in enumerate(message.get("tool_calls") or []):
                    function = call.get("function") if isinstance(call, dict) else None
                    if not isinstance(function, dict) or not isinstance(
                        function.get("arguments"), str
                    ):
                        return (
                            f"Invalid type for 'messages[{i}].tool_calls[{j}].function."
                            "arguments': expected a string"
                        )
                    pending.append(str(call.get("id")))
        if pending:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id': {', '.join(pending)}"
            )
        return None

    def render(
        self, step: ScriptStep, index: int, body: dict[str, Any], request_bytes: int
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": step.text or None}
        if step.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id or f"call_fake_{index:03d}_{j}",
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.arguments
                        if isinstance(call.arguments, str)
                        else json.dumps(call.arguments),
                    },
                }
                for j, call in enumerate(step.tool_calls)
            ]
        input_tokens, output_tokens = _estimate_tokens(step, request_bytes)
        finish = step.stop_reason or ("tool_calls" if step.tool_calls else "stop")
        return {
            "id": f"chatcmpl-fake-{index:03d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
            "usage": {
                "prompt_tokens": input_tokens,
                "completion_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens,
                "prompt_tokens_details": {"cached_tokens": step.cache_read_tokens},
            },
        }


# --------------------------------------------------------------------------- OpenAI Responses

_RUNNING_SESSION = re.compile(r"Process running with session ID (\d+)")


def _output_text(output: Any) -> str:
    """A ``function_call_output``'s text: a string, or content items with ``text``."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    return ""


class FakeOpenAIResponses(FakeOpenAI):
    """A scripted OpenAI Responses API (``POST /v1/responses``, JSON or streamed), as Codex
    CLI speaks it: the history comes back in ``input`` each time (``function_call`` items
    answered by ``function_call_output`` items with the same ``call_id``)."""

    api = "openai-responses"
    endpoint = "/v1/responses"

    def follow_up(self, body: dict[str, Any]) -> ScriptStep | None:
        """Codex's ``exec_command`` hands a command still running after its wait (at most
        30 s) to a session and answers ``Process running with session ID N``; the model then
        polls it with ``write_stdin`` (no input) until it answers ``Process exited with code
        ...``. So does this fake, wherever ``write_stdin`` is offered: a script's next step
        then reads the finished command, as it would under a real model."""
        items = body.get("input")
        if not isinstance(items, list) or not items or "write_stdin" not in self.tool_names(body):
            return None
        last = items[-1]
        if not isinstance(last, dict) or last.get("type") != "function_call_output":
            return None
        running = _RUNNING_SESSION.search(_output_text(last.get("output")))
        if running is None:
            return None
        session_id = int(running.group(1))
        return tool_call(
            "write_stdin", {"session_id": session_id, "chars": "", "yield_time_ms": 30_000}
        )

    def validate(self, body: dict[str, Any]) -> str | None:
        if not isinstance(body.get("model"), str) or not body["model"]:
            return "Missing required parameter: 'model'."
        for i, tool in enumerate(body.get("tools") or []):
            if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
                return f"Missing required parameter: 'tools[{i}].type'."
            if tool["type"] == "function" and not isinstance(tool.get("name"), str):
                return f"Missing required parameter: 'tools[{i}].name'."
        items = body.get("input")
        if isinstance(items, str):
            return None
        if not isinstance(items, list) or not items:
            return "Invalid 'input': expected a string or a non-empty array of items."
        calls: list[str] = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                return f"Invalid type for 'input[{i}]': expected an object."
            kind = item.get("type", "message")
            if kind in ("function_call", "custom_tool_call", "local_shell_call"):
                calls.append(str(item.get("call_id")))
            elif kind in ("function_call_output", "custom_tool_call_output"):
                if item.get("call_id") not in calls:
                    return (
                        f"No tool call found for {kind} with call_id "
                        f"{item.get('call_id')!r} (input[{i}])."
                    )
                calls.remove(item["call_id"])
        if calls:
            return f"No tool output found for function call {calls[0]}."
        return None

    def tool_names(self, body: dict[str, Any]) -> set[str]:
        """Function and custom tools by name, built-in ones (``local_shell``) by type."""
        return {
            str(t.get("name") or t.get("type"))
            for t in body.get("tools") or []
            if isinstance(t, dict)
        }

    def _items(self, step: ScriptStep, index: int) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if step.text:
            items.append(
                {
                    "type": "message",
                    "id": f"msg_fake_{index:03d}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": step.text, "annotations": []}],
                }
            )
        for j, call in enumerate(step.tool_calls):
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_fake_{index:03d}_{j}",
                    "call_id": call.id or f"call_fake_{index:03d}_{j}",
                    "name": call.name,
                    "arguments": _arguments_text(call),
                    "status": "completed",
                }
            )
        return items

    def render(
        self, step: ScriptStep, index: int, body: dict[str, Any], request_bytes: int
    ) -> dict[str, Any]:
        input_tokens, output_tokens = _estimate_tokens(step, request_bytes)
        return {
            "id": f"resp_fake_{index:03d}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model", ""),
            "output": self._items(step, index),
            "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": step.cache_read_tokens},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output_tokens,
            },
        }

    def events(
        self, step: ScriptStep, index: int, body: dict[str, Any], request_bytes: int
    ) -> list[tuple[str | None, dict[str, Any]]]:
        """``response.created``, each output item added, its deltas and done, then
        ``response.completed`` with the usage; every event carries its sequence number."""
        final = self.render(step, index, body, request_bytes)
        pending = {**final, "status": "in_progress", "output": [], "usage": None}
        raw: list[dict[str, Any]] = [
            {"type": "response.created", "response": pending},
            {"type": "response.in_progress", "response": pending},
        ]
        for n, item in enumerate(final["output"]):
            where = {"output_index": n, "item_id": item["id"]}
            if item["type"] == "message":
                text = item["content"][0]["text"]
                empty = {"type": "output_text", "text": "", "annotations": []}
                raw += [
                    {"type": "response.output_item.added", "output_index": n,
                     "item": {**item, "status": "in_progress", "content": []}},
                    {"type": "response.content_part.added", **where, "content_index": 0,
                     "part": empty},
                    {"type": "response.output_text.delta", **where, "content_index": 0,
                     "delta": text, "logprobs": []},
                    {"type": "response.output_text.done", **where, "content_index": 0,
                     "text": text, "logprobs": []},
                    {"type": "response.content_part.done", **where, "content_index": 0,
                     "part": item["content"][0]},
                ]  # fmt: skip
            else:
                raw += [
                    {"type": "response.output_item.added", "output_index": n,
                     "item": {**item, "status": "in_progress", "arguments": ""}},
                    {"type": "response.function_call_arguments.delta", **where,
                     "delta": item["arguments"]},
                    {"type": "response.function_call_arguments.done", **where,
                     "arguments": item["arguments"]},
                ]  # fmt: skip
            raw.append({"type": "response.output_item.done", "output_index": n, "item": item})
        raw.append({"type": "response.completed", "response": final})
        return [(e["type"], {**e, "sequence_number": k}) for k, e in enumerate(raw)]


# --------------------------------------------------------------------------- Gemini

_GEMINI_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_GEMINI_FINISH = {"end_turn": "STOP", "stop": "STOP", "max_tokens": "MAX_TOKENS"}


def _schema_instance(schema: Any) -> Any:
    """The least value a JSON schema (OpenAPI's upper-case types too) accepts: an enum's
    first value, each required property of an object, an empty array, 1, false, a text."""
    if not isinstance(schema, dict):
        return SIDE_TEXT
    if schema.get("enum"):
        return schema["enum"][0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        properties = schema.get("properties") or {}
        required = schema.get("required") or list(properties)
        return {name: _schema_instance(properties.get(name)) for name in required}
    return {"array": [], "integer": 1, "number": 1, "boolean": False}.get(kind, SIDE_TEXT)


class FakeGemini(FakeServer):
    """A scripted Gemini API (``POST /v1beta/models/MODEL:generateContent``, and
    ``:streamGenerateContent?alt=sse`` streamed), as Gemini CLI speaks it: the history comes
    back in ``contents`` each time (a ``model`` turn's ``functionCall`` parts answered by as
    many ``functionResponse`` parts in the next ``user`` turn). ``:countTokens`` is answered
    with an estimate and ``GET /v1beta/models`` with one model, neither spending a step."""

    api = "gemini"
    endpoint = "/v1beta/models/MODEL:generateContent"
    base_path = ""
    _METHODS = (":generateContent", ":streamGenerateContent")

    def is_endpoint(self, path: str) -> bool:
        return path.startswith("/v1beta/models/") and path.endswith(self._METHODS)

    def streams(self, request: web.Request, body: dict[str, Any]) -> bool:
        return request.path.endswith(":streamGenerateContent")

    def _key_of(self, request: web.Request) -> str | None:
        return (
            request.headers.get("x-goog-api-key")
            or request.query.get("key")
            or super()._key_of(request)
        )

    def _other_route(self, request: web.Request) -> web.StreamResponse | None:
        path = request.path
        if (
            request.method == "POST"
            and path.startswith("/v1beta/models/")
            and path.endswith(":countTokens")
        ):
            length = request.content_length or 0
            return web.json_response({"totalTokens": length // 4 + 1})
        if request.method == "GET" and path.rstrip("/") == "/v1beta/models":
            return web.json_response({"models": [{"name": "models/fake", "version": "fake"}]})
        return None

    def _error(
        self, status: int, message: str, headers: dict[str, str] | None = None
    ) -> web.Response:
        body = {"error": {"code": status, "message": message, "status": _GEMINI_STATUS.get(status)}}
        return web.json_response(body, status=status, headers=headers)

    def tool_names(self, body: dict[str, Any]) -> set[str]:
        return {
            str(d.get("name"))
            for t in body.get("tools") or []
            if isinstance(t, dict)
            for d in t.get("functionDeclarations") or []
            if isinstance(d, dict)
        }

    def is_side_request(self, body: dict[str, Any]) -> bool:
        """No function offered: Gemini CLI's next-speaker check, loop detection and
        summaries send ``tools`` with none, or none at all."""
        return self.side_requests and not self.tool_names(body)

    def side_step(self, body: dict[str, Any]) -> ScriptStep:
        """A short text, or where the request asks for JSON (Gemini CLI's model router and
        next-speaker check do), the least object its schema allows: a text that does not
        parse makes the CLI retry for minutes before it falls back."""
        config = body.get("generationConfig") or {}
        if config.get("responseMimeType") != "application/json":
            return super().side_step(body)
        schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
        return ScriptStep(text=json.dumps(_schema_instance(schema)))

    def validate(self, body: dict[str, Any]) -> str | None:
        for i, tool in enumerate(body.get("tools") or []):
            if not isinstance(tool, dict):
                return f"Invalid value at 'tools[{i}]': expected an object"
            for j, decl in enumerate(tool.get("functionDeclarations") or []):
                if not isinstance(decl, dict) or not isinstance(decl.get("name"), str):
                    return (
                        f"* GenerateContentRequest.tools[{i}].function_declarations[{j}].name: "
                        "field required"
                    )
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            return "* GenerateContentRequest.contents: contents is not specified"
        pending: list[str] = []
        for i, content in enumerate(contents):
            role = content.get("role") if isinstance(content, dict) else None
            if role not in ("user", "model", "function", None):
                return f"Please use a valid role: user, model (contents[{i}])"
            parts = content.get("parts") if isinstance(content, dict) else None
            if not isinstance(parts, list) or not parts:
                return f"* GenerateContentRequest.contents[{i}].parts: must not be empty."
            calls = [
                str(p["functionCall"].get("name"))
                for p in parts
                if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)
            ]
            answers = [
                str(p["functionResponse"].get("name"))
                for p in parts
                if isinstance(p, dict) and isinstance(p.get("functionResponse"), dict)
            ]
            if pending and sorted(answers) != sorted(pending):
                return (
                    "Please ensure that the number of function response parts is equal to the "
                    f"number of function call parts of the function call turn (contents[{i}] "
                    f"answers {answers or 'nothing'}, the calls were {pending})."
                )
            if answers and not pending:
                return f"contents[{i}]: a function response without a function call before it"
            if calls and role != "model":
                return f"contents[{i}]: function calls come from the model"
            pending = calls
        if pending:
            return (
                "Please ensure that function call turn comes immediately after a user turn or "
                f"after a function response turn (unanswered: {', '.join(pending)})."
            )
        return None

    def _parts(self, step: ScriptStep) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        if step.text:
            parts.append({"text": step.text})
        for call in step.tool_calls:
            arguments: Any = call.arguments
            if isinstance(arguments, str):
                with contextlib.suppress(json.JSONDecodeError):
                    arguments = json.loads(arguments)
            function: dict[str, Any] = {"name": call.name, "args": arguments}
            if call.id is not None:
                function["id"] = call.id
            parts.append({"functionCall": function})
        return parts

    def _usage(
        self, step: ScriptStep, request_bytes: int, output: int | None = None
    ) -> dict[str, Any]:
        input_tokens, output_tokens = _estimate_tokens(step, request_bytes)
        out = output_tokens if output is None else output
        usage: dict[str, Any] = {
            "promptTokenCount": input_tokens,
            "candidatesTokenCount": out,
            "totalTokenCount": input_tokens + out,
        }
        if step.cache_read_tokens:
            usage["cachedContentTokenCount"] = step.cache_read_tokens
        return usage

    def render(
        self, step: ScriptStep, index: int, body: dict[str, Any], request_bytes: int
    ) -> dict[str, Any]:
        finish = _GEMINI_FINISH.get(step.stop_reason or "stop", step.stop_reason or "STOP")
        return {
            "candidates": [
                {
                    "content": {"role": "model", "parts": self._parts(step)},
                    "finishReason": finish,
                    "index": 0,
                }
            ],
            "usageMetadata": self._usage(step, request_bytes),
            "modelVersion": "fake",
            "responseId": f"fake-{index:03d}",
        }

    def events(
        self, step: ScriptStep, index: int, body: dict[str, Any], request_bytes: int
    ) -> list[tuple[str | None, dict[str, Any]]]:
        """``alt=sse``: one chunk per part (no ``event:`` line), each a whole
        ``GenerateContentResponse``; the last carries the finish reason, and every chunk the
        usage so far (the prompt's tokens from the first)."""
        final = self.render(step, index, body, request_bytes)
        parts = final["candidates"][0]["content"]["parts"] or [{"text": ""}]
        out: list[tuple[str | None, dict[str, Any]]] = []
        for n, part in enumerate(parts):
            last = n == len(parts) - 1
            candidate: dict[str, Any] = {
                "content": {"role": "model", "parts": [part]},
                "index": 0,
            }
            if last:
                candidate["finishReason"] = final["candidates"][0]["finishReason"]
            usage = final["usageMetadata"] if last else self._usage(step, request_bytes, 0)
            out.append(
                (
                    None,
                    {
                        "candidates": [candidate],
                        "usageMetadata": usage,
                        "modelVersion": "fake",
                        "responseId": final["responseId"],
                    },
                )
            )
        return out


# --------------------------------------------------------------------------- command line


FAKES: dict[str, type[FakeServer]] = {
    "anthropic": FakeAnthropic,
    "openai": FakeOpenAI,
    "openai-responses": FakeOpenAIResponses,
    "gemini": FakeGemini,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a script until interrupted: ``python -m servegym.providers.fakes``."""
    parser = argparse.ArgumentParser(
        prog="python -m servegym.providers.fakes",
        description="Serve a scripted fake Anthropic, OpenAI or Gemini API on 127.0.0.1.",
    )
    parser.add_argument(
        "--api",
        choices=list(FAKES),
        required=True,
        help="anthropic: Messages (Claude Code, OpenCode); openai: Chat Completions; "
        "openai-responses: the Responses API (Codex CLI, OpenCode); gemini: the Gemini API "
        "(Gemini CLI)",
    )
    parser.add_argument("--script", required=True, help="a JSON list of steps")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", default=None, help="answer other keys with 401")
    parser.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--script-only",
        action="store_true",
        help="spend script steps on requests without tools too (by default a coding CLI's "
        "side requests, its titles and quota checks, get a short text)",
    )
    args = parser.parse_args(argv)
    try:
        script = load_script(args.script)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cls = FAKES[args.api]

    async def serve() -> None:
        async with cls(
            script,
            api_key=args.api_key,
            host=args.host,
            port=args.port,
            side_requests=not args.script_only,
        ) as fake:
            print(f"fake {args.api} API at {fake.base_url}", flush=True)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
