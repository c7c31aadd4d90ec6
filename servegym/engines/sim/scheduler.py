"""The simulated engine's scheduler and step loop: vLLM v1's continuous batching, in
virtual time, with event skipping.

**One step, as vLLM v1's ``Scheduler.schedule``.** A step has a budget of
``max_num_batched_tokens`` tokens. Running requests come first: each decoding request takes
one token (``1 + k`` with speculative decoding) and KV slots for it; requests still in
prefill take the next chunk of their prompt, as much as the budget has left. When the free
blocks cannot cover a running request, the lowest-priority running request is preempted
(FCFS: the one admitted last; priority: the largest ``(priority, arrival)``) by recompute:
its blocks are freed (they stay in the prefix cache until evicted) and it goes back to the
front of the waiting queue. Then, only if nothing was preempted this step, waiting requests
are admitted in order while the budget lasts, fewer than ``max_num_seqs`` run and their
first chunk's blocks can be allocated: the prefix cache supplies the longest cached run of
their leading full blocks (at most ``num_tokens - 1`` tokens: the last is always computed),
and the rest is prefilled, chunked when chunked prefill is on. With chunked prefill off a
prompt that does not fit the remaining budget is skipped this step and a later, shorter one
may go first; steps still mix prefill and decode, as in vLLM v1 (the v0 engine ran prefill
steps apart from decode steps; v1 does not). The first waiting request that cannot get its
blocks stops admission (head-of-line, as in vLLM). There is no free-block watermark in v1,
so admission is greedy and KV pressure shows up as preemptions.

Simplification: decoding requests are scheduled before running requests that are still in
prefill (vLLM walks the running list in order; a request in prefill is almost always among
the last admitted, so the two orders differ only when the budget runs out mid-list).

**The API server.** A request reaches the waiting queue only after the engine's API
server has taken it: one at a time, in arrival order, each for the engine profile's
``api_request_ms`` plus ``api_per_token_us`` per prompt token (HTTP handling, chat template,
tokenisation), overlapped with the GPU's steps. A burst thus enters at the server's pace.
With a streaming cost (``api_chunk_us``) the same server also sends every step's output:
each request that yielded tokens in a step is one chunk, queued at the step's end behind the
work already there (requests that arrived before it come first); a token's time in the
records is when its chunk was sent, not when the step ended, and a closed loop's next
request is sent when the last chunk was. The engine does not wait for the API server (vLLM's
engine core runs in a process of its own): many open streams on a fast model make every
stream slower than its steps, and a new request waits behind the chunks queued before it.

**Step cost and time.** The step's tokens, contexts and sampled positions go to the
:class:`~servegym.engines.sim.cost_model.CostModel`; noise scales it. Every token a step
produces is emitted at the step's end (one streamed chunk per request per step).

**The decode set costs O(1) per step.** Every decoding request yields the same number of
tokens in a step (one, or the speculative pattern's count), so a request's computed tokens
are ``a_i + G`` with ``G`` one global counter and ``a_i`` fixed while it decodes. Its KV
blocks after an allocation are ``(a_i + K + G) // B`` (``K`` = lookahead + B - 1), and the
sum over the set is ``sum(q_i) + n (G // B) + #{i: r_i >= B - G % B}`` with
``a_i + K = q_i B + r_i``: a table of the residues ``r_i``, rebuilt only when the set
changes, prices any step's block allocation without touching the requests. Contexts sum to
``sum(a_i) + n G`` and the next completion is at ``G = min(end_i - a_i)``. Only membership
changes (a request joins, finishes or is preempted) cost vector work over the set.

**Event skipping.** When every running request is decoding and no waiting request can be
admitted (none waits, ``max_num_seqs`` are running, or the head of the queue cannot get its
blocks), consecutive steps differ only in their growing contexts, until the next event: a
completion, a step whose block allocations would exceed the free blocks, or (when an
arrival could be admitted) the next arrival. :meth:`Scheduler._segment` finds how many steps
``k`` that is from the formulas above, prices the ``k`` steps as one vector, and commits
them at once. Per-token timestamps are never stored per request: a request's output chunks
are the end times of the steps it was decoding in, kept as intervals of global step indices
and expanded when records are built.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from servegym.engines.sim.kv_cache import BlockPool
from servegym.engines.sim.launch import LaunchedEngine
from servegym.engines.sim.noise import Noise
from servegym.engines.sim.prefix_cache import PrefixCache, output_block_hashes

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

KMAX = 16384
"""Most steps committed in one event-skipping segment."""


class Scheduler:
    """Runs requests through the simulated engine in virtual time.

    Requests are indices into the arrays given at construction: ``prompt_len``,
    ``output_len``, ``chains`` (each request's block chain hashes, ``None`` without prefix
    caching; a request uses the first ``prompt_len // block_size`` of them) and
    ``priority`` (lower runs first under the priority policy). :meth:`add_arrival` queues a
    request at a virtual time; :meth:`run` simulates until no request is left;
    ``on_done(request, time)`` is called as each one finishes (it may add arrivals).

    ``shared_blocks[r]`` is how many of request ``r``'s leading blocks some other session's
    prompts contain too, ``reused_later[r]`` whether a later request of its own session
    will start with its prompt (an agentic turn), and ``follows_turn[r]`` whether it is such
    a later request. Only the shared blocks enter the prefix cache's hash map when they are
    allocated; a request's other prompt blocks can only ever be hit by its own recompute or
    its session's next turn, so they are marked (each block's hash, found through the
    request's own table) when it is preempted, and entered in the map when it finishes with
    a next turn to come. What can hit is exactly what entering every block at once would
    allow; the bookkeeping is far less. Without the flags every block counts as shared.

    ``observer(steps, running, scheduled, tokens)``, when given, is told of every step (or
    run of identical steps): how many requests were running, scheduled, and how many tokens
    of the budget they took (for tests of the scheduler's invariants).

    Decoding requests live in parallel arrays in running order (see the module doc): ``dec``
    (ids), ``d_a`` (computed tokens minus ``G``), ``d_lim`` (the ``G`` at which each has
    yielded its last token), ``d_nb0`` / ``d_jc`` (blocks held when it joined, and the
    allocation count then: until the set's next allocation it holds ``d_nb0``). Every other
    request's state is in per-request Python lists.
    """

    def __init__(
        self,
        engine: LaunchedEngine,
        noise: Noise,
        prompt_len: IntArray,
        output_len: IntArray,
        chains: list[IntArray] | None,
        priority: IntArray,
        on_done: Callable[[int, float], None],
        *,
        shared_blocks: IntArray | None = None,
        reused_later: npt.NDArray[np.bool_] | None = None,
        follows_turn: npt.NDArray[np.bool_] | None = None,
        event_skipping: bool = True,
        observer: Callable[[int, int, int, int], None] | None = None,
    ) -> None:
        cfg = engine.config
        self.engine = engine
        self.noise = noise
        self.cost = engine.cost
        self.B = engine.block_size
        self.max_seqs = cfg.max_num_seqs
        self.budget = cfg.max_num_batched_tokens
        self.chunked = cfg.enable_chunked_prefill
        self.policy_priority = cfg.scheduling_policy == "priority"
        self.event_skipping = event_skipping
        self.observer = observer
        spec = engine.spec
        self.spec = spec is not None
        self.E = spec.tokens_per_step if spec is not None else 1.0
        self.bt = spec.budget_tokens if spec is not None else 1
        self.vc = spec.verify_tokens if spec is not None else 1.0
        self.ahead = self.bt + (spec.lookahead if spec is not None else 0)
        self.K = self.ahead + self.B - 1

        self.cache = PrefixCache(engine.num_blocks) if cfg.enable_prefix_caching else None
        self.pool = BlockPool(engine.num_blocks, self.cache)
        self.chains = chains if self.cache is not None else None

        n = len(prompt_len)
        self.P = prompt_len.astype(np.int64)
        self.O = output_len.astype(np.int64)
        self.Pl: list[int] = self.P.tolist()
        self.Ol: list[int] = self.O.tolist()
        self.prio = priority.astype(np.int64)
        self.shared: list[int] = (
            shared_blocks.tolist() if shared_blocks is not None else [1 << 40] * n
        )
        self.reused_later: list[bool] = (
            reused_later.tolist() if reused_later is not None else [False] * n
        )
        # Can a request that never ran hit anything? Only blocks other sessions share, or
        # its own session's earlier turns (``follows_turn``).
        follows = follows_turn.tolist() if follows_turn is not None else [True] * n
        self.fresh_hits = [f or b > 0 for f, b in zip(follows, self.shared, strict=True)]
        # Without the flags, no request is known to follow another one.
        self.ncomp = [0] * n
        self.ngen = [0] * n
        self.nblk = [0] * n
        self.nbk = [0] * n  # blocks named in the table (the rest are anonymous)
        self.boff = [-1] * n
        self.emit_lo = [-1] * n
        self.emit_pf = [False] * n
        self.hit_blocks = [0] * n  # cache hits at the last admission
        self.in_map = [0] * n  # leading blocks known to be in the shared hash map
        self.follows = follows_turn.tolist() if follows_turn is not None else [False] * n
        self.admitted_once = [False] * n
        self.vkey = np.zeros(n, dtype=np.int64)
        self.wkey = np.zeros(n, dtype=np.int64)
        self.on_done = on_done

        # The decode set: one 5-row array (ids, a, lim, nb0, jc), rows viewed by name.
        self._dset: IntArray = np.empty((5, 0), dtype=np.int64)
        self._views()
        self.G = 0  # tokens each decoding request has yielded, globally
        self.G_alloc = 0  # G of the set's last block allocation
        self.allocs = 0  # block allocations of the set so far
        self.S_nb = 0  # blocks the set holds
        self.Sa = 0  # sum of d_a
        self.Sq = 0  # sum of (d_a + K) // B
        self.ge: list[int] = [0] * (self.B + 1)  # ge[t] = #{(d_a + K) % B >= t}
        self._ge_arr: IntArray | None = None
        self.lim_min = 1 << 62
        self._gap = False  # some decoding request skipped a step (budget ran out)
        self._short = False  # the last segment stopped on a block shortage

        self.pf: list[int] = []
        self.waiting: deque[int] = deque()
        self.wheap: list[tuple[int, int]] = []
        self.arrivals: list[tuple[float, int, int]] = []
        self._arrival_seq = 0
        # The API server: requests pass through it one at a time, in arrival order, before
        # they reach the scheduler (``front`` holds those not yet through; ``api_free`` is
        # when it finishes the last one taken). Zero cost: arrivals go straight in.
        eng = engine.cost.engine
        self.api_req_s = eng.api_request_ms * 1e-3
        self.api_tok_s = eng.api_per_token_us * 1e-6
        self.api_lat_s = eng.api_latency_ms * 1e-3
        self.api_hold = eng.api_holds_burst
        self.api_chunk_s = eng.api_chunk_us * 1e-6
        self.stream = self.api_chunk_s > 0
        self.api = self.api_req_s > 0 or self.api_tok_s > 0 or self.stream
        self.front: list[tuple[float, int, int]] = []
        self.api_free = 0.0
        self.P_list: list[int] = prompt_len.tolist()
        self._admit_seq = 0
        self._memo: dict[int, tuple[int, IntArray, IntArray]] = {}
        self._blocked: tuple[int, int, int, int, int] | None = None
        self._out_hashes: dict[int, IntArray] = {}

        self.now = 0.0
        self.until: float | None = None
        self.step = 0
        self.T = np.zeros(4096, dtype=np.float64)
        # With a streaming cost: when each step's chunks were sent (else T stands for it).
        self.Dv = np.zeros(4096 if self.stream else 0, dtype=np.float64)
        # Emission intervals: request, first step, end step (exclusive), starts with prefill.
        self.iv_r: list[int] = []
        self.iv_lo: list[int] = []
        self.iv_hi: list[int] = []
        self.iv_pf: list[bool] = []

        # Counters (engine-side statistics).
        self.preemptions = 0
        self.sum_batch = 0
        self.sum_tokens = 0
        self.busy_s = 0.0
        self.prompt_tokens_computed = 0
        self.generated_tokens = 0
        self.finished = 0

    # --- arrivals -----------------------------------------------------------------------

    def add_arrival(self, r: int, t: float) -> None:
        """Request ``r`` arrives at virtual time ``t`` (seconds); the engine sees it after
        the serving path's latency (``api_latency_ms``)."""
        t += self.api_lat_s
        if self.api:
            heapq.heappush(self.front, (t, self._arrival_seq, r))
        else:
            heapq.heappush(self.arrivals, (t, self._arrival_seq, r))
        self._arrival_seq += 1

    def _pump(self, upto: float | None = None) -> None:
        """Pass the requests that reached the API server by :attr:`now` (or ``upto``)
        through it, in arrival order: each enters the scheduler when the server has finished
        it (after the work before it). Only arrivals up to then are taken, so one added
        later with an earlier time than a queued one (a closed loop's next request) still
        goes first."""
        front = self.front
        now = self.now if upto is None else upto
        taken: list[tuple[int, int]] = []
        while front and front[0][0] <= now:
            t, seq, r = heapq.heappop(front)
            done = max(t, self.api_free) + self.api_req_s + self.api_tok_s * self.P_list[r]
            self.api_free = done
            if self.api_hold:
                taken.append((seq, r))
            else:
                heapq.heappush(self.arrivals, (done, seq, r))
        # A server that preprocesses on its event loop hands the requests it took together
        # to the engine once it has finished the last of them.
        for seq, r in taken:
            heapq.heappush(self.arrivals, (self.api_free, seq, r))

    def _next_arrival(self) -> float | None:
        """The earliest time a request could next enter the scheduler (a lower bound while
        requests are still in front of the API server)."""
        t = self.arrivals[0][0] if self.arrivals else None
        if self.front:
            f = self.front[0][0]
            t = f if t is None or f < t else t
        return t

    def _take_arrivals(self) -> None:
        arrivals, now = self.arrivals, self.now
        while arrivals and arrivals[0][0] <= now:
            _, seq, r = heapq.heappop(arrivals)
            if self.policy_priority:
                key = (int(self.prio[r]) << 40) + seq
                self.wkey[r] = key
                heapq.heappush(self.wheap, (key, r))
            else:
                self.waiting.append(r)

    @property
    def _n_waiting(self) -> int:
        return len(self.wheap) if self.policy_priority else len(self.waiting)

    # --- main loop ----------------------------------------------------------------------

    def run(self, until: float | None = None) -> None:
        """Simulate until every arrived (and arriving) request has finished.

        ``until`` stops earlier: no step starts at or after that virtual time (a step that
        started before it may end after it). Several engines then share one virtual clock,
        each advanced in turn (:mod:`servegym.pipeline.sim`); a request added at a time
        before :attr:`now` arrived during the last step and waits for its end, as in a
        real engine.
        """
        self.until = until
        idle_steps = 0
        while True:
            if self.front and self.front[0][0] <= self.now:
                self._pump()
            if self.arrivals and self.arrivals[0][0] <= self.now:
                self._take_arrivals()
            if len(self.dec) == 0 and not self.pf and self._n_waiting == 0:
                nxt = self._next_arrival()
                if nxt is None:
                    return
                if until is not None and nxt >= until:
                    return
                self.now = max(self.now, nxt)
                continue
            if until is not None and self.now >= until:
                return
            if self._short:  # the last run of steps stopped where blocks run out
                self._short = False
            elif (
                self.event_skipping
                and not self.pf
                and len(self.dec)
                and not self._would_admit()
                and self._segment()
            ):
                continue
            if self._step():
                idle_steps = 0
            else:
                idle_steps += 1
                if idle_steps > 3:  # pragma: no cover - a scheduler bug, not a user error
                    raise RuntimeError("simulated scheduler made no progress")

    def next_start(self) -> float | None:
        """When this engine's next step could start: :attr:`now` while a request runs or
        waits, the next arrival (not before :attr:`now`) when idle, ``None`` when no request
        is left."""
        if len(self.dec) or self.pf or self._n_waiting:
            return self.now
        nxt = self._next_arrival()
        if nxt is not None:
            return max(self.now, nxt)
        return None

    # --- helpers ------------------------------------------------------------------------

    def _ensure_T(self, n: int) -> None:
        if n > len(self.T):
            grown = np.zeros(max(n, 2 * len(self.T)), dtype=np.float64)
            grown[: self.step] = self.T[: self.step]
            self.T = grown
        if self.stream and n > len(self.Dv):
            sent = np.zeros(len(self.T), dtype=np.float64)
            sent[: self.step] = self.Dv[: self.step]
            self.Dv = sent

    def emitted_at(self) -> FloatArray:
        """When each step's tokens reached the client: the chunk's send time with a
        streaming cost, else the step's end."""
        return self.Dv[: self.step] if self.stream else self.T[: self.step]

    def _send_step(self, s: int, chunks: int) -> None:
        """The API server sends step ``s``'s ``chunks`` streamed chunks: after the requests
        that arrived during the step (pumped first) and the work queued before them."""
        end = float(self.T[s])
        if self.front and self.front[0][0] <= end:
            self._pump(end)
        done = max(end, self.api_free) + chunks * self.api_chunk_s
        self.api_free = done
        self.Dv[s] = done

    def _send_run(self, s0: int, ends: FloatArray, chunks: int) -> None:
        """:meth:`_send_step` for the steps ``s0 ..`` ending at ``ends``, each with ``chunks``
        chunks: between two arrivals the sends follow ``d_j = max(e_j, d_{j-1}) + w``, which
        is ``(j + 1) w + max(free, cummax(e_i - i w))`` as a vector."""
        w = chunks * self.api_chunk_s
        k = len(ends)
        out = self.Dv[s0 : s0 + k]
        j = 0
        front = self.front
        last = float(ends[k - 1])
        while j < k:
            if front and front[0][0] <= last:
                a = front[0][0]
                stop = j + int(ends[j:].searchsorted(a, side="left"))
            else:
                a, stop = None, k
            if stop > j:
                idx = np.arange(stop - j, dtype=np.float64) * w
                d = np.maximum.accumulate(ends[j:stop] - idx)
                np.maximum(d, self.api_free, out=d)
                d += idx + w
                out[j:stop] = d
                self.api_free = float(d[-1])
                j = stop
            if a is not None:
                self._pump(a)

    def _D(self, s: int) -> int:
        """Tokens a decoding request yields in global step ``s``."""
        if not self.spec:
            return 1
        e = self.E
        return math.floor((s + 1) * e) - math.floor(s * e)

    def _G(self, s0: int, k: int) -> IntArray:
        """Tokens yielded by steps ``s0 .. s0 + j - 1``, for ``j = 0 .. k - 1``."""
        if not self.spec:
            return np.arange(k, dtype=np.int64)
        e = self.E
        out: IntArray = np.floor((s0 + np.arange(k)) * e).astype(np.int64) - math.floor(s0 * e)
        return out

    def _steps_to_emit(self, rem: int, s0: int) -> int:
        """Fewest steps from ``s0`` after which a decoding request has yielded ``rem``
        tokens."""
        if not self.spec:
            return rem
        e = self.E
        f0 = math.floor(s0 * e)
        k = max(1, math.ceil((rem + f0) / e - s0))
        while math.floor((s0 + k) * e) - f0 < rem:
            k += 1
        while k > 1 and math.floor((s0 + k - 1) * e) - f0 >= rem:
            k -= 1
        return k

    # --- the decode set -----------------------------------------------------------------

    def _set_blocks(self, g: int) -> int:
        """Blocks the decode set holds once allocated for ``G = g``."""
        B = self.B
        return self.Sq + len(self.dec) * (g // B) + self.ge[B - g % B]

    def _nb_of(self, idx: IntArray) -> IntArray:
        """Blocks held by the decode-set members at positions ``idx``."""
        cur = (self.d_a[idx] + (self.K + self.G_alloc)) // self.B
        out: IntArray = np.where(self.d_jc[idx] < self.allocs, cur, self.d_nb0[idx])
        return out

    def _views(self) -> None:
        D = self._dset
        self.dec, self.d_a, self.d_lim, self.d_nb0, self.d_jc = D[0], D[1], D[2], D[3], D[4]

    @property
    def ge_arr(self) -> IntArray:
        if self._ge_arr is None:
            self._ge_arr = np.array(self.ge, dtype=np.int64)
        return self._ge_arr

    def _account(self, a: list[int], sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) members with these ``a`` values from the sums
        and the residue table."""
        B, K = self.B, self.K
        ge = self.ge
        sq = 0
        for x in a:
            q, r = divmod(x + K, B)
            sq += q
            for t in range(r + 1):
                ge[t] += sign
        self.Sq += sign * sq
        self.Sa += sign * sum(a)
        self._ge_arr = None

    def _aggregate(self) -> None:
        """Recompute the decode set's sums and residue table from scratch."""
        self.Sa = self.Sq = 0
        self.ge = [0] * (self.B + 1)
        self._account(self.d_a.tolist(), 1)
        self.lim_min = int(self.d_lim.min()) if len(self.dec) else 1 << 62

    def _dec_join(self, rs: list[int]) -> None:
        """Requests whose prefill just completed start decoding."""
        g = self.G
        a = [self.ncomp[r] - g for r in rs]
        lim = [self.Pl[r] + self.Ol[r] - 1 - x for r, x in zip(rs, a, strict=True)]
        nb0 = [self.nblk[r] for r in rs]
        new = np.array([rs, a, lim, nb0, [self.allocs] * len(rs)], dtype=np.int64)
        self._dset = np.concatenate([self._dset, new], axis=1)
        self._views()
        self.S_nb += sum(nb0)
        self._account(a, 1)
        self.lim_min = min(self.lim_min, min(lim))

    def _dec_leave(self, idx: IntArray) -> tuple[list[int], list[int], list[int], list[int]]:
        """Take the members at positions ``idx`` out of the decode set; returns their ids,
        computed tokens, blocks held and ``lim`` values."""
        rs, a, lim, nb0, jc = self._dset[:, idx].tolist()
        K, B, ga, allocs = self.K, self.B, self.G_alloc, self.allocs
        nbs = [(x + K + ga) // B if j < allocs else n0 for x, j, n0 in zip(a, jc, nb0, strict=True)]
        self.S_nb -= sum(nbs)
        D = self._dset
        if len(idx) == 1:
            i = int(idx[0])
            self._dset = np.concatenate((D[:, :i], D[:, i + 1 :]), axis=1)
        else:
            keep = np.ones(D.shape[1], dtype=bool)
            keep[idx] = False
            self._dset = D[:, keep]
        self._views()
        self._account(a, -1)
        if len(self.dec) == 0:
            self.lim_min = 1 << 62
        elif min(lim) <= self.lim_min:
            self.lim_min = int(self.d_lim.min())
        g = self.G
        return rs, [x + g for x in a], nbs, lim

    def _allocate_set(self, g: int) -> bool:
        """Allocate the decode set's blocks for a step starting at ``G = g``; False when
        the free blocks do not cover them."""
        want = self._set_blocks(g)
        total = want - self.S_nb
        if total > self.pool.num_free:
            return False
        self.pool.pop_anonymous(total)
        self.S_nb = want
        self.G_alloc = g
        self.allocs += 1
        return True

    # --- prefix cache -------------------------------------------------------------------

    def _hashes(self, r: int, max_blocks: int) -> IntArray:
        """Chain hashes of request ``r``'s first ``max_blocks`` full blocks: prompt blocks
        from the workload's tokens, then (after a preemption) its own output blocks."""
        assert self.chains is not None
        pb = self.Pl[r] // self.B
        own = self.chains[r][: min(max_blocks, pb)]
        if max_blocks <= pb:
            return own
        out = self._out_hashes.get(r)
        if out is None:
            top = (self.Pl[r] + self.Ol[r] + self.ahead) // self.B + 1
            out = self._out_hashes[r] = output_block_hashes(r, pb, top)
        return np.concatenate([own, out[: max_blocks - pb]])

    def _first_hash(self, r: int) -> int:
        """Hash of request ``r``'s first block (a prompt block, or its first output block
        when the prompt is shorter than a block)."""
        if self.Pl[r] >= self.B:
            return int(self.chains[r][0])  # type: ignore[index]
        return int(self._hashes(r, 1)[0])

    def _lookup(self, r: int, num_tokens: int) -> IntArray:
        """Cached block ids of request ``r``'s longest cached prefix.

        A request that ran before (preempted, now recomputing) first checks the blocks its
        own table still names: those that still hold its hashes are hits, with no dictionary
        lookups. A waiting request is looked up again at every step it stays blocked; the
        last answer is kept and re-checked with two vector operations (each block still
        holds its hash; the block after the prefix is still not cached).
        """
        cache = self.cache
        if cache is None:
            return _EMPTY
        max_blocks = (num_tokens - 1) // self.B
        if max_blocks <= 0:
            return _EMPTY
        memo = self._memo.get(r)
        if memo is not None and memo[0] == num_tokens:
            _, hs, hits = memo
            h = len(hits)
            if (h == len(hs) or not cache.contains(int(hs[h]))) and (
                h == 0 or bool((cache.bhash[hits] == hs[:h]).all())
            ):
                return hits
        off = self.boff[r]
        known = max_blocks
        if off < 0:  # never admitted: only other requests' blocks can hit
            if not self.fresh_hits[r]:
                return _EMPTY
            chain = self.chains[r]  # type: ignore[index]
            if len(chain) and not cache.contains(int(chain[0])):
                return _EMPTY
            # A later turn starts with its previous turn's prompt: check the blocks that
            # turn's table names first (no map lookups), then the map for the rest.
            prev = r - 1
            if self.follows[r] and self.boff[prev] >= 0:
                off = self.boff[prev]
                known = min(max_blocks, self.Pl[prev] // self.B)
        if off >= 0 and known > 0:
            # Most often its first block is gone already (evicted while it waited): then
            # nothing after it can hit either, found with two scalar reads.
            first = self._first_hash(r)
            if int(cache.bhash[self.pool.table[off]]) != first and not cache.contains(first):
                self._memo[r] = (num_tokens, np.array([first], dtype=np.int64), _EMPTY)
                return _EMPTY
        hs = self._hashes(r, max_blocks)
        if off < 0:
            hits = cache.lookup(hs.tolist(), hs)
        else:
            own = self.pool.table[off : off + known]
            ok = cache.bhash[own] == hs[:known]
            j = known if ok.all() else int(np.argmin(ok))
            hits = own[:j]
            if j < max_blocks and cache.contains(int(hs[j])):
                hits = np.concatenate([hits, cache.lookup(hs[j:].tolist(), hs[j:])])
            hits = hits.copy()
        self._memo[r] = (num_tokens, hs, hits)
        return hits

    def _register(self, r: int, lo_block: int, hi_block: int, *, all_blocks: bool = False) -> None:
        """Enter request ``r``'s full prompt blocks ``lo_block .. hi_block - 1`` in the
        prefix cache (as vLLM does when it allocates them): only the shared ones, unless
        ``all_blocks`` (see the class doc)."""
        if self.cache is None:
            return
        if not all_blocks:
            hi_block = min(hi_block, self.shared[r])
        if hi_block <= lo_block:
            return
        assert self.chains is not None
        hs = self.chains[r][lo_block:hi_block]
        off = self.boff[r]
        blocks = self.pool.table[off + lo_block : off + hi_block]
        self.cache.register(hs.tolist(), hs, blocks)

    # --- leaving the running set --------------------------------------------------------

    def _victim(self) -> int:
        """The running request to preempt: FCFS the one admitted last; priority the one
        with the largest (priority, arrival)."""
        keys = self.wkey if self.policy_priority else self.vkey
        best, best_key = -1, -1
        if len(self.dec):
            i = int(np.argmax(keys[self.dec]))
            best, best_key = int(self.dec[i]), int(keys[self.dec[i]])
        for r in self.pf:
            if int(keys[r]) > best_key:
                best, best_key = r, int(keys[r])
        return best

    def _close_interval(self, r: int, end_step: int) -> None:
        lo = self.emit_lo[r]
        if lo >= 0:
            if end_step > lo:
                self.iv_r.append(r)
                self.iv_lo.append(lo)
                self.iv_hi.append(end_step)
                self.iv_pf.append(self.emit_pf[r])
            self.emit_lo[r] = -1

    def _release(self, r: int, nb: int) -> None:
        """Free request ``r``'s ``nb`` blocks: its anonymous decode blocks, then its named
        ones last-first (vLLM frees a request's blocks in reverse order). Only blocks of the
        shared prefix can be held by other requests too."""
        if nb <= 0:
            return
        off = self.boff[r]
        known = self.nbk[r]
        named = self.pool.table[off : off + known][::-1]
        anon = nb - known
        if anon > 0:
            named = np.concatenate([self.pool.take_anonymous(anon), named])
        shared = min(self.shared[r], known)
        if self.cache is None or shared == 0:
            self.pool.release(named, exclusive=True)
        else:
            self.pool.release(named[: nb - shared], exclusive=True)
            self.pool.release(named[nb - shared :])
        self.nbk[r] = 0
        self.nblk[r] = 0

    def _preempt(self, r: int) -> None:
        """Preempt ``r`` by recompute: free its blocks (its computed blocks stay cached
        until evicted), back to the front of the waiting queue."""
        self._close_interval(r, self.step)
        if r in self.pf:
            self.pf.remove(r)
        else:  # a decoding request: take its state out of the decode set
            i = np.flatnonzero(self.dec == r)
            _, cs, nbs, _ = self._dec_leave(i)
            self.ncomp[r] = cs[0]
            self.nblk[r] = nbs[0]
            self.ngen[r] = cs[0] - self.Pl[r] + 1
        nb = self.nblk[r]
        if self.cache is not None:
            # Its blocks stay cached for its own recompute. Beyond the shared prefix only
            # this request can ever hit them (their hashes are unique to its session, and
            # its next turn cannot start before it finishes), so they are marked in place
            # (each block's hash) and found through its own table, not the shared map.
            full = self.ncomp[r] // self.B
            lo = max(self.hit_blocks[r], min(self.shared[r], full))
            if full > lo:
                off = self.boff[r]
                known = self.nbk[r]
                if nb > known:  # name the anonymous blocks: they get hashes now
                    self.pool.table[off + known : off + nb] = self.pool.take_anonymous(nb - known)
                    self.nbk[r] = nb
                self.cache.bhash[self.pool.table[off + lo : off + full]] = self._hashes(r, full)[
                    lo:
                ]
        self._release(r, nb)
        self.ncomp[r] = 0
        if self.policy_priority:
            heapq.heappush(self.wheap, (int(self.wkey[r]), r))
        else:
            self.waiting.appendleft(r)
        self.preemptions += 1

    def _finish(self, r: int, last_step: int, nb: int) -> None:
        self._close_interval(r, last_step + 1)
        self.ngen[r] = self.Ol[r]
        if self.reused_later[r]:  # its session's next turn will look these up
            lo = max(self.shared[r], self.in_map[r])
            self._register(r, lo, self.Pl[r] // self.B, all_blocks=True)
        self._release(r, nb)
        self.finished += 1
        self.on_done(r, float(self.Dv[last_step] if self.stream else self.T[last_step]))

    def _finish_decodes(self, last_step: int) -> int:
        """Finish the decode-set members that yielded their last token; returns the tokens
        the last step over-counted for them (a truncated last chunk)."""
        g = self.G
        rs, _, nbs, lims = self._dec_leave(np.flatnonzero(self.d_lim <= g))
        for r, nb in zip(rs, nbs, strict=True):
            self._finish(r, last_step, nb)
        return sum(g - x for x in lims)

    # --- admission ------------------------------------------------------------------------

    def _plan(self, r: int, left: int) -> tuple[IntArray, int, int] | None:
        """Admission plan for waiting request ``r`` with ``left`` budget tokens: (cached
        block ids, tokens to compute now, new blocks needed), or None to skip it (chunked
        prefill off and its prompt does not fit the budget)."""
        num_tokens = self.Pl[r] + self.ngen[r]
        hits = self._lookup(r, num_tokens)
        hit_tok = len(hits) * self.B
        rem = num_tokens - hit_tok
        if not self.chunked and rem > left:
            return None
        q = min(rem, left)
        need = -(-(hit_tok + q) // self.B) - len(hits)
        return hits, q, need

    def _fits(self, hits: IntArray, need: int) -> bool:
        avail = self.pool.num_free
        if len(hits):
            avail -= self.pool.free_of(hits)
        return need <= avail

    def _waiting_order(self) -> list[int]:
        if self.policy_priority:
            return [r for _, r in sorted(self.wheap)]
        return list(self.waiting)

    def _would_admit(self) -> bool:
        """Would the next step admit a waiting request? (Decodes only are running.)

        A "no" because the queue's head cannot get its blocks stays a "no" until blocks are
        freed (decode steps only take blocks, which can only shrink the head's cache hits),
        so it is remembered until the pool frees something or the running set changes.
        """
        if self._n_waiting == 0:
            return False
        if len(self.dec) + len(self.pf) >= self.max_seqs:
            return False
        left = self.budget - len(self.dec) * self.bt
        if left <= 0 or self.pool.num_free == 0:
            return False
        head = self.wheap[0][1] if self.policy_priority else self.waiting[0]
        key = (head, len(self.dec), len(self.pf), self._n_waiting, self.pool.releases)
        if key == self._blocked:
            return False
        ok = self._would_admit_check(left)
        self._blocked = None if ok else key
        return ok

    def _would_admit_check(self, left: int) -> bool:
        if self.chunked:
            head = self.wheap[0][1] if self.policy_priority else self.waiting[0]
            candidates = [head]
        else:
            candidates = self._waiting_order()
        for r in candidates:
            plan = self._plan(r, left)
            if plan is None:
                continue
            return self._fits(plan[0], plan[2])
        return False

    def _admit(self, r: int, hits: IntArray, q: int, need: int) -> None:
        """Admit waiting request ``r``: take its cached blocks, allocate the rest of its
        first chunk, enter it in the running set (still in prefill)."""
        B = self.B
        if self.boff[r] < 0:
            total = self.Pl[r] + self.Ol[r]
            self.boff[r] = self.pool.reserve_table(-(-(total + self.ahead) // B) + 1)
        off = self.boff[r]
        self._memo.pop(r, None)
        h = len(hits)
        self.hit_blocks[r] = h
        # Hits of a first admission came from the shared map (or a previous turn's blocks,
        # which its finish entered there); a recompute keeps only what survived of those.
        self.in_map[r] = h if not self.admitted_once[r] else min(self.in_map[r], h)
        table = self.pool.table
        if h:
            self.pool.touch(hits)
            table[off : off + h] = hits
        if need > 0:
            table[off + h : off + h + need] = self.pool.pop(need)
        self.nblk[r] = h + need
        self.nbk[r] = h + need
        hit_tok = h * B
        self.ncomp[r] = hit_tok
        p = self.Pl[r]
        if not self.admitted_once[r]:
            self.admitted_once[r] = True
            if self.cache is not None:
                self.cache.queried_tokens += p
                self.cache.hit_tokens += min(hit_tok, p)
        self._register(r, h, min((hit_tok + q) // B, p // B))
        self.vkey[r] = self._admit_seq
        self._admit_seq += 1
        self.pf.append(r)

    # --- one step (general path) ----------------------------------------------------------

    def _step(self) -> bool:
        """Schedule and run one step; False when nothing could be scheduled.

        vLLM v1's order: the running decodes, then the running prefills, then (unless
        making room preempted someone) waiting requests, until the token budget is spent.
        """
        s = self.step
        m, gap, preempted = self._schedule_decodes(s)
        budget = self.budget - m * self.bt
        chunks: list[tuple[int, int, int]] = []
        m, budget, preempted_for_prefill = self._schedule_prefills(m, budget, chunks)
        preempted = preempted or preempted_for_prefill
        if not preempted and budget > 0:
            self._schedule_waiting(budget, chunks)
        if m == 0 and not chunks:
            return False
        completes = self._run_step(s, m, chunks)
        if self.stream:
            self._send_step(s, m + sum(completes))
        self._emit_outputs(s, m, gap, chunks, completes)
        return True

    def _schedule_decodes(self, s: int) -> tuple[int, bool, bool]:
        """Step phase 1, the decoding requests: returns how many run (the first ``m`` of the
        decode set), whether the budget left a gap (not all of them fit), and whether making
        room for their next tokens' blocks preempted anyone."""
        budget = self.budget
        bt = self.bt
        preempted = False
        m = len(self.dec)
        gap = m * bt > budget
        if gap:
            m = budget // bt
            for r in self.dec[m:].tolist():
                self._close_interval(r, s)
            self._gap = True
            m, preempted = self._allocate_partial(m)
        else:
            while m and not self._allocate_set(self.G):
                self._preempt(self._victim())
                preempted = True
                m = len(self.dec)
        return m, gap, preempted

    def _schedule_prefills(
        self, m: int, budget: int, chunks: list[tuple[int, int, int]]
    ) -> tuple[int, int, bool]:
        """Step phase 2, running requests still in prefill, in admission order: each gets
        its next chunk (appended to ``chunks`` as (request, computed, chunk)) and the blocks
        for it, preempting as needed, until the budget is spent or the request itself is the
        victim. Returns the decodes still running (a victim may be one of the first ``m``),
        the budget left and whether anything was preempted."""
        B = self.B
        ncomp, nblk = self.ncomp, self.nblk
        preempted = False
        for r in list(self.pf):
            if budget <= 0:
                break
            if r not in self.pf:  # preempted while making room for an earlier one
                continue
            c = ncomp[r]
            q = min(self.Pl[r] + self.ngen[r] - c, budget)
            want_r = -(-(c + q) // B)
            need = want_r - nblk[r]
            stop = False
            while need > self.pool.num_free:
                v = self._victim()
                if v != r and m and bool((self.dec[:m] == v).any()):
                    m -= 1
                self._preempt(v)
                preempted = True
                if v == r:
                    stop = True
                    break
            if stop:
                break
            if need > 0:
                off = self.boff[r] + nblk[r]
                self.pool.table[off : off + need] = self.pool.pop(need)
                nblk[r] = want_r
                self.nbk[r] = want_r
            self._register(r, c // B, min(c + q, self.Pl[r]) // B)
            chunks.append((r, c, q))
            budget -= q
        return m, budget, preempted

    def _schedule_waiting(self, budget: int, chunks: list[tuple[int, int, int]]) -> None:
        """Step phase 3, waiting requests in policy order: admit the queue's head while a
        sequence slot, the budget and its blocks allow (appending its first chunk to
        ``chunks``); with chunked prefill off, a head whose prompt does not fit the budget
        is skipped for this step and keeps its place."""
        ncomp = self.ncomp
        skipped: list[int] = []
        prio = self.policy_priority
        while (self.wheap if prio else self.waiting) and budget > 0:
            if len(self.dec) + len(self.pf) >= self.max_seqs:
                break
            r = self.wheap[0][1] if prio else self.waiting[0]
            plan = self._plan(r, budget)
            if plan is None:
                if prio:
                    heapq.heappop(self.wheap)
                else:
                    self.waiting.popleft()
                skipped.append(r)
                continue
            hits, q, need = plan
            if not self._fits(hits, need):
                break
            if prio:
                heapq.heappop(self.wheap)
            else:
                self.waiting.popleft()
            self._admit(r, hits, q, need)
            chunks.append((r, ncomp[r], q))
            budget -= q
        for r in reversed(skipped):
            if prio:
                heapq.heappush(self.wheap, (int(self.wkey[r]), r))
            else:
                self.waiting.appendleft(r)

    def _run_step(self, s: int, m: int, chunks: list[tuple[int, int, int]]) -> list[bool]:
        """Step phase 4: price the step (``m`` decodes and the prefill ``chunks``) with the
        cost model and the noise, advance the clock and the statistics; returns, per chunk,
        whether it completes its prompt (and so samples a token)."""
        vc = self.vc
        n_all = len(self.dec)
        if m == n_all:
            ctx = float(self.Sa + m * self.G)
        else:
            ctx = float((self.d_a[:m] + self.G).sum()) if m else 0.0
        kv = ctx + m * vc
        attn = vc * ctx + m * vc * (vc + 1.0) / 2.0
        logits = m * vc
        ptoks = 0
        completes: list[bool] = []
        for r, c, q in chunks:
            ptoks += q
            kv += c + q
            attn += q * c + q * (q + 1) / 2.0
            done = c + q >= self.Pl[r] + self.ngen[r]
            completes.append(done)
            if done:
                logits += 1.0
        tok_int = m * self.bt + ptoks
        if self.observer is not None:
            self.observer(1, n_all + len(self.pf), m + len(chunks), tok_int)
        dt = self.cost.step_time(
            m * vc + ptoks,
            logits,
            kv,
            attn,
            self.cost.graph_flag(tok_int),
            float(m + len(chunks)),
            float(m),
            ctx + m,
            float(ptoks),
        )
        dt *= self.noise.factor(s)
        self.now += dt
        self._ensure_T(s + 1)
        self.T[s] = self.now
        self.step = s + 1
        self.busy_s += dt
        self.sum_batch += m + len(chunks)
        self.sum_tokens += tok_int
        self.prompt_tokens_computed += ptoks
        return completes

    def _emit_outputs(
        self,
        s: int,
        m: int,
        gap: bool,
        chunks: list[tuple[int, int, int]],
        completes: list[bool],
    ) -> None:
        """Step phase 5, outputs: the decodes advance (finishing those at their length); a
        chunk that completed its prompt samples its first token and joins the decode set,
        or finishes if that was its only token."""
        ncomp, nblk = self.ncomp, self.nblk
        if m:
            d = self._D(s)
            if gap or self._gap:
                self._advance_partial(m, d, s)
            else:
                self.G += d
                gen = m * d
                if self.lim_min <= self.G:
                    gen -= self._finish_decodes(s)
                self.generated_tokens += gen
        joined: list[int] = []
        done_pf: list[int] = []
        for (r, c, q), done in zip(chunks, completes, strict=True):
            ncomp[r] = c + q
            if done:
                self.ngen[r] += 1
                self.generated_tokens += 1
                self.emit_lo[r] = s
                self.emit_pf[r] = True
                self.pf.remove(r)
                if self.ngen[r] >= self.Ol[r]:
                    done_pf.append(r)
                else:
                    joined.append(r)
        if joined:
            self._dec_join(joined)
        for r in done_pf:
            self._finish(r, s, nblk[r])

    # --- the rare path: the budget does not cover every decoding request -------------------

    def _allocate_partial(self, m: int) -> tuple[int, bool]:
        """Allocate blocks for the first ``m`` decoding requests only (vLLM schedules the
        running list in order until the budget is spent), preempting as needed; returns the
        number scheduled and whether anything was preempted."""
        B = self.B
        preempted = False
        while m:
            idx = np.arange(m)
            c = self.d_a[:m] + self.G
            nb = self._nb_of(idx)
            want = np.maximum((c + self.K) // B, nb)
            total = int((want - nb).sum())
            if total <= self.pool.num_free:
                self.pool.pop_anonymous(total)
                # Re-base every member: the scheduled ones hold `want` now, the rest keep
                # theirs; until the next set allocation each holds d_nb0.
                all_nb = self._nb_of(np.arange(len(self.dec)))
                all_nb[:m] = want
                self.d_nb0[:] = all_nb
                self.d_jc[:] = self.allocs
                self.S_nb = int(all_nb.sum())
                return m, preempted
            v = self._victim()
            pos = np.flatnonzero(self.dec[:m] == v)
            self._preempt(v)
            preempted = True
            if len(pos):
                m -= 1
        return 0, preempted

    def _advance_partial(self, m: int, d: int, s: int) -> None:
        """Outputs of a step in which only the first ``m`` decoding requests ran: they
        advance by ``d``; the others stay (their ``d_a`` drops by ``d`` as ``G`` grows)."""
        lo = np.array([self.emit_lo[r] for r in self.dec[:m].tolist()], dtype=np.int64)
        for r in self.dec[:m][lo < 0].tolist():  # resumed after skipping steps
            self.emit_lo[r] = s
            self.emit_pf[r] = False
        self.G += d
        n = len(self.dec)
        if m < n:
            self.d_a[m:] -= d
            self.d_lim[m:] += d
        else:
            self._gap = False
        self._aggregate()
        gen = m * d
        if self.lim_min <= self.G:
            gen -= self._finish_decodes(s)
        self.generated_tokens += gen

    # --- many decode steps at once ----------------------------------------------------------

    def _segment(self) -> bool:
        """Commit the run of identical decode-only steps up to the next event; False when
        the very next step needs the general path (a preemption)."""
        n = len(self.dec)
        bt = self.bt
        if n * bt > self.budget or self._gap:
            return False
        B = self.B
        s0 = self.step
        g0 = self.G
        # Blocks the set holds once step j is allocated, minus what it holds now
        # (nondecreasing in j): check the ends first, then find the shortage if any.
        free = self.pool.num_free
        if self._set_blocks(g0) - self.S_nb > free:
            return False
        k = min(self._steps_to_emit(self.lim_min - g0, s0), KMAX)
        rel = self._G(s0, k + 1)  # rel[j]: tokens before step j; rel[k]: after k steps
        g_last = g0 + int(rel[k - 1])
        total = self._set_blocks(g_last) - self.S_nb
        if total > free:
            gs = rel[:k] + g0
            gq = gs // B
            tot = (self.Sq - self.S_nb) + n * gq + self.ge_arr[B - (gs - gq * B)]
            k = int(tot.searchsorted(free, side="right"))
            total = int(tot[k - 1])
            g_last = int(gs[k - 1])
            self._short = True  # the step after these needs a preemption

        # Price the k steps.
        grown = np.arange(k, dtype=np.float64) if not self.spec else rel[:k].astype(np.float64)
        times = self.cost.decode_run(
            n, self.vc, float(self.Sa + n * g0), grown, self.cost.graph_flag(n * bt)
        )
        self.noise.apply(times, s0)
        ends = times.cumsum()
        ends += self.now
        t_next = self._next_arrival()
        if (
            t_next is not None
            and n < self.max_seqs
            and (self._n_waiting == 0 or self.policy_priority or not self.chunked)
        ):
            # An arrival could be admitted: stop before the first step starting after it.
            t_arr = t_next
            if k > 1 and ends[k - 2] >= t_arr:
                k = 1 + int(ends[: k - 1].searchsorted(t_arr, side="left"))
                g_last = g0 + int(rel[k - 1])
                self._short = False
                total = self._set_blocks(g_last) - self.S_nb

        until = self.until
        if until is not None and k > 1 and ends[k - 2] >= until:
            # Another engine's clock is behind: stop before the first step starting after it.
            k = 1 + int(ends[: k - 1].searchsorted(until, side="left"))
            g_last = g0 + int(rel[k - 1])
            self._short = False
            total = self._set_blocks(g_last) - self.S_nb

        # Commit.
        if self.observer is not None:
            self.observer(k, n, n, n * bt)
        self.pool.pop_anonymous(total)
        self.S_nb += total
        self.G_alloc = g_last
        self.allocs += 1
        gk = int(rel[k])
        self.G = g0 + gk
        self._ensure_T(s0 + k)
        self.T[s0 : s0 + k] = ends[:k]
        if self.stream:
            self._send_run(s0, ends[:k], n)
        start_now = self.now
        self.now = float(ends[k - 1])
        self.step = s0 + k
        self.busy_s += self.now - start_now
        self.sum_batch += n * k
        self.sum_tokens += n * bt * k
        gen = n * gk
        if self.lim_min <= self.G:
            gen -= self._finish_decodes(s0 + k - 1)
        self.generated_tokens += gen
        return True


_EMPTY = np.empty(0, dtype=np.int64)
