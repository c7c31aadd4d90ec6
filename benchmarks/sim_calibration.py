"""How far the simulator is from published measurements: the calibration table.

For every point of ``servegym/engines/sim/calibration.toml`` that can be simulated, it builds
the point's setting (model, GPU, tensor parallel size, weight and KV-cache format, the engine
knobs the source set; vLLM's defaults for the rest) and its workload (fixed prompt and output
lengths, or the point's documented stand-ins; offline, closed-loop concurrency or Poisson
arrivals), simulates it with noise off, computes the published metric from the records with
the load generator's metrics (per GPU where the source reports per GPU), and prints one row
per point: published, simulated and the signed error (simulated / published - 1). Below the
table: the median and the largest absolute error, over all simulated points and per engine
family of the source (vLLM/SGLang, which the simulator models, apart from TensorRT-LLM,
whose max-throughput figures are expected to sit above a vLLM model), the ``[[ratio]]``
checks of points that cannot be simulated on their own, and the points left out, with why.

Request counts above ``--max-requests`` (default 3,000) are scaled down to it: at least three
times the largest batch vLLM's defaults run (1,024 sequences), so an offline run spends most
of its time in steady state, while the whole table takes about ten seconds. Every shipped
throughput point is simulated at its published count; only the MLPerf set (13,368 samples,
not simulable anyway) would be scaled.

    .venv/bin/python benchmarks/sim_calibration.py [--markdown] [--json OUT] [--max-requests N]

``--markdown`` prints the tables as Markdown (for ``docs/simulator.md``); ``--json OUT`` also
writes every row, summary and ratio, with the simulated batch sizes and preemptions.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from servegym.engines.config import ServingConfig
from servegym.engines.sim.calibration import (
    CalibrationPoint,
    CalibrationRatio,
    CalibrationWorkload,
    load_calibration,
    load_ratios,
)
from servegym.engines.sim.engine import SimRun, simulate
from servegym.engines.sim.launch import LaunchError, launch
from servegym.engines.sim.profiles import (
    PROFILES_DIR,
    EngineProfile,
    HardwareProfile,
    engine_profiles,
    hardware_profiles,
)
from servegym.loadgen.records import RunResult
from servegym.scoring.metrics import Metrics, compute_metrics
from servegym.workloads.generate import materialise
from servegym.workloads.spec import ArrivalSpec, LengthDistribution, WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MAX_REQUESTS = 3000
"""Largest request count simulated per point; larger published counts are scaled down."""
DEFAULT_REQUESTS = 100
"""Requests simulated when the source does not say how many it sent."""
SEED = 0
LONG_PROMPT = 4000
"""Prompts of at least this many tokens put a point in the long-prompt regime."""

REGIME_BATCH1 = "batch-1"
REGIME_BURST = "burst/offline"
REGIME_CONCURRENCY = "concurrency"
REGIME_POISSON = "poisson"
REGIME_TP = "TP 2-8"
REGIME_LONG = "long prompts"
REGIMES = [
    REGIME_BATCH1,
    REGIME_BURST,
    REGIME_CONCURRENCY,
    REGIME_POISSON,
    REGIME_TP,
    REGIME_LONG,
]

FAMILY_VLLM = "vLLM/SGLang"
FAMILY_TRT = "TensorRT-LLM"
ALL = "all simulated"
FAMILY_OF = {"vllm": FAMILY_VLLM, "sglang": FAMILY_VLLM, "tensorrt-llm": FAMILY_TRT}

UNIT = {
    "output_throughput": "tok/s",
    "total_throughput": "tok/s",
    "request_throughput": "req/s",
    "tpot_ms": "ms",
    "ttft_ms": "ms",
    "itl_ms": "ms",
    "itl_median_ms": "ms",
    "ttft_median_ms": "ms",
    "e2e_ms": "ms",
}


@dataclass(frozen=True, slots=True)
class Row:
    """One calibration point: published against simulated."""

    id: str
    source: str
    url: str
    engine: str
    family: str
    group: str
    """The independent source (held out together by the leave-one-source-out check)."""
    regimes: list[str]
    """The load regimes the point belongs to (see :func:`regimes`)."""
    setting: str
    metric: str
    unit: str
    published: float
    simulated: float | None
    error: float | None
    """simulated / published - 1 (None when not simulated)."""
    reason: str | None
    """Why the point was not simulated (None when it was)."""
    requests: int | None
    """Requests simulated."""
    mean_batch: float | None
    preemptions: int | None


@dataclass(frozen=True, slots=True)
class Summary:
    """Error statistics of a group of simulated points."""

    group: str
    points: int
    median_abs_error: float | None
    max_abs_error: float | None
    worst: str | None
    """Id of the point with the largest absolute error."""
    mean_error: float | None
    """Mean signed error (the group's bias)."""


@dataclass(frozen=True, slots=True)
class RatioRow:
    """A ratio of two published figures against the same ratio simulated on a stand-in."""

    id: str
    numerator: str
    denominator: str
    group: str
    """The independent source (held out together by the leave-one-source-out check)."""
    setting: str
    published: float
    simulated: float
    error: float
    spread: list[tuple[int, float]]
    """(stand-in prompt tokens, simulated ratio) for the main and the sensitivity stand-ins."""


@dataclass(frozen=True, slots=True)
class CalibrationReport:
    rows: list[Row]
    summaries: list[Summary]
    ratios: list[RatioRow]
    max_requests: int
    wall_s: float

    def summary(self, group: str) -> Summary:
        return next(s for s in self.summaries if s.group == group)


# --- building a point's run ------------------------------------------------------------------


def _arrival(w: CalibrationWorkload) -> ArrivalSpec | str:
    """The arrival spec, or why the point's arrival cannot be simulated."""
    if w.arrival == "offline":
        return ArrivalSpec(kind="offline")
    if w.arrival == "concurrency":
        if w.concurrency is None:
            return "closed-loop concurrency not given"
        return ArrivalSpec(kind="concurrency", concurrency=w.concurrency)
    if w.arrival == "poisson":
        if w.rate is None:
            return "Poisson arrivals without a rate"
        return ArrivalSpec(kind="poisson", rate=w.rate)
    return "MLPerf Server's latency-bounded search for the highest rate is not modelled"


def _lengths(n: int, spread: float) -> LengthDistribution:
    """``n`` tokens, or uniform over ``[(1 - spread) n, (1 + spread) n]`` (the random
    dataset's ``--random-range-ratio``)."""
    if spread <= 0.0:
        return LengthDistribution(dist="fixed", value=n)
    return LengthDistribution(
        dist="uniform", low=max(1, round(n * (1 - spread))), high=round(n * (1 + spread))
    )


def _workload_spec(
    name: str, arrival: ArrivalSpec, requests: int, prompt: int, output: int, spread: float = 0.0
) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        kind="synthetic",
        num_requests=requests,
        input_tokens=_lengths(prompt, spread),
        output_tokens=_lengths(output, spread),
        arrival=arrival,
    )


Profiles = tuple[dict[str, EngineProfile], dict[str, HardwareProfile]]
"""Engine and hardware profiles to simulate with, by id (the fit varies their numbers)."""


def shipped_profiles() -> Profiles:
    """The engine and hardware profiles as shipped (``profiles/``)."""
    return dict(engine_profiles()), dict(hardware_profiles())


def _run(
    model: str,
    hardware: str,
    config: ServingConfig,
    spec: WorkloadSpec,
    *,
    engine_id: str = "vllm",
    profiles: Profiles | None = None,
    endpoint: str = "completions",
) -> tuple[Metrics, SimRun]:
    """Simulate ``spec`` on the setting (noise off) and compute the load generator's metrics.

    ``endpoint``: ``chat`` simulates the engine's API server as its chat endpoint runs, which
    renders the chat template on its event loop and so takes a burst in whole
    (``api_holds_burst``); ``offline`` (``LLM.generate``) has no API server.

    Runs are kept by everything that determines them, so points that read two metrics of
    one published run (a throughput and a TTFT) simulate it once."""
    engines, hw = profiles or shipped_profiles()
    eng = engines[engine_id]
    if endpoint == "chat":
        eng = eng.model_copy(update={"api_holds_burst": True})
    elif endpoint == "offline":
        eng = eng.model_copy(
            update={
                "api_request_ms": 0.0,
                "api_per_token_us": 0.0,
                "api_latency_ms": 0.0,
                "api_chunk_us": 0.0,
            }
        )
    key = (
        model,
        hw[hardware].model_dump_json(),
        eng.model_dump_json(),
        config.model_dump_json(),
        spec.model_dump_json(exclude={"name"}),
    )
    if key in _RUNS:
        return _RUNS[key]
    if len(_RUNS) > 64:
        _RUNS.clear()
    _RUNS[key] = out = _simulate_run(model, hw[hardware], config, spec, eng)
    return out


_RUNS: dict[tuple[str, ...], tuple[Metrics, SimRun]] = {}


def _simulate_run(
    model: str,
    hardware: HardwareProfile,
    config: ServingConfig,
    spec: WorkloadSpec,
    engine_profile: EngineProfile,
) -> tuple[Metrics, SimRun]:
    engine = launch(model, hardware, config, workload_family=spec.kind, engine=engine_profile)
    workload = materialise(spec, SEED)
    run = simulate(engine, workload, noise=False)
    result = RunResult(
        target=engine.name,
        model=model,
        workload=spec.name,
        workload_hash=workload.content_hash(),
        seed=SEED,
        started_at="-",
        duration_s=run.duration_s,
        records=run.records,
    )
    return compute_metrics(result), run


def _metric_value(p: CalibrationPoint, m: Metrics, num_gpus: int) -> float:
    value: float
    if p.metric == "output_throughput":
        value = m.output_throughput
    elif p.metric == "total_throughput":
        value = m.total_token_throughput
    elif p.metric == "request_throughput":
        value = m.request_throughput
    elif p.metric == "tpot_ms":
        value = m.tpot_ms.mean
    elif p.metric == "ttft_ms":
        value = m.ttft_ms.mean
    elif p.metric == "ttft_median_ms":
        value = m.ttft_ms.p50
    elif p.metric == "e2e_ms":
        value = m.e2e_ms.mean
    elif p.metric == "itl_median_ms":
        value = m.itl_ms.p50
    else:
        value = m.itl_ms.mean
    if p.per_gpu and p.metric.endswith("_throughput"):
        value /= num_gpus
    return value


def _requests(w: CalibrationWorkload, max_requests: int) -> int:
    return min(w.num_prompts or DEFAULT_REQUESTS, max_requests)


def _setting(p: CalibrationPoint, requests: int | None) -> str:
    """A one-line description of the simulated setting."""
    fmt = p.weights + (" + fp8 KV" if p.kv_cache_dtype == "fp8" else "")
    tp = p.tensor_parallel
    gpus = p.hardware if tp == 1 else f"{tp}x {p.hardware} (TP{tp})"
    knobs = f"max_num_seqs {p.serving['max_num_seqs']}" if "max_num_seqs" in p.serving else ""
    w = p.workload
    if w.arrival == "concurrency":
        load = f"concurrency {w.concurrency}"
    elif w.arrival == "poisson":
        load = f"Poisson {w.rate:g} req/s"
    else:
        load = w.arrival
    inp, out = w.simulated_lengths()
    lengths = f"{'?' if inp is None else inp}/{'?' if out is None else out}"
    if w.uses_stand_in:
        lengths = f"~{lengths} (stand-in)"
    elif w.range_ratio > 0:
        lengths = f"{lengths} +-{w.range_ratio:.0%}"
    count = ""
    if requests is not None and w.num_prompts is not None and requests < w.num_prompts:
        count = f"{requests:,} of {w.num_prompts:,} req"
    elif requests is not None:
        count = f"{requests:,} req"
    elif w.num_prompts is not None:
        count = f"{w.num_prompts:,} req"
    parts = [f"{p.model} {fmt}", gpus, *([knobs] if knobs else []), load, lengths]
    if count:
        parts.append(count)
    return ", ".join(parts)


def regimes(p: CalibrationPoint) -> list[str]:
    """The load regimes a point belongs to (one point may be in several): ``batch-1`` (one
    request at a time), ``burst/offline`` (everything sent at once), ``concurrency`` (a
    closed loop of more than one), ``poisson`` (open-loop arrivals at a rate), ``TP 2-8``,
    ``long prompts`` (4,000 prompt tokens or more)."""
    w = p.workload
    out: list[str] = []
    one = w.concurrency == 1 or p.serving.get("max_num_seqs") == 1
    if one:
        out.append(REGIME_BATCH1)
    elif w.arrival == "offline":
        out.append(REGIME_BURST)
    elif w.arrival == "concurrency":
        out.append(REGIME_CONCURRENCY)
    elif w.arrival in ("poisson", "mlperf-server"):
        out.append(REGIME_POISSON)
    if p.tensor_parallel > 1:
        out.append(REGIME_TP)
    inp, _ = w.simulated_lengths()
    if inp is not None and inp >= LONG_PROMPT:
        out.append(REGIME_LONG)
    return out


def simulate_point(
    p: CalibrationPoint,
    *,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    profiles: Profiles | None = None,
) -> Row:
    """Simulate one point (or say why it cannot be) and compare with the published figure,
    with the shipped profiles or the given ones."""
    family = FAMILY_OF[p.engine]
    unit = UNIT[p.metric] + ("/GPU" if p.per_gpu and p.metric.endswith("_throughput") else "")
    w = p.workload
    inp, out = w.simulated_lengths()
    arrival = _arrival(w)
    reason: str | None = None
    if not p.simulable:
        reason = p.not_simulable_reason or "marked simulable = false"
    elif isinstance(arrival, str):
        reason = arrival
    elif inp is None:
        reason = "prompt lengths not published and no stand-in given"
    elif out is None:
        reason = "output lengths not published and no stand-in given"

    def not_simulated(why: str, requests: int | None) -> Row:
        return Row(
            id=p.id,
            source=p.label,
            url=p.url,
            engine=p.engine,
            family=family,
            group=p.source_group,
            regimes=regimes(p),
            setting=_setting(p, requests),
            metric=p.metric,
            unit=unit,
            published=p.value,
            simulated=None,
            error=None,
            reason=why,
            requests=requests,
            mean_batch=None,
            preemptions=None,
        )

    if reason is not None or isinstance(arrival, str) or inp is None or out is None:
        return not_simulated(reason or "not simulable", None)
    n = _requests(w, max_requests)
    spec = _workload_spec(p.id, arrival, n, inp, out, w.range_ratio)
    try:
        metrics, run = _run(
            p.model,
            p.hardware,
            p.serving_config(),
            spec,
            engine_id=p.engine_profile,
            profiles=profiles,
            endpoint=p.endpoint,
        )
    except LaunchError as e:
        return not_simulated(f"launch fails: {e.message.splitlines()[0]}", n)
    value = _metric_value(p, metrics, run.stats.num_gpus)
    return Row(
        id=p.id,
        source=p.label,
        url=p.url,
        engine=p.engine,
        family=family,
        group=p.source_group,
        regimes=regimes(p),
        setting=_setting(p, n),
        metric=p.metric,
        unit=unit,
        published=p.value,
        simulated=value,
        error=value / p.value - 1.0,
        reason=None,
        requests=n,
        mean_batch=run.stats.mean_batch_size,
        preemptions=run.stats.preemptions,
    )


def _summary(group: str, rows: Sequence[Row]) -> Summary:
    errs = [(r.id, r.error) for r in rows if r.error is not None]
    if not errs:
        return Summary(group, 0, None, None, None, None)
    worst_id, worst = max(errs, key=lambda e: abs(e[1]))
    return Summary(
        group=group,
        points=len(errs),
        median_abs_error=statistics.median(abs(e) for _, e in errs),
        max_abs_error=abs(worst),
        worst=worst_id,
        mean_error=statistics.fmean(e for _, e in errs),
    )


def regime_summaries(rows: Sequence[Row]) -> list[Summary]:
    """The vLLM/SGLang points' error per load regime (a point counts in each of its)."""
    vllm = [r for r in rows if r.family == FAMILY_VLLM]
    return [
        _summary(f"{FAMILY_VLLM}: {reg}", [r for r in vllm if reg in r.regimes]) for reg in REGIMES
    ]


def simulate_ratio(
    r: CalibrationRatio,
    points: dict[str, CalibrationPoint],
    *,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    profiles: Profiles | None = None,
    sensitivity: bool = True,
) -> RatioRow:
    """Simulate both settings of a ratio on its stand-in workload(s), each at its point's
    endpoint (offline ``LLM.generate`` has no API server)."""
    num, den = points[r.numerator], points[r.denominator]
    w = r.stand_in
    arrival = _arrival(w)
    assert not isinstance(arrival, str), arrival
    assert w.input_tokens is not None and w.output_tokens is not None
    n = _requests(w, max_requests)
    spread: list[tuple[int, float]] = []
    lengths = [w.input_tokens, *(r.sensitivity_input_tokens if sensitivity else [])]
    for inp in lengths:
        values = []
        for p in (num, den):
            spec = _workload_spec(f"{r.id}-{inp}", arrival, n, inp, w.output_tokens)
            m, run = _run(
                p.model,
                p.hardware,
                p.serving_config(),
                spec,
                engine_id=p.engine_profile,
                profiles=profiles,
                endpoint=p.endpoint,
            )
            values.append(_metric_value(p, m, run.stats.num_gpus))
        spread.append((inp, values[0] / values[1]))
    published = num.value / den.value
    simulated = spread[0][1]
    tp = "" if num.tensor_parallel == 1 else f"TP{num.tensor_parallel} "
    shape = f"{w.input_tokens}/{w.output_tokens}"
    setting = (
        f"{tp}{num.hardware} / {den.hardware}, {num.model} {num.weights}, {w.arrival}, "
        f"{shape if r.published_workload else 'stand-in ' + shape}, {n:,} req"
    )
    return RatioRow(
        id=r.id,
        numerator=r.numerator,
        denominator=r.denominator,
        group=r.source_group,
        setting=setting,
        published=published,
        simulated=simulated,
        error=simulated / published - 1.0,
        spread=spread,
    )


def calibrate(
    points: Sequence[CalibrationPoint] | None = None,
    ratios: Sequence[CalibrationRatio] | None = None,
    *,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    profiles: Profiles | None = None,
) -> CalibrationReport:
    """The whole calibration: every point's row, the error summaries and the ratio checks
    (default: everything in ``calibration.toml``)."""
    t0 = time.perf_counter()
    pts = list(points) if points is not None else load_calibration()
    rats = list(ratios) if ratios is not None else load_ratios()
    rows = [simulate_point(p, max_requests=max_requests, profiles=profiles) for p in pts]
    summaries = [
        _summary(ALL, rows),
        _summary(FAMILY_VLLM, [r for r in rows if r.family == FAMILY_VLLM]),
        _summary(FAMILY_TRT, [r for r in rows if r.family == FAMILY_TRT]),
        *regime_summaries(rows),
    ]
    by_id = {p.id: p for p in load_calibration()} | {p.id: p for p in pts}
    ratio_rows = [
        simulate_ratio(r, by_id, max_requests=max_requests, profiles=profiles) for r in rats
    ]
    return CalibrationReport(
        rows=rows,
        summaries=summaries,
        ratios=ratio_rows,
        max_requests=max_requests,
        wall_s=time.perf_counter() - t0,
    )


# --- fitting ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Param:
    """One fitted number: a field of an engine or hardware profile (``targets`` lists the
    profile ids that share it, e.g. the H100 and H200 share their silicon's compute
    efficiency), searched within ``[lo, hi]`` in log space, pulled toward ``prior``."""

    kind: str
    """``engine`` or ``hardware``."""
    targets: tuple[str, ...]
    field: str
    prior: float
    """The judgment value the fit is pulled toward (see :data:`PRIOR_WEIGHT`)."""
    lo: float
    hi: float

    @property
    def name(self) -> str:
        return f"{'+'.join(self.targets)}.{self.field}"


FIT_PARAMS: tuple[Param, ...] = (
    # Priors (judgment, before any fit): vLLM's pre-calibration 1.4 ms step and 3 us per
    # sequence; 0.2 ms of worker synchronisation per TP step; a few ms of HTTP and chat-template
    # work per request and ~1 us per prompt token for a fast tokenizer; a few ms of latency
    # outside the API server (process hand-offs, the client's own streaming); kernels at the
    # hardware's efficiency; the GPUs' pre-calibration efficiencies (0.85 bandwidth; 0.60
    # compute, 0.75 on the A100).
    Param("engine", ("vllm",), "step_overhead_ms", 1.4, 0.2, 8.0),
    Param("engine", ("vllm",), "per_seq_overhead_us", 3.0, 0.5, 500.0),
    Param("engine", ("vllm",), "tp_step_overhead_ms", 0.2, 0.01, 10.0),
    Param("engine", ("vllm",), "api_request_ms", 2.0, 0.01, 100.0),
    Param("engine", ("vllm",), "api_per_token_us", 1.0, 0.01, 100.0),
    Param("engine", ("vllm",), "api_latency_ms", 5.0, 0.01, 200.0),
    Param("engine", ("vllm",), "api_chunk_us", 40.0, 0.5, 500.0),
    Param("engine", ("vllm",), "attention_scale", 1.0, 0.1, 3.0),
    Param("engine", ("tensorrt-llm",), "step_overhead_ms", 1.4, 0.2, 8.0),
    Param("engine", ("tensorrt-llm",), "per_seq_overhead_us", 3.0, 0.5, 500.0),
    Param("engine", ("tensorrt-llm",), "gemm_scale", 1.0, 0.5, 3.0),
    Param("engine", ("tensorrt-llm",), "attention_scale", 1.0, 0.1, 3.0),
    Param("hardware", ("h100-sxm", "h100-pcie"), "mem_efficiency", 0.85, 0.6, 0.95),
    Param("hardware", ("h200",), "mem_efficiency", 0.85, 0.6, 0.95),
    Param("hardware", ("h100-sxm", "h100-pcie", "h200"), "compute_efficiency", 0.6, 0.2, 0.9),
    Param("hardware", ("a100-80gb",), "mem_efficiency", 0.85, 0.6, 0.95),
    Param("hardware", ("a100-80gb",), "compute_efficiency", 0.75, 0.2, 0.9),
    Param("hardware", ("rtx-4090",), "mem_efficiency", 0.85, 0.6, 0.95),
    Param("hardware", ("rtx-4090",), "compute_efficiency", 0.6, 0.2, 0.9),
    Param("hardware", ("l40s",), "compute_efficiency", 0.6, 0.2, 0.9),
    Param("hardware", ("b200",), "mem_efficiency", 0.85, 0.6, 0.95),
)
"""What ``--fit`` fits. vLLM's GEMM efficiency is the hardware profile's own (its
``gemm_scale`` stays 1): the hardware efficiencies are defined as what vLLM's kernels reach,
and TensorRT-LLM's kernels are a ratio of that."""

BEFORE: dict[str, float] = {
    "vllm.step_overhead_ms": 1.4,
    "vllm.per_seq_overhead_us": 3.0,
    "vllm.tp_step_overhead_ms": 0.0,
    "vllm.api_request_ms": 0.0,
    "vllm.api_per_token_us": 0.0,
    "vllm.api_latency_ms": 0.0,
    "vllm.api_chunk_us": 0.0,
    "vllm.attention_scale": 1.0,
    "tensorrt-llm.step_overhead_ms": 1.4,
    "tensorrt-llm.per_seq_overhead_us": 3.0,
    "tensorrt-llm.gemm_scale": 1.0,
    "tensorrt-llm.attention_scale": 1.0,
    "h100-sxm+h100-pcie.mem_efficiency": 0.85,
    "h200.mem_efficiency": 0.85,
    "h100-sxm+h100-pcie+h200.compute_efficiency": 0.6,
    "a100-80gb.mem_efficiency": 0.85,
    "a100-80gb.compute_efficiency": 0.75,
    "rtx-4090.mem_efficiency": 0.85,
    "rtx-4090.compute_efficiency": 0.6,
    "l40s.compute_efficiency": 0.6,
    "b200.mem_efficiency": 0.85,
}
"""The model before this calibration (issue 18): one set of host overheads in the hardware
profiles, no API server, no TP synchronisation, kernels at the judgment efficiencies. The
report's "before" column simulates the same points with these numbers."""


def before_profiles() -> Profiles:
    """The shipped profiles with :data:`BEFORE`'s numbers."""
    return apply_params(FIT_PARAMS, [BEFORE[q.name] for q in FIT_PARAMS], shipped_profiles())


PRIOR_WEIGHT = 0.1
"""Weight of each parameter's pull toward its prior (judgment) value, per unit of log
ratio: a parameter the points hardly constrain stays near it instead of wandering (a
factor of two away costs as much as a 7% error on one source)."""
FIT_MAX_REQUESTS = 1000
"""Requests simulated per point while fitting (the final table uses the usual cap). At least
the largest published burst of small requests (1,000): a host-bound burst's TTFT grows with
its request count, so a cut-down burst would mislead the API server's cost."""


def _values(params: Sequence[Param], profiles: Profiles) -> list[float]:
    engines, hw = profiles
    out = []
    for prm in params:
        table = engines if prm.kind == "engine" else hw
        out.append(float(getattr(table[prm.targets[0]], prm.field)))
    return out


def apply_params(params: Sequence[Param], values: Sequence[float], base: Profiles) -> Profiles:
    """``base`` with the fitted fields set to ``values``."""
    engines, hw = dict(base[0]), dict(base[1])
    for prm, v in zip(params, values, strict=True):
        update = {prm.field: float(v)}
        for t in prm.targets:
            if prm.kind == "engine":
                engines[t] = engines[t].model_copy(update=update)
            else:
                hw[t] = hw[t].model_copy(update=update)
    return engines, hw


def _relevant(p: CalibrationPoint, params: Sequence[Param]) -> list[int]:
    """Indices of the parameters that can change point ``p``'s simulated figure."""
    return [
        i
        for i, prm in enumerate(params)
        if (prm.kind == "engine" and p.engine_profile in prm.targets)
        or (prm.kind == "hardware" and p.hardware in prm.targets)
        if not (prm.field == "tp_step_overhead_ms" and p.tensor_parallel == 1)
    ]


@dataclass
class FitResult:
    params: list[Param]
    values: list[float]
    start: list[float]
    points: list[str]
    """Ids of the points fitted to."""
    cost: float
    evaluations: int
    wall_s: float

    def profiles(self, base: Profiles | None = None) -> Profiles:
        return apply_params(self.params, self.values, base or shipped_profiles())

    def named(self) -> dict[str, float]:
        """Fitted value by parameter name."""
        return {q.name: v for q, v in zip(self.params, self.values, strict=True)}


def fit(
    points: Sequence[CalibrationPoint],
    *,
    params: Sequence[Param] = FIT_PARAMS,
    base: Profiles | None = None,
    start: dict[str, float] | None = None,
    ratios: Sequence[CalibrationRatio] = (),
    max_requests: int = FIT_MAX_REQUESTS,
    max_nfev: int | None = None,
    log: bool = False,
) -> FitResult:
    """Least squares on log(simulated / published) over the simulable ``points`` and the
    ``ratios`` of unsimulable points (the MLPerf H100/L40S ratio, the only measurement of
    the L40S, fits that GPU's compute efficiency; vLLM's H100/H200 latency ratios, the only
    vLLM measurements of the H200, its bandwidth).

    Each source (``group``) weighs the same in total (a point's or ratio's weight is
    1 / sqrt(points and ratios of its source)), so one source with many points does not
    outvote the others; each parameter
    is pulled toward its ``prior`` with :data:`PRIOR_WEIGHT`. A point is re-simulated
    only when a parameter it depends on changed (results are cached by those values).
    Parameters the points do not touch are left out of the search. ``start``: values to
    start from by parameter name (default: the shipped ones).
    """
    from scipy.optimize import least_squares  # a benchmark-only dependency (dev extra)

    t0 = time.perf_counter()
    base = base or shipped_profiles()
    pts = [p for p in points if p.simulable]
    every = {p.id: p for p in load_calibration()}
    rats = [(r, every[r.numerator], every[r.denominator]) for r in ratios]
    rat_rel = [sorted(set(_relevant(a, params)) | set(_relevant(b, params))) for _, a, b in rats]
    used = sorted({i for p in pts for i in _relevant(p, params)} | {i for r in rat_rel for i in r})
    prm = [params[i] for i in used]
    shipped = _values(prm, base)
    priors = [q.prior for q in prm]
    named = start or {}
    x_start = [
        min(max(named.get(q.name, v), q.lo * 1.0001), q.hi / 1.0001)
        for q, v in zip(prm, shipped, strict=True)
    ]
    counts: dict[str, int] = {}
    for g in [p.source_group for p in pts] + [r.source_group for r, _, _ in rats]:
        counts[g] = counts.get(g, 0) + 1
    weights = [1.0 / math.sqrt(counts[p.source_group]) for p in pts]
    rat_weights = [1.0 / math.sqrt(counts[r.source_group]) for r, _, _ in rats]
    rel = [_relevant(p, prm) for p in pts]
    rat_rel = [sorted(set(_relevant(a, prm)) | set(_relevant(b, prm))) for _, a, b in rats]
    cache: dict[tuple[str, tuple[float, ...]], float] = {}
    calls = 0

    def residuals(logx: np.ndarray) -> np.ndarray:
        nonlocal calls
        calls += 1
        x = np.exp(logx)
        profiles = apply_params(prm, x.tolist(), base)
        out = []
        for p, w, idx in zip(pts, weights, rel, strict=True):
            key = (p.id, tuple(round(float(x[i]), 12) for i in idx))
            if key not in cache:
                row = simulate_point(p, max_requests=max_requests, profiles=profiles)
                sim = row.simulated if row.simulated is not None else p.value * 1e3
                cache[key] = math.log(max(sim, 1e-9) / p.value)
            out.append(w * cache[key])
        for (r, _, _), w, idx in zip(rats, rat_weights, rat_rel, strict=True):
            key = (r.id, tuple(round(float(x[i]), 12) for i in idx))
            if key not in cache:
                rr = simulate_ratio(
                    r, every, max_requests=max_requests, profiles=profiles, sensitivity=False
                )
                cache[key] = math.log(rr.simulated / rr.published)
            out.append(w * cache[key])
        out += [PRIOR_WEIGHT * (lx - math.log(s)) for lx, s in zip(logx, priors, strict=True)]
        if log:
            print(f"  eval {calls}: cost {0.5 * sum(r * r for r in out):.5f}", flush=True)
        return np.asarray(out)

    lo = np.log([q.lo for q in prm])
    hi = np.log([q.hi for q in prm])
    res = least_squares(
        residuals,
        np.log(x_start),
        bounds=(lo, hi),
        diff_step=0.03,
        x_scale=1.0,
        max_nfev=max_nfev,
        xtol=1e-3,
        ftol=1e-4,
    )
    return FitResult(
        params=prm,
        values=np.exp(res.x).tolist(),
        start=x_start,
        points=[p.id for p in pts],
        cost=float(res.cost),
        evaluations=calls,
        wall_s=time.perf_counter() - t0,
    )


@dataclass(frozen=True, slots=True)
class HeldOut:
    """One source left out of the fit and predicted by the rest."""

    group: str
    rows: list[Row]
    fitted: dict[str, float]
    ratios: list[RatioRow] = field(default_factory=list)
    """The source's ratio checks, predicted by the same fit (a source of ratios only has
    no rows)."""


def leave_one_source_out(
    points: Sequence[CalibrationPoint],
    *,
    groups: Sequence[str] | None = None,
    params: Sequence[Param] = FIT_PARAMS,
    start: FitResult | None = None,
    ratios: Sequence[CalibrationRatio] = (),
    max_requests: int = FIT_MAX_REQUESTS,
    predict_max_requests: int = DEFAULT_MAX_REQUESTS,
    max_nfev: int | None = None,
    log: bool = False,
) -> list[HeldOut]:
    """For each vLLM/SGLang source (or the given ``groups``): fit on every other point and
    ratio, then simulate the held-out source's points and ratios with that fit (at up to
    ``predict_max_requests`` requests, as the fitted table). ``start`` warm-starts each
    refit from a full fit (the answer is the same; it only takes fewer steps)."""
    pts = [p for p in points if p.simulable]
    every = {p.id: p for p in load_calibration()} | {p.id: p for p in points}
    if groups is None:
        groups = sorted(
            {p.source_group for p in pts if FAMILY_OF[p.engine] == FAMILY_VLLM}
            | {
                r.source_group
                for r in ratios
                if FAMILY_OF[every[r.numerator].engine] == FAMILY_VLLM
            }
        )
    x0 = None if start is None else start.named()
    out = []
    for g in groups:
        train = [p for p in pts if p.source_group != g]
        test = [p for p in pts if p.source_group == g]
        train_ratios = [r for r in ratios if r.source_group != g]
        test_ratios = [r for r in ratios if r.source_group == g]
        if log:
            print(
                f"leave out {g}: fit on {len(train)} points and {len(train_ratios)} ratios",
                flush=True,
            )
        res = fit(
            train,
            params=params,
            start=x0,
            ratios=train_ratios,
            max_requests=max_requests,
            max_nfev=max_nfev,
        )
        profiles = res.profiles()
        rows = [
            simulate_point(p, max_requests=predict_max_requests, profiles=profiles) for p in test
        ]
        held_ratios = [
            simulate_ratio(r, every, max_requests=predict_max_requests, profiles=profiles)
            for r in test_ratios
        ]
        out.append(HeldOut(group=g, rows=rows, fitted=res.named(), ratios=held_ratios))
    return out


def _set_toml_value(path: Path, field: str, value: float) -> None:
    """Rewrite ``field = <number>`` in a profile file, keeping any trailing comment."""
    text = path.read_text()
    pattern = re.compile(rf"^({re.escape(field)} = )[-+0-9.eE]+", re.M)
    new, n = pattern.subn(lambda m: f"{m.group(1)}{value:.4g}", text, count=1)
    if n != 1:
        raise SystemExit(f"{path}: no '{field} = <number>' line to update")
    path.write_text(new)


def write_profiles(result: FitResult) -> list[Path]:
    """Write the fitted values into the shipped profile files (what ``--fit --write``
    does); returns the files changed."""
    changed: list[Path] = []
    for q, v in zip(result.params, result.values, strict=True):
        for t in q.targets:
            folder = "engines" if q.kind == "engine" else "hardware"
            path = PROFILES_DIR / folder / f"{t}.toml"
            _set_toml_value(path, q.field, v)
            if path not in changed:
                changed.append(path)
    engine_profiles.cache_clear()
    hardware_profiles.cache_clear()
    return changed


def h200_over_h100(profiles: Profiles | None = None) -> dict[str, float]:
    """Simulated vLLM speed of an H200 over an H100 on the same work (noise off): offline
    throughput of Llama-3.1-8B bf16 at 1,000/1,000 tokens (1,000 requests), and batch-1
    decode (TPOT at 128/512 tokens, one request at a time)."""
    out: dict[str, float] = {}
    offline = _workload_spec("h200-ratio-offline", ArrivalSpec(kind="offline"), 1000, 1000, 1000)
    single = _workload_spec(
        "h200-ratio-batch1", ArrivalSpec(kind="concurrency", concurrency=1), 8, 128, 512
    )
    cfg = ServingConfig()
    m = {
        hw: (
            _run("llama-3.1-8b", hw, cfg, offline, profiles=profiles)[0],
            _run("llama-3.1-8b", hw, cfg, single, profiles=profiles)[0],
        )
        for hw in ("h100-sxm", "h200")
    }
    out["offline throughput"] = m["h200"][0].output_throughput / m["h100-sxm"][0].output_throughput
    out["batch-1 decode"] = m["h100-sxm"][1].tpot_ms.mean / m["h200"][1].tpot_ms.mean
    return out


# --- output ----------------------------------------------------------------------------------


def _num(x: float, unit: str) -> str:
    if unit.startswith("tok/s") and x >= 1000:
        s = f"{x:,.0f}"
    elif x >= 100:
        s = f"{x:,.1f}".rstrip("0").rstrip(".")
    else:
        s = f"{x:.2f}"
    return f"{s} {unit}"


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"


def _cells(r: Row) -> list[str]:
    return [
        r.id,
        r.source,
        r.setting,
        _num(r.published, r.unit),
        _num(r.simulated, r.unit) if r.simulated is not None else "not simulated",
        _pct(r.error),
    ]


HEADER = ["id", "source", "setting", "published", "simulated", "error"]
SUMMARY_HEADER = ["group", "points", "median abs error", "max abs error", "worst point", "bias"]
RATIO_HEADER = ["ratio", "setting", "published", "simulated", "error", "over stand-ins"]


def _summary_cells(s: Summary) -> list[str]:
    return [
        s.group,
        str(s.points),
        _pct(s.median_abs_error, signed=False),
        _pct(s.max_abs_error, signed=False),
        s.worst or "-",
        _pct(s.mean_error),
    ]


def _ratio_cells(r: RatioRow) -> list[str]:
    spread = ", ".join(f"{inp}: {v:.2f}" for inp, v in r.spread)
    return [r.id, r.setting, f"{r.published:.2f}", f"{r.simulated:.2f}", _pct(r.error), spread]


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(out)


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join(lines)


def render(report: CalibrationReport, *, markdown: bool) -> str:
    table = _markdown_table if markdown else _text_table
    parts = [
        table(HEADER, [_cells(r) for r in report.rows]),
        "",
        "Error of the simulated figure (simulated / published - 1):",
        "",
        table(SUMMARY_HEADER, [_summary_cells(s) for s in report.summaries]),
    ]
    if report.ratios:
        parts += [
            "",
            "Ratio checks (both settings simulated on the same stand-in workload; the last "
            "column gives the simulated ratio by stand-in prompt length):",
            "",
            table(RATIO_HEADER, [_ratio_cells(r) for r in report.ratios]),
        ]
    skipped = [r for r in report.rows if r.reason is not None]
    if skipped:
        parts += ["", "Not simulated:", ""]
        parts += [f"- {r.id}: {r.reason}" for r in skipped]
    parts += [
        "",
        f"Noise off, seed {SEED}, at most {report.max_requests:,} requests per point; "
        f"{report.wall_s:.1f} s.",
    ]
    return "\n".join(parts)


def render_fit(result: FitResult) -> str:
    rows = [
        [q.name, f"{a:.4g}", f"{v:.4g}", f"{q.lo:g}-{q.hi:g}"]
        for q, a, v in zip(result.params, result.start, result.values, strict=True)
    ]
    return "\n".join(
        [
            _text_table(["parameter", "start", "fitted", "bounds"], rows),
            "",
            f"{len(result.points)} points, cost {result.cost:.5f}, {result.evaluations} "
            f"evaluations, {result.wall_s:.0f} s.",
        ]
    )


def render_loso(
    held: Sequence[HeldOut],
    fitted: CalibrationReport,
    *,
    markdown: bool,
    before: CalibrationReport | None = None,
) -> str:
    """Per point: the error before the calibration (when given), with the full fit and with
    the fit that left the point's source out; then median and worst absolute error per
    regime for each."""
    table = _markdown_table if markdown else _text_table
    fit_err = {r.id: r.error for r in fitted.rows}
    before_err = {} if before is None else {r.id: r.error for r in before.rows}
    rows: list[Row] = [r for h in held for r in h.rows]
    cells = [
        [
            r.id,
            r.group,
            ", ".join(r.regimes),
            _num(r.published, r.unit),
            _pct(before_err.get(r.id)),
            _pct(fit_err.get(r.id)),
            _pct(r.error),
        ]
        for r in rows
    ]
    header = ["id", "source", "regimes", "published", "before", "fit", "held out"]

    def by_id(report: CalibrationReport | None) -> list[Row]:
        if report is None:
            return []
        keep = {r.id for r in rows}
        return [r for r in report.rows if r.id in keep]

    sums = []
    for name, group_rows in (
        ("before", by_id(before)),
        ("fit", by_id(fitted)),
        ("held out", rows),
    ):
        if not group_rows:
            continue
        for sm in [_summary(FAMILY_VLLM, group_rows), *regime_summaries(group_rows)]:
            sums.append(
                [
                    sm.group,
                    name,
                    str(sm.points),
                    _pct(sm.median_abs_error, signed=False),
                    _pct(sm.max_abs_error, signed=False),
                    _pct(sm.mean_error),
                ]
            )
    sums.sort(key=lambda c: (c[0] != FAMILY_VLLM, c[0]))
    per_source = []
    for h in held:
        fit_rows = [r for r in by_id(fitted) if r.group == h.group]
        fs, hs = _summary(h.group, fit_rows), _summary(h.group, h.rows)
        per_source.append(
            [
                h.group,
                str(hs.points),
                _pct(fs.median_abs_error, signed=False),
                _pct(fs.max_abs_error, signed=False),
                _pct(hs.median_abs_error, signed=False),
                _pct(hs.max_abs_error, signed=False),
                hs.worst or "-",
            ]
        )
    ratio_part: list[str] = []
    held_ratios = [rr for h in held for rr in h.ratios]
    if held_ratios:
        fit_ratio = {rr.id: rr.error for rr in fitted.ratios}
        ratio_part = [
            "",
            "Ratio checks: fitted with every source, and held out:",
            "",
            table(
                ["ratio", "source", "published", "fit", "held out", "held-out simulated"],
                [
                    [
                        rr.id,
                        rr.group,
                        f"{rr.published:.3f}",
                        _pct(fit_ratio.get(rr.id)),
                        _pct(rr.error),
                        f"{rr.simulated:.3f}",
                    ]
                    for rr in held_ratios
                ],
            ),
        ]
    point_part: list[str] = []
    if cells:  # a source of ratios only has no points to list
        point_part = [table(header, cells)]
    regime_part: list[str] = []
    if sums:
        regime_part = [
            "",
            "Absolute error per regime: before the calibration, with the full fit, and held "
            "out (each source predicted by a fit without it):",
            "",
            table(["points", "model", "n", "median", "worst", "bias"], sums),
        ]
    return "\n".join(
        [
            *point_part,
            *ratio_part,
            *regime_part,
            "",
            "Per source: fitted with every source, and held out:",
            "",
            table(
                [
                    "source",
                    "n",
                    "fit median",
                    "fit worst",
                    "held-out median",
                    "held-out worst",
                    "worst point held out",
                ],
                per_source,
            ),
        ]
    ).lstrip("\n")


def main() -> None:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the report as JSON")
    ap.add_argument(
        "--max-requests",
        type=int,
        default=DEFAULT_MAX_REQUESTS,
        help="largest request count simulated per point (default %(default)s)",
    )
    ap.add_argument("--fit", action="store_true", help="fit the profiles' numbers first")
    ap.add_argument(
        "--write", action="store_true", help="with --fit: write the fitted numbers to profiles/"
    )
    ap.add_argument("--loso", action="store_true", help="also run the leave-one-source-out check")
    ap.add_argument(
        "--loso-group",
        action="append",
        metavar="SOURCE",
        help="with --loso: hold out only this source (repeatable; default: every vLLM source)",
    )
    ap.add_argument("--max-nfev", type=int, default=None, help="limit the fit's evaluations")
    ap.add_argument(
        "--start",
        type=Path,
        metavar="JSON",
        help="start the fit from the fitted values in a previous --json report",
    )
    args = ap.parse_args()
    points = load_calibration()
    profiles: Profiles | None = None
    result: FitResult | None = None
    if args.fit:
        start = None
        if args.start is not None:
            prev = json.loads(args.start.read_text())["fit"]
            start = {
                Param(**q).name: v for q, v in zip(prev["params"], prev["values"], strict=True)
            }
        result = fit(points, start=start, ratios=load_ratios(), max_nfev=args.max_nfev, log=True)
        print(render_fit(result), flush=True)
        profiles = result.profiles()
        if args.write:
            for path in write_profiles(result):
                print(f"wrote {path.relative_to(ROOT)}")
            profiles = None
    report = calibrate(max_requests=args.max_requests, profiles=profiles)
    print(render(report, markdown=args.markdown), flush=True)
    ratio = h200_over_h100(profiles)
    print(
        "\nSimulated vLLM H200 / H100 speed: "
        + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items())
    )
    held: list[HeldOut] = []
    if args.loso:
        held = leave_one_source_out(
            points,
            groups=args.loso_group,
            start=result,
            ratios=load_ratios(),
            max_nfev=args.max_nfev,
            log=True,
        )
        before = calibrate(points, ratios=[], profiles=before_profiles())
        print("")
        print(render_loso(held, report, markdown=args.markdown, before=before))
    if args.json is not None:
        out = asdict(report) | {
            "h200_over_h100": ratio,
            "fit": None if result is None else asdict(result),
            "loso": [asdict(h) for h in held],
        }
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
