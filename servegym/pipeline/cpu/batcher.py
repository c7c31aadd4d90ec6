"""Batches concurrent questions' retrieval requests into worker calls.

A question's round asks for one query; :class:`QueryBatcher` sends whatever queries are
waiting, up to ``batch_size`` of them, as one call to the retriever (embed, search and rerank
in the worker), so the embedding batch size and the concurrency between questions both
shape the retrieval stages' cost, as they would in a served embedder.

Each answer carries the seconds the question spent in each of the three stages: ``retrieve``
and ``rerank`` are the worker's own times for the batch; ``embed`` is the rest of the wait
(queueing behind other batches, the pipe, the embedding itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from servegym.pipeline.cpu.retrieval import Hit, Retriever


@dataclass(frozen=True)
class RetrievalAnswer:
    hit: Hit
    embed_s: float
    retrieve_s: float
    rerank_s: float


@dataclass
class _Pending:
    query: str
    t_submit: float
    future: asyncio.Future[RetrievalAnswer]


class QueryBatcher:
    """Collects queries and runs them through ``retriever`` in batches (see module doc)."""

    def __init__(
        self,
        retriever: Retriever,
        *,
        batch_size: int,
        ef_search: int,
        top_k: int,
        rerank_depth: int,
        keep: int,
    ) -> None:
        self._retriever = retriever
        self._batch_size = batch_size
        self._params = {
            "ef_search": ef_search,
            "top_k": top_k,
            "rerank_depth": rerank_depth,
            "keep": keep,
        }
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.batches: list[int] = []
        """The size of every batch sent, in order."""

    async def __aenter__(self) -> QueryBatcher:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while not self._queue.empty():
            pending = self._queue.get_nowait()
            if not pending.future.done():
                pending.future.cancel()

    async def search(self, query: str) -> RetrievalAnswer:
        future: asyncio.Future[RetrievalAnswer] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(query, time.perf_counter(), future))
        return await future

    async def _loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            self.batches.append(len(batch))
            try:
                answer = await self._retriever.query(
                    [p.query for p in batch], batch_size=self._batch_size, **self._params
                )
            except Exception as exc:  # handed to every waiting question
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            t_done = time.perf_counter()
            for p, hit in zip(batch, answer.results, strict=True):
                if p.future.done():
                    continue
                waited = t_done - p.t_submit
                embed = max(0.0, waited - answer.retrieve_s - answer.rerank_s)
                p.future.set_result(RetrievalAnswer(hit, embed, answer.retrieve_s, answer.rerank_s))
