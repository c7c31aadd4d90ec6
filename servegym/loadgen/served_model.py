"""What an OpenAI-compatible server serves, as far as a load generator needs it: the model's
name, its context length and the size of its vocabulary.

``GET /v1/models`` gives the name and, from vLLM, ``max_model_len`` and ``root`` (the model
folder the server loaded). When that folder is on this machine its ``config.json`` says the
vocabulary's size, so prompt token ids can be drawn inside it without a flag; otherwise a
tokenizer given by the user says it. A server that refuses ids outside its vocabulary (vLLM:
"Token id 29375 is out of vocabulary") would otherwise fail every request of a workload
whose ids were drawn for a larger model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from servegym.errors import UserError


@dataclass(frozen=True)
class ServedModel:
    """One model a server lists (``root`` and ``max_model_len`` when it says them)."""

    name: str
    root: str | None = None
    max_model_len: int | None = None


@dataclass(frozen=True)
class Vocabulary:
    """How many token ids a model takes, and where that was read (for messages)."""

    size: int
    source: str


async def served_model(base_url: str, wanted: str | None) -> ServedModel:
    """The entry of ``/v1/models`` for ``wanted`` (default: the first one listed).

    With ``wanted`` given, a server that does not list models (or not that one) is still
    used under that name; without it, the list is needed and its absence is a UserError
    naming ``--base-url`` or ``--model``."""
    url = base_url.rstrip("/") + "/v1/models"
    try:
        body = await _get_json(url)
    except UserError:
        if wanted is not None:
            return ServedModel(wanted)
        raise
    listed = body.get("data") if isinstance(body, dict) else None
    listed = listed if isinstance(listed, list) else []
    cards = [c for c in listed if isinstance(c, dict) and "id" in c]
    if wanted is None:
        if not cards:
            raise UserError(f"--model: {url} lists no model; pass --model NAME")
        card = cards[0]
    else:
        card = next((c for c in cards if str(c["id"]) == wanted), {"id": wanted})
    root, max_len = card.get("root"), card.get("max_model_len")
    return ServedModel(
        name=str(card["id"]),
        root=root if isinstance(root, str) and root else None,
        max_model_len=max_len if isinstance(max_len, int) and max_len > 0 else None,
    )


async def _get_json(url: str) -> Any:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(url) as resp,
        ):
            if resp.status != 200:
                raise UserError(f"--base-url: GET {url} answered HTTP {resp.status}")
            return await resp.json(content_type=None)
    except aiohttp.ClientError as e:
        raise UserError(f"--base-url: cannot reach {url}: {e}") from None
    except TimeoutError:
        raise UserError(f"--base-url: {url} did not answer within 10 s") from None
    except ValueError:
        raise UserError(f"--base-url: {url} did not answer JSON") from None


def folder_vocabulary(root: str) -> Vocabulary | None:
    """The vocabulary size in a local model folder's ``config.json`` (``vocab_size``, or
    ``text_config.vocab_size`` for a multimodal model); ``None`` when there is none."""
    config = Path(root).expanduser() / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for holder in (data, data.get("text_config")):
        size = holder.get("vocab_size") if isinstance(holder, dict) else None
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return Vocabulary(size, str(config))
    return None


def tokenizer_vocabulary(path: str) -> Vocabulary:
    """The vocabulary size of the tokenizer at ``path`` (its added tokens included)."""
    from servegym.workloads.text import load_tokenizer

    tokenizer = load_tokenizer(path)
    return Vocabulary(int(tokenizer.get_vocab_size(with_added_tokens=True)), f"--tokenizer {path}")


__all__ = [
    "ServedModel",
    "Vocabulary",
    "folder_vocabulary",
    "served_model",
    "tokenizer_vocabulary",
]
