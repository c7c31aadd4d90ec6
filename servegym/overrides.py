"""``--set dotted.key=value`` overrides applied to a table before pydantic validates it.

Shared by every file-backed spec (workloads, serving configs, tasks). Values are read as TOML
literals when they parse as one (numbers, booleans, quoted strings, arrays, inline tables) and
as plain strings otherwise, so ``arrival.kind=poisson`` needs no quotes. Every problem is a
one-line :class:`~servegym.errors.UserError` naming the ``--set`` at fault.
"""

from __future__ import annotations

import tomllib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from servegym.errors import UserError


def parse_value(text: str) -> Any:
    """A TOML literal when ``text`` is one, otherwise the text itself as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside a field's annotation (``X``, ``X | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        for arg in typing.get_args(annotation):
            found = _submodel(arg)
            if found is not None:
                return found
    return None


def default_table(model: type[BaseModel], key: str) -> dict[str, Any]:
    """The default value of ``model.key`` as a table, to fill in before overriding a part
    of it (so ``agentic.turns.median=10`` keeps the rest of the default distribution)."""
    field = model.model_fields[key]
    default = field.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        return default.model_dump()
    sub = _submodel(field.annotation)
    if sub is not None:
        try:
            return sub().model_dump()
        except ValidationError:
            return {}  # a table with required fields (e.g. [trace]): start empty
    return {}


def apply_override(
    raw: dict[str, Any], override: str, model: type[BaseModel], flag: str = "--set"
) -> None:
    """Apply one ``dotted.key=value`` override to ``raw``, a table for ``model``."""
    if "=" not in override:
        raise UserError(f"{flag} '{override}' needs the form key=value")
    key, _, text = override.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not key or any(not p.strip() for p in parts):
        raise UserError(f"{flag} '{override}': empty key")
    parts = [p.strip() for p in parts]
    table = raw
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the top level"
        if part not in model.model_fields:
            keys = ", ".join(sorted(model.model_fields))
            raise UserError(f"{flag} {key}: unknown key '{part}' under {where}; keys there: {keys}")
        if depth == len(parts) - 1:
            table[part] = parse_value(text)
            return
        sub = _submodel(model.model_fields[part].annotation)
        if sub is None:
            raise UserError(
                f"{flag} {key}: '{'.'.join(parts[: depth + 1])}' is a value, not a table"
            )
        current = table.get(part)
        if not isinstance(current, dict):
            current = default_table(model, part)
            table[part] = current
        table = current
        model = sub


def validation_message(
    e: ValidationError,
    source: str,
    overrides: Sequence[str],
    what: str = "the workload",
    *,
    flag: str = "--set",
) -> str:
    """One line for a validation error: the override to blame if one is (named as ``flag``:
    ``--set``, ``--workload-set``, a task's ``workload.overrides``), else ``source``."""
    errors = e.errors()
    first = errors[0]
    loc = ".".join(str(x) for x in first["loc"])
    reason = first["msg"].removeprefix("Value error, ")
    # An override is to blame when it set the failing field or a field inside the failing
    # table (a table's own check, such as "poisson needs rate", fails at the table).
    flagged = [
        o
        for o in overrides
        if "=" in o
        and loc
        and (
            (loc + ".").startswith(o.partition("=")[0].strip() + ".")
            or (o.partition("=")[0].strip() + ".").startswith(loc + ".")
        )
    ]
    if flagged:
        where = f"{flag} {flagged[-1]}"
    elif not loc and overrides:
        where = f"{source} with {flag} {' '.join(overrides)}"
    else:
        where = source
    field = f"'{loc}'" if loc else what
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: bad value for {field}: {reason}{more}"
