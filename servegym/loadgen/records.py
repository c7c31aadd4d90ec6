"""What a run records: one :class:`RequestRecord` per request, and the run around them.

Times are integer nanoseconds from the run's start (``time.perf_counter_ns`` on a real
target, virtual time on the simulator), so records from either kind of target read alike.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RecountSource = Literal["token_ids", "tokenizer", "server_usage", "chunks", "none"]


class RequestRecord(BaseModel):
    """One request as measured.

    ``chunk_ns`` holds the arrival time of every streamed chunk that carried output
    (text or token ids), and ``chunk_tokens`` the number of output tokens each carried, as
    counted by the harness when it can (``recount_source`` says how). A chunk that carries no
    output token (an empty or whitespace-only first chunk) is kept in ``empty_chunk_ns`` and
    never counts for TTFT.
    """

    model_config = ConfigDict(extra="forbid")

    request_id: str
    session_id: int
    turn_index: int
    warmup: bool = False
    prompt_tokens: int = Field(description="prompt tokens the harness sent")
    expected_output_tokens: int = Field(description="the forced output length")
    scheduled_ns: int = Field(description="when the schedule wanted the request sent")
    sent_ns: int | None = Field(
        default=None, description="when the request's bytes were written (after any connect)"
    )
    first_token_ns: int | None = None
    done_ns: int | None = None
    end_ns: int | None = Field(
        default=None,
        description="when the response ended ([DONE], or the failure); done_ns is the last token",
    )
    chunk_ns: list[int] = Field(default_factory=list)
    chunk_tokens: list[int] = Field(default_factory=list)
    empty_chunk_ns: list[int] = Field(default_factory=list)
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    output_tokens: int = Field(default=0, description="harness count of output tokens")
    recount_source: RecountSource = "none"
    output_hash: str | None = Field(default=None, description="sha256 of the output")
    output_text: str | None = None
    output_token_ids: list[int] | None = None
    http_status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.done_ns is not None

    @property
    def ttft_ns(self) -> int | None:
        if self.sent_ns is None or self.first_token_ns is None:
            return None
        return self.first_token_ns - self.sent_ns

    @property
    def e2e_ns(self) -> int | None:
        if self.sent_ns is None or self.done_ns is None:
            return None
        return self.done_ns - self.sent_ns

    @property
    def send_lag_ns(self) -> int | None:
        if self.sent_ns is None:
            return None
        return self.sent_ns - self.scheduled_ns


class LoadgenStats(BaseModel):
    """The load generator's measurement of itself.

    ``send_lag_ms_*`` are over (sent - scheduled) of every paced request (bursts of requests
    scheduled at one instant are reported apart, as ``burst_*``); ``loop_lag_ms_*`` over the
    oversleep of a probe task that wakes every ``loop_probe_interval_ms``; ``cpu_fraction`` is
    the process CPU time over wall time. ``client_bound`` is true when the generator could
    not keep its schedule (p99 send lag over ``max_send_lag_ms``), so its latencies partly
    measure the client rather than the server.
    """

    model_config = ConfigDict(extra="forbid")

    send_lag_ms_mean: float = 0.0
    send_lag_ms_p50: float = 0.0
    send_lag_ms_p99: float = 0.0
    send_lag_ms_max: float = 0.0
    loop_lag_ms_p99: float = 0.0
    loop_lag_ms_max: float = 0.0
    loop_probe_interval_ms: float = 5.0
    cpu_fraction: float = 0.0
    max_send_lag_ms: float = 5.0
    client_bound: bool = False
    reason: str | None = None
    burst_requests: int = Field(
        default=0, description="requests sharing their scheduled instant (offline, loop start)"
    )
    burst_send_ms_max: float = Field(
        default=0.0, description="longest a burst request waited to be sent, ms"
    )


class RunResult(BaseModel):
    """Everything a target run produced, before metrics."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field(description="what was measured, e.g. the base URL or 'sim'")
    model: str
    workload: str
    workload_hash: str
    seed: int
    started_at: str = Field(description="ISO-8601 wall-clock time of the run's start")
    clock_origin_ns: int = Field(
        default=0,
        description="the perf_counter_ns() value record times are relative to (0: unknown)",
    )
    duration_s: float = Field(description="first send to last completion, measured requests")
    records: list[RequestRecord]
    loadgen: LoadgenStats = Field(default_factory=LoadgenStats)
    server_metrics_delta: dict[str, float] = Field(
        default_factory=dict,
        description="Prometheus samples after minus before, when the server exposes /metrics",
    )
    server_gauges_max: dict[str, float] = Field(
        default_factory=dict,
        description="peak of each sampled /metrics gauge during the measured phase "
        "(KV-cache usage, running and waiting requests)",
    )
    stopped_early: str | None = Field(
        default=None, description="why sending stopped before the workload ended, if it did"
    )
