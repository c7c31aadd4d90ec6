"""Workloads: specs, their materialisation from a seed, and the shipped workload files.

The usual path::

    spec, base_dir = load_spec("balanced", ["arrival.kind=poisson", "arrival.rate=4"])
    workload = materialise(spec, seed=0, base_dir=base_dir)
    print(summarise(workload).content_hash)
"""

from servegym.workloads.generate import materialise
from servegym.workloads.model import Session, Turn, Workload
from servegym.workloads.registry import WorkloadInfo, list_workloads, load_spec
from servegym.workloads.spec import WorkloadSpec
from servegym.workloads.summary import WorkloadSummary, summarise

__all__ = [
    "Session",
    "Turn",
    "Workload",
    "WorkloadInfo",
    "WorkloadSpec",
    "WorkloadSummary",
    "list_workloads",
    "load_spec",
    "materialise",
    "summarise",
]
