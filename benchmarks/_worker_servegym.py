"""Worker for ServeGym's own load generator, run with ServeGym's Python.

Each job builds a synthetic :class:`~servegym.workloads.spec.WorkloadSpec` at fixed lengths
with a ``constant`` arrival at rate ``R`` (no warm-up), materialises it and runs it with
:class:`~servegym.loadgen.http_target.HttpTarget` and default :class:`RunOptions`, exactly
as ``servegym bench`` would. It replies with the completed and failed counts and the
generator's own measurement of itself (p99 send lag, CPU fraction, ``client_bound``).
See ``_worker_common.py`` for the protocol.
"""

from __future__ import annotations

from typing import Any

from _worker_common import Handler, Job, Reply, dist_version, serve


def setup(cfg: dict[str, Any]) -> tuple[dict[str, Any], Handler]:
    from servegym.loadgen.eventloop import run, uvloop_available
    from servegym.loadgen.http_target import HttpTarget
    from servegym.loadgen.target import RunOptions
    from servegym.workloads import WorkloadSpec, materialise
    from servegym.workloads.spec import ArrivalSpec, LengthDistribution

    target = HttpTarget(cfg["base_url"])

    def handle(job: Job) -> Reply:
        spec = WorkloadSpec(
            name="capacity",
            kind="synthetic",
            num_requests=int(job["num_requests"]),
            input_tokens=LengthDistribution(dist="fixed", value=cfg["input_tokens"]),
            output_tokens=LengthDistribution(dist="fixed", value=cfg["output_tokens"]),
            arrival=ArrivalSpec(kind="constant", rate=float(job["rate"])),
        )
        workload = materialise(spec, seed=int(job["seed"]))
        result = run(target.run(workload, RunOptions(model=cfg["model"])))
        measured = [r for r in result.records if not r.warmup]
        completed = sum(1 for r in measured if r.ok)
        return {
            "completed": completed,
            "failed": len(measured) - completed,
            "self_send_lag_ms_p99": result.loadgen.send_lag_ms_p99,
            "self_send_lag_ms_max": result.loadgen.send_lag_ms_max,
            "cpu_fraction": result.loadgen.cpu_fraction,
            "client_bound": result.loadgen.client_bound,
        }

    return {"version": dist_version("servegym"), "uvloop": uvloop_available()}, handle


if __name__ == "__main__":
    serve(setup)
