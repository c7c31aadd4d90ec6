"""Re-scoring outputs with the reference (see :mod:`servegym.scoring.probes`).

The reference server (the task's baseline at full precision,
:func:`~servegym.reference.config.reference_config`) reads prompt + output in one prefill
and returns vLLM's ``prompt_logprobs``: at every position, the log-probability of the token
there and of the model's top token. One request at a time, so no batching effect touches a
logit. An engine whose server has no ``prompt_logprobs``
(:attr:`~servegym.engines.base.Engine.prompt_logprobs`) gets no probe check.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from servegym.engines.base import ModelRef
from servegym.loadgen.records import RequestRecord, RunResult
from servegym.scoring.integrity import Finding
from servegym.scoring.probes import ProbeTolerance, ProbeVerdict, TokenScore, judge, probe_findings
from servegym.tasks.spec import IntegritySpec
from servegym.workloads.model import Workload


class RescoreError(Exception):
    """The reference server did not answer a re-scoring request as expected."""


def _position_scores(entry: dict[str, Any] | None, token: int) -> TokenScore:
    if not entry:
        raise RescoreError("no prompt log-probabilities at an output position")
    mine = entry.get(str(token))
    if mine is None:
        raise RescoreError(f"token {token} missing from the prompt log-probabilities")
    top_id, top = min(entry.items(), key=lambda kv: int(kv[1].get("rank", 1 << 30)))
    return TokenScore(
        token=token,
        logprob=float(mine["logprob"]),
        top_token=int(top_id),
        top_logprob=float(top["logprob"]),
    )


async def rescore_one(
    http: aiohttp.ClientSession,
    base_url: str,
    model: str,
    prompt: Sequence[int],
    output: Sequence[int],
) -> list[TokenScore]:
    """The reference's view of each token of ``output`` after ``prompt``."""
    ids = [int(t) for t in prompt] + [int(t) for t in output]
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 1,
    }
    async with http.post(f"{base_url}/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RescoreError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        data = await resp.json()
    entries = data["choices"][0].get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(ids):
        raise RescoreError("the server returned no prompt log-probabilities")
    start = len(prompt)
    return [_position_scores(entries[start + i], int(t)) for i, t in enumerate(output)]


def prompt_of(workload: Workload, record: RequestRecord) -> np.ndarray[Any, Any]:
    """The exact prompt ids a record was sent (its session and turn in ``workload``)."""
    session = next(s for s in workload.sessions if s.id == record.session_id)
    return workload.prompt_ids(session, record.turn_index)


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """What the probe check found over one side's runs."""

    verdicts: list[ProbeVerdict]
    unverifiable: int
    findings: list[Finding]


def probe_candidates(
    runs: Sequence[tuple[Workload, RunResult]],
) -> tuple[list[tuple[int, RequestRecord]], int]:
    """Every completed measured request of ``runs`` with its run's index, and how many
    completed without the token ids a re-score needs."""
    out: list[tuple[int, RequestRecord]] = []
    missing = 0
    for i, (_, result) in enumerate(runs):
        for r in result.records:
            if r.warmup or not r.ok:
                continue
            if r.output_token_ids:
                out.append((i, r))
            elif r.output_tokens > 0:
                missing += 1
    return out, missing


async def verify_probes(
    model: ModelRef,
    runs: Sequence[tuple[Workload, RunResult]],
    spec: IntegritySpec,
    seed: int,
    *,
    reference_url: str,
) -> ProbeReport:
    """Draw ``spec.probe_requests`` answers from ``runs`` (each run with the workload it
    was sent) by ``seed``, re-score them on the running reference server at
    ``reference_url``, and judge them."""
    candidates, missing = probe_candidates(runs)
    rng = random.Random(seed)
    picked = sorted(rng.sample(range(len(candidates)), min(spec.probe_requests, len(candidates))))
    probes = [candidates[k] for k in picked]
    tolerance = ProbeTolerance(
        max_gap=spec.max_gap_nats,
        min_greedy_share=spec.min_within_share,
        max_failed_share=spec.max_failed_share,
    )

    async def judge_all(base_url: str) -> list[ProbeVerdict]:
        verdicts = []
        timeout = aiohttp.ClientTimeout(total=600.0)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for i, r in probes:
                assert r.output_token_ids is not None
                prompt = prompt_of(runs[i][0], r).tolist()
                scores = await rescore_one(
                    http, base_url, model.served_name, prompt, r.output_token_ids
                )
                label = f"{r.request_id} of run {i + 1}" if len(runs) > 1 else r.request_id
                verdicts.append(judge(label, scores, spec.max_gap_nats))
        return verdicts

    verdicts = await judge_all(reference_url.rstrip("/")) if probes else []
    findings = probe_findings(verdicts, tolerance, unverifiable=missing)
    return ProbeReport(verdicts=verdicts, unverifiable=missing, findings=findings)
