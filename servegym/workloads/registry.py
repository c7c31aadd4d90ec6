"""Finding workload files and loading them, with overrides, into a validated spec.

A workload is named by its file's stem in the shipped ``workloads/`` folder (``balanced``
is ``workloads/balanced.toml``), or given as a path to any ``.toml`` file. Overrides are
``dotted.key=value`` strings (``--set`` on the command line) applied to the file's table
before validation; values are read as TOML literals when they parse as one (numbers, booleans,
quoted strings, arrays, inline tables) and as plain strings otherwise, so
``arrival.kind=poisson`` needs no quotes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from servegym.errors import UserError
from servegym.overrides import apply_override, default_table, validation_message
from servegym.paths import data_dir, inside, quoted
from servegym.tomlfile import read_toml
from servegym.workloads.spec import MAX_COUNT, MAX_SCALE, WorkloadSpec


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """One shipped workload file, as ``servegym workload list`` shows it."""

    name: str
    kind: str
    description: str
    path: Path


def workloads_dir() -> Path:
    return data_dir("workloads")


def list_workloads() -> list[WorkloadInfo]:
    """The shipped workloads, sorted by name. A malformed file is listed with its error."""
    infos: list[WorkloadInfo] = []
    for path in sorted(workloads_dir().glob("*.toml")):
        try:
            raw = read_toml(path)
        except UserError as e:
            infos.append(WorkloadInfo(path.stem, "?", f"(unreadable: {e})", path))
            continue
        kind = raw.get("kind", "synthetic")
        desc = raw.get("description", "")
        infos.append(WorkloadInfo(path.stem, str(kind), " ".join(str(desc).split()), path))
    return infos


def is_workload_path(name_or_path: str) -> bool:
    """Whether a workload is named by a path (a ``.toml`` name, or one with a slash) rather
    than as a shipped workload."""
    return Path(name_or_path).suffix == ".toml" or "/" in name_or_path or "\\" in name_or_path


def _resolve(name_or_path: str) -> Path:
    """The workload file: a path as given, or a shipped workload's file (which must lie in
    the shipped folder: a symlink out of it is refused). A name the file system cannot hold
    (5,000 characters) is one line, not ``OSError``."""
    try:
        if is_workload_path(name_or_path):
            p = Path(name_or_path).expanduser()
            if not p.is_file():
                raise UserError(f"workload file not found: {quoted(name_or_path)}")
            return p
        folder = workloads_dir()
        candidate = folder / f"{name_or_path}.toml"
        if candidate.is_file():
            if not inside(candidate, folder):
                raise UserError(
                    f"{candidate}: resolves outside the shipped workloads folder ({folder})"
                )
            return candidate
    except (OSError, RuntimeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise UserError(f"workload '{quoted(name_or_path)}': {why}") from None
    known = ", ".join(i.name for i in list_workloads()) or "(none)"
    raise UserError(f"unknown workload '{quoted(name_or_path)}'; known workloads: {known}")


def load_spec(
    name_or_path: str,
    overrides: Sequence[str] = (),
    *,
    requests: int | None = None,
    scale: float | None = None,
    flag: str = "--set",
) -> tuple[WorkloadSpec, Path]:
    """Load a workload by name or path, apply overrides, and validate it.

    Returns the spec and its base folder (where a relative ``trace.path`` is read from; pass
    it to :func:`~servegym.workloads.generate.materialise`). ``requests`` sets
    ``num_requests`` (sessions, for an agentic workload, whose ``total_turns`` then scales in
    proportion: ``--requests 2`` on the 20-session ``agentic`` gives 2 sessions and about 100
    turns). ``scale`` sets ``scale``, which multiplies every token length. Every problem is a
    one-line :class:`UserError`; one an override causes names it as ``flag`` (``--set``,
    ``--workload-set`` of ``servegym sim``, a task's ``workload.overrides``).
    """
    path = _resolve(name_or_path)
    raw = read_toml(path)
    raw.setdefault("name", path.stem)
    for override in overrides:
        apply_override(raw, override, WorkloadSpec, flag)
    if requests is not None:
        if requests < 1:
            raise UserError(f"--requests must be at least 1, got {requests}")
        if requests > MAX_COUNT:
            raise UserError(f"--requests must be at most {MAX_COUNT:,}, got {requests}")
        old = raw.get("num_requests", WorkloadSpec.model_fields["num_requests"].default)
        agentic = raw.get("agentic")
        if raw.get("kind") == "agentic" and isinstance(agentic, dict):
            default_total = default_table(WorkloadSpec, "agentic").get("total_turns")
            total = agentic.get("total_turns", default_total)
            if isinstance(total, int) and isinstance(old, int) and old > 0:
                agentic["total_turns"] = max(requests, round(total * requests / old))
        raw["num_requests"] = requests
    if scale is not None:
        if not scale > 0:
            raise UserError(f"--scale must be greater than 0, got {scale}")
        if not scale <= MAX_SCALE:  # inf too
            raise UserError(f"--scale must be at most {MAX_SCALE:g}, got {scale}")
        raw["scale"] = scale
    try:
        spec = WorkloadSpec.model_validate(raw)
    except ValidationError as e:
        raise UserError(validation_message(e, str(path), overrides, flag=flag)) from None
    return spec, path.resolve().parent
