"""Agents working a cpu-track pipeline task, fast, on stand-ins (the mock server for the LLM
stages, the numpy-only ``hash`` retrieval backend): a pipeline task is tuned through configs,
so a model agent gets the config tools through the real OpenAI client, a scripted agent
replays them, and a CLI agent tunes the workspace's ``serving.toml`` through the real
``servegym-agent`` command."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from engine_support import StandInEngine
from test_cli_agents import SECRETS, ProcessSessions
from test_llm_agent import serving
from test_pipeline_cpu_eval import MODEL, QUICK, make_task

from servegym.agents.base import CONFIG_FILE, LAUNCHER, make_agent
from servegym.agents.cli.agent import make_cli_agent
from servegym.engines.config import ServingConfig
from servegym.providers.fakes import FakeOpenAI, final_text, tool_call
from servegym.runner.environment import TrackEnvironment
from servegym.sandbox.workspace import WorkspaceError
from servegym.tasks.loader import LoadedTask
from servegym.tracks import track_for

FASTER = {"extra_args": QUICK, "pipeline": {"concurrency": 4, "embed_batch_size": 8}}
CALLS = [
    ("describe_task", {}),
    ("run_experiment", {"config": FASTER, "quick": True}),
    ("run_experiment", {"config": {"pipeline": {"top_k": 4, "rerank_depth": 9}}}),  # invalid
    ("submit", {"config": FASTER}),
]


def make_env(tmp_path: Path, loaded: LoadedTask | None = None) -> TrackEnvironment:
    task = loaded if loaded is not None else make_task(tmp_path, min_recall=0.0)
    servers = tmp_path / "trial" / "servers"
    engine = StandInEngine(tmp_path / "pid")
    return TrackEnvironment(
        task,
        track_for(task, server_logs=servers, engine=engine, model=MODEL),
        log_path=tmp_path / "trial" / "experiments.jsonl",
    )


def check_trajectory(path: Path) -> None:
    tools = [x for x in map(json.loads, path.read_text().splitlines()) if x["kind"] == "tool"]
    assert [t["name"] for t in tools] == [n for n, _ in CALLS]
    described = json.loads(tools[0]["result"].split("\n\nbudget:")[0])
    assert described["tuning"] == "config" and described["track"] == "cpu"
    assert any(k["name"] == "pipeline.ef_search" for k in described["knobs"])
    bench = json.loads(tools[1]["result"].split("\n\nbudget:")[0])
    assert bench["ok"] and bench["improvement"] > 1.0
    assert bench["pipeline"]["answered"] == 2 and bench["config"]["pipeline"]["concurrency"] == 4
    assert tools[2]["is_error"] and "rerank_depth" in tools[2]["result"]
    assert tools[3]["result"].startswith("submitted: ")
    assert all("wall seconds left" in t["result"] for t in tools)


def check_submission(env: TrackEnvironment) -> None:
    assert isinstance(env.submission, ServingConfig)
    assert env.submission.pipeline is not None
    assert env.submission.pipeline.concurrency == 4
    assert env.submission.pipeline.embed_batch_size == 8


def test_a_model_agent_tunes_a_cpu_pipeline_task_with_the_config_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path)
    script = [tool_call(n, a) for n, a in CALLS] + [final_text("done")]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with serving(FakeOpenAI, script, api_key="sk-test") as fake:
        agent = make_agent("openai:gpt-4.1", base_url=fake.base_url)
        agent.trajectory_path = tmp_path / "trial" / "trajectory.jsonl"  # type: ignore[attr-defined]
        agent.run(env, 0)
    env.close()
    assert agent.outcome == "finished"  # type: ignore[attr-defined]
    first = fake.requests[0].body
    assert {t["function"]["name"] for t in first["tools"]} == {
        "describe_task", "run_experiment", "submit",
    }  # fmt: skip
    assert "Start with describe_task" in json.dumps(first["messages"])
    assert LAUNCHER not in json.dumps(first["messages"])
    check_trajectory(tmp_path / "trial" / "trajectory.jsonl")
    check_submission(env)


def test_a_scripted_agent_replays_the_same_calls(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    script = tmp_path / "calls.jsonl"
    script.write_text("\n".join(json.dumps({"tool": n, "arguments": a}) for n, a in CALLS))
    agent = make_agent("scripted", script=script)
    agent.trajectory_path = tmp_path / "trial" / "trajectory.jsonl"  # type: ignore[attr-defined]
    agent.run(env, 0)
    env.close()
    check_trajectory(tmp_path / "trial" / "trajectory.jsonl")
    check_submission(env)


def test_the_workspace_holds_the_baseline_as_serving_toml(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    root = env.workspace.root
    assert not (root / LAUNCHER).exists()
    text = (root / CONFIG_FILE).read_text()
    seeded = ServingConfig.model_validate(tomllib.loads(text))
    assert seeded == env.task.baseline
    assert "#   pipeline.ef_search: HNSW search beam width" in text
    assert "#   max_num_seqs: max num seqs (default: engine default)" in text

    (root / CONFIG_FILE).write_text("pipeline = [")
    with pytest.raises(WorkspaceError, match=r"serving\.toml: malformed TOML"):
        env.run_benchmark(quick=True)
    (root / CONFIG_FILE).write_text("[pipeline]\ntop_k = 4\nrerank_depth = 9\n")
    with pytest.raises(WorkspaceError, match=r"toml: bad value for 'pipeline': rerank_depth"):
        env.submit_workspace()
    (root / CONFIG_FILE).write_text("[pipeline]\nhnsw_m = 1\n")
    with pytest.raises(WorkspaceError, match=r"serving\.toml: bad value for 'pipeline\.hnsw_m': "):
        env.run_benchmark(quick=True)
    (root / CONFIG_FILE).unlink()
    with pytest.raises(WorkspaceError, match=r"the workspace has no serving\.toml"):
        env.submit_workspace()
    assert env.experiments == [] and env.submission is None
    env.close()


def test_a_cli_agent_tunes_serving_toml_through_servegym_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in SECRETS.items():
        monkeypatch.setenv(var, value)
    env = make_env(tmp_path)
    config_file = env.workspace.root / CONFIG_FILE

    def session(index: int) -> list[list[str]]:
        """The "CLI" edits serving.toml (as a coding agent would), then benchmarks and
        submits it."""
        if index == 0:
            text = config_file.read_text()
            assert "[pipeline]\nembed_batch_size = 1\nconcurrency = 1\n" in text
            text = text.replace("concurrency = 1", "concurrency = 4")
            config_file.write_text(text.replace("embed_batch_size = 1", "embed_batch_size = 8"))
            return [["benchmark", "--quick"], ["submit"]]
        return []

    sessions = ProcessSessions(session)
    agent = make_cli_agent("claude-code", "claude-sonnet-4-5", sessions=sessions, max_sessions=1)
    agent.trajectory_path = tmp_path / "trial" / "trajectory.jsonl"
    agent.run(env, seed=0)
    env.close()
    prompt = sessions.kwargs[0]["command"][2]
    assert prompt.startswith("Tune the pipeline.") and f"./{CONFIG_FILE}" in prompt
    assert LAUNCHER not in prompt
    lines = [json.loads(x) for x in agent.trajectory_path.read_text().splitlines()]
    tools = [x for x in lines if x["kind"] == "tool"]
    assert [(t["name"], t["status"]) for t in tools] == [("benchmark", 200), ("submit", 200)]
    bench = tools[0]["result"]
    assert bench["ok"] and bench["quick"] and bench["improvement"] > 1.0
    assert bench["pipeline"]["answered"] == 2
    assert tools[1]["result"]["submitted"].startswith(f"submitted {CONFIG_FILE}: ")
    check_submission(env)
