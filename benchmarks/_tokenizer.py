"""A small local tokenizer for the benchmark tools, built offline.

``vllm bench serve`` and ``guidellm`` both load a Hugging Face tokenizer to size their
synthetic prompts (guidellm encodes generated English text; vllm decodes random token ids).
No model can be downloaded here, so :func:`build_tokenizer` trains a small byte-level BPE on
generated English-like text and writes ``tokenizer.json`` plus a ``tokenizer_config.json``
naming ``PreTrainedTokenizerFast``, which ``transformers.AutoTokenizer.from_pretrained(folder)``
loads with ``HF_HUB_OFFLINE=1``. Byte-level means any text encodes without unknown tokens.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_TEXT = (
    "the of and to in is was for that with as on by at from his her they this which be "
    "or an had are not but have were one all their there been has when who would will "
    "more no if out so said what up its about into than them can only other new some "
    "could time these two may then do first any my now such like our over man me even "
    "most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make "
    "world still own see men work long get here between both life being under never day "
    "same another know while last might us great old year off come since against go came "
    "right used take three server model token request latency cache batch prefill decode "
    "throughput schedule benchmark kernel memory queue stream engine"
)
_WORDS = _TEXT.split(" ")


def _corpus(lines: int, seed: int) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(8, 40))]
        words[0] = words[0].capitalize()
        yield " ".join(words) + rng.choice([".", ",", "?", "!", ";"]) + f" {rng.randint(0, 9999)}"


def build_tokenizer(folder: Path, vocab_size: int = 2048, seed: int = 0) -> Path:
    """Train a byte-level BPE of about ``vocab_size`` tokens into ``folder``; return it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(4000, seed), trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1_000_000,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    specials = {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    (folder / "special_tokens_map.json").write_text(json.dumps(specials))
    return folder
