"""Finding workload files and loading them, with overrides, into a validated spec.

A workload is named by its file's stem in the shipped ``workloads/`` folder (``balanced``
is ``workloads/balanced.toml``), or given as a path to any ``.toml`` file. Overrides are
``dotted.key=value`` strings (``--set`` on the command line) applied to the file's table
before validation; values are read as TOML literals when they parse as one (numbers, booleans,
quoted strings, arrays, inline tables) and as plain strings otherwise, so
``arrival.kind=poisson`` needs no quotes.
"""

from __future__ import annotations

import tomllib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from servegym.errors import UserError
from servegym.paths import data_dir
from servegym.workloads.spec import WorkloadSpec


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """One shipped workload file, as ``servegym workload list`` shows it."""

    name: str
    kind: str
    description: str
    path: Path


def workloads_dir() -> Path:
    return data_dir("workloads")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: malformed TOML: {e}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None


def list_workloads() -> list[WorkloadInfo]:
    """The shipped workloads, sorted by name. A malformed file is listed with its error."""
    infos: list[WorkloadInfo] = []
    for path in sorted(workloads_dir().glob("*.toml")):
        try:
            raw = _read_toml(path)
        except UserError as e:
            infos.append(WorkloadInfo(path.stem, "?", f"(unreadable: {e})", path))
            continue
        kind = raw.get("kind", "synthetic")
        desc = raw.get("description", "")
        infos.append(WorkloadInfo(path.stem, str(kind), " ".join(str(desc).split()), path))
    return infos


def _resolve(name_or_path: str) -> Path:
    p = Path(name_or_path).expanduser()
    looks_like_path = p.suffix == ".toml" or "/" in name_or_path or "\\" in name_or_path
    if looks_like_path:
        if not p.is_file():
            raise UserError(f"workload file not found: {name_or_path}")
        return p
    candidate = workloads_dir() / f"{name_or_path}.toml"
    if candidate.is_file():
        return candidate
    known = ", ".join(i.name for i in list_workloads()) or "(none)"
    raise UserError(f"unknown workload '{name_or_path}'; known workloads: {known}")


def _parse_value(text: str) -> Any:
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


def _default_table(model: type[BaseModel], key: str) -> dict[str, Any]:
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


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Apply one ``dotted.key=value`` override to ``raw`` (a workload file's table)."""
    if "=" not in override:
        raise UserError(f"--set '{override}' needs the form key=value")
    key, _, text = override.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not key or any(not p.strip() for p in parts):
        raise UserError(f"--set '{override}': empty key")
    parts = [p.strip() for p in parts]
    model: type[BaseModel] = WorkloadSpec
    table = raw
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the top level"
        if part not in model.model_fields:
            keys = ", ".join(sorted(model.model_fields))
            raise UserError(f"--set {key}: unknown key '{part}' under {where}; keys there: {keys}")
        if depth == len(parts) - 1:
            table[part] = _parse_value(text)
            return
        sub = _submodel(model.model_fields[part].annotation)
        if sub is None:
            raise UserError(
                f"--set {key}: '{'.'.join(parts[: depth + 1])}' is a value, not a table"
            )
        current = table.get(part)
        if not isinstance(current, dict):
            current = _default_table(model, part)
            table[part] = current
        table = current
        model = sub


def _validation_message(e: ValidationError, path: Path, overrides: Sequence[str]) -> str:
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
        where = f"--set {flagged[-1]}"
    elif not loc and overrides:
        where = f"{path} with --set {' '.join(overrides)}"
    else:
        where = str(path)
    field = f"'{loc}'" if loc else "the workload"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: bad value for {field}: {reason}{more}"


def load_spec(
    name_or_path: str,
    overrides: Sequence[str] = (),
    *,
    requests: int | None = None,
    scale: float | None = None,
) -> tuple[WorkloadSpec, Path]:
    """Load a workload by name or path, apply overrides, and validate it.

    Returns the spec and its base folder (where a relative ``trace.path`` is read from; pass
    it to :func:`~servegym.workloads.generate.materialise`). ``requests`` sets
    ``num_requests`` (sessions, for an agentic workload, whose ``total_turns`` then scales in
    proportion: ``--requests 2`` on the 20-session ``agentic`` gives 2 sessions and about 100
    turns). ``scale`` sets ``scale``, which multiplies every token length. Every problem is a
    one-line :class:`UserError`.
    """
    path = _resolve(name_or_path)
    raw = _read_toml(path)
    raw.setdefault("name", path.stem)
    for override in overrides:
        apply_override(raw, override)
    if requests is not None:
        if requests < 1:
            raise UserError(f"--requests must be at least 1, got {requests}")
        old = raw.get("num_requests", WorkloadSpec.model_fields["num_requests"].default)
        agentic = raw.get("agentic")
        if raw.get("kind") == "agentic" and isinstance(agentic, dict):
            default_total = _default_table(WorkloadSpec, "agentic").get("total_turns")
            total = agentic.get("total_turns", default_total)
            if isinstance(total, int) and isinstance(old, int) and old > 0:
                agentic["total_turns"] = max(requests, round(total * requests / old))
        raw["num_requests"] = requests
    if scale is not None:
        if not scale > 0:
            raise UserError(f"--scale must be greater than 0, got {scale}")
        raw["scale"] = scale
    try:
        spec = WorkloadSpec.model_validate(raw)
    except ValidationError as e:
        raise UserError(_validation_message(e, path, overrides)) from None
    return spec, path.resolve().parent
