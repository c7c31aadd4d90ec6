"""One workload on the simulated engine, written to a run folder (``servegym sim``).

The folder holds the same ``run.json``, ``requests.jsonl`` and ``metrics.json`` as
``servegym bench``, plus ``sim.json`` with the engine-side figures (KV capacity,
preemptions, prefix-cache hit rate, batch sizes, start-up time).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from servegym.engines.config_file import load_serving_config
from servegym.engines.sim.engine import SimStats
from servegym.engines.sim.profiles import get_hardware, get_model
from servegym.run_folder import prepare_out, write_json, write_records, write_text_atomic
from servegym.scoring.metrics import SLA, Metrics, Price, compute_metrics


class SimRequest(BaseModel):
    """Everything ``servegym sim`` was asked to do."""

    model_config = ConfigDict(extra="forbid")

    model: str
    hardware: str
    workload: str
    out: Path
    seed: int = 0
    config_file: Path | None = None
    overrides: list[str] = Field(default_factory=list)
    workload_overrides: list[str] = Field(default_factory=list)
    requests: int | None = None
    scale: float | None = None
    sla: SLA | None = None
    noise: bool = True


@dataclass
class SimOutcome:
    metrics: Metrics
    stats: SimStats
    out: Path
    title: str


def run_sim(request: SimRequest) -> SimOutcome:
    """Materialise the workload, launch the simulated engine, run, write the folder.

    Raises :class:`~servegym.engines.sim.launch.LaunchError` when the engine would not
    start (the command exits 3), :class:`UserError` for bad input (exit 2).
    """
    from servegym.engines.sim.target import SimTarget
    from servegym.loadgen.eventloop import run as run_async
    from servegym.loadgen.target import RunOptions
    from servegym.workloads.generate import materialise
    from servegym.workloads.registry import load_spec

    model = get_model(request.model)
    hardware = get_hardware(request.hardware)
    config = load_serving_config(request.config_file, request.overrides)
    spec, base_dir = load_spec(
        request.workload,
        request.workload_overrides,
        requests=request.requests,
        scale=request.scale,
        flag="--workload-set",
    )
    prepare_out(request.out)
    workload = materialise(spec, request.seed, base_dir=base_dir)

    meta: dict[str, Any] = {
        "track": "sim",
        "model": model.id,
        "hardware": hardware.id,
        "config": config.model_dump(mode="json", exclude_defaults=True),
        "workload": spec.name,
        "workload_spec": spec.model_dump(mode="json"),
        "workload_hash": workload.content_hash(),
        "seed": request.seed,
        "noise": request.noise,
        "sla": request.sla.model_dump() if request.sla else None,
        "argv": sys.argv[1:],
    }
    write_json(request.out / "run.json", meta)

    target = SimTarget(model.id, hardware.id, config, noise=request.noise)
    started = time.perf_counter()
    result = run_async(target.run(workload, RunOptions(model=model.id)))
    wall = time.perf_counter() - started
    assert target.last_run is not None
    stats = target.last_run.stats

    write_records(result, request.out / "requests.jsonl")
    price = Price(price_per_hour=hardware.price_per_hour, gpus=stats.num_gpus)
    metrics = compute_metrics(result, sla=request.sla, price=price)
    write_text_atomic(request.out / "metrics.json", metrics.model_dump_json(indent=2) + "\n")
    write_text_atomic(request.out / "sim.json", stats.model_dump_json(indent=2) + "\n")
    title = (
        f"{spec.name} (seed {request.seed}) on {model.id} @ {hardware.id}"
        f" x{stats.num_gpus}, simulated in {wall:.2f} s"
    )
    return SimOutcome(metrics=metrics, stats=stats, out=request.out, title=title)
