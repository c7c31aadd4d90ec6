"""The streaming fakes, driven by the real SDK clients: Anthropic Messages with server-sent
events and tool use (what Claude Code speaks), the OpenAI Responses API streamed (what Codex
CLI speaks), and the side requests a coding CLI makes beside its loop."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from servegym.providers.fakes import (
    FakeAnthropic,
    FakeOpenAIResponses,
    ScriptedToolCall,
    ScriptStep,
    final_text,
    main,
    tool_call,
)

BASH = {
    "name": "Bash",
    "description": "run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "array"}}},
}


async def test_anthropic_streams_text_and_tool_use_through_the_sdk() -> None:
    script = [
        tool_call("Bash", {"command": "servegym-agent benchmark --quick"}, text="Benchmarking."),
        final_text("Submitted.", output_tokens=7),
    ]
    async with FakeAnthropic(script) as fake:
        client = anthropic.AsyncAnthropic(api_key="placeholder", base_url=fake.base_url)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "tune it"}]
        async with client.messages.stream(
            model="claude-fake", max_tokens=100, messages=messages, tools=[BASH]
        ) as stream:
            texts = [t async for t in stream.text_stream]
            first = await stream.get_final_message()
        assert "".join(texts) == "Benchmarking."
        assert first.stop_reason == "tool_use"
        (use,) = [b for b in first.content if b.type == "tool_use"]
        assert use.name == "Bash" and use.input == {"command": "servegym-agent benchmark --quick"}
        assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0

        messages += [
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok"}],
            },
        ]
        async with client.messages.stream(
            model="claude-fake", max_tokens=100, messages=messages, tools=[BASH]
        ) as stream:
            second = await stream.get_final_message()
        assert second.stop_reason == "end_turn"
        assert second.content[0].type == "text" and second.content[0].text == "Submitted."
        assert second.usage.output_tokens == 7
        assert fake.exhausted and [r.status for r in fake.requests] == [200, 200]
        assert fake.requests[0].headers["content-type"].startswith("application/json")


async def test_anthropic_stream_refuses_a_dropped_tool_result_like_the_api() -> None:
    async with FakeAnthropic([tool_call("Bash", {"command": "ls"}, id="toolu_1")]) as fake:
        client = anthropic.AsyncAnthropic(
            api_key="placeholder", base_url=fake.base_url, max_retries=0
        )
        bad = [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}],
            },
            {"role": "user", "content": "and?"},
        ]
        with pytest.raises(anthropic.BadRequestError, match="toolu_1"):
            async with client.messages.stream(
                model="m", max_tokens=10, messages=bad, tools=[BASH]
            ) as stream:
                await stream.get_final_message()
        assert fake.steps_served == 0


async def test_side_requests_leave_the_script_alone() -> None:
    """A CLI's title and quota calls (no tools) and its token counting get harmless answers;
    the scripted steps go to the agent loop only."""
    async with FakeAnthropic([final_text("the one step")], side_requests=True) as fake:
        client = anthropic.AsyncAnthropic(api_key="placeholder", base_url=fake.base_url)
        title = await client.messages.create(
            model="claude-haiku", max_tokens=20, messages=[{"role": "user", "content": "title?"}]
        )
        async with client.messages.stream(
            model="claude-haiku",
            max_tokens=1,
            messages=[{"role": "user", "content": "quota"}],
        ) as stream:
            quota = await stream.get_final_message()
        counted = await client.messages.count_tokens(
            model="claude-fake", messages=[{"role": "user", "content": "x" * 400}]
        )
        loop = await client.messages.create(
            model="claude-fake",
            max_tokens=20,
            messages=[{"role": "user", "content": "go"}],
            tools=[BASH],  # type: ignore[list-item]
        )
    assert title.content[0].type == "text" and title.content[0].text
    assert quota.content[0].type == "text"
    assert counted.input_tokens > 100
    assert loop.content[0].type == "text" and loop.content[0].text == "the one step"
    assert fake.side_answers == 2 and fake.steps_served == 1


async def test_responses_api_streams_a_function_call_then_text_through_the_sdk() -> None:
    script = [
        ScriptStep(
            text="Running the benchmark.",
            tool_calls=[
                ScriptedToolCall(name="shell", arguments={"command": ["servegym-agent", "budget"]})
            ],
            input_tokens=120,
            output_tokens=30,
        ),
        final_text("Done.", input_tokens=200, output_tokens=5),
    ]
    async with FakeOpenAIResponses(script) as fake:
        client = openai.AsyncOpenAI(api_key="placeholder", base_url=fake.base_url)
        items: list[Any] = [{"role": "user", "content": "tune it"}]
        async with client.responses.stream(
            model="gpt-fake", input=items, tools=[SHELL], store=False
        ) as stream:
            kinds = [event.type async for event in stream]
            first = await stream.get_final_response()
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert "response.function_call_arguments.delta" in kinds
        assert first.output_text == "Running the benchmark."
        (call,) = [o for o in first.output if o.type == "function_call"]
        assert call.name == "shell"
        assert json.loads(call.arguments) == {"command": ["servegym-agent", "budget"]}
        assert first.usage is not None
        assert (first.usage.input_tokens, first.usage.output_tokens) == (120, 30)

        items += [
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "{}"},
        ]
        raw = await client.responses.create(
            model="gpt-fake",
            input=items,
            tools=[SHELL],
            stream=True,  # type: ignore[arg-type]
        )
        events = [event async for event in raw]
        done = events[-1]
        assert done.type == "response.completed"
        assert done.response.output_text == "Done."
        assert [e.sequence_number for e in events] == list(range(len(events)))

        with pytest.raises(openai.BadRequestError, match="No tool call found"):
            await client.responses.create(
                model="gpt-fake",
                input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}],
            )


def test_command_line_names_the_apis(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "openai-responses" in out and "--script-only" in out


async def test_unstreamed_side_request_through_plain_http() -> None:
    """Without the SDK: a body with no tools is a side request only when asked for."""
    async with FakeAnthropic([final_text("step")]) as fake:
        body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "t"}]}
        async with (
            aiohttp.ClientSession() as http,
            http.post(fake.url + "/v1/messages", json=body) as r,
        ):
            answer = await r.json()
        assert r.status == 200 and answer["content"][0]["text"] == "step"
        assert fake.side_answers == 0 and fake.steps_served == 1
