"""Trace replay: CSV and JSONL, date-time and seconds timestamps, windows, errors."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from servegym.errors import UserError
from servegym.paths import data_dir
from servegym.workloads import load_spec, materialise, summarise
from servegym.workloads.spec import TraceSpec, WorkloadSpec
from servegym.workloads.trace import load_trace

ROWS = [
    ("2023-11-16 18:15:46.6805900", 100, 10),
    ("2023-11-16 18:15:46.6805901", 200, 20),
    ("2023-11-16 18:15:48.1805900", 300, 0),
    ("2023-11-16 18:16:01.0000000", 400, 40),
]


def write_csv(path: Path, rows: Sequence[tuple[object, ...]] = ROWS, header: str = "") -> Path:
    head = header or "TIMESTAMP,ContextTokens,GeneratedTokens"
    path.write_text("\n".join([head] + [",".join(map(str, r)) for r in rows]) + "\n")
    return path


def trace_spec(path: str = "t.csv", **arrival: object) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "name": "t",
            "kind": "trace",
            "trace": {"path": path},
            "arrival": {"kind": "trace", **arrival},
        }
    )


def test_csv_datetime_offsets_are_exact(tmp_path: Path) -> None:
    write_csv(tmp_path / "t.csv")
    rows = load_trace(TraceSpec(path="t.csv"), tmp_path)
    assert rows.offsets_s.tolist() == pytest.approx([0.0, 1e-7, 1.5, 14.31941], abs=1e-9)
    assert rows.input_tokens.tolist() == [100, 200, 300, 400]
    assert rows.output_tokens.tolist() == [10, 20, 0, 40]


def test_replay_times_are_timestamps_times_time_scale(tmp_path: Path) -> None:
    write_csv(tmp_path / "t.csv")
    w = materialise(trace_spec(time_scale=0.5), 0, base_dir=tmp_path)
    offsets = [s.turns[0].arrival_s for s in w.sessions]
    assert offsets == pytest.approx([0.0, 0.5e-7, 0.75, 7.159705], abs=1e-9)
    turns = [(s.turns[0].prompt_len, s.turns[0].output_len) for s in w.sessions]
    assert turns == [(100, 10), (200, 20), (300, 1), (400, 40)]  # 0 output -> 1


def test_jsonl_with_seconds(tmp_path: Path) -> None:
    lines = [
        {"TIMESTAMP": 10.0, "ContextTokens": 5, "GeneratedTokens": 6},
        {"TIMESTAMP": "12.5", "ContextTokens": "7", "GeneratedTokens": 8.0},
        {},
    ]
    text = "\n".join(json.dumps(x) for x in lines[:2]) + "\n\n"
    (tmp_path / "t.jsonl").write_text(text)
    rows = load_trace(TraceSpec(path="t.jsonl"), tmp_path)
    assert rows.offsets_s.tolist() == [0.0, 2.5]
    assert rows.input_tokens.tolist() == [5, 7] and rows.output_tokens.tolist() == [6, 8]


def test_custom_columns_and_zones(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(
        "ts,in,out\n2024-01-01T00:00:00Z,1,1\n2024-01-01T01:00:00.25+01:00,2,2\n"
    )
    spec = TraceSpec(path="t.csv", timestamp_column="ts", input_column="in", output_column="out")
    assert load_trace(spec, tmp_path).offsets_s.tolist() == [0.0, 0.25]


def test_start_and_num_requests_pick_a_window(tmp_path: Path) -> None:
    write_csv(tmp_path / "t.csv")
    spec = WorkloadSpec.model_validate(
        {"name": "t", "kind": "trace", "num_requests": 2, "trace": {"path": "t.csv", "start": 1}}
    )
    w = materialise(spec, 0, base_dir=tmp_path)
    assert [s.turns[0].prompt_len for s in w.sessions] == [200, 300]
    assert [s.turns[0].arrival_s for s in w.sessions] == [0.0, 0.0]  # offline arrival


def test_other_arrivals_use_trace_lengths_only(tmp_path: Path) -> None:
    write_csv(tmp_path / "t.csv")
    spec = WorkloadSpec.model_validate(
        {
            "name": "t",
            "kind": "trace",
            "trace": {"path": "t.csv"},
            "arrival": {"kind": "constant", "rate": 2},
        }
    )
    w = materialise(spec, 0, base_dir=tmp_path)
    assert [s.turns[0].arrival_s for s in w.sessions] == [0.0, 0.5, 1.0, 1.5]
    assert [s.turns[0].prompt_len for s in w.sessions] == [100, 200, 300, 400]


def test_warmup_replays_the_first_rows(tmp_path: Path) -> None:
    write_csv(tmp_path / "t.csv")
    spec = trace_spec().model_copy(update={"warmup_requests": 6})
    w = materialise(WorkloadSpec.model_validate(spec.model_dump()), 0, base_dir=tmp_path)
    assert w.warmup_sessions == 6 and len(w.sessions) == 10
    warm = w.sessions[:6]
    assert [s.turns[0].prompt_len for s in warm] == [100, 200, 300, 400, 100, 200]
    offsets = [s.turns[0].arrival_s for s in warm]
    assert offsets[0] == 0.0 and offsets == sorted(offsets)  # type: ignore[type-var]


def test_shipped_sample_is_bursty(tmp_path: Path) -> None:
    spec, base = load_spec("trace")
    w = materialise(spec, 0, base_dir=base)
    s = summarise(w)
    assert s.sessions == 200
    assert s.arrival_span_s is not None and 60 < s.arrival_span_s < 600
    gaps = np.diff([x.turns[0].arrival_s for x in w.sessions[w.warmup_sessions :]])
    assert gaps.std() / gaps.mean() > 1.5  # burstier than Poisson (CV 1)
    # the hash does not depend on where the trace file lives
    shutil.copy(data_dir("workloads") / spec.trace.path, tmp_path / "x.csv")  # type: ignore[union-attr]
    moved = spec.model_copy(update={"trace": TraceSpec(path="x.csv")})
    assert materialise(moved, 0, base_dir=tmp_path).sessions[5].turns == w.sessions[5].turns


def test_hash_is_independent_of_the_checkout_location(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    write_csv(tmp_path / "traces" / "t.csv")
    other = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "traces", other / "traces")
    spec = trace_spec("traces/t.csv")
    a = materialise(spec, 3, base_dir=tmp_path)
    b = materialise(spec, 3, base_dir=other)
    assert a.content_hash() == b.content_hash()
    assert a.spec.trace is not None and a.spec.trace.path == "traces/t.csv"


def test_prompt_tokens_come_from_the_seed(tmp_path: Path) -> None:
    write_csv(tmp_path / "t.csv")
    a = materialise(trace_spec(), 1, base_dir=tmp_path)
    b = materialise(trace_spec(), 2, base_dir=tmp_path)
    assert not np.array_equal(a.sessions[0].tokens, b.sessions[0].tokens)
    assert a.content_hash() != b.content_hash()


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        (None, "missing.csv", r"trace file not found: .*missing\.csv"),
        ("", "t.csv", "empty"),
        ("TIMESTAMP,ContextTokens\n1,2\n", "t.csv", "missing column 'GeneratedTokens'"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\nabc,2,3\n", "t.csv",
         r"t\.csv, line 3, column 'TIMESTAMP': bad value 'abc'"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2.5,3\n", "t.csv",
         r"line 2, column 'ContextTokens'.*whole number"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,-3\n", "t.csv",
         r"line 2, column 'GeneratedTokens'.*negative"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2\n", "t.csv", "line 2: 2 fields"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n5,1,1\n4,1,1\n", "t.csv",
         "line 3.*time order"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n5,1,1\n2024-01-01 00:00:00,1,1\n", "t.csv",
         "line 3.*mixes"),
        ('{"TIMESTAMP": 1, "ContextTokens": 1}\n', "t.jsonl",
         r"t\.jsonl, line 1: missing column 'GeneratedTokens'"),
        ('{"TIMESTAMP": 1, \n', "t.jsonl", r"line 1: not valid JSON"),
        ("[1, 2]\n", "t.jsonl", "JSON object"),
        ("x", "t.parquet", "cannot tell the trace format"),
    ],
)  # fmt: skip
def test_bad_traces(tmp_path: Path, content: str | None, name: str, message: str) -> None:
    if content is not None:
        (tmp_path / name).write_text(content)
    with pytest.raises(UserError, match=message):
        materialise(trace_spec(name), 0, base_dir=tmp_path)


def test_start_past_the_end(tmp_path: Path) -> None:
    write_csv(tmp_path / "t.csv")
    with pytest.raises(UserError, match="no rows to replay"):
        load_trace(TraceSpec(path="t.csv", start=10), tmp_path)


def test_trace_kind_needs_a_table() -> None:
    with pytest.raises(ValueError, match=r"needs a \[trace\] table"):
        WorkloadSpec(name="t", kind="trace")
