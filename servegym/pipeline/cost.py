"""The modelled cost and quality of the pipeline's non-LLM stages on the task's hardware.

**Encoder work** (the embedder and the cross-encoder reranker) runs on the main GPU in
batches of up to ``embed_batch_size`` sequences. A batch of ``n`` sequences of ``t`` tokens
through a model of ``P`` parameters costs ``2 P n t`` FLOPs at an efficiency that grows
with the batch (:data:`ENCODER_EFFICIENCY` ``x n / (n + BATCH_HALF)`` of the GPU's bf16
peak) plus a fixed :data:`ENCODER_OVERHEAD_S` per batch (kernel launches through every
layer): small batches pay the overhead many times, large ones run near the efficiency
ceiling. The encoders need their weights and ``ENCODER_ACTIVATION_GIB`` per sequence of a
batch in the memory the LLM server leaves (``1 - gpu_memory_utilization``): a batch size
that does not fit refuses to launch, so batch size trades against the KV cache.

**HNSW search** runs on the host's ``cpu_cores``. A query visits about
``ef x M`` candidates on the bottom layer plus ``M log2(N)`` on the way down, each one
distance computation of ``distance_us`` (memory-bound: a corpus of millions of vectors does
not stay in cache), scaled by ``embed_dim / 1024``; ``ef`` is ``max(ef_search, top_k)`` (the
beam never holds fewer than the candidates asked for). Building the index inserts every
document at the cost of a search with ``ef_construction`` after embedding it.

**Recall** of one retrieval round, for one sub-query with one supporting passage: the HNSW
search finds the true neighbours with probability ``1 - exp(-x)``,
``x = 0.4 sqrt(ef) (M / 16)^0.35 (ef_construction / 200)^0.3`` (a graph of higher degree
and a better build are easier to search); the embedder ranks the supporting passage within
the ``d = rerank_depth`` candidates the reranker reads with probability
``1 - 0.6 exp(-d / embedding_recall_scale)``; the reranker keeps it among the
``passages_kept`` it passes on with probability :data:`RERANK_KEEP`. A sub-query the grader
finds unsupported goes round again, up to ``max_rounds`` times, so the final recall is
``1 - (1 - r)^max_rounds``. Turning ``ef_search`` or the depths down too far, or allowing
one round only, costs recall, and recall gates the score like accuracy (see
:mod:`servegym.pipeline.engine`).
"""

from __future__ import annotations

import math

from servegym.engines.pipeline_knobs import PipelineKnobs
from servegym.engines.sim.profiles import HardwareProfile
from servegym.tasks.pipeline_spec import PipelineSpec

ENCODER_EFFICIENCY = 0.5
"""The fraction of bf16 peak a large encoder batch reaches."""
BATCH_HALF = 16.0
"""The batch size at which an encoder reaches half of :data:`ENCODER_EFFICIENCY`."""
ENCODER_OVERHEAD_S = 0.004
"""Fixed seconds per encoder batch (launches through every layer)."""
ENCODER_ACTIVATION_GIB = 0.15
"""Activation memory per sequence of an encoder batch, GiB."""
RERANK_KEEP = 0.98
"""Probability the reranker keeps a supporting passage it reads among those it passes on."""
GIB = 1024**3


def encoder_batch_s(hw: HardwareProfile, params: float, seqs: int, tokens_per_seq: int) -> float:
    """Seconds of one encoder batch of ``seqs`` sequences of ``tokens_per_seq`` tokens."""
    flops = 2.0 * params * seqs * tokens_per_seq
    efficiency = ENCODER_EFFICIENCY * seqs / (seqs + BATCH_HALF)
    return ENCODER_OVERHEAD_S + flops / (hw.peak_tflops.bf16 * 1e12 * efficiency)


def encoder_memory_gib(spec: PipelineSpec, knobs: PipelineKnobs) -> float:
    """GiB the embedder and reranker need: bf16 weights plus the largest batch."""
    weights = 2.0 * (spec.embedder_params + spec.reranker_params) / GIB
    return weights + ENCODER_ACTIVATION_GIB * knobs.embed_batch_size


def effective_ef(knobs: PipelineKnobs) -> int:
    """The search beam: ``max(ef_search, top_k)``."""
    return max(knobs.ef_search, knobs.top_k)


def _distance_s(spec: PipelineSpec) -> float:
    return spec.distance_us * 1e-6 * spec.embed_dim / 1024


def search_s(spec: PipelineSpec, knobs: PipelineKnobs) -> float:
    """Seconds of one HNSW query on one core."""
    visits = effective_ef(knobs) * knobs.hnsw_m + knobs.hnsw_m * math.log2(spec.corpus_docs)
    return visits * _distance_s(spec)


def index_build_docs_per_s(hw: HardwareProfile, spec: PipelineSpec, knobs: PipelineKnobs) -> float:
    """Documents per second of building the index: embedding the corpus in full batches on
    the GPU, then inserting each document (a search with ``ef_construction``) on the
    cores; the two overlap, so the slower one sets the rate."""
    bs = knobs.embed_batch_size
    embed_per_doc = encoder_batch_s(hw, spec.embedder_params, bs, spec.passage_tokens) / bs
    visits = knobs.ef_construction * knobs.hnsw_m + knobs.hnsw_m * math.log2(spec.corpus_docs)
    insert_per_doc = visits * _distance_s(spec) / spec.cpu_cores
    return 1.0 / max(embed_per_doc, insert_per_doc)


def ann_recall(knobs: PipelineKnobs) -> float:
    """Probability the HNSW search returns a true neighbour."""
    x = (
        0.4
        * math.sqrt(effective_ef(knobs))
        * (knobs.hnsw_m / 16) ** 0.35
        * (knobs.ef_construction / 200) ** 0.3
    )
    return 1.0 - math.exp(-x)


def embedding_recall(spec: PipelineSpec, depth: int) -> float:
    """Probability the embedder ranks a supporting passage within ``depth``."""
    return 1.0 - 0.6 * math.exp(-depth / spec.embedding_recall_scale)


def round_recall(spec: PipelineSpec, knobs: PipelineKnobs) -> float:
    """Probability one round retrieves a sub-query's supporting passage into the passages
    the grader and the answer read."""
    return ann_recall(knobs) * embedding_recall(spec, knobs.rerank_depth) * RERANK_KEEP


def final_recall(spec: PipelineSpec, knobs: PipelineKnobs) -> float:
    """Expected recall after up to ``max_rounds`` rounds (the modelled recall@k, k =
    ``passages_kept``)."""
    return 1.0 - (1.0 - round_recall(spec, knobs)) ** knobs.max_rounds
