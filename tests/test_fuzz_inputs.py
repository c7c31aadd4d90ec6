"""Bad input, fuzzed: task files, workload files, serving configs and command-line values.

Hypothesis generates malformed and near-valid inputs and runs them through the real command
(``servegym.cli.app`` under Typer's ``CliRunner``). For every case:

- nothing raises but a :class:`~servegym.errors.UserError` (which ``servegym.cli.main``
  prints as one line, exit code 2) or ``SystemExit`` (Typer's own exits): no traceback;
- a rejection exits with code 2 (``task validate`` reports a failed check with 1; a simulated
  engine that will not start exits with 3, as the README says);
- the project's own rejection is ONE line naming the file, the flag or the field; Typer's
  usage box (an unknown option, a value of the wrong type or out of a declared range) is
  Typer's and may span lines, but it names the flag;
- an input that happens to be valid may succeed (exit 0).

The example counts add up to 1,200 cases: 700 in the default run and 500 more under
``-m slow`` (see ``EXAMPLES``). Runs are derandomised (the same cases every run, so CI is
stable); set ``SERVEGYM_FUZZ_RANDOM=1`` to explore new ones.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import tempfile
import tomllib
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from servegym.cli import app
from servegym.cli.console import print_user_error
from servegym.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
TEST_TASKS = ROOT / "tests" / "data" / "tasks"
WORKLOADS = ROOT / "workloads"

# Cases per test; the sum over the file is what the "at least 1,000" counts.
EXAMPLES = {
    "task_file": 250,  # default run
    "task_validate": 40,
    "task_run": 30,
    "workload_file": 200,
    "workload_flags": 120,
    "sim_config": 200,  # slow
    "serve_dry_run": 150,  # slow
    "run_sweep_flags": 60,
    "bench_flags": 80,  # slow
    "leaderboard": 70,  # slow
}

FUZZ = settings(
    deadline=None,
    derandomize=os.environ.get("SERVEGYM_FUZZ_RANDOM") is None,
    database=None,
    # SERVEGYM_FUZZ_QUICK=1: no shrinking, for a fast look while developing.
    phases=[Phase.explicit, Phase.generate]
    if os.environ.get("SERVEGYM_FUZZ_QUICK")
    else [Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)


def fuzz(examples: int) -> settings:
    return settings(FUZZ, max_examples=examples)


runner = CliRunner()

# --------------------------------------------------------------------------- the harness


@dataclass
class Outcome:
    args: list[str]
    code: int
    output: str
    """stdout and stderr together (the error box or line as a user sees it)."""
    message: str | None
    """The project's own rejection (a UserError's message), else None."""

    @property
    def usage(self) -> bool:
        """Typer's own usage error (unknown option, bad or out-of-range option value)."""
        return self.message is None and self.code == 2 and "Usage:" in self.output

    def where(self) -> str:
        return f"servegym {shlex.join(self.args)}\n--- output ---\n{self.output}"


class Hang(Exception):
    pass


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def on_alarm(signum: int, frame: object) -> None:
        raise Hang(f"no answer within {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def invoke(
    args: Sequence[str], timeout_s: float = 60.0, env: dict[str, str] | None = None
) -> Outcome:
    """Run ``servegym ARGS`` as ``servegym.cli.main`` would, minus the process."""
    args = list(args)
    with _time_limit(timeout_s):
        result = runner.invoke(app, args, catch_exceptions=True, env=env)
    exc = result.exception
    output = result.output
    if isinstance(exc, UserError):  # main() prints it (as below) and exits with its code
        printed = io.StringIO()
        with contextlib.redirect_stderr(printed):
            print_user_error(exc)
        line = printed.getvalue()
        assert line.count("\n") == 1 and line.endswith("\n"), f"not one line: {line!r}"
        return Outcome(args, exc.exit_code, output + line, line.removeprefix("error: ")[:-1])
    if exc is not None and not isinstance(exc, SystemExit):
        tb = "".join(traceback.format_exception(exc))
        raise AssertionError(f"traceback from servegym {shlex.join(args)}:\n{tb}")
    return Outcome(args, result.exit_code, output, None)


def _flat(text: str) -> str:
    """Typer's box, unboxed: one string with single spaces."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def check(
    outcome: Outcome,
    names: Sequence[str],
    *,
    ok: Sequence[int] = (0, 2),
    printed_error: bool = False,
) -> None:
    """No traceback (``invoke``), an allowed exit code, and a rejection that is one line
    naming one of ``names`` (a file, flag or field). ``printed_error``: the command prints
    its own "error:" line (rather than raising to ``main``)."""
    assert outcome.code in ok, f"exit code {outcome.code}\n{outcome.where()}"
    if outcome.code != 2:
        return
    if outcome.usage:
        flat = _flat(outcome.output)
        assert "Error" in flat, outcome.where()
        return
    if outcome.message is not None:
        message = outcome.message
    else:
        assert printed_error, f"exit 2 without a message\n{outcome.where()}"
        lines = [ln for ln in outcome.output.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error:")]
        assert len(errors) == 1, f"not one error line\n{outcome.where()}"
        message = errors[0]
    assert message.strip(), outcome.where()
    assert "\n" not in message and "\r" not in message, f"multi-line\n{outcome.where()}"
    assert "Traceback" not in message, outcome.where()
    assert any(n in message for n in names), f"names none of {list(names)}\n{outcome.where()}"


# --------------------------------------------------------------------------- values

# Strings a user plausibly types: near-valid names and values, and a few pathological ones.
NEAR_STRINGS = [
    "", " ", "nope", "auto", "fp8", "int4", "poisson", "concurrency", "trace", "offline",
    "balanced", "agentic", "fixed", "lognormal", "pareto", "sim", "vllm", "vllm-cpu", "gpu",
    "ttft", "tpot", "goodput", "composite", "max_rate_at_sla", "p90", "p100", "h100-sxm",
    "llama-3.1-8b", "servegym-tiny", "true", "True", "1", "-1", "0", "1.5", "nan", "inf",
    "-inf", "1e400", "[1, 2]", "{a = 1}", "[]", "{}", '"quoted"', "'single'", "x=y", "a.b=c",
    "=", "==", ".", "..", "arrival.rate=-1", "arrival.kind=poisson", "../x", "/nonexistent",
    "/nonexistent/file.toml", "workload.toml", "traces/azure-sample.csv", "éè", "日本",
    "line\nbreak", "tab\tchar", "\x7f", "[", "{", '"', "\\", "#comment",
]  # fmt: skip

TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
NEAR_TEXT = st.one_of(st.sampled_from(NEAR_STRINGS), TEXT)

# Numbers: small ones (often valid), edges, and absurd ones (never valid). Moderately huge
# valid sizes (a million requests) are left out: they are valid and merely slow.
SPECIAL_NUMBERS: list[int | float] = [
    0, -1, -0.0, 0.5, 2**31, 2**63, 2**64, 10**30, -(2**63) - 1,
    1e30, -1e30, 1e300, 1e-300, math.nan, math.inf, -math.inf,
]  # fmt: skip
NUMBERS = st.one_of(
    st.integers(min_value=-5, max_value=64),
    st.floats(min_value=-10, max_value=100, allow_nan=False),
    st.sampled_from(SPECIAL_NUMBERS),
)
SCALARS = st.one_of(NUMBERS, NEAR_TEXT, st.booleans())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=5,
)


def number_text(x: int | float) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


# Command-line values of numeric options: numbers as text, and text.
CLI_NUMBERS = st.one_of(
    NUMBERS.map(number_text),
    st.sampled_from(["abc", "", " 3", "3 ", "1e400", "0x10", "1_000", "+5", "--", "-"]),
)


# --------------------------------------------------------------------------- TOML


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return number_text(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def toml_key(k: str) -> str:
    return json.dumps(k, ensure_ascii=False)


def toml_dumps(data: dict[str, Any]) -> str:
    """A table as TOML: every value inline, so any nesting round-trips."""
    return "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in data.items())


def key_paths(table: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for k, v in table.items():
        out.append((*prefix, k))
        if isinstance(v, dict):
            out.extend(key_paths(v, (*prefix, k)))
    return out


def table_paths(table: dict[str, Any]) -> list[tuple[str, ...]]:
    return [(), *(p for p in key_paths(table) if isinstance(_get(table, p), dict))]


def _get(table: dict[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        table = table[part]
    return table


def nonfinite(value: Any) -> bool:
    """Whether ``value`` holds NaN or an infinity anywhere (no spec accepts one)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(nonfinite(v) for v in value.values())
    return False


@dataclass
class FileCase:
    """One mutation of a TOML file: the bytes to write (or a folder in its place)."""

    kind: str
    path: tuple[str, ...] = ()
    content: bytes | None = None
    nonfinite: bool = False
    """The mutation wrote NaN or an infinity: the file must be refused."""

    @property
    def field(self) -> str:
        return ".".join(self.path)


# Field-specific near-valid values (a wrong objective kind, a bad override list, ...).
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "kind": st.sampled_from(["ttft", "goodput", "composite", "cost_at_sla", "nope", ""]),
    "name": st.sampled_from(
        ["balanced", "nope", "../x.toml", "/no/such.toml", "w.toml", "", "../../../../etc/passwd"]
    ),
    "overrides": st.lists(
        st.sampled_from(
            [
                "arrival.kind=poisson",
                "foo=1",
                "novalue",
                "=3",
                "arrival.rate=-1",
                "a..b=1",
                "arrival.rate.x=1",
                "input_tokens=5",
                "prompt.format=chat",
                "arrival.rate=nan",
            ]
        ),
        max_size=3,
    ),
    "engines": st.lists(st.sampled_from(["sim", "vllm", "vllm-cpu", "sglang", "x"]), max_size=3),
    "model": st.sampled_from(["llama-3.1-8b", "nope", "servegym-tiny", ""]),
    "hardware": st.sampled_from(["h100-sxm", "nope", "cpu-avx2", ""]),
    "track": st.sampled_from(["sim", "cpu", "gpu", "tpu", ""]),
    "statistic": st.sampled_from(["p50", "p100", "mean", ""]),
    "dist": st.sampled_from(["fixed", "uniform", "normal", "lognormal", "pareto", "zipf"]),
}


@st.composite
def toml_mutation(draw: st.DrawFn, base: dict[str, Any]) -> FileCase:
    """One way to break (or not quite break) the file whose table is ``base``."""
    kind = draw(
        st.sampled_from(
            ["drop", "drop", "set", "set", "set", "set", "unknown", "raw", "syntax", "bytes"]
        )
    )
    data = json.loads(json.dumps(base))  # a deep copy (TOML tables are JSON-able here)
    if kind == "drop":
        path = draw(st.sampled_from(key_paths(data)))
        del _get(data, path[:-1])[path[-1]]
        return FileCase(kind, path, toml_dumps(data).encode())
    if kind in ("set", "unknown"):
        if kind == "set":
            path = draw(st.sampled_from(key_paths(data)))
        else:
            parent = draw(st.sampled_from(table_paths(data)))
            path = (*parent, draw(st.sampled_from(["foo", "Kind", "", "a b", "é"]) | TEXT))
        special = FIELD_VALUES.get(path[-1])
        value = draw(special | VALUES if special is not None else VALUES)
        parent_table = _get(data, path[:-1])
        parent_table[path[-1]] = value
        return FileCase(kind, path, toml_dumps(data).encode(), nonfinite(value))
    text = toml_dumps(data)
    if kind == "raw":
        content = draw(
            st.sampled_from([b"", b"\n", b"# only a comment\n", b"[", b"x", b"= 1", b"a = "])
            | st.binary(max_size=40)
        )
        return FileCase(kind, (), content)
    if kind == "syntax":  # cut the file short, or put junk at some point of it
        at = draw(st.integers(min_value=0, max_value=len(text)))
        junk = draw(
            st.sampled_from(["", "=", "[", "]]", '"', "\n[x\n", "\n= 3\n", "{", "a = 1\na = 2\n"])
        )
        return FileCase(kind, (), (text[:at] + junk).encode())
    # bytes: valid text with bytes that are not UTF-8 somewhere in it
    raw = text.encode()
    at = draw(st.integers(min_value=0, max_value=len(raw)))
    bad = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3", b"\x80abc", b"\xed\xa0\x80"]))
    return FileCase(kind, (), raw[:at] + bad + raw[at:])


def write_case(target: Path, case: FileCase | None) -> None:
    if case is None:
        return
    if target.is_dir():
        shutil.rmtree(target)
    elif target.exists():
        target.unlink()
    if case.kind == "folder":
        target.mkdir()
        return
    assert case.content is not None
    target.write_bytes(case.content)


def _with(table: dict[str, Any], path: tuple[str, ...], value: Any) -> bytes:
    data = json.loads(json.dumps(table))
    _get(data, path[:-1])[path[-1]] = value
    return toml_dumps(data).encode()


def read_toml(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


# --------------------------------------------------------------------------- task files

SIM_TASKS = ["tiny-latency", "tiny-throughput", "tiny-composite", "tiny-maxrate", "tiny-cost"]
TASKS = [*SIM_TASKS, "tiny-cpu"]
TASK_TABLES = {name: read_toml(TEST_TASKS / name / "task.toml") for name in TASKS}
ORACLE = {"max_num_seqs": 64, "enable_prefix_caching": True, "speculative": {}}


@st.composite
def task_case(draw: st.DrawFn, tasks: Sequence[str] = TASKS) -> tuple[str, str, FileCase]:
    """A task, which of its files to break (task.toml, oracle.toml, instruction.md), how."""
    name = draw(st.sampled_from(list(tasks)))
    target = draw(st.sampled_from(["task.toml"] * 6 + ["oracle.toml"] * 2 + ["instruction.md"]))
    if target == "task.toml":
        case = draw(toml_mutation(TASK_TABLES[name]) | st.just(FileCase("folder")))
    elif target == "oracle.toml":
        case = draw(toml_mutation(ORACLE) | st.just(FileCase("folder")))
    else:
        case = draw(
            st.sampled_from(
                [FileCase("raw", (), b""), FileCase("raw", (), b"  \n\t\n"),
                 FileCase("raw", (), b"\xff\xfe bad"), FileCase("folder"),
                 FileCase("missing"), FileCase("raw", (), b"Do the task.\n")]
            )
        )  # fmt: skip
    if draw(st.integers(0, 19)) == 0:  # now and then: the file is a symlink out of the task
        case = FileCase("symlink")
    return name, target, case


SECRET = "SECRET-OUTSIDE-THE-TASK"


def make_task(tmp: Path, name: str, target: str, case: FileCase) -> Path:
    folder = tmp / name
    shutil.copytree(TEST_TASKS / name, folder)
    path = folder / target
    if case.kind == "missing":
        path.unlink()
    elif case.kind == "symlink":  # a valid file, but outside the task's folder
        outside = tmp / f"outside-{target}"
        if target == "instruction.md":
            outside.write_text(f"{SECRET}\n")
        elif path.exists():
            shutil.copyfile(path, outside)
        else:  # the test tasks have no oracle.toml
            outside.write_text(toml_dumps(ORACLE))
        path.unlink(missing_ok=True)
        path.symlink_to(outside)
    else:
        write_case(path, case)
    return folder


def task_names(folder: Path, target: str, case: FileCase) -> list[str]:
    """What a rejection of this task must name: the broken file, or another file of it
    (a mutation may leave the broken file valid and trip a reference check elsewhere)."""
    return [str(folder / target), f"{folder}/", str(folder)]


INF_SCALE = _with(TASK_TABLES["tiny-latency"], ("workload", "scale"), math.inf)
NAN_PRICE = _with(TASK_TABLES["tiny-cpu"], ("price_per_hour",), math.nan)
CR_KEY = _with(TASK_TABLES["tiny-cpu"], ("accuracy", "a\rb"), False)
MARKUP_KEY = _with(TASK_TABLES["tiny-latency"], ("budget", "[/x]"), 1)
MARKUP_TITLE = _with(TASK_TABLES["tiny-latency"], ("title",), "a [/x] title")
TRAVERSAL = _with(TASK_TABLES["tiny-latency"], ("workload", "name"), "../../../../etc/passwd")


@fuzz(EXAMPLES["task_file"])
@given(task_case())
# Regressions this fuzzing found: each was a traceback, a multi-line or a silent acceptance.
@example(("tiny-latency", "task.toml", FileCase("bytes", (), b'id = "\xff"\n')))
@example(("tiny-latency", "task.toml", FileCase("set", ("workload", "scale"), INF_SCALE, True)))
@example(("tiny-cpu", "task.toml", FileCase("set", ("price_per_hour",), NAN_PRICE, True)))
@example(("tiny-cpu", "task.toml", FileCase("unknown", ("accuracy", "a\rb"), CR_KEY)))
@example(("tiny-latency", "task.toml", FileCase("unknown", ("budget", "[/x]"), MARKUP_KEY)))
@example(("tiny-latency", "oracle.toml", FileCase("bytes", (), b"max_num_seqs = \xc3\n")))
@example(("tiny-latency", "task.toml", FileCase("set", ("title",), MARKUP_TITLE)))
@example(("tiny-latency", "instruction.md", FileCase("symlink")))  # was shown, and sent
@example(("tiny-cpu", "task.toml", FileCase("symlink")))  # was followed
@example(("tiny-latency", "oracle.toml", FileCase("symlink")))
@example(("tiny-latency", "task.toml", FileCase("set", ("workload", "name"), TRAVERSAL)))
def test_task_files(case: tuple[str, str, FileCase]) -> None:
    name, target, fc = case
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_task(Path(tmp), name, target, fc)
        outcome = invoke(["task", "show", str(folder)])
        refuse = fc.nonfinite or fc.kind == "symlink" or fc.content == TRAVERSAL
        check(outcome, task_names(folder, target, fc), ok=(2,) if refuse else (0, 2))
        assert SECRET not in outcome.output


@fuzz(EXAMPLES["task_validate"])
@given(task_case(SIM_TASKS))
@example(("tiny-latency", "task.toml", FileCase("unknown", ("budget", "[/x]"), MARKUP_KEY)))
def test_task_validate_schema_only(case: tuple[str, str, FileCase]) -> None:
    """``task validate`` reports a broken task as a failed check (exit 1), never a traceback."""
    name, target, fc = case
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_task(Path(tmp), name, target, fc)
        outcome = invoke(["task", "validate", str(folder), "--schema-only"])
        check(outcome, task_names(folder, target, fc), ok=(0, 1, 2))


@st.composite
def broken_task_case(draw: st.DrawFn) -> tuple[str, str, FileCase]:
    """A sim task whose task.toml surely fails to load (so ``run`` stops before the trial)."""
    name = draw(st.sampled_from(SIM_TASKS))
    data = json.loads(json.dumps(TASK_TABLES[name]))
    how = draw(st.sampled_from(["drop", "type", "unknown", "syntax"]))
    if how == "drop":
        key = draw(st.sampled_from(["title", "track", "model", "workload", "objective", "budget"]))
        del data[key]
        return name, "task.toml", FileCase(how, (key,), toml_dumps(data).encode())
    if how == "type":
        path = draw(st.sampled_from([("objective", "kind"), ("workload", "requests"),
                                     ("budget", "sim_gpu_seconds"), ("max_gpus",)]))  # fmt: skip
        value = draw(st.sampled_from([[1], {"a": 1}, "x", -3, 0, math.nan]))  # each one invalid
        _get(data, path[:-1])[path[-1]] = value
        return name, "task.toml", FileCase(how, path, toml_dumps(data).encode())
    if how == "unknown":
        data[draw(st.sampled_from(["foo", "Title", "seed"]))] = draw(SCALARS)
        return name, "task.toml", FileCase(how, (), toml_dumps(data).encode())
    return name, "task.toml", FileCase(how, (), toml_dumps(data).encode()[:-3] + b"[[")


@fuzz(EXAMPLES["task_run"])
@given(broken_task_case(), st.sampled_from(["default", "random", "tpe"]))
def test_run_with_broken_task(case: tuple[str, str, FileCase], agent: str) -> None:
    name, target, fc = case
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_task(Path(tmp), name, target, fc)
        out = Path(tmp) / "runs"
        outcome = invoke(["run", "--task", str(folder), "--agent", agent, "--out", str(out)])
        check(outcome, task_names(folder, target, fc), ok=(2,))
        assert not out.exists() or not any(out.iterdir()), "a broken task wrote a trial"


# --------------------------------------------------------------------------- workload files

WORKLOAD_NAMES = ["balanced", "agentic", "trace", "decode-heavy", "prefill-heavy"]
WORKLOAD_TABLES = {n: read_toml(WORKLOADS / f"{n}.toml") for n in WORKLOAD_NAMES}


@fuzz(EXAMPLES["workload_file"])
@given(
    st.sampled_from(WORKLOAD_NAMES),
    st.one_of(
        *(toml_mutation(WORKLOAD_TABLES[n]) for n in WORKLOAD_NAMES),
        st.just(FileCase("folder")),
    ),
    st.booleans(),
)
def test_workload_files(name: str, fc: FileCase, few: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copytree(WORKLOADS / "traces", folder / "traces")
        path = folder / f"{name}.toml"
        write_case(path, fc)
        args = ["workload", "show", str(path), "--json"]
        if few or fc.path[:1] != ("num_requests",):
            args += ["--requests", "3"]
        check(invoke(args), [str(path), "--requests"], ok=(2,) if fc.nonfinite else (0, 2))


# Every dotted key a workload --set may name, and some it may not.
def _model_keys(model: Any, prefix: str = "") -> list[str]:
    from servegym.overrides import _submodel

    keys: list[str] = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        sub = _submodel(field.annotation)
        if sub is not None:
            keys.extend(_model_keys(sub, f"{prefix}{name}."))
    return keys


def _workload_keys() -> list[str]:
    from servegym.workloads.spec import WorkloadSpec

    return _model_keys(WorkloadSpec)


def _config_keys() -> list[str]:
    from servegym.engines.config import ServingConfig

    return _model_keys(ServingConfig)


JUNK_KEYS = ["foo", "", " ", ".", "a..b", "arrival.", ".kind", "arrival.rate.x", "ARRIVAL.kind"]


def set_values(keys: list[str]) -> st.SearchStrategy[str]:
    """``key=value`` texts: a known or junk key and a near-valid or junk value (or no '=')."""
    key = st.sampled_from(keys + JUNK_KEYS) | TEXT
    value = st.one_of(NEAR_TEXT, NUMBERS.map(number_text), VALUES.map(toml_value))
    pair = st.tuples(key, value).map(lambda kv: f"{kv[0]}={kv[1]}")
    return st.one_of(pair, pair, pair, key)


def _names_of(sets: Sequence[str], *more: str) -> list[str]:
    return ["--set", *more]


def test_absurd_lengths_are_refused() -> None:
    """A length no model could take was drawn as int64 garbage (prompts of 0 tokens)."""
    sets = ["input_tokens.dist=fixed", "input_tokens.max=1e31", "input_tokens.value=1e30"]
    outcome = invoke(["workload", "show", "balanced", *(f"--set={s}" for s in sets)])
    check(outcome, ["input_tokens.value"], ok=(2,))
    outcome = invoke(["workload", "show", "balanced", "--requests=3", "--scale=inf"])
    check(outcome, ["--scale"], ok=(2,))


@fuzz(EXAMPLES["workload_flags"])
@given(
    st.sampled_from([*WORKLOAD_NAMES, "nope", "x.toml", "/no/such/w.toml", "", "traces"]),
    st.lists(set_values(_workload_keys()), max_size=3),
    st.one_of(st.none(), CLI_NUMBERS),
    st.one_of(st.none(), CLI_NUMBERS),
    st.one_of(st.none(), CLI_NUMBERS),
)
@example("balanced", [], "99999999999999999999999999", None, None)  # was OverflowError
@example("balanced", [], None, None, "inf")  # was garbage: lengths -9.2e18
@example("balanced", ["input_tokens.dist=fixed", "input_tokens.value=nan"], None, None, None)
@example("balanced", ["input_tokens.max=1e31", "input_tokens.value=1e30"], None, None, None)
@example("balanced", ["[/x]=1"], None, None, None)  # was a Rich MarkupError in main()
@example("balanced", ["a\nb=1"], None, None, None)  # was a two-line message
@example("balanced", ["prompt.token_id_high=1099511627776"], None, None, None)  # numpy error
@example("balanced", [], None, "10000000", None)  # was 37 GiB allocated (MemoryError)
@example("balanced", ["input_tokens.value=-5"], None, None, None)  # was clamped to 1
@example("a" * 5000, [], None, None, None)  # was OSError: File name too long
def test_workload_flags(
    name: str, sets: list[str], seed: str | None, requests: str | None, scale: str | None
) -> None:
    args = ["workload", "show", name, "--json"]
    args += [f"--set={s}" for s in sets]
    args += [f"--seed={seed}"] if seed is not None else []
    args += [f"--requests={requests}"] if requests is not None else ["--requests=3"]
    args += [f"--scale={scale}"] if scale is not None else []
    check(invoke(args), ["--set", "--seed", "--requests", "--scale", "seed", "workload", name])


# --------------------------------------------------------------------------- serving configs

CONFIG_BASE: dict[str, Any] = {
    "max_num_seqs": 32,
    "max_num_batched_tokens": 4096,
    "kv_cache_dtype": "auto",
    "enable_prefix_caching": True,
    "gpu_memory_utilization": 0.9,
    "speculative": {"method": "ngram", "num_speculative_tokens": 3},
}
CONFIG_FIELD_VALUES = {
    "kv_cache_dtype": st.sampled_from(["fp8", "fp8_e4m3", "int8", "auto", ""]),
    "quantization": st.sampled_from(["none", "fp8", "awq", "bnb", ""]),
    "method": st.sampled_from(["ngram", "eagle", "medusa"]),
}
FIELD_VALUES.update(CONFIG_FIELD_VALUES)


@fuzz(EXAMPLES["sim_config"])
@pytest.mark.slow
@given(
    st.one_of(st.none(), toml_mutation(CONFIG_BASE), st.just(FileCase("folder"))),
    st.lists(set_values(_config_keys()), max_size=2),
    st.lists(set_values(_workload_keys()), max_size=1),
    st.sampled_from(["llama-3.1-8b", "mistral-7b-v0.3", "nope", ""]),
    st.sampled_from(["h100-sxm", "l40s", "nope", ""]),
    st.one_of(st.none(), CLI_NUMBERS),
    st.one_of(
        st.none(), st.sampled_from(["ttft_ms=200", "ttft_ms=-1", "x=1", "", ",", "ttft_ms=nan"])
    ),
)
@example(None, [], [], "llama-3.1-8b", "", None, None)  # was an AssertionError
@example(
    FileCase("bytes", (), b"max_num_seqs = 4\n\xff"), [], [], "llama-3.1-8b", "l40s", None, None
)
@example(FileCase("folder"), [], [], "llama-3.1-8b", "l40s", None, None)  # IsADirectoryError
def test_sim_config_and_flags(
    fc: FileCase | None,
    sets: list[str],
    workload_sets: list[str],
    model: str,
    hardware: str,
    seed: str | None,
    sla: str | None,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.toml"
        args = ["sim", "--model", model, "--hardware", hardware, "--workload", "balanced"]
        args += ["--requests", "4", "--scale", "0.05", "--out", str(Path(tmp) / "out")]
        if fc is not None:
            write_case(config, fc)
            args += ["--config", str(config)]
        args += [f"--set={s}" for s in sets] + [f"--workload-set={s}" for s in workload_sets]
        args += [f"--seed={seed}"] if seed is not None else []
        args += [f"--sla={sla}"] if sla is not None else []
        names = [str(config), "--config", "--set", "--workload-set", "--seed", "--sla"]
        names += ["--model", "--hardware", "model", "hardware", "seed", "workload"]
        outcome = invoke(args)
        check(outcome, names, ok=(0, 2, 3))
        if outcome.code == 3:  # the engine's own message, as `vllm serve` would print it
            assert "launch failed:" in outcome.output, outcome.where()


@fuzz(EXAMPLES["serve_dry_run"])
@pytest.mark.slow
@given(
    st.sampled_from(["vllm-cpu", "vllm", "sglang", "nope", ""]),
    st.sampled_from(["servegym-tiny", "/no/such/model", "org/model", ""]),
    st.one_of(st.none(), toml_mutation(CONFIG_BASE), st.just(FileCase("folder"))),
    st.lists(set_values(_config_keys()), max_size=3),
    st.one_of(st.none(), CLI_NUMBERS),
)
@example("vllm-cpu", "servegym-tiny", FileCase("folder"), [], None)  # was IsADirectoryError
@example("vllm", "servegym-tiny", None, ["max_num_seqs=nan", "gpu_memory_utilization=0.5"], None)
def test_serve_dry_run(
    engine: str, model: str, fc: FileCase | None, sets: list[str], port: str | None
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.toml"
        args = ["serve", "--engine", engine, "--model", model, "--dry-run"]
        if fc is not None:
            write_case(config, fc)
            args += ["--config", str(config)]
        args += [f"--set={s}" for s in sets]
        args += [f"--port={port}"] if port is not None else []
        names = [str(config), "--config", "--set", "--engine", "--model", "--port", engine]
        check(invoke(args), names)


# --------------------------------------------------------------------------- other flags

AGENTS = ["default", "random", "tpe"]
BAD_AGENTS = ["nope", "", "default2", "anthropic", ":", "scripted", "openai-compatible:x"]


@fuzz(EXAMPLES["run_sweep_flags"])
@given(
    st.booleans(),
    st.sampled_from(["tiny-latency", "nope", "", "/no/such/task", "../x", "*"]) | TEXT,
    st.sampled_from(AGENTS + BAD_AGENTS) | TEXT,
    st.one_of(st.none(), CLI_NUMBERS),
    st.sampled_from(["local", "ray", "nope"]),
    st.one_of(st.none(), st.sampled_from(["sim", "cpu", "gpu", "tpu", ""])),
)
@example(True, "", "default", None, "local", None)  # was an empty sweep, exit 0
@example(True, "*", "default", None, "local", "sim")  # no task: refused, never run
@example(False, "a" * 5000, "default", None, "local", None)  # was OSError: name too long
def test_run_and_sweep_flags(
    sweep: bool, task: str, agent: str, seed: str | None, executor: str, track: str | None
) -> None:
    """Unknown tasks and agents, bad seeds: each refused before anything runs."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "runs"
        # A data folder without tasks: no pattern can start a real sweep ('*' once did).
        data = Path(tmp) / "data"
        (data / "tasks").mkdir(parents=True)
        for name in ("workloads", "agents"):
            (data / name).symlink_to(ROOT / name)
        if task == "tiny-latency":
            task = str(TEST_TASKS / task)
            agent += "-nope"  # keep one part bad: a valid pair would run a whole trial
        if sweep:
            args = ["sweep", "--tasks", task, "--agents", agent, "--out", str(out)]
            args += [f"--seeds={seed}"] if seed is not None else []
            args += ["--executor", executor, "--max-concurrent", "1"]
            args += [f"--track={track}"] if track is not None else []
        else:
            args = ["run", "--task", task, "--agent", agent, "--out", str(out)]
            args += [f"--seed={seed}"] if seed is not None else []
        names = ["--task", "--agent", "--seed", "--out", "--executor", "--track", task, agent]
        check(invoke(args, env={"SERVEGYM_DATA_DIR": str(data)}), names, ok=(2,))


@fuzz(EXAMPLES["bench_flags"])
@pytest.mark.slow
@given(
    st.lists(
        st.sampled_from(["ttft_ms=5", "itl_ms=1", "tokens_per_chunk=2", "model=m"])
        | st.tuples(
            st.sampled_from(["ttft_ms", "itl_ms", "tokens_per_chunk", "model", "x", ""]),
            NEAR_TEXT,
        ).map(lambda kv: f"{kv[0]}={kv[1]}")
        | TEXT,
        max_size=3,
    ),
    st.one_of(st.none(), st.sampled_from(["ttft_ms=200", "x=1", "", "ttft_ms=nan"]) | TEXT),
    st.one_of(st.none(), CLI_NUMBERS),
    st.one_of(st.none(), CLI_NUMBERS),
    st.booleans(),
)
@example(["ttft_ms=nan"], None, None, None, False)  # started a mock server that hung
@example(["itl_ms=inf"], None, None, None, False)
def test_bench_mock_flags(
    mock_parts: list[str], sla: str | None, timeout: str | None, gpus: str | None, both: bool
) -> None:
    """``bench --mock`` with bad settings: refused before a server starts."""
    from servegym.runner.bench import parse_mock_settings
    from servegym.scoring.metrics import SLA

    mock = ",".join(mock_parts)
    with tempfile.TemporaryDirectory() as tmp:
        args = ["bench", "--mock", mock, "--workload", "balanced", "--requests", "2"]
        args += ["--out", str(Path(tmp) / "out")]
        args += ["--base-url", "http://127.0.0.1:9"] if both else []
        args += [f"--sla={sla}"] if sla is not None else []
        args += [f"--timeout={timeout}"] if timeout is not None else []
        args += [f"--gpus={gpus}"] if gpus is not None else []
        # Keep one part bad: valid settings would start a real mock server and run.
        valid = not both
        try:
            parse_mock_settings(mock)
            if sla:
                SLA.parse(sla)
        except UserError:
            valid = False
        if valid:
            args += ["--set", "nope=1"]
        names = ["--mock", "--sla", "--timeout", "--gpus", "--base-url", "--set"]
        check(invoke(args), names, ok=(2,))


@fuzz(EXAMPLES["leaderboard"])
@pytest.mark.slow
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a__b__s0", "t__default__s1", "x", "a__b__sX", "trial.json"]),
            st.sampled_from(["trial.json", "other.txt", "folder"]),
            st.one_of(
                st.binary(max_size=30),
                st.sampled_from([b"", b"{}", b"[]", b"null", b'{"task": 1}', b"\xff"]),
                VALUES.map(lambda v: json.dumps(v, allow_nan=True).encode()),
            ),
        ),
        max_size=3,
    ),
    st.sampled_from(["table", "markdown", "csv", "json", "html", ""]),
    st.booleans(),
)
def test_leaderboard_junk_folders(
    files: list[tuple[str, str, bytes]], fmt: str, missing: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        for folder, name, content in files:
            path = run_dir / folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if name == "folder":
                path.mkdir(exist_ok=True)
            elif not path.exists():
                path.write_bytes(content)
        dirs = [str(run_dir)] + ([str(Path(tmp) / "missing")] if missing else [])
        outcome = invoke(["leaderboard", *dirs, "--format", fmt])
        check(outcome, [str(run_dir), "--format", "missing", "run"], printed_error=True)
