"""The gpu tasks: mirrors of sim tasks (same model, hardware, workload, objective, budget),
their oracles checked on the simulator, marked not validated until ``task validate`` passes
them on a GPU host, which writes its verdict into the task."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from servegym.engines.base import get_engine
from servegym.engines.host import HostInfo
from servegym.runner import validate
from servegym.runner.validate import CheckResult, check_mirror, validate_task
from servegym.tasks.loader import list_tasks, load_task_folder
from servegym.tasks.validated import write_validated

TASKS = Path(__file__).parents[1] / "tasks"
GPU_TASKS = sorted(i.id for i in list_tasks() if i.task is not None and i.task.track == "gpu")
ONE_GPU = HostInfo(cpus=16, gpus=1, memory_bytes=1 << 40)


def test_the_gpu_tasks_are_shipped_not_yet_validated() -> None:
    assert GPU_TASKS == [
        "gpu-agentic-concurrent",
        "gpu-balanced-l40s-poisson",
        "gpu-goodput-h100-stream",
        "gpu-voice-stream-h100",
    ]
    for tid in GPU_TASKS:
        task = load_task_folder(TASKS / tid).task
        assert task.validated is False and task.validated_on is None
        assert task.mirror_of is not None and tid == f"gpu-{task.mirror_of}"
        assert task.engines == ["vllm"] and task.price_per_hour is not None


@pytest.mark.parametrize("tid", GPU_TASKS)
def test_each_mirrors_its_sim_task_and_its_oracle_wins_on_the_simulator(tid: str) -> None:
    loaded = load_task_folder(TASKS / tid)
    result = check_mirror(loaded)
    assert result.passed, result.detail
    assert result.detail.startswith(f"mirrors {loaded.task.mirror_of}; its oracle scores ")
    engine = get_engine("vllm")
    assert loaded.oracle is not None
    engine.check(loaded.oracle, ONE_GPU)  # the real engine takes it on one GPU
    engine.check(loaded.task.baseline, ONE_GPU)


def _copy(tmp_path: Path, tid: str = "gpu-voice-stream-h100") -> Path:
    """A gpu task and the sim task it mirrors, copied under ``tmp_path``."""
    task = load_task_folder(TASKS / tid).task
    for name in (tid, task.mirror_of):
        assert name is not None
        shutil.copytree(TASKS / name, tmp_path / name)
    return tmp_path / tid


def test_a_task_that_is_not_its_mirror_is_named(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    text = (folder / "task.toml").read_text()
    (folder / "task.toml").write_text(
        text.replace("wall_seconds = 6000", "wall_seconds = 9000").replace(
            'hardware = "h100-sxm"', 'hardware = "h200"'
        )
    )
    result = check_mirror(load_task_folder(folder))
    assert not result.passed
    assert result.detail == (
        "not a mirror of voice-stream-h100: hardware differs; budget in GPU-seconds differs"
    )


def test_validation_writes_its_verdict_into_the_task(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    before = (folder / "task.toml").read_text()
    loaded = load_task_folder(folder)
    write_validated(loaded, True, "1 x NVIDIA H200, 2026-12-02")
    after = (folder / "task.toml").read_text()
    assert after.startswith(before.split("\n", 1)[0])  # the author's comments stay
    raw = tomllib.loads(after)
    assert raw["validated"] is True and raw["validated_on"] == "1 x NVIDIA H200, 2026-12-02"
    write_validated(load_task_folder(folder), False, "1 x NVIDIA H200, 2026-12-03")
    again = (folder / "task.toml").read_text()
    assert again.count("validated =") == 1 and again.count("validated_on =") == 1
    task = load_task_folder(folder).task
    assert task.validated is False and task.validated_on == "1 x NVIDIA H200, 2026-12-03"
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []


def test_without_a_gpu_the_checks_are_skipped_and_nothing_is_written(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    before = (folder / "task.toml").read_text()
    results = {r.check: r for r in validate_task(folder)}
    assert results["schema"].passed and results["mirror"].passed
    assert results["nop"].skipped and results["oracle"].skipped
    assert "this host cannot run the gpu track" in results["nop"].detail
    assert (folder / "task.toml").read_text() == before


@pytest.mark.parametrize("passed", [True, False])
def test_on_a_gpu_host_the_nop_and_oracle_verdict_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, passed: bool
) -> None:
    """The GPU host's two checks are stood in for; the write-back is what is tested."""
    folder = _copy(tmp_path)
    monkeypatch.setattr(validate, "_real_track_missing", lambda loaded: None)
    monkeypatch.setattr(validate, "check_nop", lambda t, s: CheckResult(t.id, "nop", True, ""))
    monkeypatch.setattr(
        validate, "check_oracle", lambda t, s: CheckResult(t.id, "oracle", passed, "")
    )
    monkeypatch.setattr(validate, "_host_line", lambda: "1 x NVIDIA H200, 2026-12-02")
    validate_task(folder, checklist=False)
    task = load_task_folder(folder).task
    assert task.validated is passed and task.validated_on == "1 x NVIDIA H200, 2026-12-02"


def test_task_list_shows_the_state_at_80_columns() -> None:
    from rich.console import Console

    from servegym.cli.task import render_task_list

    console = Console(width=80, record=True)
    console.print(render_task_list(width=80))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    line = next(x for x in text.splitlines() if "gpu-agentic-concurrent" in x)
    assert "gpu (not validated) · Qwen/Qwen3-8B @ l40s" in line
    sim = next(x for x in text.splitlines() if x.strip().startswith("agentic-concurrent"))
    assert "sim · qwen3-8b @ l40s" in sim


def test_a_sim_task_does_not_track_validation(tmp_path: Path) -> None:
    from servegym.errors import UserError

    shutil.copytree(TASKS / "voice-stream-h100", tmp_path / "t")
    path = tmp_path / "t" / "task.toml"
    text = path.read_text().replace('id = "voice-stream-h100"', 'id = "t"')
    path.write_text(text.replace('engines = ["sim"]', 'engines = ["sim"]\nvalidated = false'))
    with pytest.raises(UserError, match="validated is for real-track tasks"):
        load_task_folder(tmp_path / "t")
