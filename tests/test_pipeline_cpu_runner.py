"""The CPU pipeline's runner and retrieval worker, without torch or faiss.

The worker runs with the project's own Python on its numpy-only ``hash`` backend (the same
protocol as the real one); the LLM stages call the in-process mock OpenAI server.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from servegym.engines.pipeline_knobs import PipelineKnobs
from servegym.errors import UserError
from servegym.pipeline.cpu.corpus import Corpus, Passage, Question, build_corpus, make_questions
from servegym.pipeline.cpu.llm import LLMCallError
from servegym.pipeline.cpu.retrieval import (
    BuildStats,
    Hit,
    QueryBatch,
    WorkerError,
    WorkerRetriever,
)
from servegym.pipeline.cpu.runner import PipelineSettings, run_pipeline
from servegym.pipeline.result import STAGES
from tests.conftest import MockFactory

MODEL = "servegym-tiny"


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return build_corpus()


@pytest.fixture
async def hash_worker() -> AsyncIterator[WorkerRetriever]:
    worker = await WorkerRetriever.start(sys.executable, backend="hash")
    yield worker
    await worker.close()


async def test_worker_protocol(hash_worker: WorkerRetriever, corpus: Corpus) -> None:
    assert hash_worker.hello["backend"] == "hash"
    texts = [p.text for p in corpus.passages[:200]]
    build = await hash_worker.build(texts, batch_size=16, hnsw_m=8, ef_construction=16)
    assert build.docs == 200 and build.docs_per_s > 0
    batch = await hash_worker.query(
        [texts[3], texts[150]], batch_size=4, ef_search=8, top_k=10, rerank_depth=10, keep=3
    )
    assert [h.ids[0] for h in batch.results] == [3, 150]  # a passage finds itself
    assert all(
        len(h.ids) == 3 and h.scores == sorted(h.scores, reverse=True) for h in batch.results
    )
    with pytest.raises(WorkerError, match="unknown op"):
        await hash_worker._call({"op": "nope"})
    # the worker goes on after a failed request
    again = await hash_worker.query(
        [texts[7]], batch_size=1, ef_search=8, top_k=1, rerank_depth=1, keep=1
    )
    assert again.results[0].ids == [7]


async def test_worker_query_before_build_and_exit() -> None:
    worker = await WorkerRetriever.start(sys.executable, backend="hash")
    with pytest.raises(WorkerError, match="query before build"):
        await worker.query(["x"], batch_size=1, ef_search=1, top_k=1, rerank_depth=1, keep=1)
    await worker.close()
    with pytest.raises(WorkerError, match="exited"):
        await worker.query(["x"], batch_size=1, ef_search=1, top_k=1, rerank_depth=1, keep=1)


async def test_worker_that_cannot_start() -> None:
    with pytest.raises(WorkerError, match="cannot start"):
        await WorkerRetriever.start("/nonexistent/python", backend="hash")


async def test_pipeline_end_to_end_with_hash_worker(
    mock_factory: MockFactory, hash_worker: WorkerRetriever, corpus: Corpus
) -> None:
    server = await mock_factory(model=MODEL, ttft_ms=2.0, itl_ms=0.2)
    questions = make_questions(corpus, 12, seed=3)
    knobs = PipelineKnobs(top_k=8, rerank_depth=6, max_rounds=2, concurrency=4)
    settings = PipelineSettings(answer_url=server.url, passages_kept=4)
    run = await run_pipeline(corpus, questions, hash_worker, knobs, settings, task="t")
    result = run.result
    assert result.track == "cpu" and result.task == "t" and result.k == 4
    assert len(result.tasks) == 12 and result.answering_tasks_per_s > 0
    assert set(result.stage_totals_s) == set(STAGES)
    assert all(result.stage_totals_s[s] > 0 for s in STAGES)
    assert result.index_build_docs_per_s == run.build.docs_per_s > 0
    assert result.latency_s.p50 <= result.latency_s.p90 <= result.latency_s.p99
    assert result.recall_at_k == pytest.approx(sum(q.recall for q in run.questions) / 12)
    assert 0 < result.recall_at_k <= 1  # the hash embedder shares words with the question
    for record, outcome in zip(result.tasks, run.questions, strict=True):
        assert record.rounds == outcome.rounds <= 2
        assert record.latency_s >= sum(record.stage_s.values()) * 0.99
        assert len(outcome.retrieved) == 4
    graded = sum(len(set(o.retrieved)) for o in run.questions)  # at least the final top-k
    assert server.state.requests >= 12 * 2 + graded / 2
    assert sum(run.batches) == sum(r.rounds for r in result.tasks)


class ScriptedRetriever:
    """Answers every query with fixed passages and scores; records the queries."""

    def __init__(self, scores: Sequence[float]) -> None:
        self.scores = list(scores)
        self.queries: list[str] = []

    async def build(
        self, texts: Sequence[str], *, batch_size: int, hnsw_m: int, ef_construction: int
    ) -> BuildStats:
        return BuildStats(docs=len(texts), dim=4, embed_s=0.5, index_s=0.5, docs_per_s=len(texts))

    async def query(
        self,
        queries: Sequence[str],
        *,
        batch_size: int,
        ef_search: int,
        top_k: int,
        rerank_depth: int,
        keep: int,
    ) -> QueryBatch:
        self.queries.extend(queries)
        ids = list(range(len(self.scores)))[:keep]
        hit = Hit(ids=ids, scores=self.scores[:keep])
        return QueryBatch(
            results=[hit] * len(queries), embed_s=0.001, retrieve_s=0.002, rerank_s=0.003
        )


def _tiny_corpus() -> tuple[Corpus, list[Question]]:
    passages = tuple(
        Passage(id=f"m.f{i}#0", title=f"m.f{i}", text=f"m.f{i}: words {i}") for i in range(6)
    )
    corpus = Corpus(python="3.11.0", modules=("m",), passages=passages)
    q = Question(
        id="q0",
        text="what about f1 and f2?",
        support=("m.f1#0", "m.f2#0"),
        sub_queries=("s1", "s2"),
    )
    return corpus, [q]


async def test_sufficiency_loops_over_sub_queries(mock_factory: MockFactory) -> None:
    server = await mock_factory(model=MODEL, ttft_ms=1.0, itl_ms=0.1)
    corpus, questions = _tiny_corpus()
    low = ScriptedRetriever([0.3, 0.2, 0.1])
    knobs = PipelineKnobs(max_rounds=4, concurrency=1)
    settings = PipelineSettings(answer_url=server.url, passages_kept=2)
    run = await run_pipeline(corpus, questions, low, knobs, settings)
    assert run.result.tasks[0].rounds == 4 and not run.questions[0].sufficient
    assert low.queries == ["what about f1 and f2?", "s1", "s2", "s1"]
    assert run.questions[0].retrieved == ["m.f0#0", "m.f1#0"]
    assert run.questions[0].recall == 0.5
    # decompose + 2 fresh passages graded once + answer
    assert server.state.requests == 4

    high = ScriptedRetriever([0.9, 0.8, 0.1])
    run = await run_pipeline(corpus, questions, high, knobs, settings)
    assert run.result.tasks[0].rounds == 1 and run.questions[0].sufficient


async def test_grader_on_its_own_server(mock_factory: MockFactory) -> None:
    answer = await mock_factory(model=MODEL, ttft_ms=1.0, itl_ms=0.1)
    grader = await mock_factory(model="grader", ttft_ms=1.0, itl_ms=0.1)
    corpus, questions = _tiny_corpus()
    knobs = PipelineKnobs(max_rounds=1, grade_server="dedicated")
    settings = PipelineSettings(
        answer_url=answer.url, grade_url=grader.url, grade_model="grader", passages_kept=3
    )
    await run_pipeline(corpus, questions, ScriptedRetriever([0.9, 0.8, 0.7]), knobs, settings)
    assert grader.state.requests == 3 and answer.state.requests == 2
    with pytest.raises(UserError, match="no grader server"):
        await run_pipeline(
            corpus,
            questions,
            ScriptedRetriever([0.9]),
            knobs,
            PipelineSettings(answer_url=answer.url),
        )


async def test_batches_follow_concurrency_and_batch_size(mock_factory: MockFactory) -> None:
    server = await mock_factory(model=MODEL, ttft_ms=1.0, itl_ms=0.1)
    corpus, (q,) = _tiny_corpus()
    questions = [q.model_copy(update={"id": f"q{i}"}) for i in range(12)]
    one = PipelineKnobs(max_rounds=1, concurrency=1)
    run = await run_pipeline(
        corpus, questions, ScriptedRetriever([0.9]), one, PipelineSettings(answer_url=server.url)
    )
    assert run.batches == [1] * 12
    wide = one.model_copy(update={"concurrency": 12, "embed_batch_size": 4})
    run = await run_pipeline(
        corpus, questions, ScriptedRetriever([0.9]), wide, PipelineSettings(answer_url=server.url)
    )
    assert max(run.batches) <= 4 and len(run.batches) < 12 and sum(run.batches) == 12


async def test_llm_failure_names_the_stage(mock_factory: MockFactory) -> None:
    server = await mock_factory(model=MODEL, http_status=503)
    corpus, questions = _tiny_corpus()
    with pytest.raises(LLMCallError, match=r"decompose q0: .* HTTP 503"):
        await run_pipeline(
            corpus,
            questions,
            ScriptedRetriever([0.9]),
            PipelineKnobs(),
            PipelineSettings(answer_url=server.url),
        )
    with pytest.raises(LLMCallError, match="decompose q0"):
        await run_pipeline(
            corpus,
            questions,
            ScriptedRetriever([0.9]),
            PipelineKnobs(),
            PipelineSettings(answer_url="http://127.0.0.1:9"),
        )


class PerQueryRetriever(ScriptedRetriever):
    """The same passages every round, scored by which query asked."""

    def __init__(self, scores_by_query: dict[str, list[float]]) -> None:
        super().__init__([])
        self.by_query = scores_by_query

    async def query(
        self,
        queries: Sequence[str],
        *,
        batch_size: int,
        ef_search: int,
        top_k: int,
        rerank_depth: int,
        keep: int,
    ) -> QueryBatch:
        self.queries.extend(queries)
        hits = [
            Hit(ids=list(range(len(self.by_query[q])))[:keep], scores=self.by_query[q][:keep])
            for q in queries
        ]
        return QueryBatch(results=hits, embed_s=0.001, retrieve_s=0.001, rerank_s=0.001)


async def test_a_passage_seen_again_with_a_better_score_counts(mock_factory: MockFactory) -> None:
    server = await mock_factory(model=MODEL, ttft_ms=1.0, itl_ms=0.1)
    corpus, _ = _tiny_corpus()
    q = Question(id="q1", text="about f0?", support=("m.f0#0",), sub_queries=("f0 words",))
    retriever = PerQueryRetriever({"about f0?": [0.5, 0.4], "f0 words": [0.9, 0.4]})
    knobs = PipelineKnobs(max_rounds=3, concurrency=1)
    settings = PipelineSettings(answer_url=server.url, passages_kept=2)
    run = await run_pipeline(corpus, [q], retriever, knobs, settings)
    assert run.result.tasks[0].rounds == 2 and run.questions[0].sufficient
    assert server.state.requests == 1 + 2 + 1  # passages graded once, in round 1


async def test_worker_that_dies_at_start_says_why(tmp_path: Path) -> None:
    """The real backend under a Python without faiss: the import error is in the message."""
    if importlib.util.find_spec("faiss") or importlib.util.find_spec("sentence_transformers"):
        pytest.skip("this Python has the real backend's packages")
    with pytest.raises(WorkerError, match=r"exited \(code 1\): .*No module named"):
        await WorkerRetriever.start(sys.executable, backend="minilm", stderr=tmp_path / "w.log")


async def test_latency_counts_from_arrival(mock_factory: MockFactory) -> None:
    server = await mock_factory(model=MODEL, ttft_ms=20.0, itl_ms=0.1)
    corpus, (q,) = _tiny_corpus()
    questions = [q.model_copy(update={"id": f"q{i}"}) for i in range(3)]
    settings = PipelineSettings(answer_url=server.url, passages_kept=1)
    knobs = PipelineKnobs(max_rounds=1, concurrency=1)
    retriever = ScriptedRetriever([0.9])
    run = await run_pipeline(corpus, questions, retriever, knobs, settings)
    lat = [t.latency_s for t in run.result.tasks]
    # one slot: the last question waited for the two before it (alone it takes ~lat[0])
    assert lat[2] > 2 * lat[0]
    spaced = await run_pipeline(
        corpus, questions, retriever, knobs, settings, arrivals=[0.0, 1.0, 2.0]
    )
    assert spaced.result.wall_s >= 2.0
    assert max(t.latency_s for t in spaced.result.tasks) < 1.0  # none waited for a slot
    with pytest.raises(UserError, match="arrivals"):
        await run_pipeline(corpus, questions, retriever, knobs, settings, arrivals=[0.0])
