"""The CPU track's RAG pipeline, run for real over a set of questions.

For each question (``concurrency`` of them in flight, all arriving at once):

1. **decompose**: one LLM call on the answer server;
2. up to ``max_rounds`` retrieval rounds, each: **embed** the round's query, **retrieve**
   ``top_k`` candidates from the HNSW index, **rerank** the first ``rerank_depth`` of them
   exactly and keep the task's ``passages_kept`` (the three in the retrieval worker, batched
   across questions by :class:`~servegym.pipeline.cpu.batcher.QueryBatcher`), then **grade**:
   one short LLM call per kept passage not graded before, in parallel, on the answer server
   (``grade_server = "shared"``) or the grader's own (``"dedicated"``). The first round's
   query is the question; later rounds take its sub-queries in turn. The sufficiency check
   stops the loop once as many passages were judged relevant as the question has
   sub-queries;
3. **answer**: one LLM call with the question and the best ``passages_kept`` passages
   found over all rounds.

The CPU track's model has random weights, so what it says carries no meaning: the LLM calls
are real work at forced output lengths, and the grader's verdict is the rerank score against
:attr:`PipelineSettings.relevance_threshold` (0.70, set from all-MiniLM-L6-v2's cosine
scores on this corpus: supporting passages score 0.72-0.78 at the median, the 90th
percentile of the others 0.73-0.75). Retrieval quality is recall@k of the supporting
passages in the final ``passages_kept`` (k), measured here from the ids the worker returned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
from pydantic import BaseModel, ConfigDict, Field

from servegym.engines.pipeline_knobs import PipelineKnobs
from servegym.errors import UserError
from servegym.pipeline.cpu.batcher import QueryBatcher
from servegym.pipeline.cpu.corpus import Corpus, Passage, Question
from servegym.pipeline.cpu.llm import complete, new_session
from servegym.pipeline.cpu.recall import recall_at_k
from servegym.pipeline.cpu.retrieval import BuildStats, Retriever
from servegym.pipeline.result import PipelineResult, TaskRecord


class PipelineSettings(BaseModel):
    """What the task fixes: where the LLMs are, the model, each LLM stage's output length."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    answer_url: str = Field(description="base URL of the OpenAI-compatible answer server")
    grade_url: str | None = Field(
        default=None, description="base URL of the grader's server (for grade_server = 'dedicated')"
    )
    model: str = "servegym-tiny"
    grade_model: str | None = Field(default=None, description="the grader's model (default: model)")
    passages_kept: int = Field(
        default=4, ge=1, description="passages per question kept after reranking (k of recall@k)"
    )
    decompose_tokens: int = Field(default=24, ge=1)
    grade_tokens: int = Field(default=6, ge=1)
    answer_tokens: int = Field(default=48, ge=1)
    context_words: int = Field(
        default=1200, ge=50, description="passage words at most in the answer prompt"
    )
    relevance_threshold: float = Field(
        default=0.70, description="rerank score at or above which the grader's verdict is yes"
    )


class QuestionOutcome(BaseModel):
    """One question's retrieval as the harness saw it."""

    model_config = ConfigDict(extra="forbid")

    id: str
    support: list[str]
    retrieved: list[str]
    recall: float
    rounds: int
    sufficient: bool


class CpuPipelineRun(BaseModel):
    """A run: the shared :class:`PipelineResult`, plus the build and the per-question detail."""

    model_config = ConfigDict(extra="forbid")

    result: PipelineResult
    build: BuildStats
    knobs: PipelineKnobs
    corpus_digest: str
    questions: list[QuestionOutcome]
    batches: list[int] = Field(description="size of every retrieval batch sent to the worker")


@dataclass
class _Timer:
    stage_s: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, seconds: float) -> None:
        self.stage_s[stage] = self.stage_s.get(stage, 0.0) + seconds


def _decompose_prompt(q: Question) -> str:
    return f"Split the question into search queries, one a line.\nQuestion: {q.text}\nQueries:\n"


def _grade_prompt(q: Question, p: Passage) -> str:
    return (
        "Does the passage help answer the question? Answer yes or no.\n"
        f"Question: {q.text}\nPassage: {p.text}\nAnswer:"
    )


def _answer_prompt(q: Question, passages: Sequence[Passage], max_words: int) -> str:
    parts: list[str] = []
    left = max_words
    for p in passages:
        words = p.text.split()
        if left <= 0:
            break
        parts.append(" ".join(words[:left]))
        left -= len(words)
    context = "\n\n".join(parts)
    return f"Answer the question from the passages.\n\n{context}\n\nQuestion: {q.text}\nAnswer:"


def _grade_url(knobs: PipelineKnobs, settings: PipelineSettings) -> str:
    if knobs.grade_server == "shared":
        return settings.answer_url
    if settings.grade_url is None:
        raise UserError("pipeline: grade_server is 'dedicated' but no grader server was given")
    return settings.grade_url


class _Pipeline:
    def __init__(
        self,
        corpus: Corpus,
        knobs: PipelineKnobs,
        settings: PipelineSettings,
        batcher: QueryBatcher,
        session: aiohttp.ClientSession,
    ) -> None:
        self.corpus = corpus
        self.knobs = knobs
        self.settings = settings
        self.batcher = batcher
        self.session = session
        self.grade_url = _grade_url(knobs, settings)
        self.grade_model = settings.grade_model or settings.model

    async def _llm(self, url: str, model: str, prompt: str, tokens: int, what: str) -> str:
        return await complete(
            self.session, url, model=model, prompt=prompt, max_tokens=tokens, what=what
        )

    async def run_one(
        self, index: int, q: Question, arrived: float
    ) -> tuple[TaskRecord, QuestionOutcome]:
        """Run ``q``; its latency counts from ``arrived`` (a ``perf_counter`` time), so the
        wait for a concurrency slot is in it."""
        s, k = self.settings, self.knobs
        timer = _Timer()
        t0 = time.perf_counter()
        await self._llm(
            s.answer_url, s.model, _decompose_prompt(q), s.decompose_tokens, f"decompose {q.id}"
        )
        timer.add("decompose", time.perf_counter() - t0)

        best: dict[int, float] = {}
        graded: set[int] = set()
        rounds = 0
        sufficient = False
        for r in range(k.max_rounds):
            rounds = r + 1
            query = q.text if r == 0 else q.sub_queries[(r - 1) % len(q.sub_queries)]
            got = await self.batcher.search(query)
            timer.add("embed", got.embed_s)
            timer.add("retrieve", got.retrieve_s)
            timer.add("rerank", got.rerank_s)
            fresh: list[int] = []
            for pid, score in zip(got.hit.ids, got.hit.scores, strict=True):
                best[pid] = max(score, best.get(pid, score))
                if pid not in graded:
                    graded.add(pid)
                    fresh.append(pid)
            tg = time.perf_counter()
            await asyncio.gather(
                *(
                    self._llm(
                        self.grade_url,
                        self.grade_model,
                        _grade_prompt(q, self.corpus.passages[pid]),
                        s.grade_tokens,
                        f"grade {q.id}",
                    )
                    for pid in fresh
                )
            )
            timer.add("grade", time.perf_counter() - tg)
            # the verdict on a passage graded in an earlier round follows its best score
            relevant = {pid for pid in graded if best[pid] >= s.relevance_threshold}
            if len(relevant) >= len(q.sub_queries):
                sufficient = True
                break

        top = sorted(best, key=lambda pid: (-best[pid], pid))[: s.passages_kept]
        passages = [self.corpus.passages[pid] for pid in top]
        ta = time.perf_counter()
        await self._llm(
            s.answer_url,
            s.model,
            _answer_prompt(q, passages, s.context_words),
            s.answer_tokens,
            f"answer {q.id}",
        )
        t_end = time.perf_counter()
        timer.add("answer", t_end - ta)
        retrieved = [p.id for p in passages]
        record = TaskRecord(
            index=index, latency_s=t_end - arrived, rounds=rounds, stage_s=timer.stage_s
        )
        outcome = QuestionOutcome(
            id=q.id,
            support=list(q.support),
            retrieved=retrieved,
            recall=recall_at_k(q.support, retrieved, s.passages_kept),
            rounds=rounds,
            sufficient=sufficient,
        )
        return record, outcome


def _first(eg: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf exception of a (nested) exception group: one question's failure."""
    first = eg.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


async def run_pipeline(
    corpus: Corpus,
    questions: Sequence[Question],
    retriever: Retriever,
    knobs: PipelineKnobs,
    settings: PipelineSettings,
    *,
    task: str | None = None,
    built: BuildStats | None = None,
    arrivals: Sequence[float] | None = None,
) -> CpuPipelineRun:
    """Build the index over ``corpus``, then run every question through the pipeline.

    ``built``: the retriever already holds this index over ``corpus``, built with ``knobs``'
    index settings (``embed_batch_size``, ``hnsw_m``, ``ef_construction``); it is reused and
    its build rate reported.

    ``arrivals``: each question's arrival, seconds after the first (default: all at once, a
    closed loop of ``concurrency``); a question waits for its arrival, then for a free slot.
    A question's latency runs from its arrival to its answer.
    """
    if not questions:
        raise UserError("pipeline: no questions to run")
    offsets = [0.0] * len(questions) if arrivals is None else [float(a) for a in arrivals]
    if len(offsets) != len(questions) or any(not 0 <= a < float("inf") for a in offsets):
        raise UserError(
            f"pipeline: {len(questions)} questions need as many finite arrivals >= 0, "
            f"got {len(offsets)}"
        )
    _grade_url(knobs, settings)
    build = built or await retriever.build(
        [p.text for p in corpus.passages],
        batch_size=knobs.embed_batch_size,
        hnsw_m=knobs.hnsw_m,
        ef_construction=knobs.ef_construction,
    )
    if build.docs != len(corpus.passages):
        raise UserError(
            f"pipeline: the index holds {build.docs} passages, the corpus {len(corpus.passages)}"
        )
    gate = asyncio.Semaphore(knobs.concurrency)
    async with (
        new_session() as session,
        QueryBatcher(
            retriever,
            batch_size=knobs.embed_batch_size,
            ef_search=knobs.ef_search,
            top_k=knobs.top_k,
            rerank_depth=knobs.rerank_depth,
            keep=settings.passages_kept,
        ) as batcher,
    ):
        pipeline = _Pipeline(corpus, knobs, settings, batcher, session)

        async def one(i: int, q: Question) -> tuple[TaskRecord, QuestionOutcome]:
            arrived = t0 + offsets[i]
            await asyncio.sleep(max(0.0, arrived - time.perf_counter()))
            async with gate:
                return await pipeline.run_one(i, q, arrived)

        t0 = time.perf_counter()
        try:
            async with asyncio.TaskGroup() as group:
                running = [group.create_task(one(i, q)) for i, q in enumerate(questions)]
        except ExceptionGroup as eg:
            raise _first(eg) from None
        wall = time.perf_counter() - (t0 + min(offsets))
        done = [t.result() for t in running]
    outcomes = [o for _, o in done]
    result = PipelineResult.from_tasks(
        track="cpu",
        task=task,
        tasks=[r for r, _ in done],
        wall_s=wall,
        index_build_docs_per_s=build.docs_per_s,
        recall_at_k=sum(o.recall for o in outcomes) / len(outcomes),
        k=settings.passages_kept,
    )
    return CpuPipelineRun(
        result=result,
        build=build,
        knobs=knobs,
        corpus_digest=corpus.digest,
        questions=outcomes,
        batches=batcher.batches,
    )
