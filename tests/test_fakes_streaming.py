"""The streaming fakes, driven by the real SDK clients: Anthropic Messages with server-sent
events and tool use (what Claude Code speaks), the OpenAI Responses API streamed (what Codex
CLI speaks), and the side requests a coding CLI makes beside its loop; the Gemini API
(``streamGenerateContent?alt=sse``, what Gemini CLI speaks) over plain HTTP, since ServeGym
has no Gemini SDK (the real CLI drives it in ``tests/test_cli_agents_docker.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from servegym.providers.fakes import (
    SIDE_TEXT,
    FakeAnthropic,
    FakeGemini,
    FakeOpenAIResponses,
    ScriptedToolCall,
    ScriptStep,
    final_text,
    load_script,
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


EXEC_TOOLS = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("exec_command", "write_stdin")
]


async def test_responses_fake_polls_a_running_codex_session_like_a_model() -> None:
    """Codex hands a command still running after its wait to a session; the fake polls it
    with ``write_stdin`` until it exits, and only then takes the script's next step."""
    script = [
        tool_call("exec_command", {"cmd": "servegym-agent benchmark"}),
        final_text("Benchmarked."),
    ]
    async with FakeOpenAIResponses(script) as fake:
        client = openai.AsyncOpenAI(api_key="placeholder", base_url=fake.base_url)
        items: list[Any] = [{"role": "user", "content": "tune it"}]
        polled: list[int] = []
        outputs = [
            "Chunk ID: a1\nWall time: 30.0 seconds\nProcess running with session ID 4242\n"
            "Original token count: 0\nOutput:\n",
            [{"type": "input_text", "text": "Process running with session ID 4242\nOutput:\n"}],
            "Chunk ID: a3\nWall time: 12.5 seconds\nProcess exited with code 0\nOutput:\nok\n",
        ]
        answer = await client.responses.create(model="gpt-fake", input=items, tools=EXEC_TOOLS)
        for output in outputs:
            (call,) = [o for o in answer.output if o.type == "function_call"]
            if call.name == "write_stdin":
                polled.append(json.loads(call.arguments)["session_id"])
            items += [
                call.model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": call.call_id, "output": output},
            ]
            answer = await client.responses.create(model="gpt-fake", input=items, tools=EXEC_TOOLS)
        assert polled == [4242, 4242]
        assert answer.output_text == "Benchmarked."
        assert fake.exhausted and fake.follow_ups == 2 and fake.steps_served == 2
        # without write_stdin on offer, a running session is the script's business
        items[-1] = {**items[-1], "output": outputs[0]}
        with pytest.raises(openai.BadRequestError, match="script is exhausted"):
            await client.responses.create(model="gpt-fake", input=items, tools=EXEC_TOOLS[:1])


def test_command_line_names_the_apis(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "openai-responses" in out and "gemini" in out and "--script-only" in out


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


# --------------------------------------------------------------------------- Gemini

SHELL_DECLARATION = {
    "functionDeclarations": [
        {
            "name": "run_shell_command",
            "description": "run a command",
            "parametersJsonSchema": {"type": "object", "properties": {"command": {}}},
        }
    ]
}


async def sse_chunks(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    """The ``data:`` objects of a server-sent event stream, as the genai SDK reads them."""
    text = await response.text()
    return [
        json.loads(line[5:])
        for block in text.split("\n\n")
        for line in block.splitlines()
        if line.startswith("data:")
    ]


async def test_gemini_streams_a_function_call_then_text() -> None:
    script = [
        tool_call(
            "run_shell_command",
            {"command": "servegym-agent budget"},
            text="Checking.",
            input_tokens=500,
            output_tokens=12,
        ),
        final_text("Done.", input_tokens=600, output_tokens=3),
    ]
    user = {"role": "user", "parts": [{"text": "tune it"}]}
    async with FakeGemini(script, api_key="g-key") as fake, aiohttp.ClientSession() as http:
        url = fake.url + "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
        body = {"contents": [user], "tools": [SHELL_DECLARATION]}
        async with http.post(url, json=body, headers={"x-goog-api-key": "g-key"}) as r:
            assert r.status == 200 and r.content_type == "text/event-stream"
            chunks = await sse_chunks(r)
        parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
        assert parts[0] == {"text": "Checking."}
        call = parts[1]["functionCall"]
        assert call == {"name": "run_shell_command", "args": {"command": "servegym-agent budget"}}
        assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
        assert "finishReason" not in chunks[0]["candidates"][0]
        usage = chunks[-1]["usageMetadata"]
        assert (usage["promptTokenCount"], usage["candidatesTokenCount"]) == (500, 12)

        answered = [
            user,
            {"role": "model", "parts": parts},
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": call["name"], "response": {"ok": 1}}}],
            },
        ]
        plain = fake.url + "/v1beta/models/gemini-2.5-pro:generateContent?key=g-key"
        async with http.post(plain, json={**body, "contents": answered}) as r:
            done = await r.json()
        assert r.status == 200
        assert done["candidates"][0]["content"]["parts"] == [{"text": "Done."}]
        assert done["usageMetadata"]["candidatesTokenCount"] == 3
        assert fake.exhausted and len(fake.bodies()) == 2

        async with http.post(url, json=body, headers={"x-goog-api-key": "wrong"}) as r:
            refused = await r.json()
        assert r.status == 401 and refused["error"]["status"] == "UNAUTHENTICATED"


async def test_gemini_refuses_an_unanswered_function_call_like_the_api() -> None:
    async with FakeGemini([final_text("x")]) as fake, aiohttp.ClientSession() as http:
        contents = [
            {"role": "user", "parts": [{"text": "go"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "run_shell_command"}}]},
            {"role": "user", "parts": [{"text": "and?"}]},
        ]
        url = fake.url + "/v1beta/models/m:generateContent"
        async with http.post(url, json={"contents": contents}) as r:
            error = await r.json()
        assert r.status == 400 and error["error"]["status"] == "INVALID_ARGUMENT"
        assert "number of function response parts" in error["error"]["message"]
        async with http.post(url, json={"contents": []}) as r:
            assert r.status == 400
        assert fake.steps_served == 0


async def test_gemini_side_requests_and_token_counting_leave_the_script_alone() -> None:
    """Gemini CLI's model router and next-speaker check ask for JSON by a schema, with no
    function offered: they get the least object the schema allows (a text would not parse,
    and the CLI would retry for minutes); ``countTokens`` is answered with an estimate."""
    schema = {
        "type": "OBJECT",
        "properties": {
            "reasoning": {"type": "STRING"},
            "next_speaker": {"type": "STRING", "enum": ["user", "model"]},
            "score": {"type": "INTEGER"},
            "extra": {"type": "ARRAY"},
        },
        "required": ["reasoning", "next_speaker", "score"],
    }
    side = {
        "contents": [{"role": "user", "parts": [{"text": "who speaks next?"}]}],
        "generationConfig": {"responseMimeType": "application/json", "responseJsonSchema": schema},
    }
    async with (
        FakeGemini([final_text("the one step")], side_requests=True) as fake,
        aiohttp.ClientSession() as http,
    ):
        base = fake.url + "/v1beta/models/gemini-2.5-flash-lite"
        async with http.post(base + ":generateContent", json=side) as r:
            answer = await r.json()
        text = answer["candidates"][0]["content"]["parts"][0]["text"]
        assert json.loads(text) == {"reasoning": SIDE_TEXT, "next_speaker": "user", "score": 1}
        untyped = {"contents": side["contents"], "tools": [{"functionDeclarations": []}]}
        async with http.post(base + ":generateContent", json=untyped) as r:
            plain = await r.json()
        assert plain["candidates"][0]["content"]["parts"] == [{"text": SIDE_TEXT}]
        async with http.post(base + ":countTokens", json={"contents": [{"parts": []}] * 40}) as r:
            counted = await r.json()
        assert counted["totalTokens"] > 100
        body = {"contents": side["contents"], "tools": [SHELL_DECLARATION]}
        async with http.post(base + ":generateContent", json=body) as r:
            step = await r.json()
        assert step["candidates"][0]["content"]["parts"] == [{"text": "the one step"}]
    assert fake.side_answers == 2 and fake.steps_served == 1


def test_the_replay_scripts_call_each_clis_shell_tool() -> None:
    """``agents/scripts/CLI-fake.json`` (docs/agents.md's replay without a key): each
    loads, and calls the shell tool its CLI offers (a tool the request does not offer is a
    400); the tool names are the ones the real CLIs' trials found."""
    shells = {
        "claude-code": "Bash",
        "codex": "exec_command",
        "gemini-cli": "run_shell_command",
        "opencode": "bash",
    }
    folder = Path(__file__).parents[1] / "agents" / "scripts"
    for cli, tool in shells.items():
        script = load_script(folder / f"{cli}-fake.json")
        calls = [c for step in script for c in step.tool_calls]
        assert calls and {c.name for c in calls} == {tool}, cli
        assert isinstance(calls[-1].arguments, dict)
        assert "servegym-agent submit" in json.dumps(calls[-1].arguments), cli
