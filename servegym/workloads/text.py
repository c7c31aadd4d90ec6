"""Token ids to text, for the ``text`` and ``chat`` prompt formats.

With the served model's tokenizer (a ``tokenizer.json``, loaded by the ``tokenizers``
library) the ids decode exactly. Re-encoding that text gives back about the same number of
tokens, but not always exactly: byte-level BPE merges across the joins between random ids.

Without a tokenizer, a built-in vocabulary stands in: id ``i`` becomes one short lowercase
word (made of 1 to 3 consonant-vowel syllables, drawn from a fixed seed) followed by a space,
so equal ids give equal text, a prefix of ids gives a prefix of the text, and the same ids
give the same text on every machine. Token counts are then approximate: a real tokenizer
splits most such words into one to three tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from servegym.errors import UserError

if TYPE_CHECKING:
    import tokenizers

BUILTIN_VOCAB_SIZE = 1 << 16
_BUILTIN_SEED = 20240611
_CONSONANTS = list("bdfghklmnprstvz")
_VOWELS = list("aeiou")


def load_tokenizer(path: str | Path) -> tokenizers.Tokenizer:
    """Load a ``tokenizers`` tokenizer from a ``tokenizer.json`` or a folder holding one."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError(
            "the 'tokenizers' package is needed to load a tokenizer; "
            "install it with: pip install 'servegym[tokenizer]'"
        ) from None
    p = Path(path).expanduser()
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        where = f"{p} holds no tokenizer.json" if p.is_dir() else f"{p} does not exist"
        raise UserError(f"cannot load tokenizer: {where}")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # the library raises a bare Exception on a malformed file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot load tokenizer from {file}: {reason}") from None


def _builtin_vocab() -> npt.NDArray[np.str_]:
    rng = np.random.Generator(np.random.PCG64(_BUILTIN_SEED))
    n = BUILTIN_VOCAB_SIZE
    syllables = np.array([c + v for c in _CONSONANTS for v in _VOWELS])
    counts = rng.choice([1, 2, 3], size=n, p=[0.3, 0.5, 0.2])
    picks = rng.integers(0, len(syllables), size=(n, 3))
    words = syllables[picks[:, 0]]
    for k in (1, 2):
        words = np.char.add(words, np.where(counts > k, syllables[picks[:, k]], ""))
    return np.char.add(words, " ")


_VOCAB: npt.NDArray[np.str_] | None = None


def builtin_vocab() -> npt.NDArray[np.str_]:
    """The built-in word vocabulary (each entry a word and a space), built once."""
    global _VOCAB
    if _VOCAB is None:
        _VOCAB = _builtin_vocab()
    return _VOCAB


class Detokenizer:
    """Turns prompt token ids into prompt text (exactly with a tokenizer, else approximately)."""

    def __init__(self, tokenizer: tokenizers.Tokenizer | None = None) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def from_path(cls, path: str | Path | None) -> Detokenizer:
        """A detokenizer for the tokenizer at ``path``, or the built-in one for ``None``."""
        return cls(None if path is None else load_tokenizer(path))

    @property
    def exact(self) -> bool:
        """True when decoding uses the model's tokenizer (token counts are exact)."""
        return self.tokenizer is not None

    def check_ids(self, token_id_high: int) -> None:
        """Raise if ids below ``token_id_high`` (``prompt.token_id_high``) may fall outside
        the tokenizer's vocabulary."""
        if self.tokenizer is None:
            return
        size = int(self.tokenizer.get_vocab_size(with_added_tokens=True))
        if token_id_high > size:
            raise UserError(
                f"prompt.token_id_high ({token_id_high}) is above the tokenizer's vocabulary "
                f"size ({size}); lower it with --set prompt.token_id_high={size}"
            )

    def decode(self, ids: npt.NDArray[np.integer[Any]] | Sequence[int]) -> str:
        arr = np.asarray(ids, dtype=np.int64)
        if self.tokenizer is not None:
            text: str = self.tokenizer.decode(arr.tolist(), skip_special_tokens=False)
            return text
        vocab = builtin_vocab()
        return "".join(vocab[arr % len(vocab)].tolist())
