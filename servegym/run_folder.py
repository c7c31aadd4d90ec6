"""Writing a run folder: ``run.json``, ``requests.jsonl``, ``metrics.json`` (and extras);
a trial's folder holds ``trial.json`` (:data:`TRIAL_FILE`).

Every file is written to a temporary name and renamed into place, so a reader never sees a
half-written file; records are written before metrics are computed, so a failure in a later
step never loses a finished run.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from servegym.errors import UserError
from servegym.loadgen.records import RunResult
from servegym.paths import quoted

TRIAL_FILE = "trial.json"
"""A trial's result in its folder (:class:`~servegym.runner.results.TrialResult`)."""


def check_nameable(path: Path, flag: str = "--out") -> None:
    """Refuse, in one line, a path the file system cannot name (a component over 255
    bytes): every later look at it would raise ``OSError``."""
    try:
        path.exists()
    except OSError as e:
        raise UserError(f"{flag}: {quoted(str(path))}: {e.strerror or e}") from None


def prepare_out(out: Path, flag: str = "--out") -> None:
    """Create the run folder, or say in one line why it cannot be."""
    try:
        if out.exists() and not out.is_dir():
            raise UserError(f"{flag}: {out} exists and is not a folder")
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{flag}: cannot create {quoted(str(out))}: {e.strerror}") from None


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def write_records(result: RunResult, path: Path) -> None:
    """One :class:`~servegym.loadgen.records.RequestRecord` per line."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for rec in result.records:
            f.write(rec.model_dump_json())
            f.write("\n")
    os.replace(tmp, path)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
