"""Model names a task or a command may use, and the folder each one is served from."""

from __future__ import annotations

import hashlib
import os
import re
from functools import lru_cache
from pathlib import Path

from servegym.engines.base import ModelRef
from servegym.engines.cpu_home import TINY_MODEL, track_paths
from servegym.errors import UserError
from servegym.paths import quoted

RANDOM_WEIGHT_MODELS = frozenset({TINY_MODEL})
"""Models whose weights are random: they serve the right shapes at the right speed but
answer no question (the quality set is off for them, :mod:`servegym.tracks.quality`)."""


def random_weights(name: str) -> bool:
    """Whether the model a task names has random weights."""
    return name in RANDOM_WEIGHT_MODELS


def resolve_model(name_or_path: str, served_name: str | None = None) -> ModelRef:
    """``servegym-tiny`` (the CPU track's model), a local model folder, or a hub id (which
    the engine must find in its own cache: nothing is downloaded)."""

    if name_or_path == TINY_MODEL:
        path = track_paths().tiny_model
        if not (path / "config.json").is_file():
            raise UserError(
                f"model {TINY_MODEL} is not built yet ({path}): run `servegym setup cpu`"
            )
        return ModelRef(path=str(path), served_name=served_name or TINY_MODEL)
    p = Path(name_or_path).expanduser()
    try:
        exists = p.exists()
    except OSError as e:  # a name too long for the file system, ...
        raise UserError(f"--model {quoted(name_or_path)}: {e.strerror or e}") from None
    if exists:
        if not (p / "config.json").is_file():
            raise UserError(f"--model {name_or_path}: the folder has no config.json")
        return ModelRef(path=str(p.resolve()), served_name=served_name or p.name)
    if name_or_path.startswith((".", "/", "~")):
        raise UserError(f"--model {name_or_path}: no such folder")
    return ModelRef(path=name_or_path, served_name=served_name or name_or_path)


def hf_cache() -> Path:
    """Where the Hugging Face hub keeps downloaded models."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home).expanduser() / "hub"


def hub_snapshot(name: str) -> Path | None:
    """The folder of hub id ``name``'s snapshot in the Hugging Face cache: the one
    ``refs/main`` names, else the only one there; None when there is none to choose."""
    repo = hf_cache() / ("models--" + name.replace("/", "--"))
    try:
        main = (repo / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    if main and (repo / "snapshots" / main / "config.json").is_file():
        return repo / "snapshots" / main
    found = [p.parent for p in (repo / "snapshots").glob("*/config.json")]
    return found[0] if len(found) == 1 else None


_BLOB = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def model_digest(folder: Path) -> str:
    """sha256 over a model folder's files, names and contents, in name order. A file that is
    a link into the Hugging Face cache's ``blobs/`` is taken by its blob's name, which is the
    hash of its content (so a 16 GB snapshot is keyed without reading it)."""
    entries = []
    for p in sorted(folder.iterdir()):
        if p.is_file():
            st = p.stat()
            entries.append((p.name, st.st_size, st.st_mtime_ns))
    return _digest(folder, tuple(entries))


@lru_cache(maxsize=16)
def _digest(folder: Path, entries: tuple[tuple[str, int, int], ...]) -> str:
    """The digest of ``folder`` as listed (names, sizes, times): read once per process."""
    h = hashlib.sha256()
    for name, _, _ in entries:
        p = folder / name
        target = p.resolve()
        if p.is_symlink() and target.parent.name == "blobs" and _BLOB.fullmatch(target.name):
            h.update(name.encode() + b"\0blob:" + target.name.encode())
        else:
            h.update(name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def model_identity(model: ModelRef) -> str:
    """What a model's outputs depend on, for keys: the digest of its local folder, or of
    its hub id's snapshot in the Hugging Face cache; a clear error when it has neither."""
    folder = Path(model.path).expanduser()
    if folder.is_dir():
        return model_digest(folder)
    snapshot = hub_snapshot(model.path)
    if snapshot is None:
        raise UserError(
            f"model {quoted(model.path)}: no local folder and no snapshot in the Hugging Face "
            f"cache ({hf_cache()}): download it first (`huggingface-cli download {model.path}`)"
        )
    return model_digest(snapshot)
