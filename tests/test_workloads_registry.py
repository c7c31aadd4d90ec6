"""Workload files: listing, loading by name or path, overrides, and every bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from servegym.errors import UserError
from servegym.paths import data_dir
from servegym.workloads import list_workloads, load_spec, materialise

SHIPPED = {"agentic", "balanced", "decode-heavy", "prefill-heavy", "trace"}


def test_list_shipped_workloads() -> None:
    infos = {i.name: i for i in list_workloads()}
    assert set(infos) >= SHIPPED
    assert infos["agentic"].kind == "agentic" and infos["trace"].kind == "trace"
    assert all(i.description and i.path.is_file() for i in infos.values())


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_workload_loads_and_materialises(name: str) -> None:
    spec, base = load_spec(name, requests=3, scale=0.05)
    assert spec.name == name and spec.num_requests == 3 and spec.scale == 0.05
    assert base == data_dir("workloads").resolve()
    assert materialise(spec, 0, base_dir=base).num_turns >= 3


def test_load_by_path(tmp_path: Path) -> None:
    f = tmp_path / "mine.toml"
    f.write_text('kind = "synthetic"\nnum_requests = 3\n')
    spec, base = load_spec(str(f))
    assert spec.name == "mine" and spec.num_requests == 3 and base == tmp_path.resolve()


def test_overrides_field_by_field() -> None:
    spec, _ = load_spec(
        "balanced",
        [
            "arrival.kind=poisson",
            "arrival.rate=4",
            "input_tokens.dist=fixed",
            "input_tokens.value=500",
            "num_requests=50",
            "prompt.format=chat",
            'description="quoted string"',
            "shared_prefix = {tokens = 100, groups = 2}",
        ],
    )
    assert spec.arrival.kind == "poisson" and spec.arrival.rate == 4.0
    assert spec.input_tokens.dist == "fixed" and spec.input_tokens.value == 500
    assert spec.output_tokens.mean == 1000  # untouched
    assert spec.num_requests == 50 and spec.prompt.format == "chat"
    assert spec.description == "quoted string"
    assert spec.shared_prefix.tokens == 100 and spec.shared_prefix.groups == 2


def test_nested_override_keeps_the_rest_of_the_default() -> None:
    spec, _ = load_spec("agentic", ["agentic.turns.median=10", "agentic.total_turns=300"])
    assert spec.agentic is not None
    assert spec.agentic.turns.median == 10 and spec.agentic.turns.dist == "lognormal"
    assert spec.agentic.turns.sigma == 0.5
    # a table the file lacks starts from its default
    spec, _ = load_spec("balanced", ["kind=agentic", "agentic.turns.median=10", "num_requests=2"])
    assert spec.agentic is not None and spec.agentic.turns.median == 10
    assert spec.agentic.reply_tokens.tail_fraction > 0


def test_scale_and_requests_flags() -> None:
    spec, _ = load_spec("balanced", ["num_requests=50"], requests=7, scale=0.05)
    assert spec.num_requests == 7 and spec.scale == 0.05
    spec, _ = load_spec("agentic", requests=40)
    assert spec.agentic is not None and spec.agentic.total_turns == 2000


@pytest.mark.parametrize(
    ("name", "overrides", "kwargs", "message"),
    [
        ("nope", [], {}, r"unknown workload 'nope'; known workloads: agentic, balanced"),
        ("/no/such/file.toml", [], {}, "workload file not found: /no/such/file.toml"),
        ("balanced", ["arrival.kind"], {}, r"--set 'arrival.kind' needs the form key=value"),
        ("balanced", ["=3"], {}, "empty key"),
        ("balanced", ["arrival..kind=x"], {}, "empty key"),
        ("balanced", ["arrival.rat=4"], {},
         r"--set arrival.rat: unknown key 'rat' under arrival; keys there: burstiness, "
         r"concurrency, kind, rate, time_scale"),
        ("balanced", ["bogus=1"], {}, r"unknown key 'bogus' under the top level; keys there: "),
        ("balanced", ["num_requests.x=1"], {}, r"'num_requests' is a value, not a table"),
        ("balanced", ["arrival.kind=sometimes"], {},
         r"--set arrival.kind=sometimes: bad value for 'arrival.kind': Input should be "),
        ("balanced", ["num_requests=abc"], {},
         r"--set num_requests=abc: bad value for 'num_requests': Input should be a valid integer"),
        ("balanced", ["arrival.kind=poisson"], {},
         r"--set arrival.kind=poisson: bad value for 'arrival': arrival 'poisson' needs rate"),
        ("balanced", ["input_tokens.dist=normal", "input_tokens.std=-1"], {},
         r"--set input_tokens.std=-1: bad value for 'input_tokens': std must be >= 0"),
        ("balanced", ["kind=trace"], {}, r"with --set kind=trace: .*needs a \[trace\] table"),
        ("balanced", [], {"requests": 0}, "--requests must be at least 1"),
        ("balanced", [], {"scale": 0.0}, "--scale must be greater than 0"),
    ],
)  # fmt: skip
def test_bad_inputs(
    name: str, overrides: list[str], kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(UserError, match=message) as info:
        load_spec(name, overrides, **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_malformed_toml_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text('name = "bad"\nnum_requests = \n')
    with pytest.raises(UserError, match=r"bad\.toml: malformed TOML: .*line 2"):
        load_spec(str(f))


def test_bad_field_in_the_file_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "w.toml"
    f.write_text("num_requests = 5\n[arrival]\nkind = 'poisson'\nrat = 3\n")
    with pytest.raises(UserError, match=r"w\.toml: bad value for 'arrival.rat': Extra inputs"):
        load_spec(str(f))
    # and an override can mend a file
    f.write_text("num_requests = 5\n[arrival]\nkind = 'poisson'\n")
    spec, _ = load_spec(str(f), ["arrival.rate=3"])
    assert spec.arrival.rate == 3


def test_unreadable_shipped_file_is_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "workloads").mkdir()
    (tmp_path / "workloads" / "ok.toml").write_text('description = "fine"\n')
    (tmp_path / "workloads" / "broken.toml").write_text("kind = \n")
    monkeypatch.setenv("SERVEGYM_DATA_DIR", str(tmp_path))
    infos = {i.name: i for i in list_workloads()}
    assert infos["ok"].kind == "synthetic" and infos["ok"].description == "fine"
    assert "unreadable" in infos["broken"].description
    with pytest.raises(UserError, match="known workloads: broken, ok"):
        load_spec("nothing")
