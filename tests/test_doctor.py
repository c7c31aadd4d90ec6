"""``servegym doctor`` (:mod:`servegym.runner.doctor`): verdicts from host facts built by
hand (a GPU host with everything, a bare one), the one line a gpu trial's preflight ends in,
and the command on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from servegym.cli import app
from servegym.errors import UserError
from servegym.runner.doctor import (
    GIB,
    Gpu,
    HostFacts,
    diagnose,
    model_present,
    require_gpu_host,
)
from servegym.tasks.loader import load_task_folder

GPU_TASK = Path(__file__).parents[1] / "tasks" / "gpu-voice-stream-h100"


def gpu_host(**changes: object) -> HostFacts:
    facts = HostFacts(
        cpus=32,
        cpu_isa="AVX-512",
        memory_bytes=512 * GIB,
        nvidia_smi=True,
        gpus=[Gpu("NVIDIA H200", 143771)],
        driver="570.86.15",
        docker="27.3.1",
        runtimes=["nvidia", "runc"],
        images={"servegym/vllm": True, "servegym/sglang": True, "servegym/vllm-cpu": False},
        engines={"vllm": "0.32.0", "sglang": None},
        cpu_track=None,
        cpu_track_error="the CPU track is not set up under /x: run `servegym setup cpu`",
        models={"Qwen/Qwen3-8B": True},
        data_dir="/data",
        free_bytes=500 * GIB,
    )
    for k, v in changes.items():
        setattr(facts, k, v)
    return facts


def test_a_gpu_host_with_everything_runs_the_gpu_and_sim_tracks() -> None:
    d = diagnose(gpu_host())
    assert d.ready("gpu") and d.ready("sim")
    assert not d.ready("cpu")
    assert [c.fix for c in d.missing("cpu")] == ["servegym setup cpu"]
    rows = {c.item: c for c in d.checks}
    assert rows["nvidia gpus"].found == "NVIDIA H200 (140 GiB)"
    assert rows["nvidia driver"].found == "570.86.15"
    assert rows["gpu engines"].found == "vllm 0.32.0"
    assert (
        not rows["image servegym/vllm-cpu"].ok and rows["image servegym/vllm-cpu"].needed_by == ()
    )


def test_a_bare_host_says_what_each_track_misses_and_how_to_fix_it() -> None:
    bare = HostFacts(cpus=2, cpu_isa="AVX2", memory_bytes=8 * GIB, docker_error="no engine",
                     engines={"vllm": None, "sglang": None}, models={"Qwen/Qwen3-8B": False},
                     data_dir="/home", free_bytes=20 * GIB)  # fmt: skip
    d = diagnose(bare)
    assert d.ready("sim")
    missing = {c.item: c.fix for c in d.missing("gpu")}
    assert set(missing) == {"nvidia gpus", "gpu engines", "gpu task models", "disk for gpu"}
    assert "nvidia-smi" in missing["nvidia gpus"]
    assert missing["gpu engines"] == (
        "pip install vllm==0.32.0 or pip install 'sglang[all]==0.5.23'"
    )
    assert missing["gpu task models"] == "huggingface-cli download Qwen/Qwen3-8B"
    assert {c.item for c in d.missing("cpu")} == {"cpu track setup"}
    rows = {c.item: c for c in d.checks}
    assert rows["docker"].found == "no engine" and rows["docker"].needed_by == ()
    assert "nvidia container runtime" not in rows  # asked of a Docker engine only


def test_a_docker_engine_without_the_nvidia_runtime_names_its_fix() -> None:
    d = diagnose(gpu_host(runtimes=["runc"]))
    row = next(c for c in d.checks if c.item == "nvidia container runtime")
    assert (
        not row.ok and row.found == "runtimes: runc" and "nvidia-ctk runtime configure" in row.fix
    )
    assert d.ready("gpu")  # servers run as processes; the runtime is for containers


def test_a_gpu_trial_refuses_a_host_that_cannot_run_its_task() -> None:
    loaded = load_task_folder(GPU_TASK)
    require_gpu_host(loaded, gpu_host(models={loaded.task.model: True}))  # passes
    with pytest.raises(UserError) as e:
        require_gpu_host(loaded, HostFacts(engines={}, free_bytes=100 * GIB))
    message = e.value.message
    assert message.startswith(f"--task {loaded.id}: this host cannot run the gpu track: ")
    assert "nvidia gpus: none (no nvidia-smi) (fix: install the NVIDIA driver" in message
    assert f"huggingface-cli download {loaded.task.model}" in message
    assert "\n" not in message
    # the task's own engine must be there, not just any gpu engine
    sglang_only = gpu_host(engines={"vllm": None, "sglang": "0.5.23"},
                           models={loaded.task.model: True})  # fmt: skip
    with pytest.raises(UserError, match="vllm is not installed"):
        require_gpu_host(loaded, sglang_only)


def test_models_are_found_in_the_hugging_face_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "abc"
    assert not model_present("Qwen/Qwen3-8B")
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    assert model_present("Qwen/Qwen3-8B")
    local = tmp_path / "local-model"
    local.mkdir()
    assert not model_present(str(local))
    (local / "config.json").write_text("{}")
    assert model_present(str(local))


def test_the_command_on_this_machine(tmp_path: Path) -> None:
    env = {"COLUMNS": "80", "SERVEGYM_HOME": str(tmp_path / "home")}
    sim = CliRunner().invoke(app, ["doctor", "--track", "sim"], env=env)
    assert sim.exit_code == 0, sim.output
    assert "sim: ready" in sim.output
    assert all(len(line) <= 80 for line in sim.output.splitlines())
    every = CliRunner().invoke(app, ["doctor"], env=env)
    assert every.exit_code == 0
    for track in ("sim", "cpu", "gpu"):
        assert f"{track}: " in every.output
    assert "nvidia gpus" in every.output and "docker" in every.output
    assert all(len(line) <= 80 for line in every.output.splitlines())
    # a fresh SERVEGYM_HOME has no cpu track set up: that track cannot run, exit 1
    cpu = CliRunner().invoke(app, ["doctor", "--track", "cpu"], env=env)
    assert cpu.exit_code == 1 and "fix cpu track setup: servegym setup cpu" in cpu.output
    bad = CliRunner().invoke(app, ["doctor", "--track", "tpu"], env=env)
    assert isinstance(bad.exception, UserError)  # the command line's net: one line, exit 2
    assert bad.exception.message == "--track tpu: no such track (known: sim, cpu, gpu)"
