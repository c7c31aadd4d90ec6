"""Paged KV cache: physical blocks, reference counts, the LRU free queue, block tables.

As in vLLM v1's ``BlockPool``: every block is free or held by one or more requests (a
cached prefix block is shared, reference-counted). Free blocks wait in one queue; new
allocations take from its head, evicting whatever cached content the block held. A request
frees its blocks to the tail in reverse order (its last block first), so when blocks run
out the tails of old sequences go first and their prefixes survive longest. A cache hit on
a free block takes it back out of the queue ("touch").

Everything is numpy over block ids, so allocating or freeing a thousand blocks is a few
vector operations: the queue is an array with a head index, and taking a block out of the
middle (a touch) marks its entry stale instead of moving anything (``qpos`` says where a
free block's live entry is; stale entries are skipped when they reach the head).

Block tables live in one flat array: each request owns a slice, reserved on first
admission for its largest possible size.

**Decode blocks are anonymous.** The blocks decoding requests grow into are private,
uncached and interchangeable: which physical id a request holds changes nothing the engine
can observe (they carry no hash; when freed they enter the queue at the same positions
whatever their ids). So a run of decode steps takes the blocks it needs from the free queue
in one pop and keeps them on a stack of anonymous blocks, and a request only counts how
many it holds; when it is freed it returns that many from the stack (ahead of its own
prompt blocks, in vLLM's last-block-first order). A preempted request's output blocks get
hashes, so those are first written into its table.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from servegym.engines.sim.prefix_cache import PrefixCache

IntArray = npt.NDArray[np.int64]


class BlockPool:
    """The KV blocks of one engine (per GPU; every GPU holds the same block ids)."""

    def __init__(self, num_blocks: int, cache: PrefixCache | None) -> None:
        if num_blocks < 1:
            raise ValueError("a KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.cache = cache
        self.ref = np.zeros(num_blocks, dtype=np.int32)
        self.bhash = cache.bhash if cache is not None else None
        self.qpos = np.arange(num_blocks, dtype=np.int64)
        self._q = np.arange(max(num_blocks * 2, 1024), dtype=np.int64)
        self._head = 0
        self._tail = num_blocks
        self.num_free = num_blocks
        self.peak_used = 0
        self.releases = 0  # counts release() calls that freed blocks
        self._stale = 0  # queue entries of blocks taken back out by cache hits
        # Flat block tables.
        self.table = np.zeros(1 << 16, dtype=np.int64)
        self._table_end = 0
        # Anonymous decode blocks (a stack).
        self._anon = np.zeros(1024, dtype=np.int64)
        self._anon_n = 0

    @property
    def used(self) -> int:
        return self.num_blocks - self.num_free

    # --- block tables -------------------------------------------------------------------

    def reserve_table(self, size: int) -> int:
        """Reserve a block-table slice of ``size`` entries; returns its offset."""
        off = self._table_end
        end = off + size
        if end > len(self.table):
            grown = np.zeros(max(end, 2 * len(self.table)), dtype=np.int64)
            grown[:off] = self.table[:off]
            self.table = grown
        self._table_end = end
        return off

    # --- allocation ---------------------------------------------------------------------

    def pop(self, n: int) -> IntArray:
        """Take ``n`` free blocks from the head of the queue (the caller checked
        ``n <= num_free``); whatever they cached is evicted."""
        if n <= 0:
            return _EMPTY
        q, head = self._q, self._head
        if self._stale == 0:  # no entry taken back by a cache hit: the head is all live
            out = q[head : head + n].copy()
            self._head = head + n
        else:
            qpos, tail = self.qpos, self._tail
            m = min(tail - head, n + 16 + (n >> 2))
            while True:
                window = q[head : head + m]
                idx = np.flatnonzero(qpos[window] == np.arange(head, head + m))
                if len(idx) >= n or head + m >= tail:
                    break
                m = min(tail - head, 2 * m)
            if len(idx) < n:  # pragma: no cover - the caller checks num_free
                raise RuntimeError(f"KV pool: asked for {n} blocks, {len(idx)} are free")
            last = int(idx[n - 1])
            out = window[idx[:n]]
            self._stale -= last + 1 - n  # stale entries skipped
            self._head = head + last + 1
        self.num_free -= n
        used = self.num_blocks - self.num_free
        if used > self.peak_used:
            self.peak_used = used
        self.ref[out] = 1
        if self.bhash is not None:
            self.bhash[out] = 0
        return out

    def touch(self, blocks: IntArray) -> None:
        """Cache hits: take a reference to each block (out of the free queue if free)."""
        if len(blocks) == 0:
            return
        ref = self.ref
        was_free = ref[blocks] == 0
        nf = int(np.count_nonzero(was_free))
        if nf:
            self.qpos[blocks[was_free]] = -1
            self.num_free -= nf
            self._stale += nf
            used = self.num_blocks - self.num_free
            if used > self.peak_used:
                self.peak_used = used
        ref[blocks] += 1

    def release(self, blocks: IntArray, *, exclusive: bool = False) -> None:
        """Drop one reference to each block; blocks no longer held join the free queue in
        the given order (callers pass a request's blocks last-first). ``exclusive``: the
        caller knows no other request holds them."""
        if len(blocks) == 0:
            return
        ref = self.ref
        if exclusive:
            ref[blocks] = 0
            freed = blocks
        else:
            ref[blocks] -= 1
            freed = blocks[ref[blocks] == 0]
        n = len(freed)
        if n == 0:
            return
        tail = self._tail
        if tail + n > len(self._q):
            self._compact(n)
            tail = self._tail
        self._q[tail : tail + n] = freed
        self.qpos[freed] = np.arange(tail, tail + n)
        self._tail = tail + n
        self.num_free += n
        self.releases += 1

    def _compact(self, extra: int) -> None:
        """Drop the consumed head of the queue (and grow it if needed)."""
        head, tail = self._head, self._tail
        live = self._q[head:tail]
        need = (tail - head) + extra
        size = max(len(self._q), 2 * need)
        q = np.empty(size, dtype=np.int64)
        q[: tail - head] = live
        valid = self.qpos[live] == np.arange(head, tail)
        self.qpos[live[valid]] -= head
        self._stale = int(len(live) - np.count_nonzero(valid))
        self._q = q
        self._head = 0
        self._tail = tail - head

    def pop_anonymous(self, n: int) -> None:
        """Allocate ``n`` blocks to decoding requests, anonymously (see the module doc)."""
        if n <= 0:
            return
        blocks = self.pop(n)
        end = self._anon_n + n
        if end > len(self._anon):
            grown = np.zeros(max(end, 2 * len(self._anon)), dtype=np.int64)
            grown[: self._anon_n] = self._anon[: self._anon_n]
            self._anon = grown
        self._anon[self._anon_n : end] = blocks
        self._anon_n = end

    def take_anonymous(self, n: int) -> IntArray:
        """Name ``n`` anonymous blocks (a request is freeing or hashing them)."""
        if n > self._anon_n:  # pragma: no cover - bookkeeping bug
            raise RuntimeError(f"KV pool: {n} anonymous blocks asked for, {self._anon_n} held")
        self._anon_n -= n
        return self._anon[self._anon_n : self._anon_n + n].copy()

    def free_of(self, blocks: IntArray) -> int:
        """How many of ``blocks`` are free (a hit on them takes them out of the free count)."""
        return int(np.count_nonzero(self.ref[blocks] == 0))


_EMPTY = np.empty(0, dtype=np.int64)
