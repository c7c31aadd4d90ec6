"""The CPU pipeline's corpus and questions: deterministic, and the support is really support."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from servegym.pipeline.cpu.corpus import (
    MAX_WORDS,
    MIN_TAIL_WORDS,
    MODULES,
    Corpus,
    build_corpus,
    dump,
    make_questions,
    python_version,
)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return build_corpus()


_DIGEST = (
    "from servegym.pipeline.cpu.corpus import build_corpus, dump, make_questions; "
    "import hashlib; c = build_corpus(); "
    "print(hashlib.sha256(dump(c, make_questions(c, 60, 7))).hexdigest())"
)


def test_same_seed_same_bytes_across_processes(corpus: Corpus) -> None:
    here = hashlib.sha256(dump(corpus, make_questions(corpus, 60, 7))).hexdigest()
    for hash_seed in ("12345",):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", _DIGEST], capture_output=True, text=True, env=env, check=True
        )
        assert out.stdout.strip() == here


def test_other_seed_other_questions(corpus: Corpus) -> None:
    a = make_questions(corpus, 40, 1)
    b = make_questions(corpus, 40, 2)
    assert [q.text for q in a] != [q.text for q in b]
    assert make_questions(corpus, 40, 1) == a


def test_digest_records_python_and_modules(corpus: Corpus) -> None:
    assert corpus.python == python_version()
    assert corpus.modules == MODULES
    other = corpus.model_copy(update={"python": "3.99.0"})
    assert other.digest != corpus.digest


def test_passages_unique_sized_and_titled(corpus: Corpus) -> None:
    assert len(corpus.passages) > 500
    ids = [p.id for p in corpus.passages]
    assert len(set(ids)) == len(ids)
    bodies = [p.text.split(": ", 1)[1] for p in corpus.passages]
    assert len(set(bodies)) == len(bodies)
    for p in corpus.passages:
        assert p.text.startswith(p.title + ": ")
        assert p.id.startswith(p.title + "#")
        words = len(p.text.split(": ", 1)[1].split())
        assert MIN_TAIL_WORDS <= words <= MAX_WORDS + MIN_TAIL_WORDS
        assert p.title.split(".")[0] in {m.split(".")[0] for m in MODULES}


def test_questions_point_at_their_support(corpus: Corpus) -> None:
    questions = make_questions(corpus, 150, 0)
    assert len({q.id for q in questions}) == 150
    two = [q for q in questions if len(q.support) == 2]
    assert len(two) == 50  # every third question
    for q in questions:
        assert len(q.sub_queries) == len(q.support)
        for pid, sub in zip(q.support, q.sub_queries, strict=True):
            passage = corpus.by_id[pid]
            terms = sub.split(": ", 1)[1].split()
            body = passage.text.lower()
            assert all(t in body for t in terms), (pid, terms)
            assert passage.title.rsplit(".", 1)[-1] in q.text or "module" in q.text
        if len(q.support) == 2:
            a, b = (corpus.by_id[s] for s in q.support)
            assert a.title != b.title


def test_too_many_questions_refused(corpus: Corpus) -> None:
    with pytest.raises(ValueError, match="at most"):
        make_questions(corpus, 100_000, 0)
