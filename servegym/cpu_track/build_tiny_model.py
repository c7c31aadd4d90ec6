"""Build ``servegym-tiny``: the CPU track's model, made here from nothing but fixed seeds.

Run with the CPU track's own Python (it has ``torch``, ``transformers`` and ``tokenizers``),
never imported by ServeGym itself::

    python build_tiny_model.py OUT_DIR [--seed N] [--layers L]

``--seed`` and ``--layers`` build another model over the same tokenizer: the impostor of the
integrity tests (a smaller model served under ``servegym-tiny``'s name).

It writes a Hugging Face model folder: a byte-level BPE tokenizer trained on the Python
standard library's source, and a small Llama with random weights from a fixed seed, saved as
float32 safetensors. The same Python, ``tokenizers`` and ``torch`` give the same files.

Why an ASCII-only alphabet: a random model emits random ids; with a full byte alphabet many
of them are pieces of multi-byte characters, which decode to nothing, so the server streams
empty-text chunks and time-to-first-token loses its meaning. With only ASCII bytes every
token decodes to at least one character.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path

VOCAB_SIZE = 4096
CORPUS_BYTES = 8_000_000
"""How much of the standard library to train on: enough for stable merges, a few seconds."""
SEED = 20261130
SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{{ message['content'] }}{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
ARCH = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
}


def corpus() -> list[str]:
    """ASCII lines of the standard library's ``.py`` files, in sorted path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and "test" not in p.parts and "tests" not in p.parts
    )
    out: list[str] = []
    size = 0
    for path in files:
        text = path.read_bytes().decode("ascii", errors="ignore")
        out.append(text)
        size += len(text)
        if size >= CORPUS_BYTES:
            break
    return out


def byte_symbol(b: int) -> str:
    """The symbol byte-level BPE uses for byte ``b`` (GPT-2's ``bytes_to_unicode``).

    Printable bytes stand for themselves; the others, in byte order, take the code points
    from U+0100 on.
    """
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    ascii_alphabet = [byte_symbol(b) for b in range(128)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=ascii_alphabet,
        limit_alphabet=len(ascii_alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "pad_token": "<|end_of_text|>",
        "model_max_length": ARCH["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({k: config[k] for k in ("bos_token", "eos_token", "pad_token")}, indent=2) + "\n"
    )


def build_model(out: Path, seed: int = SEED, layers: int | None = None) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    torch.manual_seed(seed)
    arch = dict(ARCH, num_hidden_layers=layers or ARCH["num_hidden_layers"])
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        bos_token_id=tok.token_to_id("<|begin_of_text|>"),
        eos_token_id=tok.token_to_id("<|eot_id|>"),
        pad_token_id=tok.token_to_id("<|end_of_text|>"),
        rope_theta=10000.0,
        tie_word_embeddings=False,
        torch_dtype="float32",
        **arch,
    )
    with torch.no_grad():
        model = LlamaForCausalLM(config).to(torch.float32)
        # Special tokens decode to no text: a zero output row keeps their logit at 0, below
        # the largest of the other 4,000 random logits, so greedy decoding never picks one
        # and every streamed token carries text.
        special = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
        model.lm_head.weight[special] = 0.0
    model.generation_config.do_sample = False
    model.save_pretrained(str(out), safe_serialization=True)


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.iterdir()):
        if p.is_file():
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=SEED, help="weights seed")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    build_tokenizer(out)
    build_model(out, args.seed, args.layers)
    print(json.dumps({"out": str(out), "sha256": digest(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
