"""Simulating a pipeline deployment on a workload of questions, in virtual time.

Each measured session of the workload is one question (a *pipeline task*): its first
turn's prompt length is the question's length, its output length the answer's, its arrival
the question's. A question flows through the stages:

1. **decompose** (LLM, main server): ``system + question`` tokens in,
   ``decompose_tokens_per_sub_query`` per sub-query out; a question has between
   ``sub_queries_min`` and ``sub_queries_max`` sub-queries (drawn per question from the
   workload's seed);
2. per round, for the sub-queries still open: **embed** (encoder batches on the GPU),
   **retrieve** (one HNSW search per sub-query on the host's cores), **rerank** (the
   cross-encoder reads ``rerank_depth`` (query, passage) pairs per sub-query), **grade**
   (LLM, the main server or a dedicated one: the kept passages in, a verdict per passage
   out). The grader finds a sub-query supported when its round retrieved the supporting
   passage (probability :func:`~servegym.pipeline.cost.round_recall`, decided by a uniform
   drawn per question, sub-query and round from the workload's seed, the same for every
   config); unsupported sub-queries go round again, up to ``max_rounds`` rounds in all;
3. **answer** (LLM, main server): ``system + question + passages`` in, the answer out.

At most ``concurrency`` questions are in the pipeline at once; the others wait for a slot
(that wait is part of a question's latency, but no stage's time). A stage's time for a
question is from the moment it was handed to the stage until its last piece finished,
queueing included; rounds add to the repeated stages' times.

**Servers share one clock.** Every LLM server is the simulator's own
:class:`~servegym.engines.sim.scheduler.Scheduler` (so ``max_num_seqs``, the token budget,
the KV cache, prefix caching, quantization ... all matter), advanced in turn: the one
whose next step starts first runs until the next event of the pipeline or of another
server (:meth:`Scheduler.run` with ``until``). A request handed to a server whose last
step is still running waits for that step's end, as on a real engine. Prompts of one stage
share their system prompt, which the prefix cache can reuse.

A request longer than the server's ``max_model_len`` is refused (as vLLM's HTTP 400): its
question fails and counts in the integrity figures.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from servegym.engines.sim.launch import LaunchedEngine
from servegym.engines.sim.noise import Noise
from servegym.engines.sim.scheduler import Scheduler
from servegym.pipeline.cost import encoder_batch_s, round_recall, search_s
from servegym.pipeline.engine import PipelineEngine
from servegym.pipeline.result import PipelineResult, TaskRecord
from servegym.workloads.model import Workload

MAX_ROUNDS = 8
"""Rounds of uniforms drawn per question (the knob's upper bound), whatever max_rounds is,
so every config sees the same draws."""
MAX_SUB_QUERIES = 16
_STAGE_IDS = {"decompose": 1, "grade": 2, "answer": 3}
_UNIQUE_BASE = 1 << 44

Callback = Callable[[float], None]


@dataclass(slots=True)
class Question:
    """One pipeline task's plan and progress."""

    index: int
    arrival: float
    question_tokens: int
    answer_tokens: int
    sub_queries: int
    open_per_round: list[int]
    """Sub-queries still open at the start of each round the question runs."""
    found: int
    stage_s: dict[str, float] = field(default_factory=dict)
    failed: bool = False

    def add(self, stage: str, seconds: float) -> None:
        self.stage_s[stage] = self.stage_s.get(stage, 0.0) + seconds


@dataclass(frozen=True, slots=True)
class PipelineRun:
    """What one simulated pipeline run produced."""

    result: PipelineResult
    sim_seconds: float
    requests: int
    """LLM requests sent."""
    failed: int
    """LLM requests refused (longer than max_model_len)."""


class _Server:
    """One LLM server: a scheduler over a fixed set of planned requests."""

    def __init__(
        self, engine: LaunchedEngine, noise: Noise, prompts: list[int], outputs: list[int],
        stages: list[int], system_tokens: int, on_done: Callable[[int, float], None],
    ) -> None:  # fmt: skip
        self.engine = engine
        prompt_len = np.array(prompts, dtype=np.int64)
        output_len = np.array(outputs, dtype=np.int64)
        chains = None
        if engine.config.enable_prefix_caching:
            chains = _chains(prompt_len, stages, system_tokens, engine.block_size)
        self.scheduler = Scheduler(
            engine, noise, prompt_len, output_len, chains,
            np.zeros(len(prompts), dtype=np.int64), on_done,
        )  # fmt: skip
        self.max_len = engine.config.max_model_len
        self.P = prompts
        self.O = outputs


def _chains(
    P: np.ndarray, stages: list[int], system_tokens: int, block_size: int
) -> list[np.ndarray]:
    """Block chain hashes: a stage's system-prompt blocks are shared by its requests, the
    rest are each request's own."""
    shared = system_tokens // block_size
    out: list[np.ndarray] = []
    for r, (p, stage) in enumerate(zip(P.tolist(), stages, strict=True)):
        n = p // block_size
        ids = np.arange(n, dtype=np.int64)
        own = _UNIQUE_BASE + r * 8192 + ids
        out.append(np.where(ids < shared, stage * 1_000_003 + ids, own))
    return out


class _EncoderLane:
    """The embedder and reranker on the GPU: FIFO, dynamic batches of one model."""

    def __init__(self, sim: _PipelineSim, batch_size: int, factor: float) -> None:
        self.sim = sim
        self.batch_size = batch_size
        self.factor = factor
        self.queue: deque[list[object]] = deque()
        self.busy = False

    def submit(self, params: float, seqs: int, tokens: int, t: float, done: Callback) -> None:
        self.queue.append([params, seqs, tokens, done])
        if not self.busy:
            self._start(t)

    def _start(self, t: float) -> None:
        if not self.queue:
            self.busy = False
            return
        self.busy = True
        params = self.queue[0][0]
        tokens = int(self.queue[0][2])  # type: ignore[call-overload]
        room = self.batch_size
        parts: list[tuple[list[object], int]] = []
        for job in self.queue:
            if job[0] != params or room == 0:
                break
            take = min(room, int(job[1]))  # type: ignore[call-overload]
            parts.append((job, take))
            room -= take
        seqs = self.batch_size - room
        dt = encoder_batch_s(self.sim.hw, float(params), seqs, tokens) * self.factor  # type: ignore[arg-type]
        self.sim.at(t + dt, lambda t2: self._finish(parts, t2))

    def _finish(self, parts: list[tuple[list[object], int]], t: float) -> None:
        for job, take in parts:
            job[1] = int(job[1]) - take  # type: ignore[call-overload]
            if job[1] == 0:
                self.queue.remove(job)
                done: Callback = job[3]  # type: ignore[assignment]
                done(t)
        self._start(t)


class _CpuLane:
    """The host's cores searching the index: each search on the first free core."""

    def __init__(self, sim: _PipelineSim, cores: int) -> None:
        self.sim = sim
        self.free_at = [0.0] * cores

    def submit(self, seconds: float, t: float, done: Callback) -> None:
        start = max(t, heapq.heappop(self.free_at))
        heapq.heappush(self.free_at, start + seconds)
        self.sim.at(start + seconds, done)


class _PipelineSim:
    def __init__(
        self, engine: PipelineEngine, workload: Workload, noise_seed: int, noise: bool
    ) -> None:
        self.engine = engine
        self.knobs = knobs = engine.knobs
        self.spec = spec = engine.pipeline
        self.hw = engine.hardware
        self.events: list[tuple[float, int, Callback]] = []
        self._seq = 0
        self.questions = _plan(engine, workload)
        lane_noise = Noise(noise_seed ^ 0x5EED, enabled=noise)
        self.encoder = _EncoderLane(self, knobs.embed_batch_size, lane_noise.run_factor)
        self.cpu = _CpuLane(self, spec.cpu_cores)
        self.search_s = search_s(spec, knobs) * lane_noise.run_factor
        # Plan every LLM request up front: (server, local index) per (question, stage, round).
        grade_on_main = engine.grade is None
        plans: list[tuple[list[int], list[int], list[int]]] = [([], [], []), ([], [], [])]
        self.where: dict[tuple[int, str, int], tuple[int, int]] = {}
        self.owner: list[list[tuple[int, str, int]]] = [[], []]
        sys_t = spec.system_prompt_tokens
        kept = spec.passages_kept * spec.passage_tokens
        for q in self.questions:
            reqs = [("decompose", 0, 0, sys_t + q.question_tokens,
                     spec.decompose_tokens_per_sub_query * q.sub_queries)]  # fmt: skip
            per_passage = spec.grade_tokens_per_passage * spec.passages_kept
            for r, n_open in enumerate(q.open_per_round):
                reqs.append(("grade", r, 0 if grade_on_main else 1,
                             sys_t + q.question_tokens + n_open * kept,
                             per_passage * n_open))  # fmt: skip
            reqs.append(("answer", 0, 0, sys_t + q.question_tokens + q.sub_queries * kept,
                         q.answer_tokens))  # fmt: skip
            for stage, rnd, server, p, o in reqs:
                prompts, outputs, stages = plans[server]
                self.where[(q.index, stage, rnd)] = (server, len(prompts))
                self.owner[server].append((q.index, stage, rnd))
                prompts.append(p)
                outputs.append(o)
                stages.append(_STAGE_IDS[stage])
        engines: list[LaunchedEngine] = [engine.main]
        if engine.grade is not None:
            engines.append(engine.grade)
        self.servers: list[_Server] = []
        for i, eng in enumerate(engines):
            prompts, outputs, stages = plans[i]
            self.servers.append(
                _Server(
                    eng,
                    Noise(noise_seed + 7919 * i, enabled=noise),
                    prompts,
                    outputs,
                    stages,
                    sys_t,
                    partial(self._llm_finished, i),
                )
            )
        self.sent_at: dict[tuple[int, int], float] = {}
        self.requests = 0
        self.failed = 0
        self.in_flight = 0
        self.waiting: deque[Question] = deque()
        self.done_at: dict[int, float] = {}
        self.now = 0.0

    # --- events -------------------------------------------------------------------------

    def at(self, t: float, fn: Callback) -> None:
        heapq.heappush(self.events, (t, self._seq, fn))
        self._seq += 1

    def run(self) -> None:
        for q in self.questions:
            self.at(q.arrival, partial(self._arrive, q))
        eps = 1e-9
        while True:
            t_ev = self.events[0][0] if self.events else math.inf
            starts = [s.scheduler.next_start() for s in self.servers]
            busy = [(t, i) for i, t in enumerate(starts) if t is not None]
            t_srv, i_srv = min(busy) if busy else (math.inf, -1)
            if t_ev == math.inf and t_srv == math.inf:
                break
            if t_ev <= t_srv:
                t, _, fn = heapq.heappop(self.events)
                self.now = max(self.now, t)
                fn(t)
                continue
            others = [t for t, i in busy if i != i_srv]
            until = min([t_ev, *others])
            self.servers[i_srv].scheduler.run(until=max(until, t_srv + eps))
            self.now = max(self.now, self.servers[i_srv].scheduler.now)

    # --- the flow of one question -------------------------------------------------------

    def _arrive(self, q: Question, t: float) -> None:
        if self.in_flight < self.knobs.concurrency:
            self._start(q, t)
        else:
            self.waiting.append(q)

    def _start(self, q: Question, t: float) -> None:
        self.in_flight += 1
        self._llm(q, "decompose", 0, t)

    def _finish(self, q: Question, t: float) -> None:
        self.in_flight -= 1
        self.done_at[q.index] = t
        if self.waiting:
            self._start(self.waiting.popleft(), t)

    def _llm(self, q: Question, stage: str, rnd: int, t: float) -> None:
        server, r = self.where[(q.index, stage, rnd)]
        s = self.servers[server]
        self.requests += 1
        if s.P[r] + s.O[r] > s.max_len:  # refused, as vLLM's HTTP 400
            self.failed += 1
            q.failed = True
            self._finish(q, t)
            return
        self.sent_at[(server, r)] = t
        s.scheduler.add_arrival(r, t)

    def _llm_finished(self, server: int, r: int, t: float) -> None:
        """A server's completion callback: handled as an event at ``t``, in time order
        with the pipeline's own events."""
        self.at(t, partial(self._llm_done, server, r))

    def _llm_done(self, server: int, r: int, t: float) -> None:
        index, stage, rnd = self.owner[server][r]
        q = self.questions[index]
        q.add(stage, t - self.sent_at[(server, r)])
        if stage == "decompose":
            self._round(q, 0, t)
        elif stage == "grade":
            if rnd + 1 < len(q.open_per_round):
                self._round(q, rnd + 1, t)
            else:
                self._llm(q, "answer", 0, t)
        else:
            self._finish(q, t)

    def _round(self, q: Question, rnd: int, t0: float) -> None:
        n_open = q.open_per_round[rnd]
        spec, knobs = self.spec, self.knobs

        def embedded(t1: float) -> None:
            q.add("embed", t1 - t0)
            left = [n_open]

            def searched(t2: float) -> None:
                left[0] -= 1
                if left[0] == 0:
                    q.add("retrieve", t2 - t1)
                    self.encoder.submit(
                        spec.reranker_params, n_open * knobs.rerank_depth,
                        spec.query_tokens + spec.passage_tokens, t2,
                        lambda t3: reranked(t2, t3),
                    )  # fmt: skip

            for _ in range(n_open):
                self.cpu.submit(self.search_s, t1, searched)

        def reranked(t2: float, t3: float) -> None:
            q.add("rerank", t3 - t2)
            self._llm(q, "grade", rnd, t3)

        self.encoder.submit(spec.embedder_params, n_open, spec.query_tokens, t0, embedded)

    # --- result -------------------------------------------------------------------------

    def result(self, task_id: str | None) -> PipelineRun:
        records: list[TaskRecord] = []
        for q in self.questions:
            if q.failed or q.index not in self.done_at:
                continue
            records.append(
                TaskRecord(
                    index=q.index,
                    latency_s=self.done_at[q.index] - q.arrival,
                    rounds=len(q.open_per_round),
                    stage_s=dict(q.stage_s),
                )
            )
        first = min((q.arrival for q in self.questions), default=0.0)
        last = max(self.done_at.values(), default=first)
        subs = sum(q.sub_queries for q in self.questions)
        found = sum(q.found for q in self.questions)
        result = PipelineResult.from_tasks(
            track="sim",
            task=task_id,
            tasks=records,
            wall_s=max(last - first, 0.0),
            index_build_docs_per_s=self.engine.index_build_docs_per_s,
            recall_at_k=found / subs if subs else None,
            k=self.spec.passages_kept,
        )
        return PipelineRun(
            result=result, sim_seconds=self.now, requests=self.requests, failed=self.failed
        )


def _plan(engine: PipelineEngine, workload: Workload) -> list[Question]:
    """Every measured question's sub-queries and rounds (draws from the workload's seed,
    independent of the config)."""
    spec, knobs = engine.pipeline, engine.knobs
    r = round_recall(spec, knobs)
    out: list[Question] = []
    sessions = workload.sessions[workload.warmup_sessions :]
    for i, session in enumerate(sessions):
        turn = session.turns[0]
        rng = np.random.default_rng([workload.seed & 0xFFFF_FFFF, i, 0x9A6])
        n_sub = int(rng.integers(spec.sub_queries_min, spec.sub_queries_max + 1))
        u = rng.random((MAX_ROUNDS, MAX_SUB_QUERIES))
        open_now = list(range(n_sub))
        per_round: list[int] = []
        for rnd in range(knobs.max_rounds):
            per_round.append(len(open_now))
            open_now = [j for j in open_now if u[rnd, j] >= r]
            if not open_now:
                break
        out.append(
            Question(
                index=i,
                arrival=float(turn.arrival_s or 0.0),
                question_tokens=turn.prompt_len,
                answer_tokens=turn.output_len,
                sub_queries=n_sub,
                open_per_round=per_round,
                found=n_sub - len(open_now),
            )
        )
    return out


def simulate_pipeline(
    engine: PipelineEngine,
    workload: Workload,
    *,
    noise_seed: int,
    noise: bool = True,
    task_id: str | None = None,
) -> PipelineRun:
    """Run the workload's questions through the deployment (deterministic by
    ``noise_seed`` and the workload's seed)."""
    sim = _PipelineSim(engine, workload, noise_seed, noise)
    sim.run()
    return sim.result(task_id)
