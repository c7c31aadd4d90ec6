"""LLM provider clients: one ``complete`` call over a provider-neutral history.

A :class:`Provider` turns (system prompt, history of :data:`Message`, tools) into one
:class:`ModelTurn`. Two implementations, each on its vendor's official SDK:

- :class:`AnthropicProvider`: ``anthropic.AsyncAnthropic``, the Messages API with ``tools``
  (assistant turns become ``tool_use`` blocks, tool results ``tool_result`` blocks of a user
  turn; signed thinking blocks are sent back unchanged);
- :class:`OpenAIProvider`: ``openai.AsyncOpenAI``, Chat Completions with function tools (tool
  results are ``role="tool"`` messages). With ``base_url`` it talks to any server speaking the
  OpenAI API (a local vLLM, for one); ``name="openai-compatible"`` then labels its messages.

Retries are ours alone (the SDKs' own are switched off with ``max_retries=0``): a 429, a 408
or 409, any 5xx, a timeout, a connection error or a garbage answer (a 200 whose body is no
API response: not JSON, a bare string, the wrong shape, missing fields) is retried after an
exponential backoff with jitter (at least the server's ``retry-after``), up to
:attr:`RetryPolicy.max_retries` times; then :class:`ProviderUnavailable` is raised. Any
other 4xx raises :class:`ProviderError` at once, in one line (a 401 names the environment
variable the key came from). Both ``sleep`` and the jitter's ``rng`` can be injected, so
tests neither wait nor depend on chance.

API keys come from :func:`resolve_api_key`; a provider never shows its key in ``repr``, in an
error message or in :attr:`ModelTurn.raw`.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Self, cast, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from servegym.errors import UserError
from servegym.providers.types import (
    AssistantMessage,
    Message,
    ModelTurn,
    ProviderError,
    ProviderUnavailable,
    ToolCall,
    ToolResult,
    ToolResultsMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from servegym.providers.vendors import KEY_ENV

if TYPE_CHECKING:  # the SDKs take seconds to import: loaded when a provider is made
    import anthropic
    import openai

__all__ = [
    "DEFAULT_KEY_ENV",
    "DEFAULT_PROVIDER_TIMEOUT_S",
    "DEFAULT_PROVIDER_TRIES",
    "MAX_PROVIDER_TIMEOUT_S",
    "PLACEHOLDER_API_KEY",
    "AnthropicProvider",
    "AssistantMessage",
    "MalformedResponse",
    "Message",
    "ModelTurn",
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "ProviderUnavailable",
    "RetryEvent",
    "RetryPolicy",
    "SleepFn",
    "ToolCall",
    "ToolResult",
    "ToolResultsMessage",
    "ToolSpec",
    "Usage",
    "UserMessage",
    "anthropic_request_messages",
    "openai_request_messages",
    "resolve_api_key",
]

SleepFn = Callable[[float], Awaitable[None]]
"""How a provider waits between retries (``asyncio.sleep`` unless a test injects another)."""

DEFAULT_KEY_ENV: dict[str, str] = {
    "anthropic": KEY_ENV["anthropic"],
    "openai": KEY_ENV["openai"],
    "openai-compatible": KEY_ENV["openai"],
}
"""The environment variable each provider's key is read from unless another is named."""

PLACEHOLDER_API_KEY = "EMPTY"
"""The key sent to an OpenAI-compatible server that needs none (local servers ignore it)."""

_RETRYABLE_STATUS = frozenset({408, 409, 429})

DEFAULT_PROVIDER_TIMEOUT_S = 120.0
"""A model call's request timeout by default (model agents and the judge): a long answer of a
large model takes a minute or two; a provider silent for two minutes is retried rather than
waited on."""
DEFAULT_PROVIDER_TRIES = 3
"""Requests per model call by default (the first and two retries): a hung provider costs
about 6 minutes (3 x 120 s plus backoff), not the hour of 7 tries of 600 s."""
MAX_PROVIDER_TIMEOUT_S = 3600.0


# --------------------------------------------------------------------------- API keys


def resolve_api_key(
    provider: str,
    api_key_env: str | None = None,
    *,
    allow_placeholder: bool = False,
    environ: Mapping[str, str] | None = None,
) -> str:
    """Return the API key for ``provider`` from the environment.

    The key is read from ``api_key_env`` if given, else from the provider's usual variable
    (:data:`DEFAULT_KEY_ENV`). A missing or blank key raises :class:`UserError` naming the
    variable, unless ``allow_placeholder`` (meant for OpenAI-compatible servers that ignore
    the key) returns :data:`PLACEHOLDER_API_KEY` instead.
    """
    env = os.environ if environ is None else environ
    var = api_key_env or DEFAULT_KEY_ENV.get(provider)
    if var is None:
        raise UserError(
            f"no API key variable is known for provider {provider!r}: name one with --api-key-env"
        )
    key = env.get(var, "").strip()
    if key:
        return key
    if allow_placeholder:
        return PLACEHOLDER_API_KEY
    hint = "" if api_key_env else " (or name another variable with --api-key-env)"
    raise UserError(f"no API key for {provider}: set the environment variable {var}{hint}")


# --------------------------------------------------------------------------- retries


class RetryPolicy(BaseModel):
    """How often and how patiently a provider retries a transient failure.

    The wait before retry ``n`` (0-based) is ``min(max_delay_s, base_delay_s * 2**n)``, of
    which the fraction ``jitter`` is drawn at random (so ``jitter=0.5`` waits between half and
    all of it), and never less than the server's ``retry-after`` (capped at ``max_delay_s``).
    """

    model_config = ConfigDict(extra="forbid")

    max_retries: int = Field(default=6, ge=0, description="retries after the first attempt")
    base_delay_s: float = Field(default=1.0, ge=0.0)
    max_delay_s: float = Field(default=60.0, ge=0.0)
    jitter: float = Field(default=0.5, ge=0.0, le=1.0)

    def delay_s(self, retry_index: int, rng: random.Random, retry_after_s: float | None) -> float:
        """Seconds to wait before retry ``retry_index`` (0 for the first retry)."""
        cap = min(self.max_delay_s, self.base_delay_s * (2.0**retry_index))
        delay = cap * (1.0 - self.jitter * rng.random())
        if retry_after_s is not None and retry_after_s > 0:
            delay = max(delay, min(retry_after_s, self.max_delay_s))
        return delay


@dataclass(frozen=True)
class RetryEvent:
    """A failed attempt that will be retried (passed to a provider's ``on_retry``)."""

    provider: str
    attempt: int
    reason: str
    delay_s: float
    status: int | None = None


class MalformedResponse(Exception):
    """A 200 answer that is no API response (not JSON, a bare string, the wrong shape,
    missing fields): retried like a 5xx, never an ``AttributeError`` in the agent loop."""


def _response_dict(response: object) -> dict[str, Any]:
    """The SDK's response as JSON data; :class:`MalformedResponse` when the SDK handed back
    something else (it returns the raw text, or whatever JSON came, when the body is not
    the model it expected)."""
    if not isinstance(response, BaseModel):
        raise MalformedResponse(f"the body is a {type(response).__name__}, not a response object")
    data = response.model_dump(mode="json", warnings=False)
    if not isinstance(data, dict):  # pragma: no cover - a BaseModel dumps to a dict
        raise MalformedResponse("the body is not a JSON object")
    return data


def _parse_turn(parse: Callable[[], ModelTurn]) -> ModelTurn:
    """Run a response's conversion; a field of the wrong type or shape anywhere in it is a
    :class:`MalformedResponse` naming what was wrong."""
    try:
        return parse()
    except MalformedResponse:
        raise
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
        raise MalformedResponse(f"{type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class _Failure:
    retryable: bool
    reason: str
    status: int | None = None
    retry_after_s: float | None = None


# --------------------------------------------------------------------------- the protocol


@runtime_checkable
class Provider(Protocol):
    """A model behind an API: one call turns the history into the model's next turn."""

    @property
    def name(self) -> str:
        """The provider's name in messages and trajectories (``anthropic``, ``openai`` ...)."""
        ...

    @property
    def model(self) -> str:
        """The model asked for."""
        ...

    async def complete(
        self,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        max_tokens: int,
        temperature: float | None = None,
        reasoning_effort: str | None = None,
    ) -> ModelTurn:
        """The model's next turn. Raises :class:`ProviderError` (not retryable) or
        :class:`ProviderUnavailable` (retries spent)."""
        ...

    async def aclose(self) -> None:
        """Release the HTTP connections."""
        ...


class _RetryingProvider:
    """What both providers share: the retry loop, error wording, key hygiene."""

    _name: str
    _default_key_env: str

    def __init__(
        self,
        model: str,
        api_key: str,
        *,
        base_url: str | None,
        timeout_s: float,
        retry: RetryPolicy | None,
        sleep: SleepFn | None,
        rng: random.Random | None,
        api_key_env: str | None,
        on_retry: Callable[[RetryEvent], None] | None,
        extra_body: Mapping[str, Any] | None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self._model = model
        self._api_key = api_key
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self._sleep: SleepFn = sleep or asyncio.sleep
        self._rng = rng or random.Random()
        self.api_key_env = api_key_env or self._default_key_env
        self._on_retry = on_retry
        self.extra_body: dict[str, Any] = dict(extra_body or {})

    @property
    def name(self) -> str:
        return self._name

    @property
    def model(self) -> str:
        return self._model

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"{type(self).__name__}(model={self._model!r}{where})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        raise NotImplementedError

    async def _call_once(
        self,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        max_tokens: int,
        temperature: float | None,
        reasoning_effort: str | None,
    ) -> ModelTurn:
        raise NotImplementedError

    def _classify(self, exc: BaseException) -> _Failure | None:
        raise NotImplementedError

    async def complete(
        self,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        max_tokens: int,
        temperature: float | None = None,
        reasoning_effort: str | None = None,
    ) -> ModelTurn:
        waited = 0.0
        attempt = 0
        while True:
            attempt += 1
            try:
                turn = await self._call_once(
                    system, messages, tools, max_tokens, temperature, reasoning_effort
                )
            except Exception as exc:
                failure = self._classify(exc)
                if failure is None:
                    raise
                if not failure.retryable:
                    raise ProviderError(self._name, failure.reason, status=failure.status) from exc
                if attempt > self.retry.max_retries:
                    raise ProviderUnavailable(self._name, failure.reason, attempts=attempt) from exc
                delay = self.retry.delay_s(attempt - 1, self._rng, failure.retry_after_s)
                if self._on_retry is not None:
                    self._on_retry(
                        RetryEvent(self._name, attempt, failure.reason, delay, failure.status)
                    )
                waited += delay
                await self._sleep(delay)
                continue
            return turn.model_copy(update={"attempts": attempt, "retry_wait_s": waited})

    def _redact(self, text: str) -> str:
        if self._api_key and len(self._api_key) >= 4:
            text = text.replace(self._api_key, "[api key]")
        return text

    def _classify_sdk(
        self,
        exc: BaseException,
        *,
        status_error: type[Exception],
        timeout_error: type[Exception],
        connection_error: type[Exception],
        validation_error: type[Exception],
    ) -> _Failure | None:
        """Sort an SDK exception into retryable / fatal (``None``: not the SDK's; re-raise)."""
        where = f" at {self.base_url}" if self.base_url else ""
        if isinstance(exc, MalformedResponse):
            return _Failure(True, self._redact(f"a malformed response{where} ({exc})"))
        if isinstance(exc, timeout_error):
            return _Failure(True, f"request timed out after {self.timeout_s:g} s{where}")
        if isinstance(exc, connection_error):
            cause = exc.__cause__ or exc.__context__
            detail = f": {cause}" if cause is not None else ""
            return _Failure(True, self._redact(f"could not connect{where}{detail}"))
        if isinstance(exc, status_error):
            status = int(getattr(exc, "status_code", 0))
            message = self._redact(_api_message(exc))
            headers = getattr(getattr(exc, "response", None), "headers", None)
            retry_after = _retry_after_s(headers)
            if status in _RETRYABLE_STATUS or status >= 500:
                return _Failure(True, f"HTTP {status}: {message}", status, retry_after)
            return _Failure(False, self._fatal_message(status, message), status)
        if isinstance(exc, validation_error):
            return _Failure(True, f"{self._name} returned a response that is not valid{where}")
        return None

    def _fatal_message(self, status: int, message: str) -> str:
        where = f" at {self.base_url}" if self.base_url else ""
        detail = f"HTTP {status}: {message}" if message else f"HTTP {status}"
        if status == 401:
            return (
                f"{self._name} rejected the API key{where} ({detail}); "
                f"check the key in {self.api_key_env}"
            )
        if status == 403:
            return (
                f"{self._name} denied access to model {self._model!r}{where} ({detail}); "
                f"check the permissions of the key in {self.api_key_env}"
            )
        if status == 404:
            return (
                f"{self._name}: model {self._model!r} or its endpoint not found{where} ({detail})"
            )
        return f"{self._name} rejected the request for model {self._model!r}{where} ({detail})"


def _api_message(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
    if isinstance(body, str) and body.strip():
        return body.strip()
    return str(getattr(exc, "message", "") or exc)


def _retry_after_s(headers: Any) -> float | None:
    """The wait a response asks for (``retry-after-ms``, or ``retry-after`` in seconds or as an
    HTTP date); ``None`` when it asks for none."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return float(ms) / 1000.0
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def _decode_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """Decode a tool call's arguments: (arguments, None), or ({}, what was wrong)."""
    if isinstance(raw, dict):
        return raw, None
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    if not isinstance(raw, str):
        return {}, f"the arguments must be a JSON object, got {type(raw).__name__}"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, f"the arguments are not valid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(value, dict):
        return {}, f"the arguments must be a JSON object, got {type(value).__name__}"
    return value, None


# --------------------------------------------------------------------------- Anthropic

_ANTHROPIC_STOP = {"end_turn", "tool_use", "max_tokens", "refusal"}


def anthropic_request_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The history as Anthropic Messages API ``messages``.

    User text and tool results go into user turns (consecutive ones merged, the
    ``tool_result`` blocks first as the API requires); an assistant turn becomes ``text`` and
    ``tool_use`` blocks, or its own blocks when it came from Anthropic (``native_content``).
    """
    out: list[dict[str, Any]] = []

    def add_user(blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == "user":
            merged = out[-1]["content"] + blocks
            out[-1]["content"] = [b for b in merged if b["type"] == "tool_result"] + [
                b for b in merged if b["type"] != "tool_result"
            ]
        else:
            out.append({"role": "user", "content": blocks})

    for m in messages:
        if isinstance(m, UserMessage):
            add_user([{"type": "text", "text": m.text}])
        elif isinstance(m, ToolResultsMessage):
            add_user([_anthropic_tool_result(r) for r in m.results])
        else:
            out.append({"role": "assistant", "content": _anthropic_assistant_blocks(m)})
    return out


def _anthropic_tool_result(result: ToolResult) -> dict[str, Any]:
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": result.tool_call_id,
        "content": result.content or "(no output)",
    }
    if result.is_error:
        block["is_error"] = True
    return block


def _anthropic_assistant_blocks(m: AssistantMessage) -> list[dict[str, Any]]:
    if m.native_provider == "anthropic" and m.native_content:
        return [dict(b) for b in m.native_content]
    blocks: list[dict[str, Any]] = []
    if m.text:
        blocks.append({"type": "text", "text": m.text})
    for call in m.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
        )
    return blocks or [{"type": "text", "text": "(no content)"}]


def _anthropic_turn(raw: dict[str, Any], latency_s: float) -> ModelTurn:
    if not isinstance(raw.get("content"), list):
        raise MalformedResponse("no 'content' list")
    texts: list[str] = []
    calls: list[ToolCall] = []
    native: list[dict[str, Any]] = []
    for block in raw.get("content") or []:
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
            native.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "tool_use":
            raw_input = block.get("input")
            arguments, error = _decode_arguments(raw_input)
            calls.append(
                ToolCall(
                    id=str(block.get("id", "")),
                    name=str(block.get("name", "")),
                    arguments=arguments,
                    raw_arguments=raw_input if isinstance(raw_input, str) else None,
                    arguments_error=error,
                )
            )
            native.append(
                {
                    "type": "tool_use",
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "input": arguments if error is None else {},
                }
            )
        elif kind == "thinking":
            native.append(
                {
                    "type": "thinking",
                    "thinking": block.get("thinking", ""),
                    "signature": block.get("signature", ""),
                }
            )
        elif kind == "redacted_thinking":
            native.append({"type": "redacted_thinking", "data": block.get("data", "")})
    u = raw.get("usage") or {}
    cache_read = int(u.get("cache_read_input_tokens") or 0)
    cache_write = int(u.get("cache_creation_input_tokens") or 0)
    usage = Usage(
        input_tokens=int(u.get("input_tokens") or 0) + cache_read + cache_write,
        output_tokens=int(u.get("output_tokens") or 0),
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )
    stop = raw.get("stop_reason") or ("tool_use" if calls else "end_turn")
    return ModelTurn(
        text="\n".join(t for t in texts if t),
        tool_calls=calls,
        usage=usage,
        stop_reason=str(stop),
        latency_s=latency_s,
        model=str(raw.get("model", "")),
        raw=raw,
        native_provider="anthropic",
        native_content=native,
    )


class AnthropicProvider(_RetryingProvider):
    """Claude through the Messages API with tool use (``anthropic.AsyncAnthropic``).

    ``reasoning_effort`` is sent as ``output_config.effort`` (``low`` ... ``max``);
    ``temperature``, which this SDK no longer takes as a parameter, is sent in the body when
    given (the API accepts or rejects it per model); ``extra_body`` is merged into every
    request (e.g. ``{"thinking": {"type": "adaptive"}}``).
    """

    _name = "anthropic"
    _default_key_env = KEY_ENV["anthropic"]

    def __init__(
        self,
        model: str,
        api_key: str,
        *,
        base_url: str | None = None,
        timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        sleep: SleepFn | None = None,
        rng: random.Random | None = None,
        api_key_env: str | None = None,
        on_retry: Callable[[RetryEvent], None] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            model,
            api_key,
            base_url=base_url,
            timeout_s=timeout_s,
            retry=retry,
            sleep=sleep,
            rng=rng,
            api_key_env=api_key_env,
            on_retry=on_retry,
            extra_body=extra_body,
        )
        import anthropic

        self._client: anthropic.AsyncAnthropic = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def _call_once(
        self,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        max_tokens: int,
        temperature: float | None,
        reasoning_effort: str | None,
    ) -> ModelTurn:
        import anthropic

        omit = anthropic.omit
        wire_tools = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in tools
        ]
        output_config = {"effort": reasoning_effort} if reasoning_effort else None
        extra = dict(self.extra_body)
        if temperature is not None:
            # The SDK has no ``temperature`` parameter (any more); the API judges it.
            extra["temperature"] = temperature
        start = time.perf_counter()
        response = await self._client.messages.create(
            model=self._model,
            max_tokens=max_tokens,
            system=system if system else omit,
            messages=cast(Any, anthropic_request_messages(messages)),
            tools=cast(Any, wire_tools) if wire_tools else omit,
            output_config=cast(Any, output_config) if output_config else omit,
            extra_body=extra or None,
            timeout=self.timeout_s,
        )
        latency = time.perf_counter() - start
        return _parse_turn(lambda: _anthropic_turn(_response_dict(response), latency))

    def _classify(self, exc: BaseException) -> _Failure | None:
        import anthropic

        return self._classify_sdk(
            exc,
            status_error=anthropic.APIStatusError,
            timeout_error=anthropic.APITimeoutError,
            connection_error=anthropic.APIConnectionError,
            validation_error=anthropic.APIResponseValidationError,
        )


# --------------------------------------------------------------------------- OpenAI

_OPENAI_STOP = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


def openai_request_messages(system: str, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The system prompt and history as Chat Completions ``messages`` (tool results as one
    ``role="tool"`` message each; a call's arguments sent back exactly as the model wrote
    them)."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for m in messages:
        if isinstance(m, UserMessage):
            out.append({"role": "user", "content": m.text})
        elif isinstance(m, ToolResultsMessage):
            for r in m.results:
                out.append({"role": "tool", "tool_call_id": r.tool_call_id, "content": r.content})
        else:
            entry: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.name,
                            "arguments": c.raw_arguments
                            if c.raw_arguments is not None
                            else json.dumps(c.arguments),
                        },
                    }
                    for c in m.tool_calls
                ]
            elif entry["content"] is None:
                entry["content"] = ""
            out.append(entry)
    return out


def _openai_turn(raw: dict[str, Any], latency_s: float, provider: str) -> ModelTurn:
    choices = raw.get("choices") or []
    if not isinstance(choices, list) or not choices:
        raise MalformedResponse("a completion with no choices")
    choice = choices[0]
    message = choice.get("message") or {}
    calls: list[ToolCall] = []
    for i, tc in enumerate(message.get("tool_calls") or []):
        function = tc.get("function") or {}
        raw_args = function.get("arguments")
        arguments, error = _decode_arguments(raw_args)
        if tc.get("type", "function") != "function":
            arguments, error = {}, f"unsupported tool call type {tc.get('type')!r}"
        calls.append(
            ToolCall(
                id=str(tc.get("id") or f"call_{i}"),
                name=str(function.get("name", "")),
                arguments=arguments,
                raw_arguments=raw_args if isinstance(raw_args, str) else None,
                arguments_error=error,
            )
        )
    u = raw.get("usage") or {}
    details = u.get("prompt_tokens_details") or {}
    usage = Usage(
        input_tokens=int(u.get("prompt_tokens") or 0),
        output_tokens=int(u.get("completion_tokens") or 0),
        cache_read_tokens=int(details.get("cached_tokens") or 0),
    )
    finish = choice.get("finish_reason")
    if finish is None:
        stop = "tool_use" if calls else "end_turn"
    else:
        stop = _OPENAI_STOP.get(str(finish), str(finish))
    return ModelTurn(
        text=str(message.get("content") or ""),
        tool_calls=calls,
        usage=usage,
        stop_reason=stop,
        latency_s=latency_s,
        model=str(raw.get("model", "")),
        raw=raw,
    )


class OpenAIProvider(_RetryingProvider):
    """A model behind Chat Completions with function calling (``openai.AsyncOpenAI``).

    ``name`` labels messages and trajectories (``"openai-compatible"`` for a local server);
    ``max_tokens_field`` picks the request field for the output limit
    (``max_completion_tokens``, which OpenAI's reasoning models require, or the older
    ``max_tokens`` some compatible servers still want). ``reasoning_effort`` is sent as is.
    """

    _default_key_env = KEY_ENV["openai"]

    def __init__(
        self,
        model: str,
        api_key: str,
        *,
        base_url: str | None = None,
        name: str = "openai",
        timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        sleep: SleepFn | None = None,
        rng: random.Random | None = None,
        api_key_env: str | None = None,
        on_retry: Callable[[RetryEvent], None] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_tokens_field: str = "max_completion_tokens",
    ) -> None:
        if max_tokens_field not in ("max_completion_tokens", "max_tokens"):
            raise ValueError("max_tokens_field must be 'max_completion_tokens' or 'max_tokens'")
        self._name = name
        super().__init__(
            model,
            api_key,
            base_url=base_url,
            timeout_s=timeout_s,
            retry=retry,
            sleep=sleep,
            rng=rng,
            api_key_env=api_key_env,
            on_retry=on_retry,
            extra_body=extra_body,
        )
        self.max_tokens_field = max_tokens_field
        import openai

        self._client: openai.AsyncOpenAI = openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def _call_once(
        self,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        max_tokens: int,
        temperature: float | None,
        reasoning_effort: str | None,
    ) -> ModelTurn:
        import openai

        omit = openai.omit
        wire_tools = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in tools
        ]
        new_field = self.max_tokens_field == "max_completion_tokens"
        start = time.perf_counter()
        response = await self._client.chat.completions.create(
            model=self._model,
            messages=cast(Any, openai_request_messages(system, messages)),
            tools=cast(Any, wire_tools) if wire_tools else omit,
            max_completion_tokens=max_tokens if new_field else omit,
            max_tokens=omit if new_field else max_tokens,
            temperature=temperature if temperature is not None else omit,
            reasoning_effort=cast(Any, reasoning_effort) if reasoning_effort else omit,
            extra_body=self.extra_body or None,
            timeout=self.timeout_s,
        )
        latency = time.perf_counter() - start
        return _parse_turn(lambda: _openai_turn(_response_dict(response), latency, self._name))

    def _classify(self, exc: BaseException) -> _Failure | None:
        import openai

        return self._classify_sdk(
            exc,
            status_error=openai.APIStatusError,
            timeout_error=openai.APITimeoutError,
            connection_error=openai.APIConnectionError,
            validation_error=openai.APIResponseValidationError,
        )
