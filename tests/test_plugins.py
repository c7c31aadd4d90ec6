"""Outside plug-ins without edits to ServeGym (:mod:`servegym.registry`): an agent class
named ``--agent package.module:Class`` and run by the real command line to a scored trial;
agents, engines and sandboxes installed as entry points; and the one-line errors for specs
that do not name an agent. Plus the registries' own contract: each built-in module map is
exactly what its modules register."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from servegym.agents.base import AGENTS, MODEL_AGENTS, PlainAgent, agent_names, make_agent
from servegym.engines.base import ENGINES, Engine, engine_names, get_engine
from servegym.errors import UserError
from servegym.registry import Registry, is_spec
from servegym.runner.executors import EXECUTORS, make_executor
from servegym.runner.trial import run_trial
from servegym.sandbox.registry import SANDBOXES, get_sandbox, sandbox_names
from servegym.tasks.loader import load_task, load_task_folder
from servegym.tasks.spec import TRACK_TRAITS, track_names
from servegym.tracks import TRACKS, TrackSetup, track_for
from servegym.tracks.sim import SimTrack

ROOT = Path(__file__).resolve().parent.parent

AGENT_SOURCE = '''
from servegym.engines.config import ServingConfig


class MyAgent:
    """Runs the baseline once, then submits it."""

    name = "my-agent"

    def run(self, env, seed):
        baseline = ServingConfig.model_validate(env.describe().baseline)
        env.run_experiment(baseline, quick=True)
        env.submit(baseline)


class Configured(MyAgent):
    def __init__(self, note: str) -> None:
        self.note = note
'''

ENGINE_SOURCE = '''
from servegym.engines.base import EngineMetrics
from servegym.engines.vllm import VllmEngine


class MyEngine(VllmEngine):
    """vLLM under another launcher (a plug-in's own engine class)."""

    metrics = EngineMetrics(prefix="my:", running="my:running")

    def command(self):
        return ["my-vllm", "serve"]


class MySandbox:
    def available(self):
        return None
'''

TRACK_SOURCE = '''
from servegym.tasks.spec import TrackTraits
from servegym.tracks.sim import SimTrack


class QuietSimTrack(SimTrack):
    """An outside track: the simulator, telling agents nothing of a rate search."""

    name = "quiet-sim"
    traits = TrackTraits(
        engines=("sim",), simulated=True, pipelines=False, readiness="none", occupies="nothing"
    )

    def workload_facts(self, task):
        return {}
'''


def _package(root: Path, name: str) -> Path:
    """A package ``name`` under ``root`` holding ``agent.py``, ``engine.py``, ``track.py``."""
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "agent.py").write_text(textwrap.dedent(AGENT_SOURCE))
    (pkg / "engine.py").write_text(textwrap.dedent(ENGINE_SOURCE))
    (pkg / "track.py").write_text(textwrap.dedent(TRACK_SOURCE))
    return pkg


def _dist_info(root: Path, entry_points: str) -> None:
    """An installed distribution's metadata under ``root`` (what ``pip install`` writes):
    :mod:`importlib.metadata` finds it on ``sys.path``."""
    info = root / "servegym_test_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: servegym-test-plugin\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tmp_path/site`` on ``sys.path``, holding the package ``tests_plugin_pkg``; the
    package and anything the registries learnt from it are forgotten afterwards."""
    site = tmp_path / "site"
    _package(site, "tests_plugin_pkg")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield site
    for name in [m for m in sys.modules if m.split(".")[0] == "tests_plugin_pkg"]:
        del sys.modules[name]
    plugged = ((AGENTS, "myplugin"), (ENGINES, "my-engine"), (SANDBOXES, "mybox"),
               (TRACKS, "quiet-sim"))  # fmt: skip
    for registry, name in plugged:
        registry.unregister(name)
    TRACK_TRAITS.pop("quiet-sim", None)


def _servegym(*args: str, pythonpath: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "servegym", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
    )


# --- an outside agent by module:Class, on the real command line ------------------------------


def test_outside_agent_runs_to_a_scored_trial(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _package(site, "tests_plugin_pkg")
    out = tmp_path / "runs"
    agent = "tests_plugin_pkg.agent:MyAgent"
    proc = _servegym(
        "run", "--task", "voice-stream-h100", "--agent", agent, "--out", str(out),
        pythonpath=site, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "outcome: scored" in proc.stdout
    # the folder is named from the spec as given: the same spec, the same folder
    folder = out / f"voice-stream-h100__{agent}__s0"
    trial = json.loads((folder / "trial.json").read_text())
    assert trial["agent"] == agent and trial["outcome"] == "scored"
    assert trial["score"] is not None
    again = _servegym(
        "run", "--task", "voice-stream-h100", "--agent", agent, "--out", str(out),
        pythonpath=site, cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 0 and sorted(p.name for p in out.iterdir()) == [folder.name]


@pytest.mark.parametrize(
    ("agent", "says"),
    [
        ("nosuch.module:X", "no module named 'nosuch.module'"),
        ("servegym.errors:UserError", "is not an agent class (it is the class UserError)"),
        ("servegym.errors:Missing", "module 'servegym.errors' has no attribute 'Missing'"),
        ("tests_plugin_pkg.agent:Missing", "has no attribute 'Missing'"),
    ],
)
def test_bad_agent_specs_are_one_line(tmp_path: Path, agent: str, says: str) -> None:
    site = tmp_path / "site"
    _package(site, "tests_plugin_pkg")
    proc = _servegym(
        "run", "--task", "voice-stream-h100", "--agent", agent,
        "--out", str(tmp_path / "runs"), pythonpath=site, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and line.count("--agent") == 1, line
    assert says in line and agent in line
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_module_class_specs_in_process(plugin_path: Path) -> None:
    agent = make_agent("tests_plugin_pkg.agent:MyAgent")
    assert isinstance(agent, PlainAgent) and type(agent.agent).__name__ == "MyAgent"
    configured = make_agent("tests_plugin_pkg.agent:Configured", note="x")
    assert isinstance(configured, PlainAgent) and configured.agent.note == "x"
    with pytest.raises(UserError, match=r"^--agent tests_plugin_pkg.agent:Configured: cannot"):
        make_agent("tests_plugin_pkg.agent:Configured")
    with pytest.raises(UserError, match="does not take the settings nope"):
        make_agent("tests_plugin_pkg.agent:MyAgent", nope=1)
    with pytest.raises(UserError, match="is not an agent class"):
        make_agent("tests_plugin_pkg:agent")  # a module, not a class
    engine = get_engine("tests_plugin_pkg.engine:MyEngine")
    assert engine.command() == ["my-vllm", "serve"] and engine.platform == "gpu"
    with pytest.raises(UserError, match="is not an Engine subclass"):
        get_engine("tests_plugin_pkg.agent:MyAgent")
    assert get_sandbox("tests_plugin_pkg.engine:MySandbox")().available() is None
    with pytest.raises(UserError, match=r"^--executor: '\S+:MySandbox' is not an executor"):
        make_executor("tests_plugin_pkg.engine:MySandbox")  # has no run(): not an executor
    # the model agents' kind:model names never import anything
    with pytest.raises(UserError, match=r"^--agent: unknown agent 'anthropic'"):
        make_agent("anthropic")


def test_what_counts_as_a_spec() -> None:
    assert is_spec("pkg.mod:Class") and is_spec("mod:Class") and is_spec("a.b:C.D")
    for name in ("tpe", "claude-code:claude-x", "anthropic:claude-sonnet-4-5", "a:b:c",
                 ":x", "x:", "pkg.mod:", "../x:y", "a b:c", ""):  # fmt: skip
        assert not is_spec(name), name


# --- installed plug-ins: entry points -------------------------------------------------------


ENTRY_POINTS = """
    [servegym.agents]
    myplugin = tests_plugin_pkg.agent:MyAgent
    notanagent = servegym.errors:UserError

    [servegym.engines]
    my-engine = tests_plugin_pkg.engine:MyEngine

    [servegym.sandboxes]
    mybox = tests_plugin_pkg.engine:MySandbox

    [servegym.tracks]
    quiet-sim = tests_plugin_pkg.track:QuietSimTrack
    notatrack = tests_plugin_pkg.engine:MySandbox
"""


def test_installed_plugins_are_found(plugin_path: Path) -> None:
    assert "myplugin" not in agent_names()
    _dist_info(plugin_path, ENTRY_POINTS)
    assert {"myplugin", "notanagent"} <= set(agent_names())
    agent = make_agent("myplugin")
    assert isinstance(agent, PlainAgent) and type(agent.agent).__name__ == "MyAgent"
    with pytest.raises(UserError) as e:
        make_agent("notanagent")
    assert e.value.message.startswith("--agent: plug-in 'notanagent' (servegym.agents entry")
    assert e.value.message.endswith("is not an agent class")
    # unknown names list the plug-ins too
    with pytest.raises(UserError, match=r"unknown agent 'nope' \(known: .*myplugin"):
        make_agent("nope")

    assert "my-engine" in engine_names()
    engine = get_engine("my-engine")
    assert isinstance(engine, Engine) and engine.name == "my-engine"
    assert get_engine("vllm").name == "vllm"  # the subclass did not rename its parent
    assert "mybox" in sandbox_names() and get_sandbox("mybox")().available() is None

    assert {"quiet-sim", "sim", "cpu", "gpu"} <= set(TRACKS.names())
    track = TRACKS.get("quiet-sim").for_task(load_task("chat-h100-cost-sla"), TrackSetup())
    assert isinstance(track, SimTrack) and type(track).__name__ == "QuietSimTrack"
    with pytest.raises(UserError, match=r"plug-in 'notatrack' .* is not a track class"):
        TRACKS.get("notatrack")


def test_an_installed_track_runs_the_tasks_that_name_it(plugin_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "quiet" / "tiny-throughput"
    shutil.copytree(ROOT / "tests" / "data" / "tasks" / "tiny-throughput", folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace('track = "sim"', 'track = "quiet-sim"'))
    with pytest.raises(UserError, match=r"unknown track 'quiet-sim' \(known: cpu, gpu, sim\)"):
        load_task_folder(folder)  # not installed yet
    _dist_info(plugin_path, ENTRY_POINTS)
    assert "quiet-sim" in track_names()
    result = run_trial(folder, "default", 0, tmp_path / "runs")
    assert result.track == "quiet-sim" and result.outcome == "scored"
    assert type(track_for(load_task_folder(folder))).__name__ == "QuietSimTrack"


def test_an_installed_agent_runs_on_the_command_line(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _package(site, "tests_plugin_pkg")
    _dist_info(site, ENTRY_POINTS)
    proc = _servegym(
        "run", "--task", "voice-stream-h100", "--agent", "myplugin",
        "--out", str(tmp_path / "runs"), pythonpath=site, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "outcome: scored" in proc.stdout


def test_a_plugin_never_shadows_a_builtin(plugin_path: Path) -> None:
    _dist_info(plugin_path, "[servegym.agents]\ntpe = tests_plugin_pkg.agent:MyAgent\n")
    assert type(make_agent("tpe")).__name__ == "TPEAgent"


# --- the registries' contract ---------------------------------------------------------------


@pytest.mark.parametrize("registry", [AGENTS, ENGINES, SANDBOXES, EXECUTORS, TRACKS], ids=str)
def test_builtin_maps_match_what_their_modules_register(registry: Registry[object]) -> None:
    registry.load_builtins()
    shipped = {
        name for name, obj in registry.registered().items()
        if getattr(obj, "__module__", "").startswith("servegym.")
    }  # fmt: skip
    assert shipped == set(registry.builtins)
    for name, module in registry.builtins.items():
        assert registry.registered()[name].__module__.startswith(module)


def test_lookup_imports_only_the_module_it_needs() -> None:
    code = (
        "import sys; from servegym.agents.base import make_agent; make_agent('tpe'); "
        "print('servegym.agents.llm.agent' in sys.modules, 'servegym.agents.cli.agent' in "
        "sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)  # fmt: skip
    assert proc.stdout.split() == ["False", "False"], proc.stderr


def test_unknown_names_keep_their_messages() -> None:
    with pytest.raises(UserError) as e:
        make_agent("nope")
    known = ", ".join(
        sorted([n for n in agent_names() if n not in MODEL_AGENTS]
               + [f"{k}:MODEL" for k in MODEL_AGENTS])
    )  # fmt: skip
    assert e.value.message == f"--agent: unknown agent 'nope' (known: {known})"
    with pytest.raises(UserError, match=r"^unknown engine 'nope' \(known: sglang, vllm, vllm-cpu"):
        get_engine("nope")
    with pytest.raises(UserError, match=r"^unknown sandbox 'podman' \(known: docker, local"):
        get_sandbox("podman")
    with pytest.raises(UserError, match=r"^--executor: unknown executor 'slurm' \(known: local"):
        make_executor("slurm")


# --- engines declare their own facts --------------------------------------------------------


def test_engines_declare_tracks_metrics_and_search_space() -> None:
    from servegym.agents.search_space import search_spaces_dir
    from servegym.tasks.spec import TRACK_ENGINES

    for name in ("vllm", "vllm-cpu", "sglang"):
        engine = get_engine(name)
        for track in engine.tracks:
            assert name in TRACK_ENGINES[track]
        assert engine.metrics is not None and len(engine.metrics.gauges()) == 3
        if engine.search_space is not None:
            assert (search_spaces_dir() / f"{engine.search_space}.toml").is_file()
    assert get_engine("vllm-cpu").search_space == "vllm-cpu"
    assert {t for n in ("vllm", "sglang") for t in get_engine(n).tracks} == {"gpu"}
