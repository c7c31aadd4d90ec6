"""ServeGym tasks in Inspect AI, end to end: ``inspect eval`` (its Python entry, the one the
command line calls) with Inspect's scripted mock model, on a small sim task, against the
trial folder it writes and against ``servegym run`` with the same calls.

The mock model's replies carry their token counts: without them Inspect counts tokens with
a tokenizer it downloads, and the tests run offline.
"""

from __future__ import annotations

import json
import shutil
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from servegym.errors import UserError
from servegym.integrations.inspect.generate import CATALOG, render_catalog
from servegym.integrations.inspect.session import TrialSession
from servegym.reporting.leaderboard import scan_trials
from servegym.runner.results import read_trial
from servegym.runner.trial import run_trial
from servegym.tasks.loader import task_ids

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "data" / "tasks" / "tiny-throughput"  # baseline max_num_seqs = 8
MODEL = "mockllm/model"
AGENT = f"inspect:{MODEL}"

needs_inspect = pytest.mark.skipif(
    find_spec("inspect_ai") is None,
    reason="Inspect AI is an optional extra: pip install -e '.[inspect]'",
)

CALLS: list[dict[str, Any]] = [
    {"tool": "describe_task", "arguments": {}},
    {"tool": "run_experiment", "arguments": {"config": {"max_num_seqs": 32}}},
    {"tool": "submit", "arguments": {"config": {"max_num_seqs": 64}}},
]


def test_the_catalog_lists_every_shipped_task_and_is_up_to_date() -> None:
    assert CATALOG.read_text(encoding="utf-8") == render_catalog(), (
        "servegym/integrations/inspect/catalog.py is out of date: run "
        "python -m servegym.integrations.inspect.generate"
    )
    for task_id in task_ids():
        assert f'@task(name="{task_id}"' in CATALOG.read_text(encoding="utf-8")


def test_a_driven_trial_serves_its_calls_then_scores_the_submission(tmp_path: Path) -> None:
    """The relay under the Inspect tasks, driven directly (no Inspect needed)."""
    session = TrialSession(str(TINY), 0, tmp_path, "driven")
    desc = session.start()
    assert desc.task_id == "tiny-throughput" and desc.tuning == "config"
    for c in CALLS:
        outcome = session.call(c["tool"], c["arguments"])
        assert not outcome.is_error and "budget:" in outcome.content
    bad = session.call("run_experiment", {"config": {"max_num_seqs": -1}})
    assert bad.is_error and "max_num_seqs" in bad.content
    result = session.finish("finished", {"calls": 4})
    assert result.outcome == "scored" and result.agent_outcome == "finished"
    assert result.agent_cost == {"calls": 4}
    assert session.folder == tmp_path / "tiny-throughput__driven__s0"
    assert session.call("describe_task", {}).content == "error: the agent phase is over"
    assert session.finish() is result
    with pytest.raises(UserError, match="finished already"):
        TrialSession(str(TINY), 0, tmp_path, "driven").start()
    with pytest.raises(UserError, match="no-such-task"):
        TrialSession("no-such-task", 0, tmp_path, "driven").start()


def test_an_outside_loop_that_raised_is_the_agents_error_and_its_submission_stands(
    tmp_path: Path,
) -> None:
    session = TrialSession(str(TINY), 0, tmp_path, "driven")
    session.start()
    session.call("submit", {"config": {"max_num_seqs": 64}})
    result = session.finish("crashed", None, error="the model provider went away")
    assert result.outcome == "scored" and result.score is not None
    assert result.agent_error == "AgentStopped: the model provider went away"
    assert result.agent_outcome == "crashed"


def _outputs(calls: list[dict[str, Any]], final: str = "done") -> list[Any]:
    """The mock model's replies: one tool call each, then a plain answer."""
    from inspect_ai.model import ModelOutput, ModelUsage

    outs = [
        ModelOutput.for_tool_call(MODEL, c["tool"], c["arguments"], tool_call_id=f"c{i}")
        for i, c in enumerate(calls)
    ]
    outs.append(ModelOutput.from_content(MODEL, final))
    for o in outs:
        o.usage = ModelUsage(input_tokens=100, output_tokens=10, total_tokens=110)
    return outs


def _eval(spec: str, calls: list[dict[str, Any]], logs: Path, **kwargs: Any) -> Any:
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import get_model

    epochs = kwargs.pop("epochs", 1)
    model = get_model(MODEL, custom_outputs=_outputs(calls) * epochs)
    (log,) = inspect_eval(
        spec, model=model, task_args=kwargs, log_dir=str(logs), display="none", epochs=epochs
    )
    return log


@needs_inspect
def test_inspect_lists_every_shipped_task() -> None:
    from inspect_ai import list_tasks

    listed = list_tasks(["servegym/integrations/inspect"], root_dir=REPO)
    names = {t.name for t in listed}
    assert names == {*task_ids(), "trial"}
    sim = {t.name for t in listed if t.attribs.get("track") == "sim"}
    assert "voice-stream-h100" in sim and "cpu-prefill-ttft" not in sim


@needs_inspect
def test_an_inspect_eval_is_a_servegym_trial_with_the_same_score_as_servegym_run(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    log = _eval("servegym/trial", CALLS, tmp_path / "logs", task=str(TINY), out=str(runs))
    assert log.status == "success"
    (sample,) = log.samples
    score = sample.scores["final_evaluation"]
    folder = runs / "tiny-throughput__inspect:mockllm_model__s0"
    assert score.metadata["trial_folder"] == str(folder)
    trial = read_trial(folder / "trial.json")
    assert trial.agent == AGENT and trial.outcome == "scored" and trial.score is not None
    assert trial.agent_outcome == "finished"
    # the log's score is the trial's: value, interval, outcome, gates
    assert score.value == trial.leaderboard_score == trial.score > 1.0
    assert score.metadata["score"] == trial.score
    assert score.metadata["score_ci"] == list(trial.score_ci or ())
    assert score.metadata["outcome"] == "scored"
    gates = {k: g.model_dump(mode="json") for k, g in trial.gates.items()}
    assert score.metadata["gates"] == gates and gates["accuracy"]["passed"] is True
    # the experiments ran through ServeGym's tools, and the model's cost is recorded
    experiments = [json.loads(x) for x in (folder / "experiments.jsonl").read_text().splitlines()]
    assert [e["config"] for e in experiments] == [{"max_num_seqs": 32}]
    assert trial.submission is not None and trial.submission.config == {"max_num_seqs": 64}
    assert trial.agent_cost is not None and trial.agent_cost["calls"] == 4
    assert trial.agent_cost["input_tokens"] == 400
    tool_messages = [m for m in sample.messages if m.role == "tool"]
    assert [m.function for m in tool_messages] == ["describe_task", "run_experiment", "submit"]
    assert all("budget:" in m.text for m in tool_messages)

    # the same calls through `servegym run --agent scripted`: the same score
    script = tmp_path / "calls.jsonl"
    script.write_text("".join(json.dumps(c) + "\n" for c in CALLS))
    scripted = run_trial(TINY, "scripted", 0, runs, agent_options={"script": script})
    assert scripted.score == trial.score and scripted.score_ci == trial.score_ci
    # and the Inspect trial's own trajectory replays as a script, to the same score
    replay = run_trial(
        TINY, "scripted", 0, tmp_path / "replay",
        agent_options={"script": folder / "trajectory.jsonl"},
    )  # fmt: skip
    assert replay.score == trial.score
    # the leaderboard reads Inspect's trials beside the others
    found = {t.result.agent for t in scan_trials([runs]).trials}
    assert found == {AGENT, "scripted"}


@needs_inspect
def test_seed_and_epochs_are_servegym_seeds_and_a_finished_trial_is_kept(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    log = _eval(
        "servegym/trial", [], tmp_path / "logs", task=str(TINY), out=str(runs), seed=3, epochs=2
    )
    assert log.status == "success"
    seeds = sorted(s.scores["final_evaluation"].metadata["seed"] for s in log.samples)
    assert seeds == [3, 4]
    for seed in seeds:
        trial = read_trial(runs / f"tiny-throughput__inspect:mockllm_model__s{seed}" / "trial.json")
        assert trial.seed == seed and trial.outcome == "no_submission"
        assert trial.leaderboard_score == 1.0
    before = (runs / "tiny-throughput__inspect:mockllm_model__s3" / "trial.json").read_bytes()
    again = _eval("servegym/trial", [], tmp_path / "logs", task=str(TINY), out=str(runs), seed=3)
    (refused,) = again.samples
    assert again.status == "error" and "finished already" in refused.error.message
    assert "-T force=true" in refused.error.message
    assert (runs / "tiny-throughput__inspect:mockllm_model__s3" / "trial.json").read_bytes() == (
        before
    )
    forced = _eval(
        "servegym/trial", CALLS, tmp_path / "logs", task=str(TINY), out=str(runs), seed=3,
        force=True,
    )  # fmt: skip
    assert forced.samples[0].scores["final_evaluation"].metadata["outcome"] == "scored"


@needs_inspect
def test_the_budget_is_servegyms(tmp_path: Path) -> None:
    task = tmp_path / "tasks" / "tiny-throughput"
    shutil.copytree(TINY, task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("max_experiments = 12", "max_experiments = 1"))
    calls = [CALLS[1], CALLS[1], CALLS[2]]
    log = _eval("servegym/trial", calls, tmp_path / "logs", task=str(task), out=str(tmp_path))
    (sample,) = log.samples
    tools = [m for m in sample.messages if m.role == "tool"]
    assert tools[0].error is None and tools[2].error is None
    assert tools[1].error is not None and "the budget is spent" in tools[1].error.message
    folder = tmp_path / "tiny-throughput__inspect:mockllm_model__s0"
    assert len((folder / "experiments.jsonl").read_text().splitlines()) == 1
    assert sample.scores["final_evaluation"].metadata["outcome"] == "scored"


@needs_inspect
def test_a_shipped_task_runs_by_its_inspect_name(tmp_path: Path) -> None:
    log = _eval("servegym/voice-stream-h100", [], tmp_path / "logs", out=str(tmp_path))
    assert log.status == "success"
    score = log.samples[0].scores["final_evaluation"]
    assert score.metadata["outcome"] == "no_submission" and score.value == 1.0
    trial = read_trial(Path(score.metadata["trial_folder"]) / "trial.json")
    assert trial.task == "voice-stream-h100" and trial.outcome == "no_submission"


@needs_inspect
def test_an_unknown_task_is_one_line_naming_the_parameter(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="-T task"):
        _eval("servegym/trial", [], tmp_path / "logs", task="no-such-task", out=str(tmp_path))
