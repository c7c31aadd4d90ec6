"""The CPU pipeline's passage corpus and questions, made locally from the standard library.

Passages are cut from the docstrings of a fixed list of standard-library modules
(:data:`MODULES`): each module's own docstring, its public functions and classes defined in
it, and the methods a class defines itself. A docstring is split into paragraphs and the
paragraphs packed into passages of :data:`MIN_WORDS` to :data:`MAX_WORDS` words; a passage's
text starts with its title (``module.qualname``), as a document's title would, and its id is
``module.qualname#n``. Everything is walked in sorted order and identical texts are kept once,
so the corpus depends only on the module list and the Python version, which
:attr:`Corpus.digest` records.

Each question is built from known supporting passages: its terms are the passage's most
distinctive words (by tf-idf over the corpus, ties broken by the word), so the passages that
answer it are known and retrieval quality is measurable as recall@k. One question in three
asks about two objects of one module and has two supporting passages; every question also
carries one sub-query per supporting passage, which the pipeline's later retrieval rounds use.
Same corpus and seed, same questions, byte for byte.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import random
import re
import sys
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MODULES: tuple[str, ...] = (
    "argparse",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "enum",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "getopt",
    "gettext",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html.parser",
    "http.client",
    "http.cookies",
    "imaplib",
    "inspect",
    "ipaddress",
    "json",
    "logging",
    "mailbox",
    "netrc",
    "numbers",
    "optparse",
    "os",
    "pathlib",
    "pickle",
    "pprint",
    "queue",
    "random",
    "re",
    "sched",
    "secrets",
    "selectors",
    "shlex",
    "shutil",
    "smtplib",
    "socket",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "tokenize",
    "traceback",
    "typing",
    "unittest.case",
    "urllib.parse",
    "uuid",
    "warnings",
    "weakref",
    "wave",
    "zipfile",
)
"""The modules the corpus is cut from, pure-Python ones mostly (their docstrings are long)."""

MIN_WORDS = 60
MAX_WORDS = 120
MIN_TAIL_WORDS = 25
"""A docstring's last piece shorter than this joins the passage before it (or, alone, is
dropped)."""
TERMS_PER_PASSAGE = 3
TWO_SUPPORT_EVERY = 3
"""Every third question has two supporting passages."""

_WORD = re.compile(r"[A-Za-z][A-Za-z_]*[A-Za-z]")
_STOP_WORDS = """
    a about above after again all also an and any are as at be because been before being
    below between both but by can could did do does doing done each either else even every
    few for from further given has have having here how however if in into is it its itself
    just may might more most must no nor not now of off on once one only or other otherwise
    our out over own same should since so some such than that the their them then there these
    they this those through to too under until up upon use used uses using very was we were
    what when where whether which while who whom why will with within without would yet you
    your default defaults return returns returned value values object objects argument
    arguments none true false true false function method class instance new see note string
    strings number numbers following first second list called call calls set sets example
    name names type types specified specify like get gets given make makes otherwise"""
_STOP = frozenset(_STOP_WORDS.split())


class Passage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    title: str
    text: str = Field(description="the passage as embedded: title, colon, body")


class Question(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    text: str
    support: tuple[str, ...] = Field(min_length=1, description="ids of supporting passages")
    sub_queries: tuple[str, ...] = Field(min_length=1)


class Corpus(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    python: str = Field(description="the Python version whose docstrings were cut")
    modules: tuple[str, ...]
    passages: tuple[Passage, ...]

    @property
    def digest(self) -> str:
        """sha256 over the Python version, module list and every passage."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()

    @property
    def by_id(self) -> dict[str, Passage]:
        return {p.id: p for p in self.passages}


def python_version() -> str:
    v = sys.version_info
    return f"{v.major}.{v.minor}.{v.micro}"


def _own_members(module: Any, name: str) -> list[tuple[str, Any]]:
    """``(qualname, object)`` for the module's public functions and classes defined in it,
    and the public methods each such class defines itself, sorted by qualname."""
    out: list[tuple[str, Any]] = []
    for attr in sorted(vars(module)):
        if attr.startswith("_"):
            continue
        obj = vars(module)[attr]
        if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)):
            continue
        if getattr(obj, "__module__", None) != name:
            continue
        out.append((attr, obj))
        if inspect.isclass(obj):
            for meth in sorted(vars(obj)):
                if meth.startswith("_") and meth != "__init__":
                    continue
                member = vars(obj)[meth]
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if inspect.isfunction(member):
                    out.append((f"{attr}.{meth}", member))
    return out


def _pieces(doc: str) -> list[list[str]]:
    """A docstring's words packed into pieces of MIN_WORDS..MAX_WORDS words, paragraph-wise."""
    paragraphs = [p.split() for p in re.split(r"\n\s*\n", doc) if p.split()]
    pieces: list[list[str]] = []
    current: list[str] = []
    for words in paragraphs:
        current.extend(words)
        while len(current) > MAX_WORDS:
            pieces.append(current[:MAX_WORDS])
            current = current[MAX_WORDS:]
        if len(current) >= MIN_WORDS:
            pieces.append(current)
            current = []
    if current:
        if pieces and len(current) < MIN_TAIL_WORDS:
            pieces[-1] = pieces[-1] + current
        elif len(current) >= MIN_TAIL_WORDS:
            pieces.append(current)
    return pieces


def _documents(modules: Iterable[str]) -> list[tuple[str, str]]:
    """``(title, cleaned docstring)`` in module-list order, then qualname order."""
    docs: list[tuple[str, str]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in modules:
            module = importlib.import_module(name)
            if isinstance(module.__doc__, str):
                docs.append((name, inspect.cleandoc(module.__doc__)))
            for qualname, obj in _own_members(module, name):
                doc = obj.__doc__
                if isinstance(doc, str) and doc.strip():
                    docs.append((f"{name}.{qualname}", inspect.cleandoc(doc)))
    return docs


def build_corpus(modules: Sequence[str] = MODULES) -> Corpus:
    """The passage corpus of ``modules`` (see the module docstring)."""
    seen: set[str] = set()
    passages: list[Passage] = []
    for title, doc in _documents(modules):
        for n, words in enumerate(_pieces(doc)):
            text = f"{title}: {' '.join(words)}"
            body = " ".join(words)
            if body in seen:
                continue
            seen.add(body)
            passages.append(Passage(id=f"{title}#{n}", title=title, text=text))
    return Corpus(python=python_version(), modules=tuple(modules), passages=tuple(passages))


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _key_terms(corpus: Corpus, count: int = TERMS_PER_PASSAGE) -> dict[str, list[str]]:
    """Each passage's ``count`` most distinctive words (tf-idf; ties by the word)."""
    df: Counter[str] = Counter()
    bodies: dict[str, list[str]] = {}
    for p in corpus.passages:
        title_words = set(_words(p.title.replace(".", " ")))
        words = [
            w
            for w in _words(p.text.split(": ", 1)[1])
            if len(w) >= 4 and w not in _STOP and w not in title_words
        ]
        bodies[p.id] = words
        df.update(set(words))
    n = len(corpus.passages)
    terms: dict[str, list[str]] = {}
    for pid, words in bodies.items():
        tf = Counter(words)
        ranked = sorted(tf, key=lambda w: (-tf[w] * math.log(n / df[w]), w))
        terms[pid] = ranked[:count]
    return terms


def _short(title: str) -> tuple[str, str]:
    """``("module", "Obj.meth")`` of a title whose module is in the corpus's list."""
    for module in sorted(MODULES, key=len, reverse=True):
        if title == module:
            return module, "the module"
        if title.startswith(module + "."):
            return module, title[len(module) + 1 :]
    module, _, rest = title.rpartition(".")
    return module, rest


def _terms_text(terms: Sequence[str]) -> str:
    if len(terms) <= 1:
        return "".join(terms)
    return ", ".join(terms[:-1]) + " and " + terms[-1]


def make_questions(corpus: Corpus, count: int, seed: int) -> list[Question]:
    """``count`` questions with known supporting passages, chosen by ``seed``."""
    terms = _key_terms(corpus)
    usable = [p for p in corpus.passages if len(terms[p.id]) == TERMS_PER_PASSAGE]
    if count > len(usable):
        raise ValueError(f"at most {len(usable)} questions from this corpus, asked for {count}")
    rng = random.Random(seed)
    by_module: dict[str, list[Passage]] = {}
    for p in usable:
        by_module.setdefault(_short(p.title)[0], []).append(p)
    picked = rng.sample(usable, count)
    questions: list[Question] = []
    for i, p in enumerate(picked):
        module, obj = _short(p.title)
        t = terms[p.id]
        sub = f"{module} {obj}: {' '.join(t)}"
        partners = [q for q in by_module[module] if q.title != p.title]
        if i % TWO_SUPPORT_EVERY == TWO_SUPPORT_EVERY - 1 and partners:
            other = partners[rng.randrange(len(partners))]
            _, obj2 = _short(other.title)
            t2 = terms[other.id]
            text = (
                f"In Python's {module} module, how do {obj} and {obj2} compare, "
                f"regarding {_terms_text(t[:2])} versus {_terms_text(t2[:2])}?"
            )
            questions.append(
                Question(
                    id=f"q{i:04d}",
                    text=text,
                    support=(p.id, other.id),
                    sub_queries=(sub, f"{module} {obj2}: {' '.join(t2)}"),
                )
            )
        else:
            text = f"In Python's {module} module, what does {obj} say about {_terms_text(t)}?"
            questions.append(
                Question(id=f"q{i:04d}", text=text, support=(p.id,), sub_queries=(sub,))
            )
    return questions


def dump(corpus: Corpus, questions: Sequence[Question]) -> bytes:
    """Corpus and questions as canonical JSON bytes (what determinism is checked on)."""
    data = {
        "digest": corpus.digest,
        "corpus": corpus.model_dump(mode="json"),
        "questions": [q.model_dump(mode="json") for q in questions],
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
