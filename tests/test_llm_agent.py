"""Model agents on the sim track, end to end: the real anthropic and openai clients talk to
the local fake APIs, which replay scripted tool calls; the trial runs and is scored."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from servegym.agents.base import make_agent
from servegym.errors import UserError
from servegym.providers.fakes import FakeAnthropic, FakeOpenAI, Fault, final_text, tool_call
from servegym.runner.trial import run_trial
from servegym.tasks.loader import LoadedTask, load_task_folder

DATA = Path(__file__).parent / "data" / "tasks"
FAST_RETRIES = {"provider_tries": 3, "retry_base_delay_s": 0.01}


@pytest.fixture
def loaded() -> LoadedTask:
    return load_task_folder(DATA / "tiny-throughput")  # baseline max_num_seqs = 8


@contextmanager
def serving(cls: type[FakeOpenAI] | type[FakeAnthropic], script: Any, **kw: Any) -> Iterator[Any]:
    """Run a fake API on a thread of its own (the trial runs its own event loop)."""
    ready = threading.Event()
    box: dict[str, Any] = {}
    loop = asyncio.new_event_loop()

    async def main() -> None:
        stop = asyncio.Event()
        box["stop"] = stop
        async with cls(script, **kw) as fake:
            box["fake"] = fake
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield box["fake"]
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(10)


SCRIPT = [
    tool_call("describe_task", {}),
    tool_call("run_experiment", {"config": {"max_num_seqs": 64}}),
    tool_call("run_experiment", {"config": {"max_num_seqs": "many"}}),  # invalid: an error
    tool_call("submit", {"config": {"max_num_seqs": 64}}),
    final_text("Submitted max_num_seqs=64."),
]


def check_trial(result: Any, folder: Path) -> None:
    assert result.outcome == "scored" and result.score is not None and result.score > 1.0
    assert result.agent_outcome == "finished"
    experiments = [json.loads(x) for x in (folder / "experiments.jsonl").read_text().splitlines()]
    assert [e["config"] for e in experiments] == [{"max_num_seqs": 64}]  # exactly what it asked
    assert result.submission is not None and result.submission.config == {"max_num_seqs": 64}
    lines = [json.loads(x) for x in (folder / "trajectory.jsonl").read_text().splitlines()]
    assert [x["kind"] for x in lines].count("model") == 5
    tools = [x for x in lines if x["kind"] == "tool"]
    assert [t["name"] for t in tools] == [
        "describe_task", "run_experiment", "run_experiment", "submit",
    ]  # fmt: skip
    assert tools[2]["is_error"] and "max_num_seqs" in tools[2]["result"]
    assert all("budget:" in t["result"] for t in tools)
    cost = result.agent_cost
    assert cost is not None and cost["calls"] == 5
    assert cost["input_tokens"] > 0 and cost["output_tokens"] > 0


def test_an_openai_compatible_agent_runs_a_scripted_trial(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    with serving(FakeOpenAI, SCRIPT) as fake:
        result = run_trial(
            loaded,
            "openai-compatible:fake-model",
            0,
            tmp_path,
            agent_options={"base_url": fake.base_url, **FAST_RETRIES},
        )
        bodies = fake.bodies()
    check_trial(result, tmp_path / "tiny-throughput__openai-compatible:fake-model__s0")
    assert result.agent_cost is not None and result.agent_cost["dollars"] is None  # no price
    tool_msgs = [m for m in bodies[-1]["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == 4 and "submitted" in tool_msgs[-1]["content"]


def test_an_anthropic_agent_runs_a_scripted_trial_and_its_key_stays_in_the_harness(
    loaded: LoadedTask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-ant-test-0123456789"
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    model = "claude-opus-5"
    with serving(FakeAnthropic, SCRIPT, api_key=key) as fake:
        result = run_trial(
            loaded, f"anthropic:{model}", 0, tmp_path,
            agent_options={"base_url": fake.base_url, **FAST_RETRIES},
        )  # fmt: skip
        assert all(r.status == 200 for r in fake.requests)
    folder = tmp_path / f"tiny-throughput__anthropic:{model}__s0"
    check_trial(result, folder)
    cost = result.agent_cost
    assert cost is not None and cost["dollars"] is not None and cost["dollars"] > 0  # priced
    for path in folder.iterdir():
        assert key not in path.read_text(errors="replace"), path.name


def test_a_provider_down_for_good_ends_the_agent_phase_and_the_submission_is_scored(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    script = [tool_call("submit", {"config": {"max_num_seqs": 32}}), final_text("done")]
    faults = [Fault(count=1), Fault.server_error()]  # the first answer, then 500 forever
    with serving(FakeOpenAI, script, faults=faults) as fake:
        result = run_trial(
            loaded, "openai-compatible:fake-model", 0, tmp_path,
            agent_options={"base_url": fake.base_url, **FAST_RETRIES},
        )  # fmt: skip
        statuses = [r.status for r in fake.requests]
    assert result.agent_outcome == "provider_unavailable"
    assert statuses == [200, 500, 500, 500]  # one answer, then the first try and 2 retries
    assert result.outcome == "scored" and result.submission is not None
    assert result.submission.config == {"max_num_seqs": 32}


def test_rate_limits_are_retried(loaded: LoadedTask, tmp_path: Path) -> None:
    script = [tool_call("submit", {"config": {"max_num_seqs": 16}}), final_text("done")]
    with serving(FakeOpenAI, script, faults=[Fault.rate_limited(2, retry_after_s=0.01)]) as fake:
        result = run_trial(
            loaded, "openai-compatible:fake-model", 0, tmp_path,
            agent_options={"base_url": fake.base_url, **FAST_RETRIES},
        )  # fmt: skip
        statuses = [r.status for r in fake.requests]
    assert statuses == [429, 429, 200, 200]
    assert result.agent_outcome == "finished" and result.outcome == "scored"


def test_agent_names_and_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(UserError) as e:
        make_agent("anthropic:claude-x")
    assert "ANTHROPIC_API_KEY" in e.value.message and "\n" not in e.value.message
    with pytest.raises(UserError, match="--base-url"):
        make_agent("openai-compatible:m")
    with pytest.raises(UserError, match="name the model"):
        make_agent("openai:")
    with pytest.raises(UserError, match="unknown setting"):
        make_agent("openai-compatible:m", base_url="http://x/v1", nope=1)
    with pytest.raises(UserError, match="does not take the settings base_url"):
        make_agent("tpe", base_url="http://x/v1")
    with pytest.raises(UserError, match="anthropic:MODEL"):
        make_agent("nope")
