"""Loading tasks: task.toml + instruction.md (+ oracle.toml), and one-line errors naming
the file and field for every bad task."""

from __future__ import annotations

from pathlib import Path

import pytest

from servegym.engines.config import ServingConfig
from servegym.errors import UserError
from servegym.tasks.loader import (
    list_tasks,
    load_task,
    resolve_task_folder,
    task_ids,
    tasks_dir,
    workload_spec,
)

TASKS = Path(__file__).parent / "data" / "tasks"

GOOD = """\
id = "{id}"
title = "a task"
track = "sim"
model = "llama-3.1-8b"
hardware = "h100-sxm"
engines = ["sim"]

[workload]
name = "balanced"
requests = 10

[objective]
kind = "output_throughput"

[budget]
sim_gpu_seconds = 100
"""


def make(root: Path, tid: str, toml: str | None = None, instruction: str | None = "Do it.",
         oracle: str | None = None) -> Path:  # fmt: skip
    folder = root / tid
    folder.mkdir(parents=True)
    (folder / "task.toml").write_text(GOOD.format(id=tid) if toml is None else toml)
    if instruction is not None:
        (folder / "instruction.md").write_text(instruction)
    if oracle is not None:
        (folder / "oracle.toml").write_text(oracle)
    return folder


def error_of(root: Path, tid: str) -> str:
    with pytest.raises(UserError) as e:
        load_task(tid, root)
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_loads_a_task_with_its_instruction_and_oracle() -> None:
    loaded = load_task("tiny-throughput", TASKS)
    assert loaded.id == "tiny-throughput" and loaded.task.objective.kind == "output_throughput"
    assert loaded.instruction.startswith("Maximise")
    assert loaded.oracle == ServingConfig(max_num_seqs=64)
    assert loaded.task.baseline == ServingConfig(max_num_seqs=8)
    spec, _ = workload_spec(loaded)
    assert spec.name == "balanced" and spec.num_requests == 40
    quick, _ = workload_spec(loaded, requests=12)
    assert quick.num_requests == 12


def test_listing_and_resolving(tmp_path: Path) -> None:
    assert {"tiny-throughput", "tiny-maxrate"} <= set(task_ids(TASKS))
    make(tmp_path, "ok-task")
    make(tmp_path, "broken", toml="id = ")
    infos = {i.id: i for i in list_tasks(tmp_path)}
    assert infos["ok-task"].task is not None and infos["ok-task"].error is None
    assert infos["broken"].task is None and infos["broken"].error is not None
    assert "malformed TOML" in infos["broken"].error
    # By path, to the folder or to task.toml.
    assert resolve_task_folder(str(tmp_path / "ok-task")) == tmp_path / "ok-task"
    assert load_task(tmp_path / "ok-task" / "task.toml").id == "ok-task"
    assert tasks_dir().name == "tasks"


def test_unknown_task(tmp_path: Path) -> None:
    make(tmp_path, "ok-task")
    msg = error_of(tmp_path, "nope")
    assert msg == "--task: unknown task 'nope' (known: ok-task)"
    with pytest.raises(UserError, match="no task at"):
        load_task(str(tmp_path / "missing"), tmp_path)
    # A root that is not there is named as such (once an empty "none in" listing).
    assert "--root" in error_of(tmp_path / "empty", "x")
    assert "no such folder" in error_of(tmp_path / "empty", "x")
    (tmp_path / "empty").mkdir()
    assert "none in" in error_of(tmp_path / "empty", "x")


def test_malformed_toml_names_the_file(tmp_path: Path) -> None:
    make(tmp_path, "t", toml='id = "t"\ntitle = ')
    msg = error_of(tmp_path, "t")
    assert str(tmp_path / "t" / "task.toml") in msg and "malformed TOML" in msg


@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        (("[budget]\nsim_gpu_seconds = 100", "[budget]\nsim_gpu_seconds = -1"),
         ["'budget.sim_gpu_seconds'", "greater than 0"]),
        (('kind = "output_throughput"', 'kind = "speed"'), ["'objective.kind'"]),
        (('title = "a task"', 'title = "a task"\ncolour = "red"'), ["'colour'", "not permitted"]),
        (('kind = "output_throughput"', 'kind = "goodput"'), ["needs an [sla] table"]),
        (('engines = ["sim"]', 'engines = ["vllm"]'), ["engines must be ['sim']"]),
        (("[workload]", "[baseline]\nmax_num_seqs = 0\n\n[workload]"),
         ["'baseline.max_num_seqs'"]),
    ],
)  # fmt: skip
def test_schema_errors_name_file_and_field(
    tmp_path: Path, edit: tuple[str, str], needles: list[str]
) -> None:
    old, new = edit
    toml = GOOD.format(id="t")
    assert old in toml
    make(tmp_path, "t", toml=toml.replace(old, new))
    msg = error_of(tmp_path, "t")
    assert msg.startswith(str(tmp_path / "t" / "task.toml"))
    for needle in needles:
        assert needle in msg, msg


def test_fewer_than_five_repeats_are_refused(tmp_path: Path) -> None:
    # The score's bootstrap interval is over pairs: 3 pairs cannot give a 95% interval.
    make(tmp_path, "t", toml=GOOD.format(id="t") + "\n[evaluation]\nrepeats = 3\n")
    msg = error_of(tmp_path, "t")  # one line, no traceback
    assert msg.startswith(str(tmp_path / "t" / "task.toml"))
    assert "'evaluation.repeats'" in msg and "at least 5" in msg and "got 3" in msg, msg
    make(tmp_path, "five", toml=GOOD.format(id="five") + "\n[evaluation]\nrepeats = 5\n")
    assert load_task("five", tmp_path).task.evaluation.repeats == 5


def test_id_must_match_the_folder(tmp_path: Path) -> None:
    make(tmp_path, "t", toml=GOOD.format(id="other"))
    msg = error_of(tmp_path, "t")
    assert "'id'" in msg and "'other'" in msg and "folder name 't'" in msg


def test_unknown_references_name_the_field(tmp_path: Path) -> None:
    make(tmp_path, "m", toml=GOOD.format(id="m").replace("llama-3.1-8b", "gpt-9"))
    assert "model: unknown model 'gpt-9'" in error_of(tmp_path, "m")
    make(tmp_path, "h", toml=GOOD.format(id="h").replace("h100-sxm", "tpu"))
    assert "hardware: unknown hardware 'tpu'" in error_of(tmp_path, "h")
    make(tmp_path, "w", toml=GOOD.format(id="w").replace('"balanced"', '"nope"'))
    msg = error_of(tmp_path, "w")
    assert "task.toml: workload: unknown workload 'nope'" in msg
    bad_override = GOOD.format(id="o").replace(
        "requests = 10", 'requests = 10\noverrides = ["arrival.kind=poisson"]'
    )
    make(tmp_path, "o", toml=bad_override)
    # The override is the task's own field, not a --set flag.
    assert "workload: workload.overrides arrival.kind=poisson" in error_of(tmp_path, "o")


def test_instruction_and_oracle_problems(tmp_path: Path) -> None:
    make(tmp_path, "no-instr", instruction=None)
    assert "instruction.md: missing" in error_of(tmp_path, "no-instr")
    make(tmp_path, "blank", instruction="  \n")
    assert "instruction.md: empty" in error_of(tmp_path, "blank")
    make(tmp_path, "bad-oracle", oracle="max_num_seqs = -4\n")
    msg = error_of(tmp_path, "bad-oracle")
    assert "oracle.toml" in msg and "'max_num_seqs'" in msg
    make(tmp_path, "ok-oracle", oracle="max_num_seqs = 64\nquantization = 'fp8'\n")
    assert load_task("ok-oracle", tmp_path).oracle == ServingConfig(
        max_num_seqs=64, quantization="fp8"
    )


def test_a_workload_file_beside_the_task(tmp_path: Path) -> None:
    folder = make(tmp_path, "local", toml=GOOD.format(id="local").replace(
        '"balanced"', '"my-workload.toml"'))  # fmt: skip
    (folder / "my-workload.toml").write_text(
        'kind = "synthetic"\nnum_requests = 5\n[input_tokens]\ndist = "fixed"\nvalue = 10\n'
        '[output_tokens]\ndist = "fixed"\nvalue = 5\n'
    )
    spec, _ = workload_spec(load_task("local", tmp_path))
    assert spec.name == "my-workload" and spec.num_requests == 10


def test_shipped_tasks_load() -> None:
    """Every task under tasks/ loads (the task data is another engineer's; this only checks
    that the loader accepts what ships)."""
    for info in list_tasks():
        assert info.error is None, f"{info.id}: {info.error}"
