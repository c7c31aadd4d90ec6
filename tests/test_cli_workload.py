"""The ``servegym workload`` commands and their bad-input messages, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def servegym(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servegym", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    text = " ".join(ln.strip() for ln in lines)
    assert text.startswith("error:") or "Error" in text, proc.stderr
    for needle in needles:
        assert needle in text, (needle, proc.stderr)


def test_workload_list_names_every_shipped_workload() -> None:
    proc = servegym("workload", "list")
    assert proc.returncode == 0, proc.stderr
    for name in ("decode-heavy", "prefill-heavy", "balanced", "agentic", "trace"):
        assert name in proc.stdout


def test_workload_show_json_is_deterministic_and_seed_sensitive() -> None:
    a = json.loads(servegym("workload", "show", "balanced", "--requests", "20", "--json").stdout)
    b = json.loads(servegym("workload", "show", "balanced", "--requests", "20", "--json").stdout)
    c = json.loads(
        servegym("workload", "show", "balanced", "--requests", "20", "--seed", "1", "--json").stdout
    )
    assert a["content_hash"] == b["content_hash"]
    assert a["content_hash"] != c["content_hash"]
    assert a["turns"] == 20


def test_workload_show_scale_and_set() -> None:
    proc = servegym(
        "workload", "show", "balanced", "--requests", "30", "--scale", "0.05",
        "--set", "input_tokens.dist=fixed", "--set", "output_tokens.dist=fixed", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["prompt_tokens"]["p50"] == 50
    assert data["output_tokens"]["max"] == 50


def test_workload_show_table_has_hash() -> None:
    proc = servegym("workload", "show", "agentic")
    assert proc.returncode == 0, proc.stderr
    assert "content hash" in proc.stdout
    assert "tool result tokens" in proc.stdout


def test_unknown_workload() -> None:
    assert_one_line_error(servegym("workload", "show", "nope"), "nope", "balanced")


def test_bad_set_key_and_value() -> None:
    assert_one_line_error(servegym("workload", "show", "balanced", "--set", "foo=1"), "foo")
    assert_one_line_error(
        servegym("workload", "show", "balanced", "--set", "arrival.rate=-1"), "arrival.rate"
    )
    assert_one_line_error(servegym("workload", "show", "balanced", "--set", "novalue"), "novalue")


def test_malformed_toml_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.toml"
    bad.write_text('name = "broken"\nkind = [unclosed\n')
    assert_one_line_error(servegym("workload", "show", str(bad)), "broken.toml")


def test_unknown_field_in_toml_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "typo.toml"
    bad.write_text('name = "typo"\nnum_reqests = 5\n')
    assert_one_line_error(servegym("workload", "show", str(bad)), "typo.toml", "num_reqests")


def test_bad_flag_value_is_a_usage_error() -> None:
    proc = servegym("workload", "show", "balanced", "--requests", "zero")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "--requests" in proc.stderr
