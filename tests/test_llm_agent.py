"""Model agents on the sim track, end to end: the real anthropic and openai clients talk to
the local fake APIs, which replay scripted tool calls; the trial runs and is scored."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from servegym.agents.base import make_agent
from servegym.errors import UserError
from servegym.providers.clients import OpenAIProvider
from servegym.providers.fakes import FakeAnthropic, FakeOpenAI, Fault, final_text, tool_call
from servegym.runner.environment import TrackEnvironment
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


# --------------------------------------------------------------------------- a hostile provider


@pytest.mark.parametrize("fake_cls", [FakeOpenAI, FakeAnthropic], ids=["openai", "anthropic"])
def test_a_garbage_reply_is_a_provider_error_retried_then_provider_unavailable(
    loaded: LoadedTask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_cls: Any
) -> None:
    """A 200 whose body is a bare string once crashed the agent (AttributeError, outcome
    ``crashed``, agent_outcome ``max_turns``)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789")
    agent = "openai-compatible:m" if fake_cls is FakeOpenAI else "anthropic:claude-x"
    faults = [Fault.garbage('"not a reply"')]
    with serving(fake_cls, [final_text("never")], faults=faults) as fake:
        result = run_trial(
            loaded, agent, 0, tmp_path,
            agent_options={"base_url": fake.base_url, **FAST_RETRIES},
        )  # fmt: skip
        statuses = [r.status for r in fake.requests]
    assert statuses == [200, 200, 200]  # three tries, each answered with garbage
    assert result.outcome == "provider_unavailable"
    assert result.agent_outcome == "provider_unavailable"
    assert result.agent_error is None and result.leaderboard_score == 1.0
    folder = tmp_path / f"tiny-throughput__{agent}__s0"
    kinds = [json.loads(x)["kind"] for x in (folder / "trajectory.jsonl").read_text().splitlines()]
    assert kinds[-1] == "provider_unavailable"
    assert not (folder / "agent_error.txt").exists()


def test_a_hung_provider_is_abandoned_per_request_and_its_wait_charged(
    tmp_path: Path,
) -> None:
    """600 s a try and 7 tries once blocked a trial for over an hour; now the request
    timeout and the tries are settings (``--provider-timeout``, ``--provider-tries``), and
    the wait counts against the task's wall-clock budget."""
    folder = tmp_path / "tiny-throughput"
    shutil.copytree(DATA / "tiny-throughput", folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("[budget]\n", "[budget]\nwall_seconds = 0.5\n"))
    loaded = load_task_folder(folder)
    options = {"provider_timeout_s": 0.3, "provider_tries": 2, "retry_base_delay_s": 0.01}
    t0 = time.monotonic()
    with serving(FakeOpenAI, [final_text("never")], faults=[Fault.hung()]) as fake:
        result = run_trial(
            loaded, "openai-compatible:m", 0, tmp_path / "runs",
            agent_options={"base_url": fake.base_url, **options},
        )  # fmt: skip
        assert len(fake.requests) == 2
    assert time.monotonic() - t0 < 30
    assert result.outcome == "provider_unavailable"
    assert result.agent_outcome == "provider_unavailable"
    assert result.budget.exhausted  # 2 x 0.3 s waited: the 0.5 s wall budget is spent


class RealStyleEnvironment(TrackEnvironment):
    """A sim environment that keeps its wall budget apart from the clock, as a real
    track's does (experiments and the agent's waits are charged to it)."""

    def __init__(self, loaded: LoadedTask) -> None:
        super().__init__(loaded)
        self.charged: list[float] = []

    def charge_wall_seconds(self, seconds: float) -> None:
        self.charged.append(seconds)


def test_the_wait_on_a_hung_provider_is_charged_to_a_real_track_budget(
    loaded: LoadedTask,
) -> None:
    env = RealStyleEnvironment(loaded)
    with serving(FakeOpenAI, [final_text("never")], faults=[Fault.hung()]) as fake:
        agent = make_agent(
            "openai-compatible:m", base_url=fake.base_url, provider_timeout_s=0.3,
            provider_tries=2, retry_base_delay_s=0.01,
        )  # fmt: skip
        agent.run(env, 0)
    assert agent.trial_outcome() == "provider_unavailable"
    assert len(env.charged) == 1 and env.charged[0] >= 0.6


def test_provider_settings_reach_the_client(tmp_path: Path) -> None:
    from servegym.agents.llm.agent import LLMAgent

    agent = make_agent(
        "openai-compatible:m", base_url="http://127.0.0.1:9/v1",
        provider_timeout_s=5.0, provider_tries=4,
    )  # fmt: skip
    assert isinstance(agent, LLMAgent)
    provider = agent.make_provider()
    assert isinstance(provider, OpenAIProvider)
    assert provider.timeout_s == 5.0 and provider.retry.max_retries == 3  # 4 tries
    asyncio.run(provider.aclose())
    default = make_agent("openai-compatible:m", base_url="http://127.0.0.1:9/v1")
    assert isinstance(default, LLMAgent)
    assert default.settings.provider_timeout_s == 120.0 and default.settings.provider_tries == 3
    with pytest.raises(UserError, match="--provider-tries"):
        make_agent("openai-compatible:m", base_url="http://x/v1", provider_tries=0)
    with pytest.raises(UserError, match="--provider-timeout"):
        make_agent("openai-compatible:m", base_url="http://x/v1", provider_timeout_s=-1.0)


def test_a_provider_refusing_mid_run_says_so_in_agent_outcome(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    script = [tool_call("describe_task", {}), final_text("done")]
    faults = [Fault(count=1), Fault(status=400, message="your request is bad")]
    with serving(FakeOpenAI, script, faults=faults) as fake:
        result = run_trial(
            loaded, "openai-compatible:m", 0, tmp_path,
            agent_options={"base_url": fake.base_url, **FAST_RETRIES},
        )  # fmt: skip
    assert result.outcome == "crashed" and result.agent_outcome == "provider_error"
    assert result.agent_error is not None and "your request is bad" in result.agent_error
