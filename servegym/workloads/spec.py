"""The workload specification: what a workload file (``workloads/<name>.toml``) says.

A spec is pure data. :func:`servegym.workloads.generate.materialise` turns a spec and a seed
into a :class:`~servegym.workloads.model.Workload`; the same spec and seed always give the
same workload, byte for byte.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DistKind = Literal["fixed", "uniform", "normal", "lognormal", "pareto"]

MAX_LENGTH = 10_000_000
"""The largest length a distribution may name or draw (10M tokens: longer than any model's
context; 10M seconds of think time, 115 days). Draws past it are clamped to it."""
MAX_COUNT = 10_000_000
"""The most requests, sessions, turns or prefix groups a workload may ask for."""
MAX_MATERIALISED_BYTES = 4 * 2**30
"""The most memory a materialised workload may take (4 GiB): what
:func:`~servegym.workloads.generate.materialise` refuses past, in one line, before it
allocates (10M requests of 1,000 prompt tokens would take 47 GiB)."""
BYTES_PER_TOKEN = 4
"""A prompt token id is an int32."""
BYTES_PER_TURN = 1024
"""What one request (a turn of a session) costs in Python objects and its summary arrays,
measured: 1M one-token requests materialise and summarise in 1.1 GiB."""
MAX_SCALE = 1000.0
"""The largest ``scale`` (the multiplier of every token length)."""
MAX_TOKEN_ID = 2**31
"""Token ids are drawn as 32-bit integers: ``prompt.token_id_high`` is at most 2^31."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LengthDistribution(_Strict):
    """A distribution of positive values (token counts, or seconds for think times).

    Parameters by ``dist``:

    - ``fixed``: ``value``
    - ``uniform``: ``low``, ``high`` (inclusive)
    - ``normal``: ``mean``, ``std``
    - ``lognormal``: ``median``, ``sigma`` (standard deviation of the log)
    - ``pareto``: ``scale`` (the minimum, x_m), ``alpha`` (tail index)

    Any of them may add a Pareto tail: with probability ``tail_fraction`` a value is drawn
    from a Pareto distribution starting at ``tail_start`` with index ``tail_alpha`` instead of
    the body ("a lognormal body with a Pareto tail"). Every value is finally clamped to
    ``[min, max]``.
    """

    dist: DistKind = "fixed"
    # A length (or a think time) is never negative: a negative parameter is refused, naming
    # the field, rather than drawn and clamped to 1 without a word.
    value: float | None = Field(default=None, ge=0, le=MAX_LENGTH)
    low: float | None = Field(default=None, ge=0, le=MAX_LENGTH)
    high: float | None = Field(default=None, ge=0, le=MAX_LENGTH)
    mean: float | None = Field(default=None, ge=0, le=MAX_LENGTH)
    std: float | None = Field(default=None, le=MAX_LENGTH)
    median: float | None = Field(default=None, le=MAX_LENGTH)
    sigma: float | None = Field(default=None, le=100)
    scale: float | None = Field(default=None, le=MAX_LENGTH)
    alpha: float | None = None
    tail_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    tail_start: float | None = Field(default=None, le=MAX_LENGTH)
    tail_alpha: float | None = None
    min: float | None = Field(default=None, ge=0, le=MAX_LENGTH)
    max: float | None = Field(default=None, ge=0, le=MAX_LENGTH)

    @model_validator(mode="after")
    def _check_parameters(self) -> LengthDistribution:
        needed: dict[str, tuple[str, ...]] = {
            "fixed": ("value",),
            "uniform": ("low", "high"),
            "normal": ("mean", "std"),
            "lognormal": ("median", "sigma"),
            "pareto": ("scale", "alpha"),
        }
        missing = [p for p in needed[self.dist] if getattr(self, p) is None]
        if missing:
            raise ValueError(f"dist '{self.dist}' needs {', '.join(missing)}")
        if (
            self.dist == "uniform"
            and self.low is not None
            and self.high is not None
            and self.low > self.high
        ):
            raise ValueError("uniform needs low <= high")
        for name in ("std", "sigma", "scale", "alpha", "median"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.dist == "pareto" and self.alpha is not None and self.alpha <= 0:
            raise ValueError("pareto needs alpha > 0")
        for name in ("tail_start", "tail_alpha"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.tail_fraction > 0 and (self.tail_start is None or self.tail_alpha is None):
            raise ValueError("tail_fraction > 0 needs tail_start and tail_alpha")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("min must be <= max")
        return self


ArrivalKind = Literal[
    "offline", "poisson", "constant", "gamma", "concurrency", "single_stream", "trace"
]


class ArrivalSpec(_Strict):
    """When requests (or, for agentic workloads, sessions) start.

    - ``offline``: everything at t=0.
    - ``poisson``: exponential gaps at ``rate`` per second.
    - ``constant``: gaps of exactly ``1/rate``.
    - ``gamma``: gamma-distributed gaps at mean ``rate`` with shape ``burstiness``
      (1 = Poisson, < 1 burstier, > 1 more regular), as in ``vllm bench serve``.
    - ``concurrency``: closed loop, ``concurrency`` requests (or sessions) in flight.
    - ``single_stream``: closed loop with one in flight.
    - ``trace``: the timestamps of a trace, multiplied by ``time_scale``.
    """

    kind: ArrivalKind = "offline"
    rate: float | None = Field(default=None, gt=0)
    burstiness: float = Field(default=1.0, gt=0)
    concurrency: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    time_scale: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> ArrivalSpec:
        if self.kind in ("poisson", "constant", "gamma") and self.rate is None:
            raise ValueError(f"arrival '{self.kind}' needs rate")
        if self.kind == "concurrency" and self.concurrency is None:
            raise ValueError("arrival 'concurrency' needs concurrency")
        return self

    @property
    def closed_loop(self) -> bool:
        return self.kind in ("concurrency", "single_stream")

    @property
    def max_in_flight(self) -> int | None:
        """In-flight cap of a closed loop; ``None`` for open-loop arrivals."""
        if self.kind == "single_stream":
            return 1
        if self.kind == "concurrency":
            return self.concurrency
        return None


class SharedPrefixSpec(_Strict):
    """Requests share an exact token prefix: ``groups`` distinct prefixes of ``tokens``."""

    tokens: int = Field(default=0, ge=0, le=MAX_LENGTH)
    groups: int = Field(default=1, ge=1, le=MAX_COUNT)


class AgenticSpec(_Strict):
    """Coding-agent sessions shaped like recorded SWE-bench agent trajectories.

    Every session starts with the same system prompt and tool schema (a shared prefix), then a
    task statement. Each turn's prompt is the previous turn's prompt plus the previous reply
    plus a tool result; the reply is the turn's forced output. Replies and tool results are
    heavy-tailed; turns per session too. ``total_turns``, when set, rescales the drawn turn
    counts so they sum to it (keeping their shape; the rescaled counts may pass the ``turns``
    clamps).

    The defaults, over 20 sessions (``num_requests = 20``), give 1,000 turns (a session that
    would outgrow ``max_context_tokens`` stops early, which rarely takes a few off), final
    contexts of about 27k tokens at the median and 45k-130k at the largest session, and tool
    results whose p99 is over 10x their median (MLPerf Edge Agentic's replay: 20
    conversations, 1,007 turns). See ``servegym.workloads.agentic`` for the session layout.
    """

    system_prompt_tokens: int = Field(default=2500, ge=0, le=MAX_LENGTH)
    tool_schema_tokens: int = Field(default=1200, ge=0, le=MAX_LENGTH)
    task_tokens: LengthDistribution = Field(
        default_factory=lambda: LengthDistribution(
            dist="lognormal", median=400, sigma=0.5, min=50, max=4000
        )
    )
    turns: LengthDistribution = Field(
        default_factory=lambda: LengthDistribution(
            dist="lognormal", median=40, sigma=0.5, min=5, max=200
        )
    )
    total_turns: int | None = Field(default=1000, ge=1, le=MAX_COUNT)
    reply_tokens: LengthDistribution = Field(
        default_factory=lambda: LengthDistribution(
            dist="lognormal",
            median=100,
            sigma=0.7,
            tail_fraction=0.03,
            tail_start=500,
            tail_alpha=1.8,
            min=8,
            max=4096,
        )
    )
    tool_result_tokens: LengthDistribution = Field(
        default_factory=lambda: LengthDistribution(
            dist="lognormal",
            median=180,
            sigma=0.9,
            tail_fraction=0.04,
            tail_start=1200,
            tail_alpha=1.6,
            min=10,
            max=10000,
        )
    )
    think_time_s: LengthDistribution = Field(
        default_factory=lambda: LengthDistribution(
            dist="lognormal", median=1.0, sigma=0.8, min=0.05, max=30.0
        )
    )
    max_context_tokens: int = Field(
        default=131072,
        ge=16,
        le=MAX_LENGTH,
        description="a session stops before a turn whose prompt + reply would exceed this",
    )
    warmup_turns: int = Field(
        default=2,
        ge=1,
        le=MAX_COUNT,
        description="warm-up sessions are cut to at most this many turns",
    )


class TraceSpec(_Strict):
    """A trace file of timestamps and token counts (Azure LLM inference trace layout).

    ``path`` is relative to the workload file's folder (or absolute). CSV or JSONL; the
    columns are named by ``timestamp_column``, ``input_column`` and ``output_column``.
    Timestamps are seconds (numbers) or date-times; offsets are taken from the first row.
    """

    path: str
    format: Literal["auto", "csv", "jsonl"] = "auto"
    timestamp_column: str = "TIMESTAMP"
    input_column: str = "ContextTokens"
    output_column: str = "GeneratedTokens"
    start: int = Field(default=0, ge=0, le=2**63 - 1, description="first row to replay")


PromptFormat = Literal["token_ids", "text", "chat"]


class PromptSpec(_Strict):
    """How prompt tokens are drawn and sent.

    Token ids are drawn uniformly from ``[token_id_low, token_id_high)`` so that no special
    token is drawn by chance. ``format`` chooses the request body: ``token_ids`` sends the ids
    to ``/v1/completions`` exactly; ``text`` sends decoded text to ``/v1/completions``;
    ``chat`` sends decoded text to ``/v1/chat/completions``.
    """

    format: PromptFormat = "token_ids"
    token_id_low: int = Field(default=1000, ge=0)
    token_id_high: int = Field(default=30000, ge=1, le=MAX_TOKEN_ID)

    @model_validator(mode="after")
    def _check(self) -> PromptSpec:
        if self.token_id_high <= self.token_id_low:
            raise ValueError("token_id_high must be > token_id_low")
        return self


WorkloadKind = Literal["synthetic", "agentic", "trace"]


class WorkloadSpec(_Strict):
    """One workload definition (a ``workloads/<name>.toml`` file, after overrides)."""

    name: str
    description: str = ""
    kind: WorkloadKind = "synthetic"
    num_requests: int = Field(
        default=1000,
        ge=1,
        le=MAX_COUNT,
        description="requests (synthetic, trace) or sessions (agentic)",
    )
    duration_s: float | None = Field(
        default=None, gt=0, description="stop sending new requests after this many seconds"
    )
    warmup_requests: int = Field(default=0, ge=0, le=MAX_COUNT)
    scale: float = Field(
        default=1.0, gt=0, le=MAX_SCALE, description="multiplies every token length"
    )
    input_tokens: LengthDistribution = Field(
        default_factory=lambda: LengthDistribution(dist="fixed", value=1000)
    )
    output_tokens: LengthDistribution = Field(
        default_factory=lambda: LengthDistribution(dist="fixed", value=1000)
    )
    shared_prefix: SharedPrefixSpec = Field(default_factory=SharedPrefixSpec)
    arrival: ArrivalSpec = Field(default_factory=ArrivalSpec)
    agentic: AgenticSpec | None = None
    trace: TraceSpec | None = None
    prompt: PromptSpec = Field(default_factory=PromptSpec)

    @model_validator(mode="after")
    def _check_kind(self) -> WorkloadSpec:
        if self.kind == "agentic" and self.agentic is None:
            raise ValueError("kind 'agentic' needs an [agentic] table")
        if self.kind == "trace" and self.trace is None:
            raise ValueError("kind 'trace' needs a [trace] table")
        if self.arrival.kind == "trace" and self.kind != "trace":
            raise ValueError("arrival 'trace' needs kind 'trace'")
        return self
