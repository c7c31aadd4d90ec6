"""Hostile and odd input, each refused in one line (exit code 2) before it does harm.

- Task files and workload references that resolve outside their folder (a symlink to a
  secret, ``../`` in ``[workload] name``, an absolute path, a trace outside): refused by
  ``task show``, ``task validate``, ``run`` and ``task new --from``, before anything is
  shown, written to a trajectory, or sent to a model provider.
- A task whose baseline does not launch, or whose budget does not cover one start-up of it:
  a task error, never a recorded 1.0x ``harness_error``.
- Names too long for the file system, non-UTF-8 files, negative token lengths, a missing
  ``--root``, unknown names given with ``sim --list``, workloads too large to hold in
  memory, ``--workload-set`` errors.

Every command runs as the user runs it (``servegym.cli.app`` under Typer's ``CliRunner``).
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servegym.cli import app
from servegym.cli.console import print_user_error
from servegym.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "tests" / "data" / "tasks"
SECRET = "TOP-SECRET-0xC0FFEE"
LONG = "a" * 5000


@dataclass
class Result:
    code: int
    output: str
    message: str | None
    """The one line a user error prints (without ``error: ``), else None."""


def servegym(*args: str, env: dict[str, str] | None = None) -> Result:
    """``servegym ARGS`` as ``servegym.cli.main`` runs it: a UserError is one line, exit 2;
    anything else raised is a traceback and fails the test."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=True, env=env)
    exc = result.exception
    if isinstance(exc, UserError):
        printed = io.StringIO()
        with contextlib.redirect_stderr(printed):
            print_user_error(exc)
        line = printed.getvalue()
        assert line.count("\n") == 1, f"not one line: {line!r}"
        return Result(exc.exit_code, result.output + line, line.removeprefix("error: ")[:-1])
    if exc is not None and not isinstance(exc, SystemExit):
        raise AssertionError(f"servegym {args[:3]} raised {type(exc).__name__}: {exc}") from exc
    return Result(result.exit_code, result.output, None)


def flat(text: str) -> str:
    """A table's text as one line of words (cells wrap at the terminal's width)."""
    return " ".join(re.sub(r"[│┃╭╮╰╯─━┏┓┗┛┡┩┳┻╇╈┠┨└┘┌┐├┤┬┴┼]", " ", text).split())


def refused(r: Result, *names: str) -> str:
    """The one-line refusal (exit code 2) naming every one of ``names``; a command may
    print its own ``error:`` line rather than raise (``pipeline analyze``, ``leaderboard``)."""
    assert r.code == 2, r.output
    message = r.message
    if message is None:
        errors = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1, r.output
        message = errors[0].removeprefix("error: ")
    assert all(n in message for n in names), f"{message!r} does not name all of {names}"
    return message


def copy_task(tmp: Path, name: str = "tiny-latency", new_id: str = "t") -> Path:
    folder = tmp / new_id
    shutil.copytree(TASKS / name, folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace(f'id = "{name}"', f'id = "{new_id}"'))
    (folder / "oracle.toml").write_text("max_num_seqs = 64\n")
    return folder


def edit(folder: Path, old: str, new: str) -> None:
    toml = folder / "task.toml"
    text = toml.read_text()
    assert old in text
    toml.write_text(text.replace(old, new))


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir()
    path.write_text(f"{SECRET}\n")
    return path


# --------------------------------------------------------------------------- item 2: symlinks


@pytest.mark.parametrize("name", ["instruction.md", "task.toml", "oracle.toml"])
def test_a_task_file_symlinked_out_of_its_folder_is_refused_everywhere(
    tmp_path: Path, secret: Path, name: str
) -> None:
    folder = copy_task(tmp_path)
    target = secret
    if name == "task.toml":  # a valid task.toml outside, so only the link is wrong
        target = tmp_path / "outside" / "task.toml"
        shutil.copyfile(folder / "task.toml", target)
    (folder / name).unlink()
    (folder / name).symlink_to(target)
    out = tmp_path / "runs"
    for args in (
        ["task", "show", str(folder)],
        ["run", "--task", str(folder), "--agent", "default", "--out", str(out)],
    ):
        r = servegym(*args)
        message = refused(r, f"{folder / name}", "outside the task's folder")
        assert SECRET not in r.output and SECRET not in message
    assert not out.exists()
    v = servegym("task", "validate", str(folder), "--schema-only")
    assert (
        v.code == 1
        and "outside the task's folder" in flat(v.output)
        and SECRET not in flat(v.output)
    )


def test_a_symlink_that_stays_inside_the_folder_is_fine(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    (folder / "notes.md").write_text("Tune the server.\n")
    (folder / "instruction.md").unlink()
    (folder / "instruction.md").symlink_to("notes.md")
    r = servegym("task", "show", str(folder))
    assert r.code == 0 and "Tune the server." in r.output


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../../../../../../../../etc/passwd", "resolves outside the task's folder"),
        ("sub/../../w.toml", "resolves outside the task's folder"),
        ("/etc/passwd", "is an absolute path"),
        ("~/w.toml", "is an absolute path"),
    ],
)
def test_a_workload_name_reaching_out_of_the_task_is_refused(
    tmp_path: Path, name: str, why: str
) -> None:
    folder = copy_task(tmp_path)
    shutil.copyfile(ROOT / "workloads" / "balanced.toml", tmp_path / "w.toml")
    edit(folder, 'name = "balanced"', f'name = "{name}"')
    r = servegym("task", "show", str(folder))
    refused(r, str(folder / "task.toml"), "workload.name", why)
    v = servegym("task", "validate", str(folder), "--schema-only")
    assert v.code == 1 and why in flat(v.output)


def test_a_workload_file_symlinked_out_and_a_trace_outside_are_refused(
    tmp_path: Path, secret: Path
) -> None:
    folder = copy_task(tmp_path)
    outside = tmp_path / "outside" / "w.toml"
    shutil.copyfile(ROOT / "workloads" / "balanced.toml", outside)
    (folder / "w.toml").symlink_to(outside)
    edit(folder, 'name = "balanced"', 'name = "w.toml"')
    refused(servegym("task", "show", str(folder)), "workload.name", "outside the task's folder")

    folder2 = copy_task(tmp_path, new_id="t2")
    trace = (ROOT / "workloads" / "trace.toml").read_text()
    (folder2 / "w.toml").write_text(trace.replace('path = "traces/', f'path = "{secret.parent}/'))
    edit(folder2, 'name = "balanced"', 'name = "w.toml"')
    refused(servegym("task", "show", str(folder2)), "trace.path", "outside the task's folder")

    folder3 = copy_task(tmp_path, new_id="t3")  # the same through an override
    edit(folder3, 'name = "balanced"', 'name = "trace"')
    edit(folder3, "overrides = [", f'overrides = ["trace.path={secret}", ')
    refused(servegym("task", "show", str(folder3)), "trace.path", "outside")


def test_nothing_reaches_the_model_provider_from_a_task_symlinked_out(
    tmp_path: Path, secret: Path
) -> None:
    from test_llm_agent import serving

    from servegym.providers.fakes import FakeOpenAI, final_text

    folder = copy_task(tmp_path)
    (folder / "instruction.md").unlink()
    (folder / "instruction.md").symlink_to(secret)
    out = tmp_path / "runs"
    with serving(FakeOpenAI, [final_text("done")]) as fake:
        r = servegym(
            "run", "--task", str(folder), "--agent", "openai-compatible:m",
            "--base-url", fake.base_url, "--out", str(out),
        )  # fmt: skip
        assert fake.requests == []
    refused(r, "instruction.md", "outside")
    assert not out.exists()


def test_task_new_from_a_task_with_a_symlink_out_copies_nothing(
    tmp_path: Path, secret: Path
) -> None:
    root = tmp_path / "tasks"
    root.mkdir()
    source = copy_task(root, new_id="src")
    (source / "notes.md").symlink_to(secret)
    r = servegym("task", "new", "copy", "--from", str(source), "--root", str(root))
    refused(r, "notes.md", "outside the task's folder")
    assert not (root / "copy").exists()


# --------------------------------------------------------------------------- item 8: baseline


def test_a_baseline_that_does_not_launch_is_a_task_error_not_a_trial(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    edit(folder, "[baseline]\n", "[baseline]\ngpu_memory_utilization = 0.05\n")
    out = tmp_path / "runs"
    r = servegym("run", "--task", str(folder), "--agent", "default", "--out", str(out))
    refused(r, str(folder / "task.toml"), "baseline", "does not launch", "task validate")
    assert not list(out.glob("*/trial.json"))  # no harness_error counted 1.0x
    v = servegym("task", "validate", str(folder), "--schema-only")
    assert v.code == 1 and "does not launch" in flat(v.output)
    # A sweep names the broken task and records no trial of it either.
    data = tmp_path / "data"
    (data / "tasks").mkdir(parents=True)
    shutil.copytree(folder, data / "tasks" / "t")
    (data / "workloads").symlink_to(ROOT / "workloads")
    sweep_out = tmp_path / "sweep"
    s = servegym("sweep", "--tasks", "t", "--agents", "default", "--out", str(sweep_out),
                 env={"SERVEGYM_DATA_DIR": str(data)})  # fmt: skip
    assert s.code == 1 and "does not launch" in flat(s.output)
    assert not list(sweep_out.glob("*/trial.json"))


def test_a_baseline_found_broken_mid_trial_is_refused_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a real track the baseline is only known not to start when the agent's first
    experiment (or the evaluation) starts it: the trial is refused then, the same way."""
    import servegym.runner.trial as trial_module

    folder = copy_task(tmp_path)
    edit(folder, "[baseline]\n", "[baseline]\ngpu_memory_utilization = 0.05\n")
    monkeypatch.setattr(trial_module, "check_task_runs", lambda loaded: None)
    out = tmp_path / "runs"
    with pytest.raises(UserError) as info:
        trial_module.run_trial(folder, "default", 0, out)
    assert "baseline" in info.value.message and "does not launch" in info.value.message
    assert str(folder / "task.toml") in info.value.message
    assert not list(out.glob("*/trial.json"))


def test_a_budget_below_one_baseline_start_up_is_refused(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    edit(folder, "sim_gpu_seconds = 5000", "sim_gpu_seconds = 1")
    out = tmp_path / "runs"
    r = servegym("run", "--task", str(folder), "--agent", "default", "--out", str(out))
    refused(r, "budget.sim_gpu_seconds = 1", "start-up of the baseline")
    assert not out.exists()
    v = servegym("task", "validate", str(folder), "--schema-only")
    assert v.code == 1 and "budget.sim_gpu_seconds" in flat(v.output)
    # One start-up's worth is accepted, and the one experiment that crosses it completes.
    edit(folder, "sim_gpu_seconds = 1", "sim_gpu_seconds = 50")
    ok = servegym("run", "--task", str(folder), "--agent", "default", "--out", str(out))
    assert ok.code == 0 and "1 experiments" in " ".join(ok.output.split())


# --------------------------------------------------------------------------- item 9: odd input


@pytest.mark.parametrize(
    "args",
    [
        ["task", "show", LONG],
        ["task", "new", LONG],
        ["workload", "show", LONG],
        ["run", "--task", LONG, "--agent", "default"],
        ["sim", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--workload", LONG,
         "--out", "x"],
        ["leaderboard", LONG],
        ["pipeline", "analyze", LONG],
        ["judge", LONG, "--model", "openai-compatible:m", "--base-url", "http://127.0.0.1:9"],
        ["serve", "--engine", "vllm-cpu", "--model", LONG, "--dry-run"],
    ],
    ids=lambda a: " ".join(x[:10] for x in a[:2]),
)  # fmt: skip
def test_a_name_too_long_for_the_file_system_is_one_line(args: list[str]) -> None:
    message = refused(servegym(*args))
    assert "(5,000 characters)" in message or "at most" in message
    assert len(message) < 600


def test_an_out_folder_too_long_is_one_line(tmp_path: Path) -> None:
    long_out = str(tmp_path / LONG)
    r = servegym("run", "--task", str(TASKS / "tiny-latency"), "--agent", "default",
                 "--out", long_out)  # fmt: skip
    refused(r, "--out", "too long")
    r = servegym("sim", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--workload",
                 "balanced", "--requests", "2", "--out", long_out)  # fmt: skip
    refused(r, "--out", "too long")


def test_a_workload_too_large_for_memory_is_refused_before_it_is_drawn() -> None:
    t0 = time.perf_counter()
    r = servegym("workload", "show", "balanced", "--requests", "10000000")
    message = refused(r, "workload 'balanced'", "GiB", "--requests", "--scale")
    assert "46.8 GiB" in message  # 10M requests of ~1,000 tokens: refused, not allocated
    assert time.perf_counter() - t0 < 60
    prefix = ["--set", "shared_prefix.tokens=10000000", "--set", "shared_prefix.groups=1000"]
    refused(servegym("workload", "show", "balanced", "--requests", "3", *prefix), "GiB")
    ok = servegym("workload", "show", "balanced", "--requests", "2000", "--json")
    assert ok.code == 0


@pytest.mark.parametrize(
    "field", ["value", "mean", "low", "min", "max"]
)  # each would have been clamped to 1 token
def test_negative_token_lengths_are_refused_naming_the_field(field: str) -> None:
    r = servegym("workload", "show", "balanced", "--requests", "3",
                 "--set", f"input_tokens.{field}=-5")  # fmt: skip
    refused(r, f"input_tokens.{field}", "greater than or equal to 0")


def test_negative_lengths_in_a_task_name_its_overrides(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    edit(folder, "overrides = [", 'overrides = ["output_tokens.mean=-3", ')
    refused(servegym("task", "show", str(folder)), "workload.overrides output_tokens.mean=-3")


def test_files_that_are_not_utf8_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "pipeline.json"
    bad.write_bytes(b"\xff\xfe\x00{not text")
    refused(servegym("pipeline", "analyze", str(bad)), str(bad), "not UTF-8")
    script = tmp_path / "script.jsonl"
    script.write_bytes(b'{"tool": "submit"}\n\xff\n')
    r = servegym("run", "--task", str(TASKS / "tiny-latency"), "--agent", "scripted",
                 "--script", str(script), "--out", str(tmp_path / "runs"))  # fmt: skip
    refused(r, "--script", "not UTF-8")


def test_a_missing_root_is_an_error_not_an_empty_list(tmp_path: Path) -> None:
    for command in ("list", "validate"):
        refused(servegym("task", command, "--root", "/nonexistent"), "--root", "no such folder")
    afile = tmp_path / "file"
    afile.write_text("x")
    refused(servegym("task", "list", "--root", str(afile)), "--root", "not a folder")


def test_sim_list_checks_the_names_it_is_given() -> None:
    refused(servegym("sim", "--list", "--model", "nosuch"), "--model", "nosuch")
    refused(servegym("sim", "--list", "--hardware", "nosuch"), "--hardware", "nosuch")
    assert servegym("sim", "--list", "--model", "llama-3.1-8b").code == 0


@pytest.mark.parametrize("override", ["nope=1", "arrival.rate=-1", "arrival.kind.x=1"])
def test_workload_set_errors_name_workload_set(tmp_path: Path, override: str) -> None:
    r = servegym("sim", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--workload",
                 "balanced", "--workload-set", override, "--out", str(tmp_path / "o"))  # fmt: skip
    message = refused(r, "--workload-set")
    assert "--set" not in message.replace("--workload-set", "")
