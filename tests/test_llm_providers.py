"""LLM provider clients through the real anthropic and openai SDKs against the local fakes.

No SDK is mocked: each provider's real client talks HTTP to a fake server from
:mod:`servegym.providers.fakes` on 127.0.0.1, which replays a script and records what it got.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from servegym.errors import UserError
from servegym.providers.clients import (
    PLACEHOLDER_API_KEY,
    AnthropicProvider,
    AssistantMessage,
    Message,
    OpenAIProvider,
    Provider,
    ProviderError,
    ProviderUnavailable,
    RetryEvent,
    RetryPolicy,
    ToolCall,
    ToolResult,
    ToolResultsMessage,
    ToolSpec,
    Usage,
    UserMessage,
    anthropic_request_messages,
    openai_request_messages,
    resolve_api_key,
)
from servegym.providers.cost import cost_of, load_price_table, price_for
from servegym.providers.fakes import (
    FakeAnthropic,
    FakeOpenAI,
    FakeServer,
    Fault,
    final_text,
    tool_call,
)

KEY = "sk-test-3f9a7c21-secret"
SYSTEM = "You tune LLM servers."
TOOLS = [
    ToolSpec(
        name="run_experiment",
        description="Run one experiment with a config.",
        parameters={
            "type": "object",
            "properties": {"config": {"type": "object"}, "quick": {"type": "boolean"}},
            "required": ["config"],
        },
    )
]
ARGS = {"config": {"max_num_seqs": 64, "enable_prefix_caching": True}, "quick": True}


class Sleeps:
    """An injected no-op sleep that remembers what it was asked to wait."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


FakeKind = type[FakeAnthropic] | type[FakeOpenAI]
ProviderMaker = Callable[..., AnthropicProvider | OpenAIProvider]


def make_provider(
    fake: FakeServer, key: str = KEY, **kw: Any
) -> AnthropicProvider | OpenAIProvider:
    kw.setdefault("sleep", Sleeps())
    kw.setdefault("rng", random.Random(0))
    kw.setdefault("timeout_s", 10.0)
    if isinstance(fake, FakeAnthropic):
        return AnthropicProvider("claude-sonnet-4-6", key, base_url=fake.base_url, **kw)
    return OpenAIProvider("gpt-4.1", key, base_url=fake.base_url, **kw)


both = pytest.mark.parametrize("fake_cls", [FakeAnthropic, FakeOpenAI], ids=["anthropic", "openai"])


def two_step_script() -> list[Any]:
    return [
        tool_call(
            "run_experiment", ARGS, text="Trying a config.", input_tokens=120, output_tokens=30
        ),
        final_text("Submitted.", input_tokens=200, output_tokens=7),
    ]


async def run_two_steps(
    provider: AnthropicProvider | OpenAIProvider,
) -> tuple[list[Message], Any, Any]:
    history: list[Message] = [UserMessage(text="Tune the server.")]
    first = await provider.complete(SYSTEM, history, TOOLS, max_tokens=512)
    call = first.tool_calls[0]
    history += [
        first.to_message(),
        ToolResultsMessage(results=[ToolResult(tool_call_id=call.id, content="throughput 123.4")]),
    ]
    second = await provider.complete(SYSTEM, history, TOOLS, max_tokens=512, temperature=0.5)
    return history, first, second


# --------------------------------------------------------------------------- round trips


async def test_anthropic_round_trip() -> None:
    async with FakeAnthropic(two_step_script(), api_key=KEY) as fake:
        provider = make_provider(fake)
        assert isinstance(provider, Provider)
        async with provider:
            _, first, second = await run_two_steps(provider)

    assert first.text == "Trying a config."
    assert first.stop_reason == "tool_use"
    assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
        ("toolu_fake_000_0", "run_experiment", ARGS)
    ]
    assert first.tool_calls[0].arguments_error is None
    assert first.usage == Usage(input_tokens=120, output_tokens=30)
    assert first.model == "claude-sonnet-4-6" and first.attempts == 1 and first.latency_s > 0
    assert first.raw["id"] == "msg_fake_000"
    assert (second.text, second.stop_reason, second.tool_calls) == ("Submitted.", "end_turn", [])
    assert second.usage == Usage(input_tokens=200, output_tokens=7)

    body0, body1 = fake.bodies()
    assert body0["system"] == SYSTEM and body0["max_tokens"] == 512
    assert body0["tools"] == [
        {
            "name": "run_experiment",
            "description": TOOLS[0].description,
            "input_schema": TOOLS[0].parameters,
        }
    ]
    assert "temperature" not in body0 and body1["temperature"] == 0.5
    assert body0["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Tune the server."}]}
    ]
    # The assistant's tool_use goes back, answered by a tool_result in the next user turn.
    assistant, results = body1["messages"][1:]
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Trying a config."},
            {"type": "tool_use", "id": "toolu_fake_000_0", "name": "run_experiment", "input": ARGS},
        ],
    }
    assert results == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_fake_000_0",
                "content": "throughput 123.4",
            }
        ],
    }
    # The key travels in its header only.
    assert [r.api_key for r in fake.requests] == [KEY, KEY]
    assert all(KEY not in r.text for r in fake.requests)
    assert KEY not in repr(provider) and KEY not in json.dumps(first.raw)


async def test_openai_round_trip() -> None:
    async with FakeOpenAI(two_step_script(), api_key=KEY) as fake:
        provider = make_provider(fake)
        async with provider:
            _, first, second = await run_two_steps(provider)

    assert first.text == "Trying a config."
    assert first.stop_reason == "tool_use"
    assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
        ("call_fake_000_0", "run_experiment", ARGS)
    ]
    assert first.usage == Usage(input_tokens=120, output_tokens=30)
    assert (second.text, second.stop_reason, second.tool_calls) == ("Submitted.", "end_turn", [])
    assert second.usage == Usage(input_tokens=200, output_tokens=7)

    body0, body1 = fake.bodies()
    assert body0["max_completion_tokens"] == 512 and "max_tokens" not in body0
    assert body0["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "run_experiment",
                "description": TOOLS[0].description,
                "parameters": TOOLS[0].parameters,
            },
        }
    ]
    assert body0["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Tune the server."},
    ]
    assistant, tool = body1["messages"][2:]
    assert assistant["role"] == "assistant" and assistant["content"] == "Trying a config."
    [sent_call] = assistant["tool_calls"]
    assert sent_call["id"] == "call_fake_000_0"
    assert json.loads(sent_call["function"]["arguments"]) == ARGS
    assert tool == {
        "role": "tool",
        "tool_call_id": "call_fake_000_0",
        "content": "throughput 123.4",
    }
    assert [r.api_key for r in fake.requests] == [KEY, KEY]
    assert all(KEY not in r.text for r in fake.requests)


async def test_openai_compatible_placeholder_key_and_max_tokens_field() -> None:
    key = resolve_api_key("openai-compatible", allow_placeholder=True, environ={})
    assert key == PLACEHOLDER_API_KEY
    async with (
        FakeOpenAI([final_text("hi")]) as fake,
        OpenAIProvider(
            "qwen3-8b",
            key,
            base_url=fake.base_url,
            name="openai-compatible",
            max_tokens_field="max_tokens",
        ) as provider,
    ):
        turn = await provider.complete("", [UserMessage(text="hello")], [], max_tokens=16)
    assert turn.text == "hi" and provider.name == "openai-compatible"
    [body] = fake.bodies()
    assert body["max_tokens"] == 16 and "max_completion_tokens" not in body
    assert "tools" not in body and body["messages"] == [{"role": "user", "content": "hello"}]
    assert fake.requests[0].api_key == "EMPTY"


# --------------------------------------------------------------------------- retries and errors


@both
async def test_rate_limited_twice_then_success(fake_cls: FakeKind) -> None:
    events: list[RetryEvent] = []
    sleeps = Sleeps()
    retry = RetryPolicy(max_retries=3, base_delay_s=1.0, max_delay_s=30.0)
    faults = [Fault.rate_limited(2, retry_after_s=4.0)]
    async with (
        fake_cls([final_text("ok")], faults=faults) as fake,
        make_provider(fake, retry=retry, sleep=sleeps, on_retry=events.append) as p,
    ):
        turn = await p.complete(SYSTEM, [UserMessage(text="go")], TOOLS, max_tokens=64)
    assert turn.text == "ok"
    assert turn.attempts == 3
    assert [r.status for r in fake.requests] == [429, 429, 200]  # no SDK-level retries
    assert len(sleeps.delays) == 2 and all(d >= 4.0 for d in sleeps.delays)  # retry-after
    assert turn.retry_wait_s == pytest.approx(sum(sleeps.delays))
    assert [(e.attempt, e.status) for e in events] == [(1, 429), (2, 429)]


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=10.0, jitter=0.5)
    rng = random.Random(1)
    delays = [policy.delay_s(n, rng, None) for n in range(6)]
    for n, d in enumerate(delays):
        cap = min(10.0, 2.0**n)
        assert cap / 2 <= d <= cap
    assert policy.delay_s(0, rng, retry_after_s=100.0) == 10.0  # retry-after, capped
    same = [RetryPolicy().delay_s(n, random.Random(7), None) for n in range(3)]
    assert same == [RetryPolicy().delay_s(n, random.Random(7), None) for n in range(3)]


@both
async def test_server_error_forever_is_unavailable(fake_cls: FakeKind) -> None:
    sleeps = Sleeps()
    async with (
        fake_cls([final_text("never")], faults=[Fault.server_error()]) as fake,
        make_provider(fake, retry=RetryPolicy(max_retries=2), sleep=sleeps) as p,
    ):
        with pytest.raises(ProviderUnavailable) as info:
            await p.complete(SYSTEM, [UserMessage(text="go")], TOOLS, max_tokens=64)
    assert info.value.attempts == 3 and len(fake.requests) == 3 and len(sleeps.delays) == 2
    assert info.value.provider == p.name and "500" in info.value.reason
    assert "\n" not in str(info.value)


@both
async def test_timeout_is_retried(fake_cls: FakeKind) -> None:
    faults = [Fault.slow(5.0, count=1)]
    async with (
        fake_cls([final_text("late but fine")], faults=faults) as fake,
        make_provider(fake, timeout_s=0.2, retry=RetryPolicy(max_retries=1)) as p,
    ):
        turn = await p.complete(SYSTEM, [UserMessage(text="go")], TOOLS, max_tokens=64)
    assert turn.text == "late but fine" and turn.attempts == 2


GARBAGE = [
    ('"just a string"', "application/json"),  # the SDK hands back a str: was AttributeError
    ("<html>502 Bad Gateway</html>", "text/html"),
    ("null", "application/json"),
    ("[1, 2]", "application/json"),
    ("{}", "application/json"),  # missing every field
    ('{"choices": "x", "content": "y"}', "application/json"),  # the wrong shapes
    ('{"choices": [{"message": "hi"}], "content": [1, "a"]}', "application/json"),
    ('{"choices": [{"message": {"tool_calls": [1]}}], "content": [{"type": "tool_use"}],'
     ' "usage": {"input_tokens": "many", "prompt_tokens": "many"}}', "application/json"),
]  # fmt: skip


@both
@pytest.mark.parametrize(("body", "content_type"), GARBAGE)
async def test_a_garbage_answer_is_retried_then_unavailable(
    fake_cls: FakeKind, body: str, content_type: str
) -> None:
    sleeps = Sleeps()
    faults = [Fault.garbage(body, content_type=content_type)]
    async with (
        fake_cls([final_text("never")], faults=faults) as fake,
        make_provider(fake, retry=RetryPolicy(max_retries=2), sleep=sleeps) as p,
    ):
        with pytest.raises(ProviderUnavailable) as info:
            await p.complete(SYSTEM, [UserMessage(text="go")], TOOLS, max_tokens=64)
    assert info.value.attempts == 3 and len(fake.requests) == 3 and len(sleeps.delays) == 2
    assert all(r.status == 200 for r in fake.requests)
    assert "malformed response" in info.value.reason and "\n" not in str(info.value)
    assert KEY not in str(info.value)


@both
async def test_one_garbage_answer_then_a_good_one(fake_cls: FakeKind) -> None:
    faults = [Fault.garbage('"oops"', count=1)]
    async with (
        fake_cls([final_text("fine")], faults=faults) as fake,
        make_provider(fake, retry=RetryPolicy(max_retries=1)) as p,
    ):
        turn = await p.complete(SYSTEM, [UserMessage(text="go")], TOOLS, max_tokens=64)
    assert turn.text == "fine" and turn.attempts == 2


@both
async def test_a_hung_provider_times_out_each_try_then_is_unavailable(fake_cls: FakeKind) -> None:
    t0 = time.monotonic()
    async with (
        fake_cls([final_text("never")], faults=[Fault.hung()]) as fake,
        make_provider(fake, timeout_s=0.3, retry=RetryPolicy(max_retries=1)) as p,
    ):
        with pytest.raises(ProviderUnavailable, match=r"timed out after 0\.3 s") as info:
            await p.complete(SYSTEM, [UserMessage(text="go")], TOOLS, max_tokens=64)
        assert len(fake.requests) == 2
    assert info.value.attempts == 2
    assert time.monotonic() - t0 < 5  # two tries of 0.3 s, not 600 s x 7


@both
async def test_connection_refused_is_unavailable(fake_cls: FakeKind) -> None:
    async with fake_cls([]) as fake:
        provider = make_provider(fake, retry=RetryPolicy(max_retries=1))
    # The server is gone: nothing listens on its port any more.
    async with provider:
        with pytest.raises(ProviderUnavailable, match="could not connect"):
            await provider.complete(SYSTEM, [UserMessage(text="go")], TOOLS, max_tokens=64)


@both
async def test_bad_key_is_one_line_naming_the_variable(fake_cls: FakeKind) -> None:
    wrong = "sk-wrong-0000-key"
    async with (
        fake_cls([final_text("never")], api_key=KEY) as fake,
        make_provider(fake, key=wrong, api_key_env="MY_LLM_KEY") as p,
    ):
        with pytest.raises(ProviderError) as info:
            await p.complete(SYSTEM, [UserMessage(text="go")], TOOLS, max_tokens=64)
    message = str(info.value)
    assert isinstance(info.value, UserError) and info.value.status == 401
    assert "MY_LLM_KEY" in message and "401" in message and "\n" not in message
    assert wrong not in message and KEY not in message
    assert len(fake.requests) == 1  # not retried


@both
async def test_default_key_variable_named_on_401(fake_cls: FakeKind) -> None:
    async with (
        fake_cls([final_text("never")], api_key=KEY) as fake,
        make_provider(fake, key="nope") as p,
    ):
        with pytest.raises(ProviderError) as info:
            await p.complete(SYSTEM, [UserMessage(text="go")], TOOLS, max_tokens=64)
    expected = "ANTHROPIC_API_KEY" if fake_cls is FakeAnthropic else "OPENAI_API_KEY"
    assert expected in str(info.value)


@both
async def test_bad_request_is_not_retried(fake_cls: FakeKind) -> None:
    # A tool call left unanswered: the fake, like the real API, answers 400.
    unanswered = AssistantMessage(tool_calls=[ToolCall(id="t1", name="run_experiment")])
    history: list[Message] = [UserMessage(text="go"), unanswered, UserMessage(text="well?")]
    async with fake_cls([final_text("never")]) as fake, make_provider(fake) as p:
        with pytest.raises(ProviderError) as info:
            await p.complete(SYSTEM, history, TOOLS, max_tokens=64)
    assert info.value.status == 400 and "t1" in str(info.value)
    assert len(fake.requests) == 1


@both
async def test_script_exhausted_is_a_clear_error(fake_cls: FakeKind) -> None:
    async with fake_cls([]) as fake, make_provider(fake) as p:
        with pytest.raises(ProviderError, match="script is exhausted"):
            await p.complete(SYSTEM, [UserMessage(text="go")], TOOLS, max_tokens=64)


# --------------------------------------------------------------------------- malformed arguments


async def test_openai_malformed_arguments_are_an_error_value() -> None:
    broken = '{"config": {"max_num_seqs": 64'
    script = [tool_call("run_experiment", broken), final_text("fixed")]
    async with FakeOpenAI(script) as fake, make_provider(fake) as p:
        history: list[Message] = [UserMessage(text="go")]
        turn = await p.complete(SYSTEM, history, TOOLS, max_tokens=64)
        [call] = turn.tool_calls
        assert call.arguments == {} and call.raw_arguments == broken
        assert call.arguments_error is not None and "not valid JSON" in call.arguments_error
        history += [
            turn.to_message(),
            ToolResultsMessage(
                results=[
                    ToolResult(tool_call_id=call.id, content=call.arguments_error, is_error=True)
                ]
            ),
        ]
        again = await p.complete(SYSTEM, history, TOOLS, max_tokens=64)
    assert again.text == "fixed"
    # The model's own (broken) arguments are sent back as it wrote them.
    assistant = fake.bodies()[1]["messages"][2]
    assert assistant["tool_calls"][0]["function"]["arguments"] == broken


async def test_openai_non_object_arguments_are_an_error_value() -> None:
    async with (
        FakeOpenAI([tool_call("run_experiment", "[1, 2]")]) as fake,
        make_provider(fake) as p,
    ):
        turn = await p.complete(SYSTEM, [UserMessage(text="go")], TOOLS, max_tokens=64)
    assert turn.tool_calls[0].arguments_error == "the arguments must be a JSON object, got list"


# --------------------------------------------------------------------------- history conversion


def test_anthropic_history_merges_user_turns_results_first_and_keeps_native_blocks() -> None:
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    native = [thinking, {"type": "tool_use", "id": "a", "name": "describe_task", "input": {}}]
    history: list[Message] = [
        UserMessage(text="go"),
        AssistantMessage(
            tool_calls=[ToolCall(id="a", name="describe_task")],
            native_provider="anthropic",
            native_content=native,
        ),
        ToolResultsMessage(results=[ToolResult(tool_call_id="a", content="", is_error=True)]),
        UserMessage(text="20 minutes left"),
    ]
    wire = anthropic_request_messages(history)
    assert [m["role"] for m in wire] == ["user", "assistant", "user"]
    assert wire[1]["content"] == native  # signed thinking block sent back unchanged
    assert wire[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "a", "content": "(no output)", "is_error": True},
        {"type": "text", "text": "20 minutes left"},
    ]
    # Another provider's turn is rebuilt from the neutral fields.
    foreign = AssistantMessage(text="", tool_calls=[ToolCall(id="b", name="x", arguments={"k": 1})])
    assert anthropic_request_messages([UserMessage(text="go"), foreign])[1]["content"] == [
        {"type": "tool_use", "id": "b", "name": "x", "input": {"k": 1}}
    ]
    # ... and OpenAI ignores Anthropic's native blocks.
    assert openai_request_messages("", history)[1]["tool_calls"][0]["function"] == {
        "name": "describe_task",
        "arguments": "{}",
    }


def test_messages_round_trip_through_json() -> None:
    from pydantic import TypeAdapter

    adapter = TypeAdapter(list[Message])
    history: list[Message] = [
        UserMessage(text="go"),
        AssistantMessage(text="t", tool_calls=[ToolCall(id="a", name="n", arguments={"x": 1})]),
        ToolResultsMessage(results=[ToolResult(tool_call_id="a", content="r")]),
    ]
    assert adapter.validate_json(adapter.dump_json(history)) == history


# --------------------------------------------------------------------------- keys and cost


def test_missing_key_is_one_user_error_line() -> None:
    with pytest.raises(UserError) as info:
        resolve_api_key("anthropic", environ={})
    assert "ANTHROPIC_API_KEY" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(UserError, match="MY_VAR"):
        resolve_api_key("openai", "MY_VAR", environ={"OPENAI_API_KEY": "x", "MY_VAR": "  "})
    with pytest.raises(UserError, match="OPENAI_API_KEY"):
        resolve_api_key("openai", environ={})
    assert resolve_api_key("openai", environ={"OPENAI_API_KEY": " sk-1 \n"}) == "sk-1"
    assert resolve_api_key("openai-compatible", "LOCAL", environ={"LOCAL": "k"}) == "k"


def test_cost_of_known_and_unknown_models() -> None:
    million = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert cost_of(million, "claude-sonnet-4-5") == pytest.approx(3.0 + 15.0)
    assert cost_of(million, "claude-sonnet-4-5-20250929") == pytest.approx(18.0)
    assert cost_of(million, "gpt-4.1-2025-04-14") == pytest.approx(2.0 + 8.0)
    assert cost_of(million, "qwen3-8b") is None and price_for("qwen3-8b") is None
    cached = Usage(input_tokens=1_000_000, cache_read_tokens=800_000, output_tokens=0)
    assert cost_of(cached, "claude-sonnet-4-5") == pytest.approx(0.2 * 3.0 + 0.8 * 0.30)
    assert cost_of(Usage(), "gpt-4.1") == 0.0


def test_price_table_file_errors_are_user_errors(tmp_path: Any) -> None:
    bad = tmp_path / "prices.toml"
    bad.write_text('[models."m"]\ninput = -1\noutput = 2\n')
    with pytest.raises(UserError, match=r"models\.m\.input"):
        load_price_table(bad)
    good = tmp_path / "ok.toml"
    good.write_text('[models."m"]\ninput = 1\noutput = 2\naliases = ["m-latest"]\n')
    table = load_price_table(good)
    assert cost_of(Usage(output_tokens=500_000), "m-latest", table) == pytest.approx(1.0)
