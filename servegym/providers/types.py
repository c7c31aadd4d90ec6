"""Provider-neutral types of an LLM conversation with tools.

The agent loop speaks only these types; each provider (:mod:`servegym.providers.clients`)
converts them to and from its own wire format. All are pydantic models, so a trajectory can
write any of them with ``model_dump(mode="json")`` and read it back.

Token accounting (:class:`Usage`): ``input_tokens`` counts every prompt token of the call,
cached or not; ``cache_read_tokens`` and ``cache_write_tokens`` say how many of those were
read from or written to the provider's prompt cache (Anthropic reports its three kinds
separately and they are summed here; OpenAI's ``prompt_tokens`` already includes its cached
tokens).

Stop reasons (:attr:`ModelTurn.stop_reason`) use one vocabulary for every provider:
``end_turn`` (the model finished), ``tool_use`` (it wants tool results), ``max_tokens`` (cut
off by the output limit), ``refusal`` (a safety stop), or the provider's own word for anything
else (``stop_sequence``, ``pause_turn`` ...).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from servegym.errors import UserError

__all__ = [
    "AssistantMessage",
    "Message",
    "ModelTurn",
    "ProviderError",
    "ProviderUnavailable",
    "ToolCall",
    "ToolResult",
    "ToolResultsMessage",
    "ToolSpec",
    "Usage",
    "UserMessage",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolSpec(_Model):
    """A tool the model may call: its name, what it does, and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="JSON schema of the arguments object",
    )


class ToolCall(_Model):
    """One call of a tool by the model.

    ``arguments`` is the decoded arguments object. When the model sent arguments that are not
    a JSON object (OpenAI-style APIs send them as a string the model wrote, which may be
    malformed), ``arguments`` is empty, ``arguments_error`` says what was wrong, and the loop
    should answer the call with that error instead of running the tool. ``raw_arguments``
    keeps the string as the model wrote it, so the history sent back is what the model said.
    """

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str | None = None
    arguments_error: str | None = None


class ToolResult(_Model):
    """The result of one tool call, sent back to the model."""

    tool_call_id: str
    content: str
    is_error: bool = False


class Usage(_Model):
    """Tokens one call (or a sum of calls) consumed; see the module docstring for the meaning."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class UserMessage(_Model):
    """Text from the user (the task instruction, a continuation prompt)."""

    role: Literal["user"] = "user"
    text: str


class AssistantMessage(_Model):
    """A turn of the model: its text and the tool calls it made.

    ``native_content`` is the provider's own content blocks for this turn (for Anthropic:
    text, tool_use and the signed thinking blocks that must be sent back unchanged with the
    tool results); the provider named in ``native_provider`` sends those instead of rebuilding
    the turn from ``text`` and ``tool_calls``. Any other provider ignores them.
    """

    role: Literal["assistant"] = "assistant"
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    native_provider: str | None = None
    native_content: list[dict[str, Any]] | None = None


class ToolResultsMessage(_Model):
    """The results of the tool calls of the preceding assistant turn."""

    role: Literal["tool"] = "tool"
    results: list[ToolResult]


Message = Annotated[
    UserMessage | AssistantMessage | ToolResultsMessage, Field(discriminator="role")
]
"""One entry of the provider-neutral conversation history (the system prompt is separate)."""


class ModelTurn(_Model):
    """What one model call returned.

    ``latency_s`` is the wall time of the call that succeeded; ``attempts`` counts the
    requests made (1 when nothing was retried) and ``retry_wait_s`` the time spent backing off
    between them. ``raw`` is the provider's response body as JSON (for trajectories).
    """

    text: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage
    stop_reason: str
    latency_s: float
    model: str = ""
    attempts: int = 1
    retry_wait_s: float = 0.0
    raw: dict[str, Any] = Field(default_factory=dict)
    native_provider: str | None = None
    native_content: list[dict[str, Any]] | None = None

    def to_message(self) -> AssistantMessage:
        """The assistant message to append to the history."""
        return AssistantMessage(
            text=self.text,
            tool_calls=list(self.tool_calls),
            native_provider=self.native_provider,
            native_content=self.native_content,
        )


class ProviderError(UserError):
    """The provider refused the request and retrying will not help (bad key, bad request,
    unknown model): one line naming the provider, the status and what to fix."""

    def __init__(self, provider: str, message: str, *, status: int | None = None) -> None:
        super().__init__(_one_line(message))
        self.provider = provider
        self.status = status


class ProviderUnavailable(Exception):
    """The provider kept failing (429, 5xx, timeouts, connection errors) until the retries were
    spent. The agent loop ends its phase with this as the outcome."""

    def __init__(self, provider: str, reason: str, *, attempts: int = 0) -> None:
        self.provider = provider
        self.reason = _one_line(reason)
        self.attempts = attempts
        super().__init__(f"{provider} unavailable after {attempts} attempt(s): {self.reason}")


def _one_line(text: str, limit: int = 400) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
