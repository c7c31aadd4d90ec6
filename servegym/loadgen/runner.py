"""Scheduling a workload's requests against an OpenAI-compatible HTTP server.

Scheduling. Open-loop arrivals (``offline``, ``poisson``, ``constant``, ``gamma``,
``trace``) start each session at its first turn's ``arrival_s`` from the phase start. Closed
loops (``concurrency``, ``single_stream``) keep at most ``max_in_flight`` sessions active; a
new one starts when one ends, scheduled at that moment. Within a session, turn ``k + 1`` is
scheduled ``think_s`` after turn ``k``'s last token; a failed turn ends its session.
Warm-up sessions run first, as a phase of their own with their own clock, and finish before
the measured phase starts. ``spec.duration_s`` stops sending new requests that long after
the measured phase starts; requests in flight finish.

Precision. Every wait for a scheduled time goes through one
:class:`~servegym.loadgen.timing.PreciseScheduler` (coarse sleep, then a yield-spin), and a
request's body is built before its wait, so what lies between the scheduled time and the
send is a task switch and one socket write. Counting and hashing outputs waits for the end
of the run. How well the schedule was kept is measured by
:mod:`servegym.loadgen.selfcheck`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

import numpy as np

from servegym.loadgen.client import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    StreamResult,
    TokenCounter,
    build_body,
    done_time,
    finish_record,
    stream_request,
)
from servegym.loadgen.http1 import HttpPool
from servegym.loadgen.records import RequestRecord
from servegym.loadgen.target import ProgressFn, RunOptions
from servegym.loadgen.timing import PreciseScheduler
from servegym.workloads.model import Session, Workload

OPEN_LOOP_LOOKAHEAD_NS = 20_000_000
"""Open loop: a session's task starts (and builds its first body) this long before its time."""
OPEN_LOOP_PREWARM = 16
"""Connections opened before an open loop starts."""
PHASE_LEAD_NS = 10_000_000
"""A phase's clock starts this long after it is set up, so its first sends are not late."""
PROGRESS_INTERVAL_NS = 50_000_000
"""Progress is reported at most this often (and once at the end)."""


def _prompt_builder(
    workload: Workload, options: RunOptions
) -> Callable[[Session, int], tuple[np.ndarray[Any, Any] | str, int]]:
    fmt = workload.spec.prompt.format
    if fmt == "token_ids":

        def ids_prompt(session: Session, k: int) -> tuple[np.ndarray[Any, Any] | str, int]:
            ids = workload.prompt_ids(session, k)
            return ids, len(ids)

        return ids_prompt
    decode = _detokenizer(options.tokenizer)

    def text_prompt(session: Session, k: int) -> tuple[np.ndarray[Any, Any] | str, int]:
        ids = workload.prompt_ids(session, k)
        return decode(ids), len(ids)

    return text_prompt


def _detokenizer(tokenizer: str | None) -> Callable[[np.ndarray[Any, Any]], str]:
    from servegym.workloads.text import Detokenizer

    return Detokenizer.from_path(tokenizer).decode


@dataclass(slots=True)
class _Finished:
    """A request as it came back; made a record after the run (off the hot path)."""

    result: StreamResult
    session_id: int
    turn_index: int
    warmup: bool
    prompt_tokens: int
    expected_output_tokens: int
    scheduled_ns: int

    def record(self, run: Run) -> RequestRecord:
        return finish_record(
            self.result,
            request_id=f"{self.session_id}-{self.turn_index}",
            session_id=self.session_id,
            turn_index=self.turn_index,
            warmup=self.warmup,
            prompt_tokens=self.prompt_tokens,
            expected_output_tokens=self.expected_output_tokens,
            scheduled_ns=self.scheduled_ns,
            origin_ns=run.origin_ns,
            counter=run.counter,
            keep_outputs=run.options.keep_outputs,
        )


@dataclass(slots=True)
class _Prepared:
    session: Session
    request: bytes
    prompt_tokens: int


class _ReadyQueue:
    """A closed loop's next sessions, up to ``ahead`` of them with their first request built.

    ``take`` hands out the next one (building it if none is ready); ``refill`` tops the
    prepared ones up and is run after a send, off the path from a freed slot to a send.
    """

    def __init__(
        self, sessions: Sequence[Session], prepare: Callable[[Session, int], _Prepared], ahead: int
    ) -> None:
        self.total = len(sessions)
        self._it: Iterator[Session] = iter(sessions)
        self._prepare = prepare
        self._ahead = ahead
        self._ready: deque[_Prepared] = deque()
        self.refill()

    def take(self) -> _Prepared | None:
        if self._ready:
            return self._ready.popleft()
        s = next(self._it, None)
        return None if s is None else self._prepare(s, 0)

    def drain(self) -> int:
        """Drop every session left (none will be sent); return how many turns they had."""
        turns = sum(len(p.session.turns) for p in self._ready)
        self._ready.clear()
        turns += sum(len(s.turns) for s in self._it)
        return turns

    def refill(self) -> None:
        while len(self._ready) < self._ahead:
            s = next(self._it, None)
            if s is None:
                return
            self._ready.append(self._prepare(s, 0))


@dataclass(slots=True)
class _Phase:
    warmup: bool
    t0: int
    stop_at: int | None


class Run:
    """The state of one run (one workload, one server)."""

    def __init__(
        self,
        pool: HttpPool,
        workload: Workload,
        options: RunOptions,
        progress: ProgressFn | None,
        extra_body: Mapping[str, Any] | None,
    ) -> None:
        self.pool = pool
        self.workload = workload
        self.options = options
        chat = workload.spec.prompt.format == "chat"
        self.chat = chat
        self.path = CHAT_PATH if chat else COMPLETIONS_PATH
        self.prompt = _prompt_builder(workload, options)
        self.extra_body = extra_body
        self.counter = TokenCounter.from_path(options.tokenizer) if options.tokenizer else None
        self.scheduler = PreciseScheduler()
        self.finished: list[_Finished] = []
        self.total = workload.num_turns
        self.done = 0
        self.progress = progress
        self.last_progress_ns = 0
        self.origin_ns = 0
        self.duration_hit = False
        self.aborted: str | None = None
        self.on_failure: Callable[[int | None], Awaitable[str | None]] | None = None
        """Asked after each failed request, with its HTTP status (``None``: no HTTP answer):
        a reason to stop sending, or ``None``."""

    def abort(self, reason: str) -> None:
        """Send no more requests (the server died, say); requests in flight finish or fail
        on their own, and every finished one keeps its record."""
        if self.aborted is None:
            self.aborted = reason

    def _advance(self, n: int) -> None:
        self.done += n
        if self.progress is None:
            return
        now = perf_counter_ns()
        if self.done >= self.total or now - self.last_progress_ns >= PROGRESS_INTERVAL_NS:
            self.last_progress_ns = now
            self.progress(self.done, self.total)

    def prepare(self, s: Session, k: int) -> _Prepared:
        """Build turn ``k``'s request bytes (done ahead of its time where possible)."""
        prompt, n_prompt = self.prompt(s, k)
        body = build_body(
            model=self.options.model,
            prompt=prompt,
            max_tokens=s.turns[k].output_len,
            options=self.options,
            chat=self.chat,
            extra=self.extra_body,
        )
        return _Prepared(s, self.pool.request_bytes(self.path, body), n_prompt)

    async def session(
        self,
        first: _Prepared,
        scheduled: int,
        phase: _Phase,
        after_send: Callable[[], None] | None = None,
    ) -> None:
        """Send a session's turns in order; each after its think time.

        ``after_send`` is called once the first request is on its way (off the send path).
        """
        s = first.session
        opts = self.options
        turns = s.turns
        prev_done = scheduled
        prepared: _Prepared | None = first
        for k, turn in enumerate(turns):
            if k > 0:
                scheduled = prev_done + round(turn.think_s * 1e9)
            if phase.stop_at is not None and scheduled >= phase.stop_at:
                self.duration_hit = True
                self._advance(len(turns) - k)
                return
            if self.aborted is not None:
                self._advance(len(turns) - k)
                return
            if prepared is None:
                prepared = self.prepare(s, k)
            request, n_prompt = prepared.request, prepared.prompt_tokens
            prepared = None
            await self.scheduler.sleep_until(scheduled)
            if after_send is not None:
                asyncio.get_running_loop().call_soon(after_send)
                after_send = None
            res = await stream_request(
                self.pool, request, chat=self.chat, timeout_s=opts.request_timeout_s
            )
            self.finished.append(
                _Finished(res, s.id, k, phase.warmup, n_prompt, turn.output_len, scheduled)
            )
            done = done_time(res)
            if done is None:
                if self.on_failure is not None and self.aborted is None:
                    reason = await self.on_failure(res.status)
                    if reason is not None:
                        self.abort(reason)
                self._advance(len(turns) - k)
                return
            self._advance(1)
            prev_done = done

    async def _open_session(self, s: Session, t: int, phase: _Phase) -> None:
        await self.session(self.prepare(s, 0), t, phase)

    async def open_loop(self, sessions: Sequence[Session], phase: _Phase) -> None:
        """Start each session at its arrival offset; its task (and first request) is made
        ``OPEN_LOOP_LOOKAHEAD_NS`` ahead."""
        order = sorted(sessions, key=lambda s: s.turns[0].arrival_s or 0.0)
        # Finished tasks leave the set at once: gathering thousands of tasks at the end
        # would stall the loop (milliseconds) just before the last sends.
        tasks: set[asyncio.Task[None]] = set()
        failures: list[BaseException] = []

        def done(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            if not task.cancelled() and (exc := task.exception()) is not None:
                failures.append(exc)

        for i, s in enumerate(order):
            t = phase.t0 + round((s.turns[0].arrival_s or 0.0) * 1e9)
            if phase.stop_at is not None and t >= phase.stop_at:
                self.duration_hit = True
                self._advance(sum(len(x.turns) for x in order[i:]))
                break
            ahead = t - OPEN_LOOP_LOOKAHEAD_NS - perf_counter_ns()
            if ahead > 0:
                await asyncio.sleep(ahead / 1e9)
            if self.aborted is not None:
                self._advance(sum(len(x.turns) for x in order[i:]))
                break
            task = asyncio.create_task(self._open_session(s, t, phase))
            tasks.add(task)
            task.add_done_callback(done)
        while tasks:
            await asyncio.wait(list(tasks))
        if failures:
            raise failures[0]

    def closed_loop_queue(self, sessions: Sequence[Session], cap: int) -> _ReadyQueue:
        """The sessions of a closed loop, the next ``cap`` of them prepared ahead."""
        return _ReadyQueue(sessions, self.prepare, cap)

    async def closed_loop(self, queue: _ReadyQueue, cap: int, phase: _Phase) -> None:
        """Keep ``cap`` sessions going; each next one starts when one ends."""

        async def worker() -> None:
            scheduled = phase.t0
            while (item := queue.take()) is not None:
                if self.aborted is not None:
                    self._advance(len(item.session.turns) + queue.drain())
                    return
                if phase.stop_at is not None and scheduled >= phase.stop_at:
                    self.duration_hit = True
                    self._advance(len(item.session.turns) + queue.drain())
                    return
                await self.session(item, scheduled, phase, after_send=queue.refill)
                scheduled = perf_counter_ns()

        await asyncio.gather(*(worker() for _ in range(min(cap, queue.total))))

    async def phase(self, sessions: Sequence[Session], warmup: bool) -> _Phase:
        """Run ``sessions`` (the warm-up or the measured ones) on a clock of their own."""
        sessions = [s for s in sessions if s.turns]
        cap = self.workload.spec.arrival.max_in_flight
        # Open connections (all a closed loop needs; a few for an open loop) and build a
        # closed loop's first wave of requests before the clock starts, so the first sends
        # are not late by setup work.
        await self.pool.prewarm(min(cap or OPEN_LOOP_PREWARM, len(sessions)))
        queue = None if cap is None else self.closed_loop_queue(sessions, cap)
        t0 = perf_counter_ns() + PHASE_LEAD_NS
        duration = self.workload.spec.duration_s
        stop_at = None if warmup or duration is None else t0 + round(duration * 1e9)
        ph = _Phase(warmup=warmup, t0=t0, stop_at=stop_at)
        if queue is None:
            await self.open_loop(sessions, ph)
        else:
            await self.closed_loop(queue, cap or 1, ph)
        return ph

    def final_progress(self) -> None:
        if self.progress is not None and self.done < self.total:
            self.progress(self.done, self.total)

    def records(self) -> list[RequestRecord]:
        """Every request's record, warm-up first, in scheduled order (built now, after the
        run, so counting and hashing never slowed it)."""
        return sorted(
            (f.record(self) for f in self.finished),
            key=lambda r: (not r.warmup, r.scheduled_ns, r.session_id, r.turn_index),
        )

    def stopped_early(self, measured: Sequence[Session], sent: int) -> str | None:
        if self.aborted is not None:
            return f"aborted: {self.aborted}"
        if not self.duration_hit:
            return None
        total = sum(len(s.turns) for s in measured)
        return (
            f"duration_s {self.workload.spec.duration_s:g} reached: "
            f"{sent} of {total} measured requests sent"
        )


def measured_duration_s(measured: Sequence[RequestRecord]) -> float:
    """First measured send to last measured completion (the last token, or the failure)."""
    sent = [r.sent_ns for r in measured if r.sent_ns is not None]
    ends = [e for r in measured if (e := r.done_ns if r.ok else r.end_ns) is not None]
    if not sent or not ends:
        return 0.0
    return max((max(ends) - min(sent)) / 1e9, 0.0)
