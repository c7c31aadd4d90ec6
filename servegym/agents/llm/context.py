"""Context management for the tool loop: when the conversation nears the model's context
limit, older tool results are shortened (their head kept, the rest replaced by a note), so a
long run keeps going instead of failing on an over-long prompt. The latest results are kept
whole: they are what the model is reasoning about."""

from __future__ import annotations

from servegym.providers.types import Message, ToolResult, ToolResultsMessage

KEEP_RECENT = 2
"""Tool-result messages at the end of the conversation that are never shortened."""
KEEP_CHARS = 300
"""What a shortened result keeps of its head."""


def needs_trimming(context_tokens: int, limit_tokens: int, fraction: float = 0.7) -> bool:
    """Whether a conversation of ``context_tokens`` (the last call's prompt plus answer) is
    close enough to ``limit_tokens`` to shorten."""
    return context_tokens >= fraction * limit_tokens


def shorten_old_results(
    messages: list[Message], *, keep_recent: int = KEEP_RECENT, keep_chars: int = KEEP_CHARS
) -> tuple[list[Message], int]:
    """``messages`` with every tool result older than the last ``keep_recent`` result
    messages cut to ``keep_chars`` characters; returns the new list and the characters
    removed. Results already shortened stay as they are; the input is not changed."""
    result_positions = [i for i, m in enumerate(messages) if isinstance(m, ToolResultsMessage)]
    old = set(result_positions[:-keep_recent] if keep_recent else result_positions)
    out: list[Message] = []
    removed = 0
    for i, m in enumerate(messages):
        if i not in old or not isinstance(m, ToolResultsMessage):
            out.append(m)
            continue
        results = []
        for r in m.results:
            if len(r.content) > keep_chars + 100:
                cut = len(r.content) - keep_chars
                removed += cut
                text = f"{r.content[:keep_chars]}\n[... {cut} characters shortened to save context]"
                results.append(
                    ToolResult(tool_call_id=r.tool_call_id, content=text, is_error=r.is_error)
                )
            else:
                results.append(r)
        out.append(ToolResultsMessage(results=results))
    return out, removed
