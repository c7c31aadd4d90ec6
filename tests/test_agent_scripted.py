"""The scripted agent on the sim track, the token and dollar caps, and context management."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_llm_agent import FAST_RETRIES, serving

from servegym.agents.base import make_agent
from servegym.agents.llm.context import needs_trimming, shorten_old_results
from servegym.errors import UserError
from servegym.providers.fakes import FakeOpenAI, final_text, tool_call
from servegym.providers.types import (
    AssistantMessage,
    Message,
    ToolResult,
    ToolResultsMessage,
    UserMessage,
)
from servegym.runner.trial import run_trial
from servegym.tasks.loader import LoadedTask, load_task_folder

DATA = Path(__file__).parent / "data" / "tasks"


@pytest.fixture
def loaded() -> LoadedTask:
    return load_task_folder(DATA / "tiny-throughput")  # baseline max_num_seqs = 8


def write_script(path: Path, calls: list[dict[str, object]]) -> Path:
    path.write_text("\n".join(json.dumps(c) for c in calls) + "\n")
    return path


def test_a_scripted_run_is_scored_with_exactly_the_configs_it_was_told(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path / "calls.jsonl",
        [
            {"tool": "describe_task", "arguments": {}},
            {"tool": "run_experiment", "arguments": {"config": {"max_num_seqs": 32}}},
            {
                "tool": "run_experiment",
                "arguments": {"config": {"max_num_seqs": 64}, "quick": True},
            },
            {"tool": "submit", "arguments": {"config": {"max_num_seqs": 64}}},
        ],
    )
    result = run_trial(loaded, "scripted", 0, tmp_path / "runs", agent_options={"script": script})
    assert result.outcome == "scored" and result.score is not None and result.score > 1.0
    assert result.agent_outcome == "finished"
    folder = tmp_path / "runs" / "tiny-throughput__scripted__s0"
    experiments = [json.loads(x) for x in (folder / "experiments.jsonl").read_text().splitlines()]
    assert [(e["config"], e["quick"]) for e in experiments] == [
        ({"max_num_seqs": 32}, False),
        ({"max_num_seqs": 64}, True),
    ]
    trajectory = (folder / "trajectory.jsonl").read_text()
    # a trial's trajectory replays as a script: the same experiments again
    replay = run_trial(
        loaded, "scripted", 1, tmp_path / "runs",
        agent_options={"script": folder / "trajectory.jsonl"},
    )  # fmt: skip
    assert replay.outcome == "scored" and replay.process is not None
    assert replay.process.experiments == 2
    assert replay.submission is not None and replay.submission.config == {"max_num_seqs": 64}
    assert trajectory.count('"kind": "tool"') == 4


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json\n", "calls.jsonl:1: not JSON"),
        ('{"arguments": {}}\n', 'needs "tool"'),
        ("\n# only a comment\n", "no tool calls"),
    ],
)
def test_bad_scripts_are_one_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        make_agent("scripted", script=path)
    with pytest.raises(UserError, match="--script"):
        make_agent("scripted")
    with pytest.raises(UserError, match="No such file"):
        make_agent("scripted", script=tmp_path / "missing.jsonl")


def test_a_token_cap_ends_the_loop_and_the_submission_still_counts(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    script = [
        tool_call("submit", {"config": {"max_num_seqs": 32}}),
        tool_call("run_experiment", {"config": {"max_num_seqs": 64}}),
        final_text("never reached"),
    ]
    with serving(FakeOpenAI, script) as fake:
        result = run_trial(
            loaded, "openai-compatible:fake-model", 0, tmp_path,
            agent_options={"base_url": fake.base_url, "max_agent_tokens": 1, **FAST_RETRIES},
        )  # fmt: skip
        calls = len(fake.requests)
    assert calls == 1  # the call that crossed the cap completed; no other was made
    assert result.agent_outcome == "token_budget"
    assert result.outcome == "scored" and result.submission is not None
    assert result.submission.config == {"max_num_seqs": 32}


def test_a_dollar_cap_from_the_task_ends_the_loop(
    loaded: LoadedTask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = loaded.task.budget.model_copy(update={"max_agent_dollars": 1e-9})
    task = loaded.task.model_copy(update={"budget": budget})
    capped = dataclasses.replace(loaded, task=task)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    script = [tool_call("submit", {"config": {"max_num_seqs": 16}}), final_text("x")]
    with serving(FakeOpenAI, script, api_key="sk-test") as fake:
        result = run_trial(
            capped, "openai:gpt-4.1", 0, tmp_path,
            agent_options={"base_url": fake.base_url, **FAST_RETRIES},
        )  # fmt: skip
        assert len(fake.requests) == 1
    assert result.agent_outcome == "dollar_budget" and result.outcome == "scored"


def _history(n: int, size: int) -> list[Message]:
    out: list[Message] = [UserMessage(text="task")]
    for i in range(n):
        out.append(AssistantMessage(text=f"turn {i}"))
        out.append(
            ToolResultsMessage(results=[ToolResult(tool_call_id=f"c{i}", content="x" * size)])
        )
    return out


def test_older_tool_results_are_shortened_near_the_limit() -> None:
    assert not needs_trimming(50_000, 128_000) and needs_trimming(100_000, 128_000)
    history = _history(5, 5000)
    trimmed, removed = shorten_old_results(history, keep_recent=2)
    sizes = [len(m.results[0].content) for m in trimmed if isinstance(m, ToolResultsMessage)]
    assert sizes[-2:] == [5000, 5000] and all(s < 400 for s in sizes[:3])
    assert removed == 3 * (5000 - 300)
    assert len(trimmed) == len(history)  # every call keeps its result: the API needs them
    again, removed_again = shorten_old_results(trimmed, keep_recent=2)
    assert removed_again == 0 and again == trimmed
    assert isinstance(history[2], ToolResultsMessage) and len(history[2].results[0].content) == 5000


def test_the_loop_trims_its_context(loaded: LoadedTask, tmp_path: Path) -> None:
    script = [tool_call("describe_task", {}) for _ in range(4)] + [final_text("done")]
    with serving(FakeOpenAI, script) as fake:
        run_trial(
            loaded, "openai-compatible:fake-model", 0, tmp_path,
            agent_options={"base_url": fake.base_url, "context_tokens": 10, **FAST_RETRIES},
        )  # fmt: skip
        last = fake.requests[-1].body["messages"]
    tool_msgs = [m["content"] for m in last if m["role"] == "tool"]
    assert len(tool_msgs) == 4
    assert all("shortened to save context" in c for c in tool_msgs[:2])
    assert all("shortened" not in c for c in tool_msgs[2:])
    lines = tmp_path / "tiny-throughput__openai-compatible:fake-model__s0" / "trajectory.jsonl"
    assert '"context_trimmed"' in lines.read_text()


def test_shipped_best_compares_the_submission_with_the_best_experiment() -> None:
    from servegym.agents.base import BudgetState, ExperimentResult
    from servegym.engines.config import ServingConfig
    from servegym.engines.launcher import LauncherSubmission
    from servegym.runner.trial import _shipped_best

    def exp(config: dict[str, object]) -> ExperimentResult:
        return ExperimentResult(index=0, config=config, ok=True, budget=BudgetState())

    best = exp({"max_num_seqs": 64})
    assert _shipped_best(ServingConfig(max_num_seqs=64), best) is True
    assert _shipped_best(ServingConfig(max_num_seqs=32), best) is False
    assert _shipped_best(None, best) is None and _shipped_best(ServingConfig(), None) is None
    sub = LauncherSubmission(path="x", files=1, bytes=1, digest="ab" * 32)
    assert _shipped_best(sub, exp({"launcher": "start_server.sh", "digest": "ab" * 8})) is True
    assert _shipped_best(sub, exp({"launcher": "start_server.sh", "digest": "cd" * 8})) is False
