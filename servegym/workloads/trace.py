"""Loading of request traces (the Azure LLM inference trace layout) for ``trace`` workloads.

A trace is a CSV file with a header row, or a JSONL file of one object per line, with a
timestamp column and two token-count columns (by default ``TIMESTAMP``, ``ContextTokens``,
``GeneratedTokens``, as in the Azure LLM inference traces). Timestamps are either seconds (a
number) or date-times such as ``2023-11-16 18:15:46.6805900`` (any number of fraction digits,
kept exactly to the nanosecond; an optional ``Z`` or ``+hh:mm`` zone). Rows must be in time
order. Offsets are taken from the first replayed row.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from servegym.errors import UserError
from servegym.workloads.spec import TraceSpec

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_DATETIME = re.compile(
    r"^(?P<base>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2})?)"
    r"(?:[.,](?P<frac>\d+))?"
    r"(?P<tz>Z|[+-]\d{2}:?\d{2})?$"
)


@dataclass(frozen=True, slots=True)
class TraceRows:
    """The replayed rows of a trace: offsets (seconds from the first row, unscaled) and
    token counts as the file gives them."""

    path: Path
    offsets_s: FloatArray
    input_tokens: IntArray
    output_tokens: IntArray

    def __len__(self) -> int:
        return len(self.offsets_s)


def resolve_path(spec: TraceSpec, base_dir: Path) -> Path:
    """The trace file: ``spec.path`` if absolute, else relative to ``base_dir``.

    The resolved path is never written back into the spec: the workload's content hash
    covers the spec and must not depend on where the checkout lives.
    """
    p = Path(spec.path).expanduser()
    return p if p.is_absolute() else base_dir / p


def _format_of(spec: TraceSpec, path: Path) -> str:
    if spec.format != "auto":
        return spec.format
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    raise UserError(
        f"{path}: cannot tell the trace format from the extension '{suffix}'; "
        "use .csv or .jsonl, or set trace.format"
    )


def _csv_rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, Mapping[str, Any]]]:
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise UserError(f"{path}: the trace file is empty (no header row)") from None
        missing = [c for c in columns if c not in header]
        if missing:
            raise UserError(
                f"{path}: missing column {', '.join(repr(c) for c in missing)} in the header "
                f"(columns: {', '.join(header)}); set trace.timestamp_column / "
                "trace.input_column / trace.output_column"
            )
        for values in reader:
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise UserError(
                    f"{path}, line {reader.line_num}: {len(values)} fields, "
                    f"the header has {len(header)}"
                )
            yield reader.line_num, dict(zip(header, values, strict=True))


def _jsonl_rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, Mapping[str, Any]]]:
    with path.open(encoding="utf-8-sig") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}, line {line_no}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise UserError(f"{path}, line {line_no}: expected a JSON object per line")
            for c in columns:
                if c not in obj:
                    raise UserError(
                        f"{path}, line {line_no}: missing column '{c}' "
                        f"(keys: {', '.join(map(str, obj))})"
                    )
            yield line_no, obj


def _parse_time(value: Any) -> tuple[datetime | None, float]:
    """(date-time without its fraction, or None for plain seconds; seconds or fraction)."""
    if isinstance(value, bool):
        raise ValueError("not a timestamp")
    if isinstance(value, int | float):
        return None, float(value)
    text = str(value).strip()
    try:
        return None, float(text)
    except ValueError:
        pass
    m = _DATETIME.match(text)
    if m is None:
        raise ValueError("not a number of seconds or a date-time")
    tz = m["tz"] or ""
    base = datetime.fromisoformat(m["base"] + ("+00:00" if tz == "Z" else tz))
    frac = m["frac"]
    return base, float("0." + frac) if frac else 0.0


def _parse_count(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("not a token count")
    if isinstance(value, int):
        n = value
    else:
        x = float(str(value).strip()) if not isinstance(value, float) else value
        if not x.is_integer():
            raise ValueError("not a whole number")
        n = int(x)
    if n < 0:
        raise ValueError("negative")
    return n


def load_trace(spec: TraceSpec, base_dir: Path, *, limit: int | None = None) -> TraceRows:
    """Read rows ``spec.start`` .. ``spec.start + limit`` (all when ``limit`` is None).

    Rows after the last one needed are not read, so replaying the head of a large trace is
    cheap. Every problem is a :class:`UserError` naming the file, line and column.
    """
    path = resolve_path(spec, base_dir)
    if not path.is_file():
        raise UserError(f"trace file not found: {path} (trace.path = '{spec.path}')")
    fmt = _format_of(spec, path)
    columns = (spec.timestamp_column, spec.input_column, spec.output_column)
    rows = _csv_rows(path, columns) if fmt == "csv" else _jsonl_rows(path, columns)

    bases: list[datetime | None] = []
    secs: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    lines: list[int] = []
    try:
        for index, (line_no, row) in enumerate(rows):
            if index < spec.start:
                continue
            if limit is not None and len(secs) >= limit:
                break
            column = spec.timestamp_column
            try:
                base, sec = _parse_time(row[column])
                column = spec.input_column
                n_in = _parse_count(row[column])
                column = spec.output_column
                n_out = _parse_count(row[column])
            except (ValueError, TypeError) as e:
                raise UserError(
                    f"{path}, line {line_no}, column '{column}': bad value {row[column]!r} ({e})"
                ) from None
            bases.append(base)
            secs.append(sec)
            ins.append(n_in)
            outs.append(n_out)
            lines.append(line_no)
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read the trace ({e})") from None

    if not secs:
        raise UserError(
            f"{path}: no rows to replay (trace.start = {spec.start}, the file has fewer rows)"
        )
    offsets = _offsets(path, spec.timestamp_column, bases, secs, lines)
    return TraceRows(
        path=path,
        offsets_s=offsets,
        input_tokens=np.asarray(ins, dtype=np.int64),
        output_tokens=np.asarray(outs, dtype=np.int64),
    )


def _offsets(
    path: Path,
    column: str,
    bases: list[datetime | None],
    secs: list[float],
    lines: list[int],
) -> FloatArray:
    b0, s0 = bases[0], secs[0]
    offsets = np.empty(len(secs), dtype=np.float64)
    for i, (b, s) in enumerate(zip(bases, secs, strict=True)):
        if (b is None) != (b0 is None):
            raise UserError(
                f"{path}, line {lines[i]}, column '{column}': mixes date-times and seconds"
            )
        try:
            whole = 0.0 if b is None or b0 is None else (b - b0).total_seconds()
        except TypeError:
            raise UserError(
                f"{path}, line {lines[i]}, column '{column}': mixes time zones with "
                "zone-less date-times"
            ) from None
        offsets[i] = whole + (s - s0)
        if i and offsets[i] < offsets[i - 1]:
            raise UserError(
                f"{path}, line {lines[i]}, column '{column}': timestamp earlier than the "
                "row before; traces must be in time order"
            )
    return offsets
