"""``servegym task list | show | new | validate``: output, scaffolding, validation checks,
and one-line errors (exit code 2) for unknown ids and bad task files."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from rich.console import Console

from servegym.cli.task import task_list, task_new, task_show, task_validate
from servegym.errors import UserError
from servegym.runner.validate import check_checklist, check_nop, check_oracle, validate_task
from servegym.tasks.loader import load_task, load_task_folder, tasks_dir


def console() -> Console:
    return Console(record=True, width=200, color_system=None)


def small_task(root: Path, task_id: str = "tiny") -> Path:
    """A scaffolded task made small enough to evaluate in a fraction of a second."""
    folder = task_new(task_id, console(), root=root)
    toml = folder / "task.toml"
    text = toml.read_text()
    text = re.sub(r"^requests = \d+", "requests = 60", text, flags=re.M)
    text = re.sub(r"^repeats = \d+", "repeats = 5", text, flags=re.M)
    toml.write_text(text)
    return folder


def test_list_shows_every_shipped_task() -> None:
    c = console()
    task_list(c)
    out = c.export_text()
    for folder in sorted(tasks_dir().glob("*/task.toml")):
        assert folder.parent.name in out
    assert "max output_throughput" in out and "min itl p99" in out


def test_list_shows_a_broken_task_with_its_error(tmp_path: Path) -> None:
    small_task(tmp_path, "good")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "task.toml").write_text('id = "broken\n')
    c = console()
    task_list(c, tmp_path)
    out = c.export_text()
    assert "good" in out and "broken" in out and "malformed TOML" in out


def test_show_prints_the_task_and_instruction_but_never_the_oracle() -> None:
    loaded = load_task("balanced-l40s-poisson")
    c = console()
    task_show("balanced-l40s-poisson", c)
    out = c.export_text()
    assert loaded.task.title.split(":")[0] in out
    assert "min ratio 0.99" in out and "Rules" in out
    oracle_text = (loaded.path / "oracle.toml").read_text()
    comment = next(line for line in oracle_text.splitlines() if line.startswith("#"))
    assert comment.lstrip("# ")[:40] not in out
    assert "EAGLE-3 with 2 proposals" not in out


def test_unknown_task_id_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        task_show("no-such-task", console())
    assert "unknown task 'no-such-task'" in info.value.message
    assert "balanced-l40s-poisson" in info.value.message  # lists the known ids
    with pytest.raises(UserError, match="unknown task 'nope'"):
        task_validate(["nope"], console())


def test_bad_task_files_name_the_file_and_field(tmp_path: Path) -> None:
    folder = small_task(tmp_path, "bad")
    toml = folder / "task.toml"
    good = toml.read_text()
    toml.write_text(good.replace('title = "', 'title = "unterminated'))
    toml.write_text('id = "bad"\ntitle = "x\n')
    with pytest.raises(UserError) as info:
        task_show("bad", console(), tmp_path)
    assert str(toml) in info.value.message and "malformed TOML" in info.value.message
    toml.write_text(good.replace("min_ratio = 0.98", "min_ratio = 1.5"))
    with pytest.raises(UserError) as info:
        task_show("bad", console(), tmp_path)
    assert str(toml) in info.value.message and "accuracy.min_ratio" in info.value.message
    toml.write_text(good.replace('kind = "output_throughput"', 'kind = "vibes"'))
    with pytest.raises(UserError, match=r"objective\.kind"):
        task_show("bad", console(), tmp_path)


def test_new_scaffolds_a_task_that_loads(tmp_path: Path) -> None:
    folder = task_new("fresh-task", console(), root=tmp_path)
    assert {p.name for p in folder.iterdir()} == {"task.toml", "instruction.md", "oracle.toml"}
    loaded = load_task_folder(folder)
    assert loaded.id == "fresh-task" and loaded.oracle is not None
    assert "#" in (folder / "task.toml").read_text()  # commented for the researcher


def test_new_refuses_an_existing_or_bad_id(tmp_path: Path) -> None:
    task_new("taken", console(), root=tmp_path)
    with pytest.raises(UserError, match="exists already"):
        task_new("taken", console(), root=tmp_path)
    with pytest.raises(UserError, match="bad id 'Bad Id'"):
        task_new("Bad Id", console(), root=tmp_path)
    with pytest.raises(UserError, match="unknown task 'ghost'"):
        task_new("copy", console(), from_="ghost", root=tmp_path)


def test_new_from_copies_an_existing_task(tmp_path: Path) -> None:
    source = load_task("balanced-l40s-poisson").path
    folder = task_new("my-copy", console(), from_=str(source), root=tmp_path)
    loaded = load_task_folder(folder)
    assert loaded.id == "my-copy"
    original = load_task_folder(source)
    assert loaded.task.model_dump(exclude={"id"}) == original.task.model_dump(exclude={"id"})
    assert loaded.oracle == original.oracle
    assert loaded.instruction == original.instruction


def test_validate_schema_only_reports_broken_tasks(tmp_path: Path) -> None:
    small_task(tmp_path, "fine")
    broken = small_task(tmp_path, "no-oracle")
    (broken / "oracle.toml").unlink()
    bad_oracle = small_task(tmp_path, "bad-oracle")
    (bad_oracle / "oracle.toml").write_text("max_num_seqs = -3\n")
    c = console()
    code = task_validate([], c, root=tmp_path, schema_only=True)
    out = c.export_text()
    assert code == 1
    assert "2 failed checks" in out
    assert "oracle.toml: missing" in out and "bad value for 'max_num_seqs'" in out
    assert validate_task(tmp_path / "fine", schema_only=True)[0].passed


def test_validate_runs_the_nop_and_oracle_checks(tmp_path: Path) -> None:
    folder = small_task(tmp_path)
    loaded = load_task_folder(folder)
    nop = check_nop(loaded)
    oracle = check_oracle(loaded)
    assert nop.passed, nop.detail
    assert oracle.passed, oracle.detail
    c = console()
    assert task_validate(["tiny"], c, root=tmp_path, checklist=False) == 0
    assert "all 1 tasks valid" in c.export_text()


def test_validate_fails_a_task_the_checklist_solves(tmp_path: Path) -> None:
    # The scaffold's oracle is a generic win the checklist agent finds on its own.
    folder = small_task(tmp_path)
    c = console()
    assert task_validate(["tiny"], c, root=tmp_path) == 1
    out = c.export_text()
    assert "1 failed check" in out and "of the oracle (reaches 90%)" in out
    # With a budget of one experiment the checklist keeps the baseline: far below the oracle.
    toml = folder / "task.toml"
    text = re.sub(r"^max_experiments = \d+", "max_experiments = 1", toml.read_text(), flags=re.M)
    toml.write_text(text)
    result = check_checklist(load_task_folder(folder))
    assert result.passed, result.detail
    assert "(below 90%)" in result.detail


def test_validate_fails_an_oracle_that_does_not_beat_the_baseline(tmp_path: Path) -> None:
    folder = small_task(tmp_path)
    (folder / "oracle.toml").write_text("enforce_eager = true\n")  # slower, not faster
    c = console()
    assert task_validate(["tiny"], c, root=tmp_path, checklist=False) == 1
    out = c.export_text()
    assert "1 failed check" in out and "oracle scores" in out
    # An oracle the accuracy gate refuses names the gate.
    (folder / "oracle.toml").write_text('quantization = "int4"\n')
    text = (folder / "task.toml").read_text()
    (folder / "task.toml").write_text(text.replace("min_ratio = 0.98", "min_ratio = 0.99"))
    result = check_oracle(load_task_folder(folder))
    assert not result.passed and "accuracy_failed" in result.detail


def test_cli_task_errors_exit_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from servegym import cli

    monkeypatch.setattr(sys, "argv", ["servegym", "task", "show", "no-such-task"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "unknown task 'no-such-task'" in err
