"""Prefix caching: block hashes of real token ids, and the hash -> cached block map.

vLLM v1 names each full KV block by a chain hash: the hash of its parent block's hash and
its own token ids, so two prompts share a cached block exactly when they share every token
up to the end of that block. The simulator hashes the workload's real token ids the same
way, so shared system prompts, shared-prefix groups and the growing context of agentic
sessions hit exactly as they would on the engine, and random prompts never do.

**Vectorised chain hash.** A block chain hash is computed for a whole token sequence at once
with numpy: every token is mixed with its absolute position by a 64-bit bijective mixer,
the mixes are summed per block, and the block sums are accumulated (``cumsum``) and
finalised with the block index (splitmix64), so hash ``i`` depends on every token of blocks
``0..i`` and their positions, which is what a chain hash provides. Two different prefixes
collide with probability about 2^-63. A session's turns are prefixes of one buffer
(``prefix + session.tokens``), so its chain is hashed once and every turn slices it.

**Outputs.** Generated tokens are not real tokens here; the blocks holding them are given
hashes unique to their request (:func:`output_block_hash`), marked only when the request is
preempted, so that its recompute hits its own blocks while they survive, as in vLLM. A
later turn of an agentic session never hits them: its prompt carries the recorded reply,
which differs from whatever the engine generated, exactly as on a real server.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S29 = np.uint64(29)
_S32 = np.uint64(32)
_OUTPUT_TAG = 0x6F75747075740000  # "output" tag mixed into output-block hashes


def _splitmix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    x = x ^ (x >> _S30)
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


def chain_hashes(tokens: npt.NDArray[np.integer], block_size: int) -> IntArray:
    """The chain hash of every full block of ``tokens`` (``len(tokens) // block_size`` of
    them), as non-zero int64 values (0 means "no hash" elsewhere)."""
    nb = len(tokens) // block_size
    if nb == 0:
        return np.empty(0, dtype=np.int64)
    n = nb * block_size
    x = _mix_tokens(tokens[:n], np.arange(1, n + 1, dtype=np.uint64))
    with np.errstate(over="ignore"):
        sums = x.reshape(nb, block_size).sum(axis=1, dtype=np.uint64)
        chain = np.cumsum(sums, dtype=np.uint64)
    # Mix the block index in, so a chain never equals a shorter chain's value by chance.
    return _finish_chain(chain, np.arange(1, nb + 1, dtype=np.uint64))


def output_block_hash(uid: int, index: int) -> int:
    """Hash of a request's ``index``-th block when it holds generated tokens: unique to the
    request (only its own recompute after a preemption can hit it)."""
    with np.errstate(over="ignore"):
        x = np.array(
            [(uid * 0x100000001B3 + index + _OUTPUT_TAG) & 0xFFFF_FFFF_FFFF_FFFF], dtype=np.uint64
        )
        v = int(_splitmix(x).view(np.int64)[0])
    return v or 1


def output_block_hashes(uid: int, start: int, stop: int) -> IntArray:
    """:func:`output_block_hash` of blocks ``start .. stop - 1``."""
    if stop <= start:
        return np.empty(0, dtype=np.int64)
    with np.errstate(over="ignore"):
        base = np.uint64((uid * 0x100000001B3 + _OUTPUT_TAG) & 0xFFFF_FFFF_FFFF_FFFF)
        x = np.arange(start, stop, dtype=np.uint64) + base
        v = _splitmix(x).view(np.int64)
    v[v == 0] = 1
    return v


class PrefixCache:
    """Which physical KV block holds each cached block hash.

    Like vLLM's ``BlockPool.cached_block_hash_to_block``: a block is entered when the
    scheduler allocates it for tokens it is about to compute (so a request scheduled later in
    the same step already hits it), and stops counting when the block is evicted for reuse.
    When two requests compute the same block at once, the first one's block is the cached
    one and the other stays a private copy.

    Eviction is lazy: the pool clears a reused block's entry in ``bhash`` (the hash each
    physical block holds), and a map entry counts only while ``bhash[block]`` still equals
    its hash, so evicting a thousand blocks is one vector store, not a thousand deletions.
    """

    __slots__ = ("bhash", "hit_tokens", "map", "queried_tokens")

    def __init__(self, num_blocks: int) -> None:
        self.map: dict[int, int] = {}
        self.bhash = np.zeros(num_blocks, dtype=np.int64)
        self.queried_tokens = 0
        self.hit_tokens = 0

    def contains(self, h: int) -> bool:
        b = self.map.get(h)
        return b is not None and int(self.bhash[b]) == h

    def lookup(self, hashes: list[int], hash_arr: IntArray) -> IntArray:
        """Block ids of the longest prefix of ``hashes`` that is cached."""
        if not hashes or not self.contains(hashes[0]):
            return np.empty(0, dtype=np.int64)
        found = list(map(self.map.get, hashes))
        m = found.index(None) if None in found else len(found)
        blocks = np.array(found[:m], dtype=np.int64)
        valid = self.bhash[blocks] == hash_arr[:m]
        if not valid.all():
            blocks = blocks[: int(np.argmin(valid))]
        return blocks

    def register(self, hashes: list[int], hash_arr: IntArray, blocks: IntArray) -> None:
        """Enter ``blocks`` under ``hashes`` where the hash is not cached yet."""
        got = list(map(self.map.get, hashes))
        if got.count(None) == len(got):
            self.map.update(zip(hashes, blocks.tolist(), strict=True))
            self.bhash[blocks] = hash_arr
            return
        g = np.fromiter((-1 if x is None else x for x in got), dtype=np.int64, count=len(got))
        new = g < 0
        live = ~new
        new[live] = self.bhash[g[live]] != hash_arr[live]
        sel = np.flatnonzero(new)
        if len(sel):
            self.map.update(zip(hash_arr[sel].tolist(), blocks[sel].tolist(), strict=True))
            self.bhash[blocks[sel]] = hash_arr[sel]


def _mix_tokens(
    tokens: npt.NDArray[np.integer], pos: npt.NDArray[np.uint64]
) -> npt.NDArray[np.uint64]:
    """A pseudo-random 64-bit value per (token, position): ``token + position << 32`` is
    injective for 32-bit token ids, and a multiply by an odd constant, an xor-shift and
    another odd multiply are bijections, so different pairs never mix to the same value;
    a block's hash sums its tokens' values."""
    with np.errstate(over="ignore"):
        x = pos << _S32
        x += tokens.astype(np.uint64)
        x *= _GOLDEN
        x ^= x >> _S29
        x *= _M1
        x ^= x >> _S32
        return x


def _finish_chain(chain: npt.NDArray[np.uint64], index: npt.NDArray[np.uint64]) -> IntArray:
    with np.errstate(over="ignore"):
        out = _splitmix(chain ^ (index * _M1)).view(np.int64)
    out[out == 0] = 1
    return out


def session_chains(
    prefixes: list[npt.NDArray[np.int32]],
    sessions: list[tuple[int | None, npt.NDArray[np.int32]]],
    block_size: int,
) -> list[IntArray]:
    """:func:`chain_hashes` of every session's full sequence (its shared prefix, if any,
    then its own token buffer), computed for all sessions in a few vector operations.

    ``sessions`` holds ``(prefix id or None, own tokens)``; the result is equal, session by
    session, to ``chain_hashes(concatenate([prefix, tokens]), block_size)``.
    """
    B = block_size
    # Shared prefixes: the chain of their full blocks, and the mixes of their partial tail.
    p_final: list[IntArray] = []
    p_tail: list[npt.NDArray[np.uint64]] = []
    p_base: list[int] = []
    p_full: list[int] = []
    for p in prefixes:
        n = len(p)
        mix = _mix_tokens(p, np.arange(1, n + 1, dtype=np.uint64))
        full = n // B
        with np.errstate(over="ignore"):
            cum = np.cumsum(
                mix[: full * B].reshape(full, B).sum(axis=1, dtype=np.uint64), dtype=np.uint64
            )
        p_final.append(_finish_chain(cum, np.arange(1, full + 1, dtype=np.uint64)))
        p_tail.append(mix[full * B :])
        p_base.append(int(cum[-1]) if full else 0)
        p_full.append(full)
    m = len(sessions)
    if m == 0:
        return []
    lens = np.fromiter((len(t) for _, t in sessions), dtype=np.int64, count=m)
    pid = np.fromiter((-1 if q is None else q for q, _ in sessions), dtype=np.int64, count=m)
    plen = np.array([len(p) for p in prefixes] + [0], dtype=np.int64)[pid]
    own = np.concatenate([t for _, t in sessions]) if lens.sum() else np.empty(0, np.int32)
    starts = np.cumsum(lens) - lens
    pos = (np.arange(len(own), dtype=np.int64) - np.repeat(starts - plen - 1, lens)).astype(
        np.uint64
    )
    mix = _mix_tokens(own, pos)
    tails = np.array([len(t) for t in p_tail] + [0], dtype=np.int64)[pid]
    if tails.any():
        parts: list[npt.NDArray[np.uint64]] = []
        for i in range(m):
            if tails[i]:
                parts.append(p_tail[pid[i]])
            parts.append(mix[starts[i] : starts[i] + lens[i]])
        comb = np.concatenate(parts)
    else:
        comb = mix
    clen = lens + tails
    coff = np.cumsum(clen) - clen
    nbo = clen // B
    total_blocks = int(nbo.sum())
    bo = np.cumsum(nbo) - nbo
    j = np.arange(total_blocks, dtype=np.int64) - np.repeat(bo, nbo)
    bstart = np.repeat(coff, nbo) + j * B
    with np.errstate(over="ignore"):
        csum = np.zeros(len(comb) + 1, dtype=np.uint64)
        np.cumsum(comb, dtype=np.uint64, out=csum[1:])
        bsum = csum[bstart + B] - csum[bstart]
        gc = np.cumsum(bsum, dtype=np.uint64)
        before = np.zeros(m, dtype=np.uint64)
        has = nbo > 0
        before[has] = gc[bo[has]] - bsum[bo[has]]
        pbase = np.array([*p_base, 0], dtype=np.uint64)[pid]
        chain = gc - np.repeat(before, nbo) + np.repeat(pbase, nbo)
        pfull = np.array([*p_full, 0], dtype=np.int64)[pid]
        index = (np.repeat(pfull, nbo) + j + 1).astype(np.uint64)
    final = _finish_chain(chain, index)
    out: list[IntArray] = []
    for i in range(m):
        own_chain = final[bo[i] : bo[i] + nbo[i]]
        q = int(pid[i])
        out.append(
            own_chain if q < 0 or p_full[q] == 0 else np.concatenate([p_final[q], own_chain])
        )
    return out
