"""Reading a :class:`~servegym.engines.config.ServingConfig` from a TOML file and ``--set``
overrides: the one way every command (``sim``, ``serve``) takes a config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servegym.engines.config import ServingConfig
from servegym.errors import UserError
from servegym.overrides import apply_override, validation_message
from servegym.tomlfile import read_toml


def load_serving_config(path: Path | None, overrides: list[str]) -> ServingConfig:
    """A ServingConfig from a TOML file (knobs at the top level, ``[speculative]`` table)
    with ``--set knob=value`` overrides; every problem names the file, knob or flag."""
    raw: dict[str, Any] = {}
    source = "--set"
    if path is not None:
        source = str(path)
        raw = read_toml(path, missing=f"--config: no such file: {path}")
    for override in overrides:
        apply_override(raw, override, ServingConfig)
    try:
        return ServingConfig.model_validate(raw)
    except ValidationError as e:
        raise UserError(validation_message(e, source, overrides, "the config")) from None
