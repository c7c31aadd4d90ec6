"""Model names a task or a command may use, and the folder each one is served from."""

from __future__ import annotations

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
