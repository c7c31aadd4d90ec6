"""The key proxy's cost meter: each provider's usage read off JSON answers and server-sent
events as they pass, added up per trial (tokens, dollars, calls per model)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import anthropic
import openai

from servegym.agents.cli.proxy import KeyProxy
from servegym.agents.cli.usage import CostMeter, UsageReader, billed, request_model
from servegym.providers.fakes import (
    FakeAnthropic,
    FakeGemini,
    FakeOpenAIResponses,
    ScriptStep,
    final_text,
    tool_call,
)


def sse(events: list[tuple[str | None, dict[str, Any]]]) -> bytes:
    return b"".join(
        (f"event: {e}\n" if e else "").encode() + f"data: {json.dumps(d)}\n\n".encode()
        for e, d in events
    )


def read(provider: Any, content_type: str, data: bytes, cut: int = 7) -> Any:
    reader = UsageReader(provider, content_type)
    for i in range(0, len(data), cut):  # in pieces, as a stream arrives
        reader.feed(data[i : i + cut])
    return reader.usage()


def test_anthropic_stream_and_json() -> None:
    fake = FakeAnthropic([])
    step = ScriptStep(text="hi", input_tokens=1000, output_tokens=40, cache_read_tokens=600)
    events = fake.events(step, 0, {"model": "m"}, 10)
    usage = read("anthropic", "text/event-stream; charset=utf-8", sse(events))
    # Anthropic's input_tokens leaves cache reads out; the meter wants the whole prompt.
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (1000, 40, 600)
    body = json.dumps(fake.render(step, 0, {"model": "m"}, 10)).encode()
    assert read("anthropic", "application/json", body) == usage


def test_responses_stream_chat_json_and_gemini() -> None:
    fake = FakeOpenAIResponses([])
    step = ScriptStep(text="ok", input_tokens=500, output_tokens=9, cache_read_tokens=100)
    usage = read("openai", "text/event-stream", sse(fake.events(step, 0, {"model": "g"}, 1)))
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (500, 9, 100)
    chat = {"usage": {"prompt_tokens": 7, "completion_tokens": 3}}
    assert read("openai", "application/json", json.dumps(chat).encode()).input_tokens == 7
    chunks = (
        b'data: {"choices": []}\n\ndata: ' + json.dumps(chat).encode() + b"\n\ndata: [DONE]\n\n"
    )
    assert read("openai", "text/event-stream", chunks).output_tokens == 3
    gemini = {"usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 2,
                                "thoughtsTokenCount": 5}}  # fmt: skip
    assert read("gemini", "text/event-stream", sse([(None, gemini)])).output_tokens == 7
    assert read("openai", "application/json", b"not json") is None
    assert read("anthropic", "text/event-stream", b"event: ping\ndata: {}\n\n") is None


def test_billed_paths_and_models() -> None:
    assert billed("/v1/messages") and billed("/v1/responses") and billed("/v1/chat/completions")
    assert billed("/v1beta/models/gemini-2.5-pro:streamGenerateContent")
    assert not billed("/v1/messages/count_tokens") and not billed("/v1/models")
    assert request_model("anthropic", "/v1/messages", b'{"model": "claude-x"}') == "claude-x"
    assert request_model("gemini", "/v1beta/models/gemini-2.5-pro:generateContent", b"") == (
        "gemini-2.5-pro"
    )
    assert request_model("openai", "/v1/responses", b"[") == ""


def test_meter_prices_known_models_and_gives_up_dollars_on_unknown() -> None:
    from servegym.providers.types import Usage

    meter = CostMeter("claude-sonnet-4-5")
    meter.add("claude-sonnet-4-5", Usage(input_tokens=1_000_000, output_tokens=0))
    priced = meter.summary()
    assert priced["calls"] == 1 and priced["dollars"] > 0
    meter.add("a-model-without-a-price", Usage(input_tokens=1, output_tokens=1))
    summary = meter.summary()
    assert summary["dollars"] is None and summary["input_tokens"] == 1_000_001
    assert summary["calls_by_model"] == {"claude-sonnet-4-5": 1, "a-model-without-a-price": 1}


async def test_the_proxy_counts_streamed_calls_and_not_token_counting() -> None:
    """The real SDKs through the proxy to the fakes: every call's tokens counted once."""
    script = [tool_call("Bash", {"command": "ls"}, input_tokens=300, output_tokens=20)]
    async with (
        FakeAnthropic([*script, final_text("done", input_tokens=400)], side_requests=True) as up,
        KeyProxy("anthropic", "sk-real", upstream=up.url, client_token="tok") as proxy,
    ):
        client = anthropic.AsyncAnthropic(api_key="tok", base_url=proxy.url)
        tools: Any = [{"name": "Bash", "input_schema": {"type": "object"}}]
        async with client.messages.stream(
            model="claude-sonnet-4-5", max_tokens=50, tools=tools,
            messages=[{"role": "user", "content": "go"}],
        ) as stream:  # fmt: skip
            first = await stream.get_final_message()
        await client.messages.count_tokens(
            model="claude-sonnet-4-5", messages=[{"role": "user", "content": "x"}]
        )
        await client.messages.create(
            model="claude-haiku-4-5", max_tokens=5, messages=[{"role": "user", "content": "t"}]
        )
    assert first.stop_reason == "tool_use"
    cost = proxy.meter.summary()
    assert cost["calls"] == 2  # the loop's call and the side call; count_tokens is free
    assert cost["calls_by_model"] == {"claude-sonnet-4-5": 1, "claude-haiku-4-5": 1}
    assert cost["input_tokens"] >= 300 and cost["output_tokens"] >= 20
    assert all(r.api_key == "sk-real" for r in up.requests)

    step = ScriptStep(text="fine", input_tokens=70, output_tokens=6)
    async with (
        FakeOpenAIResponses([step]) as up,
        KeyProxy("openai", "sk-real", upstream=up.url) as proxy,
    ):
        oa = openai.AsyncOpenAI(api_key="placeholder", base_url=proxy.url + "/v1")
        stream = await oa.responses.create(model="gpt-5", input="hi", stream=True)
        async for _ in stream:
            pass
    assert proxy.meter.summary()["input_tokens"] == 70
    assert proxy.meter.summary()["output_tokens"] == 6


async def test_the_proxy_counts_gemini_streams_and_prices_them() -> None:
    """Gemini CLI's calls: streamed, the key in ``x-goog-api-key``; ``countTokens`` free."""
    step = tool_call("run_shell_command", {"command": "ls"}, input_tokens=2000, output_tokens=50)
    async with (
        FakeGemini([step], api_key="g-real", side_requests=True) as up,
        KeyProxy("gemini", "g-real", upstream=up.url + "/v1beta", client_token="tok") as proxy,
        aiohttp.ClientSession(headers={"x-goog-api-key": "tok"}) as http,
    ):
        base = proxy.url + "/v1beta/models/gemini-2.5-pro"
        body = {
            "contents": [{"role": "user", "parts": [{"text": "go"}]}],
            "tools": [{"functionDeclarations": [{"name": "run_shell_command"}]}],
        }
        async with http.post(base + ":streamGenerateContent?alt=sse", json=body) as r:
            assert r.status == 200 and "functionCall" in await r.text()
        async with http.post(base + ":countTokens", json=body) as r:
            assert r.status == 200
    cost = proxy.meter.summary()
    assert cost["calls"] == 1 and cost["calls_by_model"] == {"gemini-2.5-pro": 1}
    assert (cost["input_tokens"], cost["output_tokens"]) == (2000, 50)
    assert cost["dollars"] is not None and cost["dollars"] > 0  # pricing.toml lists it
    assert all(r.api_key == "g-real" for r in up.requests)
