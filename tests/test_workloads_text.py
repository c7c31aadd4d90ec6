"""Token ids to prompt text: the built-in vocabulary and a real tokenizer file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servegym.errors import UserError
from servegym.workloads import load_spec, materialise
from servegym.workloads.text import BUILTIN_VOCAB_SIZE, Detokenizer, builtin_vocab, load_tokenizer

tokenizers = pytest.importorskip("tokenizers")


def make_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 100)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def test_builtin_is_deterministic_and_prefix_preserving() -> None:
    d = Detokenizer()
    assert not d.exact
    ids = np.array([1000, 1001, 29999, 1000], dtype=np.int32)
    text = d.decode(ids)
    assert text == Detokenizer().decode(ids.tolist())
    words = text.split(" ")
    assert len(words) == 5 and words[-1] == "" and words[0] == words[3]
    assert all(w.isalpha() and w.islower() and len(w) <= 6 for w in words[:-1])
    assert d.decode(ids).startswith(d.decode(ids[:2]))
    assert len(builtin_vocab()) == BUILTIN_VOCAB_SIZE


def test_builtin_decodes_a_whole_agentic_turn_prefix() -> None:
    spec, base = load_spec("agentic", requests=1, scale=0.1)
    w = materialise(spec, 0, base_dir=base)
    s = w.sessions[-1]
    d = Detokenizer()
    t0, t1 = d.decode(w.prompt_ids(s, 0)), d.decode(w.prompt_ids(s, 1))
    assert t1.startswith(t0) and len(t1) > len(t0)


def test_tokenizer_decodes_exactly(tmp_path: Path) -> None:
    path = make_tokenizer(tmp_path)
    for where in (path, tmp_path, str(tmp_path)):
        d = Detokenizer.from_path(where)
        assert d.exact
        assert d.decode(np.array([1, 2, 42])) == "w1 w2 w42"
    d.check_ids(100)
    with pytest.raises(UserError, match=r"token_id_high \(30000\) is above .* size \(100\)"):
        d.check_ids(30000)
    assert load_tokenizer(path).encode("w3 w4").ids == [3, 4]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing.json", "does not exist"),
        (lambda p: p, "holds no tokenizer.json"),
        (lambda p: (p / "bad.json").write_text("{not json") and p / "bad.json",
         r"cannot load tokenizer from .*bad\.json"),
    ],
)  # fmt: skip
def test_bad_tokenizer_paths(tmp_path: Path, make: object, message: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(UserError, match=message) as info:
        load_tokenizer(path)
    assert "\n" not in str(info.value)
