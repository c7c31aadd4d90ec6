"""The pipeline's LLM calls: one non-streamed ``/v1/completions`` request each.

The output length is forced (``max_tokens`` with ``ignore_eos``), so a stage's cost depends
on the server and the prompt, not on what a random-weight model happens to say.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from servegym.errors import UserError

REQUEST_TIMEOUT_S = 600.0


class LLMCallError(UserError):
    """An LLM stage's request failed (unreachable server, HTTP error, malformed answer)."""


def new_session(timeout_s: float = REQUEST_TIMEOUT_S) -> aiohttp.ClientSession:
    """A session with no connection cap (the pipeline's concurrency knob is the cap)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    )


async def complete(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    model: str,
    prompt: str,
    max_tokens: int,
    what: str,
) -> str:
    """The completion's text; :class:`LLMCallError` naming ``what`` when it fails."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": False,
    }
    url = base_url.rstrip("/") + "/v1/completions"
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200]
                raise LLMCallError(f"{what}: {url} answered HTTP {resp.status}: {text}")
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise LLMCallError(f"{what}: {url}: {type(exc).__name__}: {exc}") from None
    except ValueError:
        raise LLMCallError(f"{what}: {url} answered something that is not JSON") from None
    try:
        return str(data["choices"][0]["text"])
    except (KeyError, IndexError, TypeError):
        raise LLMCallError(f"{what}: {url} answered without choices[0].text") from None
