"""Writing a run folder: ``run.json``, ``requests.jsonl``, ``metrics.json`` (and extras).

Every file is written to a temporary name and renamed into place, so a reader never sees a
half-written file; records are written before metrics are computed, so a failure in a later
step never loses a finished run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from servegym.errors import UserError
from servegym.loadgen.records import RunResult


def prepare_out(out: Path, flag: str = "--out") -> None:
    """Create the run folder, or say in one line why it cannot be."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag}: {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{flag}: cannot create {out}: {e.strerror}") from None


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
