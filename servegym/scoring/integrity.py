"""Integrity by measurement: what the harness itself saw of a server's answers.

The load generator records every streamed chunk with its arrival time and the number of
output tokens the harness counted in it (token ids, or the task's tokenizer), separately
from what the server claims in ``usage``. These checks read those records and raise a
:class:`Finding` naming the check, the request and the evidence:

- ``empty_first_chunk``: a chunk carrying no output token (empty or whitespace) arrived
  before the first real token: the shape of a faked time to first token. The harness never
  counts such a chunk for TTFT anyway; the finding says someone tried.
- ``usage_overcount``: the server's ``usage.completion_tokens`` claims more tokens than the
  harness counted in the stream.
- ``short_output`` / ``long_output``: a completed request whose recounted output length is
  not the forced one (EOS honoured, ``ignore_eos`` or ``max_tokens`` dropped).

Each check is one function over the measured (non-warm-up) records, so a new check is one
function and one entry in :data:`CHECKS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from servegym.loadgen.records import RequestRecord, RunResult

HARNESS_COUNTED = ("token_ids", "tokenizer")
"""Recount sources the harness counted itself (``server_usage`` and ``chunks`` are not)."""


class Finding(BaseModel):
    """One integrity finding: the check, how many requests, the first one, the evidence."""

    model_config = ConfigDict(extra="forbid")

    check: str
    requests: int
    of: int
    request_id: str
    evidence: str
    subject: str = "request"
    """What ``request_id`` names and ``requests``/``of`` count (checks of an agent phase
    or a server name an action, a file or a connection)."""

    def text(self) -> str:
        plural = self.subject + ("es" if self.subject.endswith("s") else "s")
        return (
            f"{self.check}: {self.evidence} ({self.subject} {self.request_id}; "
            f"{self.requests} of {self.of} {plural})"
        )


Evidence = Callable[[RequestRecord], str | None]


def _empty_first_chunk(r: RequestRecord) -> str | None:
    if not r.empty_chunk_ns or r.first_token_ns is None or r.sent_ns is None:
        return None
    first_empty = min(r.empty_chunk_ns)
    if first_empty >= r.first_token_ns:
        return None
    return (
        f"a chunk without output tokens came {(first_empty - r.sent_ns) / 1e6:.1f} ms after "
        f"sending, the first token {(r.first_token_ns - r.sent_ns) / 1e6:.1f} ms after"
    )


def _usage_overcount(r: RequestRecord) -> str | None:
    claimed = r.usage_completion_tokens
    if claimed is None or r.recount_source not in HARNESS_COUNTED or not r.ok:
        return None
    if claimed <= r.output_tokens:
        return None
    return f"usage claims {claimed} completion tokens; the stream carried {r.output_tokens}"


def _short_output(r: RequestRecord) -> str | None:
    if not r.ok or r.recount_source not in HARNESS_COUNTED:
        return None
    if r.output_tokens >= r.expected_output_tokens:
        return None
    return f"{r.output_tokens} output tokens where {r.expected_output_tokens} were forced"


def _long_output(r: RequestRecord) -> str | None:
    if not r.ok or r.recount_source not in HARNESS_COUNTED:
        return None
    if r.output_tokens <= r.expected_output_tokens:
        return None
    return f"{r.output_tokens} output tokens where {r.expected_output_tokens} were forced"


CHECKS: dict[str, Evidence] = {
    "empty_first_chunk": _empty_first_chunk,
    "usage_overcount": _usage_overcount,
    "short_output": _short_output,
    "long_output": _long_output,
}


def measured(results: Iterable[RunResult]) -> list[RequestRecord]:
    return [r for result in results for r in result.records if not r.warmup]


def stream_findings(results: Sequence[RunResult]) -> list[Finding]:
    """Every check over every measured request of ``results``: one finding per check that
    caught anything, with the first request it caught."""
    records = measured(results)
    findings: list[Finding] = []
    for name, check in CHECKS.items():
        hits = [(r, ev) for r in records if (ev := check(r)) is not None]
        if hits:
            first, evidence = hits[0]
            findings.append(
                Finding(
                    check=name,
                    requests=len(hits),
                    of=len(records),
                    request_id=first.request_id,
                    evidence=evidence,
                )
            )
    return findings
