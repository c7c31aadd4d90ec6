"""The paged KV cache: block pool, LRU free queue, block hashes, capacity arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from sim_support import engine, hardware, model

from servegym.engines.sim.cost_model import GIB
from servegym.engines.sim.kv_cache import BlockPool
from servegym.engines.sim.launch import REFERENCE_BUDGET
from servegym.engines.sim.prefix_cache import (
    PrefixCache,
    chain_hashes,
    output_block_hashes,
    session_chains,
)


def test_pool_pops_in_queue_order_and_frees_to_the_tail() -> None:
    pool = BlockPool(8, None)
    a = pool.pop(3)
    assert a.tolist() == [0, 1, 2] and pool.num_free == 5
    pool.release(a[::-1])  # a request frees last block first
    b = pool.pop(5)
    assert b.tolist() == [3, 4, 5, 6, 7]  # never-used blocks come first
    c = pool.pop(3)
    assert c.tolist() == [2, 1, 0]  # then the freed ones, in the order they were freed
    assert pool.num_free == 0 and pool.peak_used == 8


def test_shared_blocks_are_reference_counted() -> None:
    pool = BlockPool(4, None)
    a = pool.pop(2)
    pool.touch(a)  # a second request hits the same blocks
    pool.release(a)
    assert pool.num_free == 2
    pool.release(a)
    assert pool.num_free == 4


def test_touching_a_free_cached_block_takes_it_out_of_the_queue() -> None:
    cache = PrefixCache(6)
    pool = BlockPool(6, cache)
    a = pool.pop(3)
    hs = np.array([11, 12, 13], dtype=np.int64)
    cache.register(hs.tolist(), hs, a)
    pool.release(a[::-1])
    assert pool.num_free == 6
    hits = cache.lookup([11, 12, 99], np.array([11, 12, 99], dtype=np.int64))
    assert hits.tolist() == [0, 1]
    pool.touch(hits)
    assert pool.num_free == 4
    out = pool.pop(4)  # skips the touched (stale) queue entries
    assert sorted(out.tolist()) == [2, 3, 4, 5]
    assert 0 not in out and 1 not in out


def test_reusing_a_block_evicts_its_hash() -> None:
    cache = PrefixCache(2)
    pool = BlockPool(2, cache)
    a = pool.pop(2)
    hs = np.array([5, 6], dtype=np.int64)
    cache.register(hs.tolist(), hs, a)
    pool.release(a[::-1])  # block 1 (the tail) is evicted first
    assert cache.contains(5) and cache.contains(6)
    pool.pop(1)
    assert cache.contains(5) and not cache.contains(6)
    assert cache.lookup([5, 6], hs).tolist() == [0]


def test_first_copy_of_a_block_stays_the_cached_one() -> None:
    cache = PrefixCache(4)
    pool = BlockPool(4, cache)
    a, b = pool.pop(1), pool.pop(1)
    h = np.array([7], dtype=np.int64)
    cache.register([7], h, a)
    cache.register([7], h, b)
    assert cache.lookup([7], h).tolist() == a.tolist()


def test_chain_hashes_name_whole_prefixes() -> None:
    rng = np.random.default_rng(0)
    t = rng.integers(1000, 30000, size=100, dtype=np.int32)
    h = chain_hashes(t, 16)
    assert len(h) == 6 and (h != 0).all()
    u = t.copy()
    u[40] += 1  # block 2 changes: blocks 0-1 stay, every later block differs
    g = chain_hashes(u, 16)
    assert (g[:2] == h[:2]).all() and (g[2:] != h[2:]).all()
    assert (chain_hashes(t[:64], 16) == h[:4]).all()


def test_session_chains_match_hashing_each_sequence() -> None:
    rng = np.random.default_rng(1)
    prefixes = [rng.integers(0, 50000, size=n, dtype=np.int32) for n in (37, 48)]
    sessions = [
        (None, rng.integers(0, 50000, size=100, dtype=np.int32)),
        (0, rng.integers(0, 50000, size=5, dtype=np.int32)),
        (1, rng.integers(0, 50000, size=70, dtype=np.int32)),
        (0, rng.integers(0, 50000, size=0, dtype=np.int32)),
        (None, rng.integers(0, 50000, size=7, dtype=np.int32)),
    ]
    got = session_chains(prefixes, sessions, 16)
    for (pid, own), chain in zip(sessions, got, strict=True):
        seq = own if pid is None else np.concatenate([prefixes[pid], own])
        np.testing.assert_array_equal(chain, chain_hashes(seq, 16))


def test_output_block_hashes_are_unique_to_the_request() -> None:
    a = output_block_hashes(1, 0, 10)
    b = output_block_hashes(2, 0, 10)
    assert len(set(a.tolist()) | set(b.tolist())) == 20


def test_kv_capacity_arithmetic() -> None:
    """Blocks = (memory x utilization - weights - activation reserve) / (block size x KV
    bytes per token); an fp8 KV cache stores twice the tokens."""
    hw, m = hardware("h100-sxm"), model("llama-3.1-8b")
    e = engine()
    weights = m.num_parameters * 2
    kv = hw.memory_gib * GIB * 0.9 - weights - hw.activation_reserve_gib * GIB
    per_token = 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2
    assert e.config.max_num_batched_tokens == REFERENCE_BUDGET
    assert e.num_blocks == int(kv // (16 * per_token))
    assert e.kv_capacity_tokens == e.num_blocks * 16
    fp8 = engine(kv_cache_dtype="fp8")
    assert fp8.kv_capacity_tokens == pytest.approx(2 * e.kv_capacity_tokens, rel=0.001)
    more = engine(gpu_memory_utilization=0.95)
    assert more.kv_capacity_tokens > e.kv_capacity_tokens
    fixed = engine(kv_cache_memory_bytes=10 * GIB, max_model_len=32768)
    assert fixed.kv_capacity_tokens == int(10 * GIB // (16 * per_token)) * 16
    big_blocks = engine(block_size=64)
    assert big_blocks.num_blocks == int(kv // (64 * per_token))


def test_tensor_parallel_splits_weights_and_kv_heads() -> None:
    one = engine("llama-3.1-70b", "h100-sxm", tensor_parallel_size=4)
    two = engine("llama-3.1-70b", "h100-sxm", tensor_parallel_size=8)
    assert two.weight_bytes_per_gpu == pytest.approx(one.weight_bytes_per_gpu / 2)
    # 8 KV heads over 8 GPUs: one head each; per-GPU KV per token halves from TP 4.
    assert two.cost.memory.kv_bytes_per_token_per_gpu == pytest.approx(
        one.cost.memory.kv_bytes_per_token_per_gpu / 2
    )
    assert two.price_per_hour == pytest.approx(2 * one.price_per_hour)
