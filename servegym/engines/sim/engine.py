"""Simulating a workload end to end: phases, sessions, arrivals, records, statistics.

:func:`simulate` drives a :class:`~servegym.workloads.model.Workload` through the
:class:`~servegym.engines.sim.scheduler.Scheduler` exactly as the HTTP load generator drives a
server (``servegym.loadgen.runner``): warm-up sessions first, as a phase of their own that
finishes before the measured phase starts (the engine, and its prefix cache, carry over);
open-loop sessions start at their first turn's ``arrival_s`` from the phase start; closed
loops keep ``max_in_flight`` sessions going, a new one starting when one ends; turn ``k+1``
of a session arrives ``think_s`` after turn ``k``'s last token; a failed turn ends its
session; ``spec.duration_s`` stops new sends that long after the measured phase starts.

A request whose prompt plus output exceeds ``max_model_len`` is refused on arrival, as vLLM
answers HTTP 400; its record carries the error and the run goes on.

Under the ``priority`` scheduling policy a turn's priority is minus its index in its session
(later turns of a session first, as an agent harness would ask, so a session's growing
context is not evicted between turns); single-turn requests all have priority 0 and run in
arrival order. A real engine only sees priorities the client sends, so the HTTP client
must send the same values for the tracks to agree.

What is approximated, in one place (each is explained where it is modelled): speculative
acceptance by its expectation (:mod:`.speculative`); decoding requests scheduled ahead of
running prefill chunks (:mod:`.scheduler`); the step's CPU overhead added to its GPU time
(no overlap from asynchronous scheduling); the API server as one queue that takes each
request a fixed time plus a time per prompt token before the scheduler sees it (the engine
profile's ``api_request_ms`` and ``api_per_token_us``, :mod:`.scheduler`) and, on the same
queue, a fixed time per streamed chunk (``api_chunk_us``): tokens reach the client when the
server has sent the chunk of the step that made them (at the step's end when it costs
nothing), with no network or client latency on top; the
activation reserve scaled with the token budget (:mod:`.launch`).

Records are in virtual nanoseconds from the start of the run (the warm-up phase's start):
``scheduled_ns = sent_ns`` = arrival (the simulated client never lags), one chunk per engine
step that yielded tokens for the request, ``first_token_ns`` = when the chunk of the step that
produced the first token was sent, ``done_ns = end_ns`` = the last token's. Output counts are exact
(``recount_source = "token_ids"``): the engine produces the forced length.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from servegym.engines.sim.launch import LaunchedEngine
from servegym.engines.sim.noise import Noise
from servegym.engines.sim.prefix_cache import session_chains
from servegym.engines.sim.scheduler import Scheduler
from servegym.loadgen.records import RequestRecord
from servegym.workloads.model import Workload

NS = 1e9


class SimStats(BaseModel):
    """Engine-side figures of one simulated run (``sim.json``).

    Counters (preemptions, prefix-cache tokens, steps, batch sizes) cover the whole run,
    warm-up included, except the ``measured_*`` fields; ``startup_s`` is not part of the
    run's virtual time.
    """

    model_config = ConfigDict(extra="forbid")

    model: str
    hardware: str
    num_gpus: int
    config: dict[str, object] = Field(description="every knob, defaults resolved")
    startup_s: float = Field(description="simulated engine start-up (load, compile, graphs)")
    weight_gib_per_gpu: float
    kv_cache_gib_per_gpu: float
    kv_capacity_tokens: int
    kv_blocks: int
    block_size: int
    peak_kv_usage: float = Field(description="largest fraction of KV blocks in use")
    preemptions: int
    measured_preemptions: int
    prefix_cache_queries: int = Field(description="prompt tokens looked up (first admissions)")
    prefix_cache_hits: int = Field(description="of those, tokens found cached")
    prefix_cache_hit_rate: float | None
    steps: int
    mean_batch_size: float = Field(description="requests scheduled per step")
    mean_tokens_per_step: float
    busy_s: float = Field(description="virtual time the engine spent in steps")
    virtual_s: float = Field(description="virtual time from the run's start to its end")
    prompt_tokens_computed: int = Field(description="prefill tokens computed (after hits)")
    generated_tokens: int
    rejected_requests: int
    accuracy_ratio: float = Field(description="modelled accuracy relative to bf16")
    speculative: dict[str, object] | None = None
    noise_seed: int | None
    notes: list[str] = Field(default_factory=list, description="what the simulator ignored")
    wall_s: float = Field(description="real seconds the simulation took")


@dataclass(slots=True)
class SimRun:
    """Everything one simulation produced."""

    records: list[RequestRecord]
    stats: SimStats
    startup_s: float
    duration_s: float
    """First measured send to last measured completion (virtual seconds)."""
    stopped_early: str | None
    server_metrics_delta: dict[str, float]


class _Phase:
    """One phase (warm-up or measured): its sessions and how they start."""

    def __init__(
        self, sim: _Simulation, first: int, last: int, t0: float, stop_at: float | None
    ) -> None:
        self.sim = sim
        self.t0 = t0
        self.stop_at = stop_at
        self.sessions = [i for i in range(first, last) if sim.turn_start[i + 1] > sim.turn_start[i]]
        self.next_session = 0
        self.unsent = 0
        self.hit_stop = False

    def start(self) -> None:
        sim = self.sim
        cap = sim.workload.spec.arrival.max_in_flight
        if cap is None:
            order = sorted(self.sessions, key=lambda i: (sim.first_arrival[i], i))
            for i in order:
                self.start_turn(i, 0, self.t0 + sim.first_arrival[i])
            self.next_session = len(self.sessions)
        else:
            for _ in range(min(cap, len(self.sessions))):
                self.start_next(self.t0)

    def start_next(self, t: float) -> None:
        """Closed loop: start the next waiting session at ``t``."""
        while self.next_session < len(self.sessions):
            i = self.sessions[self.next_session]
            self.next_session += 1
            if self.start_turn(i, 0, t):
                return
            # A session that ended at once (refused, or past the duration) frees its slot.

    def start_turn(self, i: int, k: int, t: float) -> bool:
        """Send turn ``k`` of session ``i`` at ``t``; False when the session ends instead."""
        sim = self.sim
        r = int(sim.turn_start[i]) + k
        if self.stop_at is not None and t >= self.stop_at:
            self.hit_stop = True
            self.unsent += int(sim.turn_start[i + 1]) - r
            if self.sim.closed:
                # Nothing else will be sent; count every remaining session's turns too.
                for j in self.sessions[self.next_session :]:
                    self.unsent += int(sim.turn_start[j + 1] - sim.turn_start[j])
                self.next_session = len(self.sessions)
            return False
        sim.sent_t[r] = t
        if sim.P[r] + sim.O[r] > sim.max_model_len:
            sim.rejected[r] = True
            return False
        sim.scheduler.add_arrival(r, t)
        return True

    def done(self, r: int, t: float) -> None:
        sim = self.sim
        i = int(sim.session_of[r])
        k = r - int(sim.turn_start[i])
        if r + 1 < int(sim.turn_start[i + 1]):
            t_next = t + sim.think[r + 1]
            if self.start_turn(i, k + 1, t_next):
                return
            t = t_next  # refused: the session ends when the refusal comes back
        if sim.closed:
            self.start_next(t)


class _Simulation:
    def __init__(
        self,
        engine: LaunchedEngine,
        workload: Workload,
        noise: Noise,
        event_skipping: bool,
        observer: Callable[[int, int, int, int], None] | None = None,
    ) -> None:
        self.engine = engine
        self.workload = workload
        sessions = workload.sessions
        counts = np.fromiter((len(s.turns) for s in sessions), dtype=np.int64, count=len(sessions))
        self.turn_start = np.zeros(len(sessions) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.turn_start[1:])
        n = int(self.turn_start[-1])
        self.session_of = np.repeat(np.arange(len(sessions), dtype=np.int64), counts)
        turns = [t for s in sessions for t in s.turns]
        self.P = np.fromiter((t.prompt_len for t in turns), dtype=np.int64, count=n)
        self.O = np.fromiter((t.output_len for t in turns), dtype=np.int64, count=n)
        self.think = [t.think_s for t in turns]
        self.first_arrival = [(s.turns[0].arrival_s or 0.0) if s.turns else 0.0 for s in sessions]
        self.turn_index = np.arange(n, dtype=np.int64) - np.repeat(self.turn_start[:-1], counts)
        self.max_model_len = engine.config.max_model_len
        self.closed = workload.spec.arrival.max_in_flight is not None
        self.sent_t = np.full(n, np.nan)
        self.rejected = np.zeros(n, dtype=bool)

        chains = None
        if engine.config.enable_prefix_caching:
            per_session = session_chains(
                workload.prefixes,
                [(s.prefix_id, s.tokens) for s in sessions],
                engine.block_size,
            )
            chains = [per_session[i] for i in self.session_of.tolist()]
            shared = _shared_leading_blocks(per_session)[self.session_of]
        else:
            shared = np.zeros(n, dtype=np.int64)
        last_turn = np.zeros(n, dtype=bool)
        last_turn[self.turn_start[1:][counts > 0] - 1] = True
        # Priority policy: later turns of a session first (lower value runs first).
        priority = -self.turn_index
        self.phase: _Phase | None = None
        self.scheduler = Scheduler(
            engine,
            noise,
            self.P,
            self.O,
            chains,
            priority,
            self._on_done,
            shared_blocks=shared,
            reused_later=~last_turn,
            follows_turn=self.turn_index > 0,
            event_skipping=event_skipping,
            observer=observer,
        )

    def _on_done(self, r: int, t: float) -> None:
        assert self.phase is not None
        self.phase.done(r, t)

    def run_phase(self, first: int, last: int, t0: float, stop_at: float | None) -> _Phase:
        self.phase = _Phase(self, first, last, t0, stop_at)
        self.phase.start()
        self.scheduler.run()
        return self.phase


def _shared_leading_blocks(chains: list[np.ndarray]) -> np.ndarray:
    """For each session's block chain, how many leading blocks another session's chain also
    holds (chain hashes name whole prefixes, so the shared blocks always lead)."""
    m = len(chains)
    lens = np.fromiter((len(c) for c in chains), dtype=np.int64, count=m)
    out = np.zeros(m, dtype=np.int64)
    if m == 0 or lens.sum() == 0:
        return out
    nonempty = lens > 0
    firsts = np.array([c[0] for c in chains if len(c)], dtype=np.int64)
    if len(np.unique(firsts)) == len(firsts):
        return out  # no two sessions share even their first block, hence no block at all
    flat = np.concatenate(chains)
    _, inverse, counts = np.unique(flat, return_inverse=True, return_counts=True)
    shared = counts[inverse] > 1
    starts = np.cumsum(lens) - lens
    local = np.arange(len(flat), dtype=np.int64) - np.repeat(starts, lens)
    first_unshared = np.where(shared, np.iinfo(np.int64).max, local)
    mins = np.minimum.reduceat(first_unshared, starts[nonempty])
    out[nonempty] = np.minimum(mins, lens[nonempty])
    return out


def simulate(
    engine: LaunchedEngine,
    workload: Workload,
    *,
    noise: bool = True,
    noise_seed: int | None = None,
    event_skipping: bool = True,
    observer: Callable[[int, int, int, int], None] | None = None,
) -> SimRun:
    """Run ``workload`` on the launched engine in virtual time.

    ``noise_seed`` defaults to the workload's seed. ``event_skipping=False`` simulates every
    step on the general path (slow; for checking the fast path, which must agree).
    ``observer`` sees every step (see :class:`~servegym.engines.sim.scheduler.Scheduler`).

    Automatic garbage collection is paused meanwhile: building a run's records allocates
    a few thousand lists that would trigger full collections over every live object (a
    third of the records' cost, measured), and a simulation makes no cyclic garbage.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(engine, workload, noise, noise_seed, event_skipping, observer)
    finally:
        if was_enabled:
            gc.enable()


def _simulate(
    engine: LaunchedEngine,
    workload: Workload,
    noise: bool,
    noise_seed: int | None,
    event_skipping: bool,
    observer: Callable[[int, int, int, int], None] | None,
) -> SimRun:
    """Run the warm-up phase, then the measured phase (counting what the engine did in it),
    then build the records and the run's figures."""
    wall0 = time.perf_counter()
    seed = workload.seed if noise_seed is None else noise_seed
    nz = Noise(seed, enabled=noise)
    sim = _Simulation(engine, workload, nz, event_skipping, observer)
    sched = sim.scheduler
    w = workload.warmup_sessions
    n_sessions = len(workload.sessions)

    sim.run_phase(0, w, 0.0, None)
    before = _counters(sched)
    t_measured = sched.now
    spec_duration = workload.spec.duration_s
    stop_at = None if spec_duration is None else t_measured + spec_duration
    measured = sim.run_phase(w, n_sessions, t_measured, stop_at)
    after = _counters(sched)

    records = _records(sim, w)
    duration = _measured_duration(records)
    stopped = _stopped_early(sim, measured, w, spec_duration)
    stats = _stats(sim, nz, seed if noise else None, before, after, wall0)
    return SimRun(
        records=records,
        stats=stats,
        startup_s=stats.startup_s,
        duration_s=duration,
        stopped_early=stopped,
        server_metrics_delta=_server_metrics_delta(before, after),
    )


def _measured_duration(records: list[RequestRecord]) -> float:
    """Virtual seconds from the first measured send to the last measured end (a failed
    request's end when it has no completion), as the load generator measures it."""
    meas = [r for r in records if not r.warmup]
    sent = [r.sent_ns for r in meas if r.sent_ns is not None]
    ends = [e for r in meas if (e := r.done_ns if r.error is None else r.end_ns) is not None]
    return max((max(ends) - min(sent)) / NS, 0.0) if sent and ends else 0.0


def _stopped_early(
    sim: _Simulation, measured: _Phase, warmup_sessions: int, spec_duration: float | None
) -> str | None:
    """Why the measured phase stopped sending before its last request, if it did."""
    if not measured.hit_stop:
        return None
    total = int(sim.turn_start[-1] - sim.turn_start[warmup_sessions])
    return (
        f"duration_s {spec_duration:g} reached: {total - measured.unsent} of {total} "
        "measured requests sent"
    )


def _stats(
    sim: _Simulation,
    nz: Noise,
    noise_seed: int | None,
    before: dict[str, int],
    after: dict[str, int],
    wall0: float,
) -> SimStats:
    """The engine-side figures of the run: the launch's memory plan, the scheduler's
    counters (whole run; preemptions also for the measured phase alone), the speculative
    plan and what the simulator ignored."""
    engine = sim.engine
    sched = sim.scheduler
    cache = sched.cache
    queries = cache.queried_tokens if cache is not None else 0
    hits = cache.hit_tokens if cache is not None else 0
    steps = sched.step
    return SimStats(
        model=engine.model.id,
        hardware=engine.hardware.id,
        num_gpus=engine.num_gpus,
        config=engine.config.as_dict(),
        startup_s=engine.startup_s * nz.run_factor,
        weight_gib_per_gpu=engine.weight_bytes_per_gpu / 1024**3,
        kv_cache_gib_per_gpu=engine.kv_cache_bytes_per_gpu / 1024**3,
        kv_capacity_tokens=engine.kv_capacity_tokens,
        kv_blocks=engine.num_blocks,
        block_size=engine.block_size,
        peak_kv_usage=sched.pool.peak_used / engine.num_blocks,
        preemptions=sched.preemptions,
        measured_preemptions=after["preemptions"] - before["preemptions"],
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=(hits / queries) if queries else None,
        steps=steps,
        mean_batch_size=sched.sum_batch / steps if steps else 0.0,
        mean_tokens_per_step=sched.sum_tokens / steps if steps else 0.0,
        busy_s=sched.busy_s,
        virtual_s=sched.now,
        prompt_tokens_computed=sched.prompt_tokens_computed,
        generated_tokens=sched.generated_tokens,
        rejected_requests=int(sim.rejected.sum()),
        accuracy_ratio=engine.accuracy_ratio,
        speculative=_speculative_stats(engine),
        noise_seed=noise_seed,
        notes=_notes(engine),
        wall_s=time.perf_counter() - wall0,
    )


def _speculative_stats(engine: LaunchedEngine) -> dict[str, object] | None:
    """The speculative plan as ``sim.json`` reports it (None when speculation is off)."""
    spec = engine.spec
    if spec is None:
        return None
    return {
        "method": spec.method,
        "num_speculative_tokens": spec.k,
        "acceptance_rate": spec.rate,
        "match_rate": spec.match_rate,
        "mean_tokens_per_step": spec.tokens_per_step,
        "source": spec.source,
    }


def _server_metrics_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """The measured phase's counters under the names of vLLM's Prometheus metrics, as the
    HTTP target reads them from ``/metrics`` before and after its run."""
    delta = {k: float(after[k] - before[k]) for k in after}
    return {
        "vllm:num_preemptions_total": delta["preemptions"],
        "vllm:prefix_cache_queries_total": delta["queries"],
        "vllm:prefix_cache_hits_total": delta["hits"],
        "vllm:prompt_tokens_total": delta["prompt_tokens"],
        "vllm:generation_tokens_total": delta["generated"],
    }


def _notes(engine: LaunchedEngine) -> list[str]:
    cfg = engine.config
    notes: list[str] = []
    if cfg.extra_args:
        notes.append(f"extra_args not modelled, ignored: {' '.join(cfg.extra_args)}")
    env = [
        k
        for k, _ in cfg.env
        if k not in ("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_ATTENTION_BACKEND")
    ]
    if env:
        notes.append(f"env not modelled, ignored: {', '.join(env)}")
    return notes


def _counters(sched: Scheduler) -> dict[str, int]:
    cache = sched.cache
    admitted = np.array(sched.admitted_once, dtype=bool)
    return {
        "preemptions": sched.preemptions,
        "queries": cache.queried_tokens if cache is not None else 0,
        "hits": cache.hit_tokens if cache is not None else 0,
        "prompt_tokens": int(sched.P[admitted].sum()),
        "generated": sched.generated_tokens,
    }


_FIELDS = tuple(RequestRecord.model_fields)
_FIELDS_SET = frozenset(_FIELDS)
_new = object.__new__
_set = object.__setattr__


def _record(values: dict[str, object]) -> RequestRecord:
    """``RequestRecord.model_construct(**values)`` for a dict of every field: the same
    object (pydantic's own construct path) without its per-field default handling, which
    costs more than the rest of building a record. Fields are put in declaration order, so
    a record serialises exactly as the HTTP target's do."""
    rec: RequestRecord = _new(RequestRecord)
    _set(rec, "__dict__", {f: values[f] for f in _FIELDS})
    _set(rec, "__pydantic_fields_set__", set(_FIELDS_SET))
    _set(rec, "__pydantic_extra__", None)
    _set(rec, "__pydantic_private__", None)
    return rec


def _records(sim: _Simulation, warmup_sessions: int) -> list[RequestRecord]:
    """Build every sent request's record from the step times and emission intervals.

    Every request decoding in a step gets that step's time: the timestamps are one
    Python int per step, shared by reference between the records' ``chunk_ns`` lists (list
    slices), so building records costs little more than one reference per token.
    """
    sched = sim.scheduler
    n = len(sim.P)
    t_list = _emitted_ns(sched)
    d_list = _tokens_per_step(sched) if sched.spec else None
    ivs = _emission_intervals(sched)

    sent_ns = np.rint(sim.sent_t * NS).tolist()
    session_ids = [s.id for s in sim.workload.sessions]
    warm_limit = int(sim.turn_start[warmup_sessions])
    prompt = sim.P.tolist()
    out_len = sim.O.tolist()
    session_of = sim.session_of.tolist()
    turn_index = sim.turn_index.tolist()
    rejected = sim.rejected.tolist()
    max_len = sim.max_model_len
    out: list[RequestRecord] = []
    for r in range(n):
        s_ns = sent_ns[r]
        if s_ns != s_ns:  # NaN: never sent (the duration was reached)
            continue
        sent = int(s_ns)
        sid = session_ids[session_of[r]]
        k = turn_index[r]
        p, o = prompt[r], out_len[r]
        # Fields every record shares; a rejected and a served request differ only below.
        base: dict[str, object] = {
            "request_id": f"{sid}-{k}",
            "session_id": sid,
            "turn_index": k,
            "warmup": r < warm_limit,
            "prompt_tokens": p,
            "expected_output_tokens": o,
            "scheduled_ns": sent,
            "sent_ns": sent,
            "empty_chunk_ns": [],
            "output_hash": None,
            "output_text": None,
            "output_token_ids": None,
        }
        if rejected[r]:
            _add_rejected_fields(base, sent, p, o, max_len)
        else:
            _add_served_fields(base, ivs[r], t_list, d_list, p, o)
        out.append(_record(base))
    out.sort(key=lambda rec: (not rec.warmup, rec.scheduled_ns, rec.session_id, rec.turn_index))
    return out


def _emitted_ns(sched: Scheduler) -> list[int]:
    """When each step's tokens reached the client (its end, or with a streaming API server
    when its chunks were sent), in integer virtual nanoseconds (one Python int per step)."""
    ns: list[int] = np.rint(sched.emitted_at() * NS).astype(np.int64).tolist()
    return ns


def _tokens_per_step(sched: Scheduler) -> list[int]:
    """Tokens each decoding request yields per step under speculation: the expected
    ``tokens_per_step`` spread over steps as whole tokens (floor of the running sum)."""
    e = sched.E
    s = np.arange(sched.step + 1, dtype=np.float64)
    tokens: list[int] = np.diff(np.floor(s * e)).astype(np.int64).tolist()
    return tokens


def _emission_intervals(sched: Scheduler) -> dict[int, list[tuple[int, int, bool]]]:
    """Per request, its emission intervals in time order: steps ``[lo, hi)`` in which it
    yielded tokens, and whether the first of them ended a prefill (one token)."""
    ivs: dict[int, list[tuple[int, int, bool]]] = {}
    for r, lo, hi, pf in sorted(
        zip(sched.iv_r, sched.iv_lo, sched.iv_hi, sched.iv_pf, strict=True)
    ):
        ivs.setdefault(r, []).append((lo, hi, pf))
    return ivs


def _add_rejected_fields(base: dict[str, object], sent: int, p: int, o: int, max_len: int) -> None:
    """A request refused on arrival: no tokens, HTTP 400 with vLLM's context-length text."""
    base.update(
        first_token_ns=None,
        done_ns=None,
        end_ns=sent,
        chunk_ns=[],
        chunk_tokens=[],
        usage_prompt_tokens=None,
        usage_completion_tokens=None,
        output_tokens=0,
        recount_source="none",
        http_status=400,
        error=(
            f"HTTP 400: This model's maximum context length is {max_len} "
            f"tokens. However, you requested {p + o} tokens ({p} in the "
            f"messages, {o} in the completion). Please reduce the length of "
            "the messages or completion."
        ),
    )


def _add_served_fields(
    base: dict[str, object],
    parts: list[tuple[int, int, bool]],
    t_list: list[int],
    d_list: list[int] | None,
    p: int,
    o: int,
) -> None:
    """A served request: one chunk per step of its emission intervals (``parts``), of one
    token each, or under speculation the step's ``d_list`` tokens (one for the step that
    ended its prefill; the last chunk trimmed to the forced length)."""
    if len(parts) == 1:
        lo, hi, pf = parts[0]
        chunk_ns = t_list[lo:hi]
    else:
        chunk_ns = []
        for lo, hi, _ in parts:
            chunk_ns += t_list[lo:hi]
    if d_list is not None:
        chunk_tokens: list[int] = []
        for lo, hi, pf in parts:
            piece = d_list[lo:hi]
            if pf:
                piece[0] = 1
            chunk_tokens += piece
        chunk_tokens[-1] -= sum(chunk_tokens) - o
    else:
        chunk_tokens = [1] * len(chunk_ns)
    last = chunk_ns[-1]
    base.update(
        first_token_ns=chunk_ns[0],
        done_ns=last,
        end_ns=last,
        chunk_ns=chunk_ns,
        chunk_tokens=chunk_tokens,
        usage_prompt_tokens=p,
        usage_completion_tokens=o,
        output_tokens=o,
        recount_source="token_ids",
        http_status=200,
        error=None,
    )
