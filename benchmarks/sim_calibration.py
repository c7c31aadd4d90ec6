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
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

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
from servegym.loadgen.records import RunResult
from servegym.scoring.metrics import Metrics, compute_metrics
from servegym.workloads.generate import materialise
from servegym.workloads.spec import ArrivalSpec, LengthDistribution, WorkloadSpec

DEFAULT_MAX_REQUESTS = 3000
"""Largest request count simulated per point; larger published counts are scaled down."""
DEFAULT_REQUESTS = 100
"""Requests simulated when the source does not say how many it sent."""
SEED = 0

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
}


@dataclass(frozen=True, slots=True)
class Row:
    """One calibration point: published against simulated."""

    id: str
    source: str
    url: str
    engine: str
    family: str
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


def _workload_spec(
    name: str, arrival: ArrivalSpec, requests: int, prompt: int, output: int
) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        kind="synthetic",
        num_requests=requests,
        input_tokens=LengthDistribution(dist="fixed", value=prompt),
        output_tokens=LengthDistribution(dist="fixed", value=output),
        arrival=arrival,
    )


def _run(
    model: str, hardware: str, config: ServingConfig, spec: WorkloadSpec
) -> tuple[Metrics, SimRun]:
    """Simulate ``spec`` on the setting (noise off) and compute the load generator's metrics."""
    engine = launch(model, hardware, config, workload_family=spec.kind)
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


def simulate_point(p: CalibrationPoint, *, max_requests: int = DEFAULT_MAX_REQUESTS) -> Row:
    """Simulate one point (or say why it cannot be) and compare with the published figure."""
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
    spec = _workload_spec(p.id, arrival, n, inp, out)
    try:
        metrics, run = _run(p.model, p.hardware, p.serving_config(), spec)
    except LaunchError as e:
        return not_simulated(f"launch fails: {e.message.splitlines()[0]}", n)
    value = _metric_value(p, metrics, run.stats.num_gpus)
    return Row(
        id=p.id,
        source=p.label,
        url=p.url,
        engine=p.engine,
        family=family,
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


def simulate_ratio(
    r: CalibrationRatio,
    points: dict[str, CalibrationPoint],
    *,
    max_requests: int = DEFAULT_MAX_REQUESTS,
) -> RatioRow:
    """Simulate both settings of a ratio on its stand-in workload(s)."""
    num, den = points[r.numerator], points[r.denominator]
    w = r.stand_in
    arrival = _arrival(w)
    assert not isinstance(arrival, str), arrival
    assert w.input_tokens is not None and w.output_tokens is not None
    n = _requests(w, max_requests)
    spread: list[tuple[int, float]] = []
    for inp in [w.input_tokens, *r.sensitivity_input_tokens]:
        values = []
        for p in (num, den):
            spec = _workload_spec(f"{r.id}-{inp}", arrival, n, inp, w.output_tokens)
            m, run = _run(p.model, p.hardware, p.serving_config(), spec)
            values.append(_metric_value(p, m, run.stats.num_gpus))
        spread.append((inp, values[0] / values[1]))
    published = num.value / den.value
    simulated = spread[0][1]
    setting = (
        f"{num.hardware} / {den.hardware}, {num.model} {num.weights}, {w.arrival}, "
        f"stand-in {w.input_tokens}/{w.output_tokens}, {n:,} req"
    )
    return RatioRow(
        id=r.id,
        numerator=r.numerator,
        denominator=r.denominator,
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
) -> CalibrationReport:
    """The whole calibration: every point's row, the error summaries and the ratio checks
    (default: everything in ``calibration.toml``)."""
    t0 = time.perf_counter()
    pts = list(points) if points is not None else load_calibration()
    rats = list(ratios) if ratios is not None else load_ratios()
    rows = [simulate_point(p, max_requests=max_requests) for p in pts]
    summaries = [
        _summary(ALL, rows),
        _summary(FAMILY_VLLM, [r for r in rows if r.family == FAMILY_VLLM]),
        _summary(FAMILY_TRT, [r for r in rows if r.family == FAMILY_TRT]),
    ]
    by_id = {p.id: p for p in load_calibration()} | {p.id: p for p in pts}
    ratio_rows = [simulate_ratio(r, by_id, max_requests=max_requests) for r in rats]
    return CalibrationReport(
        rows=rows,
        summaries=summaries,
        ratios=ratio_rows,
        max_requests=max_requests,
        wall_s=time.perf_counter() - t0,
    )


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
    args = ap.parse_args()
    report = calibrate(max_requests=args.max_requests)
    print(render(report, markdown=args.markdown))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")


if __name__ == "__main__":
    main()
