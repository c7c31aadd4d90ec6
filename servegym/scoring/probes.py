"""Probe verification: the reference model re-scores what the submission generated.

Every scoring request of a real-track evaluation is decoded greedily (the harness sends
temperature 0), so every answer is a probe: the server cannot tell which ones the harness
will check, because the harness picks them *after* the run, from a seed the server never
sees (:func:`servegym.reference.rescore.verify_probes`). For each probe the reference model
(float32, one sequence at a time) reads the prompt followed by the submission's output in
one prefill and reports, at every output position, the log-probability of the token the
submission chose and of its own greedy choice there (:class:`TokenScore`).

Why re-score instead of comparing with the reference's own greedy output: an honest change
of numerics (bfloat16, int8 KV cache) flips a near-tie somewhere, and from there greedy
decoding follows another, equally valid path; a comparison of whole outputs would then
judge the rest of the answer by a path the submission never took. Re-scoring asks, at each
position of the submission's own path, whether its token is the one the reference model
would have picked given the same prefix, up to the numerical tolerance ``max_gap`` (nats
between the reference's top log-probability and the chosen token's). So the whole length of
every probe is checked, an honest bfloat16 answer passes, and another model, a replayed
reply, a constant token or sampling at temperature > 0 picks tokens the reference ranks far
below its top.

The thresholds are per task (:class:`~servegym.tasks.spec.IntegritySpec`): a probe fails
when fewer than ``min_greedy_share`` of its tokens are within ``max_gap``; the check fails
when more than ``max_failed_share`` of the probes fail. Their measured honest and cheating
distributions are in ``docs/integrity.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servegym.scoring.integrity import Finding


@dataclass(frozen=True, slots=True)
class TokenScore:
    """One output position as the reference model scores it."""

    token: int
    logprob: float
    top_token: int
    top_logprob: float

    @property
    def gap(self) -> float:
        """Nats between the reference's greedy choice and the submitted token (0 if same)."""
        return 0.0 if self.token == self.top_token else max(0.0, self.top_logprob - self.logprob)


@dataclass(frozen=True, slots=True)
class ProbeTolerance:
    """When a probe, and the check as a whole, fail (see the module docstring)."""

    max_gap: float
    min_greedy_share: float
    max_failed_share: float


@dataclass(frozen=True, slots=True)
class ProbeVerdict:
    """One probe's re-scored output."""

    request_id: str
    tokens: int
    greedy: int
    """Positions where the submitted token is the reference's top one."""
    within: int
    """Positions whose gap is at most the tolerance (``greedy`` included)."""
    worst_position: int | None
    worst_gap: float

    @property
    def within_share(self) -> float:
        return self.within / self.tokens if self.tokens else 1.0

    @property
    def greedy_share(self) -> float:
        return self.greedy / self.tokens if self.tokens else 1.0


def judge(request_id: str, scores: Sequence[TokenScore], max_gap: float) -> ProbeVerdict:
    worst_i: int | None = None
    worst = 0.0
    for i, s in enumerate(scores):
        if s.gap > worst:
            worst_i, worst = i, s.gap
    return ProbeVerdict(
        request_id=request_id,
        tokens=len(scores),
        greedy=sum(1 for s in scores if s.token == s.top_token),
        within=sum(1 for s in scores if s.gap <= max_gap),
        worst_position=worst_i,
        worst_gap=worst,
    )


def probe_findings(
    verdicts: Sequence[ProbeVerdict], tolerance: ProbeTolerance, *, unverifiable: int = 0
) -> list[Finding]:
    """The ``probe_disagreement`` finding when too many probes fail, naming the worst one
    and its evidence; and ``probe_unverifiable`` when probes returned no token ids to
    re-score (a server must return what it generated)."""
    findings: list[Finding] = []
    failed = [v for v in verdicts if v.within_share < tolerance.min_greedy_share]
    if verdicts and len(failed) > tolerance.max_failed_share * len(verdicts):
        worst = min(failed, key=lambda v: (v.within_share, v.request_id))
        worst_at = ""
        if worst.worst_position is not None:
            worst_at = (
                f"; token {worst.worst_position} is {worst.worst_gap:.2f} nats below the "
                f"reference's top choice"
            )
        findings.append(
            Finding(
                check="probe_disagreement",
                requests=len(failed),
                of=len(verdicts),
                request_id=worst.request_id,
                evidence=(
                    f"{worst.within} of {worst.tokens} output tokens are the reference model's "
                    f"greedy choice within {tolerance.max_gap:g} nats, where the task asks for "
                    f"{tolerance.min_greedy_share:.0%}{worst_at}"
                ),
            )
        )
    if unverifiable:
        findings.append(
            Finding(
                check="probe_unverifiable",
                requests=unverifiable,
                of=unverifiable + len(verdicts),
                request_id="-",
                evidence="completed requests returned no output token ids to re-score",
            )
        )
    return findings
