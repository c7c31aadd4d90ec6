"""The OpenAI-compatible half of the mock server: options, request parsing, response bytes.

No I/O here; :mod:`servegym.loadgen.mock_server` does the HTTP and the timing.
"""

from __future__ import annotations

import math
import time
import zlib
from collections import deque
from dataclasses import dataclass, field, fields, replace
from typing import Any

import orjson

DEFAULT_MAX_TOKENS = 16
HIST_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DONE_EVENT = b"data: [DONE]\n\n"
MAX_ARRIVALS = 2_000_000
"""The receipt times kept for /debug/arrivals (the latest ones), so a long-running server's
memory stays bounded."""

_FIXED_OPTIONS = frozenset(
    {"model", "check_model", "vocab_size", "check_vocab", "root", "spin_us", "replies"}
)
"""Options a single request cannot override."""


@dataclass(frozen=True, slots=True)
class MockOptions:
    """Timing, identity and faults of the mock server (defaults for every request).

    Faults (``-1`` / ``0`` / ``False`` = off): ``empty_first_chunk`` sends a chunk with empty
    text and no tokens at receipt, before "prefill"; ``whitespace_first_chunk`` one with text
    ``" "`` and no tokens; ``error_after`` N sends an error event (then ``[DONE]``) in place
    of chunk N; ``malformed_after`` N sends a line of broken JSON before chunk N;
    ``drop_after`` N ends the HTTP response cleanly, without ``[DONE]``, before chunk N;
    ``http_status`` answers at once with that status and a JSON error; ``keepalive`` sends an
    SSE comment before every chunk; ``no_usage`` never sends usage; ``usage_extra`` N claims
    N more completion tokens in ``usage`` than it streams; ``stop_after`` N ends the output
    after N chunks as if at EOS (``finish_reason: stop``), ignoring the forced length;
    ``hang_after`` N stops sending after N chunks and keeps the connection open (a hung
    stream).
    """

    ttft_ms: float = 50.0
    itl_ms: float = 10.0
    tokens_per_chunk: int = 1
    model: str = "mock"
    check_model: bool = True
    vocab_size: int = 32000
    check_vocab: bool = False
    """Refuse prompt token ids outside ``[0, vocab_size)``, as vLLM does (HTTP 400)."""
    root: str | None = None
    """The model folder ``/v1/models`` names, as vLLM's ``root`` (``None``: not listed)."""
    max_model_len: int = 131072
    spin_us: float = 1500.0
    empty_first_chunk: bool = False
    whitespace_first_chunk: bool = False
    error_after: int = -1
    malformed_after: int = -1
    drop_after: int = -1
    http_status: int = 0
    keepalive: bool = False
    no_usage: bool = False
    usage_extra: int = 0
    stop_after: int = -1
    hang_after: int = -1
    replies: str = ""
    """A JSON file of scripted chat answers: a non-streamed chat request whose last message's
    content is a key gets that value as its whole answer ("" : none)."""

    def __post_init__(self) -> None:
        if self.tokens_per_chunk < 1:
            raise ValueError("tokens_per_chunk must be >= 1")
        if not (0 <= self.ttft_ms < math.inf and 0 <= self.itl_ms < math.inf):  # NaN too
            raise ValueError("ttft_ms and itl_ms must be finite numbers >= 0")
        if self.vocab_size < 200:
            raise ValueError("vocab_size must be >= 200")

    def with_overrides(self, overrides: dict[str, Any]) -> MockOptions:
        """A copy with fields from ``overrides`` (values may be strings, as in a header)."""
        names = {f.name for f in fields(self)}
        clean: dict[str, Any] = {}
        for key, value in overrides.items():
            if key not in names or key in _FIXED_OPTIONS:
                raise ValueError(f"unknown mock option '{key}'")
            clean[key] = _coerce(value, getattr(self, key))
        return replace(self, **clean)


def _coerce(value: Any, like: Any) -> Any:
    if isinstance(like, bool):
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on", "")
        return bool(value)
    if isinstance(like, int):
        return int(value)
    if isinstance(like, float):
        return float(value)
    return value


def parse_overrides(text: str) -> dict[str, str]:
    """``"ttft_ms=5,error_after=3,keepalive"`` -> ``{"ttft_ms": "5", ...}``."""
    out: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if part:
            key, _, value = part.partition("=")
            out[key.strip()] = value.strip()
    return out


class Histogram:
    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * len(HIST_BUCKETS)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, bound in enumerate(HIST_BUCKETS):
            if value <= bound:
                self.counts[i] += 1


@dataclass(slots=True)
class MockState:
    """Everything the server counts."""

    options: MockOptions
    arrivals: deque[int] = field(default_factory=lambda: deque(maxlen=MAX_ARRIVALS))
    requests: int = 0
    rescored: int = 0
    """Requests that asked for prompt log-probabilities (a reference's re-scoring)."""
    running: int = 0
    max_running: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    success: int = 0
    failed: int = 0
    ttft_hist: Histogram = field(default_factory=Histogram)
    e2e_hist: Histogram = field(default_factory=Histogram)
    words: list[str] = field(default_factory=list)
    lateness_ns: deque[int] = field(default_factory=lambda: deque(maxlen=100_000))
    """How late each stream's chunk emission ran (now - due), the latest 100,000."""
    replies: dict[str, str] = field(default_factory=dict)
    """Scripted chat answers, by the last message's content (:attr:`MockOptions.replies`)."""

    def __post_init__(self) -> None:
        if not self.words:
            self.words = [f" w{i}" for i in range(self.options.vocab_size)]
        if self.options.replies and not self.replies:
            with open(self.options.replies, "rb") as f:
                loaded = orjson.loads(f.read())
            self.replies = {str(k): str(v) for k, v in dict(loaded).items()}

    def scripted_reply(self, req: GenRequest) -> str | None:
        """The scripted answer to a chat request, if there is one."""
        if not (req.chat and self.replies and isinstance(req.prompt, list) and req.prompt):
            return None
        last = req.prompt[-1]
        content = last.get("content") if isinstance(last, dict) else None
        return self.replies.get(content) if isinstance(content, str) else None

    def reset(self) -> None:
        """Clear the arrivals, lateness samples and request count; max_running restarts from
        running."""
        self.arrivals.clear()
        self.lateness_ns.clear()
        self.requests = 0
        self.max_running = self.running

    def stats(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "requests": self.requests,
            "rescored": self.rescored,
            "running": self.running,
            "max_running": self.max_running,
            "success": self.success,
            "failed": self.failed,
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "emit_lateness_us": _summary_us(self.lateness_ns),
            "options": asdict(self.options),
        }


def _summary_us(values_ns: deque[int]) -> dict[str, float]:
    """p50, p99 and max in microseconds (empty when there are no values)."""
    if not values_ns:
        return {}
    xs = sorted(values_ns)
    n = len(xs)
    return {
        "count": n,
        "p50": xs[n // 2] / 1e3,
        "p99": xs[min(n - 1, int(n * 0.99))] / 1e3,
        "max": xs[-1] / 1e3,
    }


def output_token_ids(prompt: Any, n: int, vocab_size: int) -> list[int]:
    """The mock's deterministic output for ``prompt``: ``n`` ids in ``[100, vocab_size)``."""
    seed = zlib.crc32(orjson.dumps(prompt))
    span = vocab_size - 100
    a = seed % span
    b = 1 + (seed >> 8) % (span - 1)
    return [100 + (a + i * b) % span for i in range(n)]


def error_body(status: int, message: str, kind: str = "BadRequestError") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "code": status}})


def _prompt_len(prompt: Any) -> int:
    if isinstance(prompt, list):
        if prompt and isinstance(prompt[0], str):
            return sum(len(p.split()) for p in prompt)
        if prompt and isinstance(prompt[0], list):
            return sum(len(p) for p in prompt)
        return len(prompt)
    if isinstance(prompt, str):
        return len(prompt.split())
    return 0


def _out_of_vocab(prompt: Any, vocab_size: int) -> int | None:
    """The first prompt token id outside ``[0, vocab_size)``, if any (vLLM's check)."""
    nested = isinstance(prompt, list) and prompt and isinstance(prompt[0], list)
    rows = prompt if nested else [prompt]
    for row in rows:
        if isinstance(row, list) and row and isinstance(row[0], int):
            low, high = min(row), max(row)
            if low < 0:
                return int(low)
            if high >= vocab_size:
                return int(high)
    return None


def _chat_prompt_len(messages: Any) -> int:
    if not isinstance(messages, list):
        raise ValueError("'messages' must be a list")
    n = 0
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            n += len(content.split())
        elif isinstance(content, list):
            n += sum(len(str(p.get("text", "")).split()) for p in content if isinstance(p, dict))
    return n


class GenRequest:
    """One parsed generation request and how to answer it."""

    __slots__ = (
        "chat",
        "created",
        "include_usage",
        "max_tokens",
        "model",
        "opts",
        "prompt",
        "prompt_logprobs",
        "prompt_tokens",
        "return_ids",
        "rid",
        "stream",
        "t_recv",
    )

    def __init__(self, t_recv: int, chat: bool, opts: MockOptions) -> None:
        self.t_recv = t_recv
        self.chat = chat
        self.opts = opts
        self.model = opts.model
        self.rid = f"{'chatcmpl' if chat else 'cmpl'}-{t_recv:x}"
        self.created = int(time.time())
        self.prompt: Any = None
        self.prompt_tokens = 0
        self.max_tokens = DEFAULT_MAX_TOKENS
        self.stream = False
        self.include_usage = False
        self.return_ids = False
        self.prompt_logprobs = False

    # -- response bytes ------------------------------------------------------------------

    def chunk(self, text: str, ids: list[int] | None, finish: str | None) -> bytes:
        choice: dict[str, Any]
        if self.chat:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish
        if self.return_ids:
            choice["token_ids"] = ids if ids is not None else []
        return self._event(choices=[choice])

    def role_chunk(self) -> bytes:
        delta = {"role": "assistant", "content": ""}
        return self._event(
            choices=[{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
        )

    def usage_chunk(self) -> bytes:
        return self._event(choices=[], usage=self.usage())

    def error_event(self, message: str) -> bytes:
        return b"data: " + error_body(500, message, "InternalServerError") + b"\n\n"

    def _event(self, **fields_: Any) -> bytes:
        payload = {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            **fields_,
        }
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.max_tokens + self.opts.usage_extra,
            "total_tokens": self.prompt_tokens + self.max_tokens + self.opts.usage_extra,
        }

    def whole(self, text: str, ids: list[int]) -> bytes:
        """The non-streaming response body."""
        choice: dict[str, Any]
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice["logprobs"] = None
        choice["finish_reason"] = "length"
        if self.return_ids:
            choice["token_ids"] = ids
        if self.prompt_logprobs and isinstance(self.prompt, list):
            # vLLM's shape; the mock's own choice is every token it is shown (a reference
            # that finds every answer greedy: the probe check passes on the mock)
            top = [{str(t): {"logprob": 0.0, "rank": 1}} for t in self.prompt[1:]]
            choice["prompt_logprobs"] = [None, *top]
        payload = {
            "id": self.rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
        }
        return orjson.dumps(payload)


def parse_request(
    options: MockOptions, t_recv: int, chat: bool, raw: bytes, header: str | None
) -> GenRequest | tuple[int, str]:
    """Parse a generation request body; ``(status, message)`` when it is bad."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return 400, "request body is not valid JSON"
    if not isinstance(body, dict):
        return 400, "request body must be a JSON object"
    opts = options
    extra = body.get("mock")
    if header or extra:
        overrides: dict[str, Any] = parse_overrides(header) if header else {}
        if isinstance(extra, dict):
            overrides.update(extra)
        try:
            opts = opts.with_overrides(overrides)
        except (ValueError, TypeError) as e:
            return 400, f"bad mock options: {e}"
    req = GenRequest(t_recv, chat, opts)
    model = body.get("model")
    if opts.check_model and model is not None and model != opts.model:
        return 404, f"The model `{model}` does not exist."
    try:
        if chat:
            req.prompt = body.get("messages")
            req.prompt_tokens = _chat_prompt_len(req.prompt)
            mt = body.get("max_completion_tokens", body.get("max_tokens"))
        else:
            req.prompt = body.get("prompt")
            if req.prompt is None:
                return 400, "'prompt' is required"
            req.prompt_tokens = _prompt_len(req.prompt)
            mt = body.get("max_tokens")
            if opts.check_vocab and (bad := _out_of_vocab(req.prompt, opts.vocab_size)):
                return 400, f"Token id {bad} is out of vocabulary"
    except (ValueError, AttributeError) as e:
        return 400, str(e)
    if mt is not None:
        if not isinstance(mt, int) or mt < 0:
            return 400, "'max_tokens' must be a non-negative integer"
        req.max_tokens = mt
    if req.prompt_tokens + req.max_tokens > opts.max_model_len:
        return 400, (
            f"prompt ({req.prompt_tokens}) + max_tokens ({req.max_tokens}) exceeds "
            f"max_model_len {opts.max_model_len}"
        )
    req.stream = bool(body.get("stream", False))
    so = body.get("stream_options")
    req.include_usage = bool(isinstance(so, dict) and so.get("include_usage"))
    req.return_ids = bool(body.get("return_token_ids"))
    req.prompt_logprobs = not chat and body.get("prompt_logprobs") is not None
    return req


def models_body(options: MockOptions) -> bytes:
    return orjson.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": options.model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "servegym",
                    "max_model_len": options.max_model_len,
                    **({"root": options.root} if options.root is not None else {}),
                }
            ],
        }
    )


def render_metrics(state: MockState) -> str:
    """The server's counters in the Prometheus text format, named as vLLM names them."""
    label = f'model_name="{state.options.model}"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{label}}} {state.running}",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{label}}} {state.prompt_tokens}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{label}}} {state.generation_tokens}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{finished_reason="length",{label}}} {state.success}',
    ]
    for name, hist, help_ in (
        ("vllm:time_to_first_token_seconds", state.ttft_hist, "Time to first token."),
        ("vllm:e2e_request_latency_seconds", state.e2e_hist, "End to end request latency."),
    ):
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} histogram")
        for bound, count in zip(HIST_BUCKETS, hist.counts, strict=True):
            lines.append(f'{name}_bucket{{le="{bound}",{label}}} {count}')
        lines.append(f'{name}_bucket{{le="+Inf",{label}}} {hist.count}')
        lines.append(f"{name}_count{{{label}}} {hist.count}")
        lines.append(f"{name}_sum{{{label}}} {hist.sum!r}")
    return "\n".join(lines) + "\n"
