"""The Docker sandbox: one server image run in one container, on the gpu and cpu tracks.

A :class:`ContainerSpec` says what to run and with what limits; :func:`container_kwargs` turns
it into the exact keyword arguments of the Docker SDK's ``containers.run`` / ``create`` (a pure
function, the part the unit tests check); :class:`DockerRunner` starts it and hands back a
:class:`RunningContainer` that streams its logs to a file, reports its exit (and whether the
kernel's OOM killer ended it), and stops it: SIGTERM, SIGKILL after a timeout, then removal.

Containers get no network unless a port must be published, or the harness must reach a
port of theirs without giving them the outside: ``network="internal"`` attaches them to
:data:`INTERNAL_NETWORK`, a Docker network with no route out, whose addresses this host
reaches (:meth:`RunningContainer.address`). They see the model read-only under
``/models/<name>``, and carry the label ``servegym=1`` so that leftovers of a crashed harness
can be found and removed (:meth:`DockerRunner.cleanup_leftovers`). The images themselves are
built from ``sandbox/`` at the repository root (see ``sandbox/README.md``).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import threading
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any, Literal

import docker
import docker.errors
import docker.types
import requests.exceptions
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from servegym.errors import UserError
from servegym.sandbox.registry import register_sandbox

LABEL = "servegym"
"""Every container the runner starts carries ``LABEL=LABEL_VALUE``."""
LABEL_VALUE = "1"
OWNER_LABEL = "servegym.owner"
"""``HOST:PID`` of the process that started the container: a container whose owner is gone
(a harness killed with SIGKILL can remove nothing) is an orphan,
:meth:`DockerRunner.cleanup_orphans` removes it."""
MODELS_ROOT = "/models"
"""The model folder is mounted read-only at ``MODELS_ROOT/<folder name>``."""
WORKSPACE = "/workspace"
"""The workspace folder, when given, is mounted read-write here."""
DEFAULT_ENDPOINT = "unix:///var/run/docker.sock"
INTERNAL_NETWORK = "servegym-internal"
"""The Docker network of ``network="internal"`` containers: ``--internal``, so it has no
route beyond this host (no egress, no DNS), while this host reaches its containers'
addresses. Made on first use, labelled ``servegym=1``."""

_SIZE = re.compile(r"^[1-9][0-9]*[bkmg]?$", re.IGNORECASE)
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


class Mount(BaseModel):
    """One host folder or file bind-mounted into the container."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: Path
    container: str
    read_only: bool = True

    @field_validator("host")
    @classmethod
    def _absolute_host(cls, v: Path) -> Path:
        # A relative path would be taken by Docker as the name of a volume, not a folder.
        return v.expanduser().absolute()

    @field_validator("container")
    @classmethod
    def _absolute_container(cls, v: str) -> str:
        if not v.startswith("/") or PurePosixPath(v) == PurePosixPath("/"):
            raise ValueError(f"container path must be an absolute path below '/', not '{v}'")
        return str(PurePosixPath(v))


class ContainerSpec(BaseModel):
    """What to run in one container, and with what limits."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field(min_length=1)
    command: list[str] = Field(default_factory=list)
    """The container's command: the arguments of the image's entrypoint, if it has one."""
    entrypoint: list[str] | None = None
    """Replaces the image's entrypoint when given."""
    env: dict[str, str] = Field(default_factory=dict)
    name: str | None = None
    gpus: PositiveInt | Literal["all"] | None = None
    """GPUs to grant: a count, ``"all"``, or none (no GPU device at all)."""
    network: Literal["none", "bridge", "internal"] = "none"
    """``"none"``: no network at all (the default); ``"bridge"``: needed to publish a port;
    ``"internal"``: on :data:`INTERNAL_NETWORK`, reached by this host at the container's
    address, with no route beyond this host."""
    ports: dict[int, int] = Field(default_factory=dict)
    """Container port -> host port (0: any free host port); only with ``network="bridge"``."""
    host_ip: str = "127.0.0.1"
    """The host address published ports are bound to (loopback: not reachable from outside)."""
    model_dir: Path | None = None
    """Host folder of the model, mounted read-only at :attr:`container_model_path`."""
    workspace_dir: Path | None = None
    """Host folder mounted read-write at ``/workspace``."""
    mounts: list[Mount] = Field(default_factory=list)
    mem_limit: str | None = None
    """Memory limit in Docker's form, e.g. ``"16g"``; past it the kernel's OOM killer acts."""
    cpus: float | None = Field(default=None, gt=0)
    shm_size: str | None = None
    """Size of ``/dev/shm``, e.g. ``"8g"`` (PyTorch workers share tensors through it)."""
    labels: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    """``UID[:GID]`` to run as (None: the image's user), e.g. the host user's, so that what
    the container writes into a mounted folder is the host user's to remove."""

    @field_validator("mem_limit", "shm_size")
    @classmethod
    def _valid_size(cls, v: str | None) -> str | None:
        if v is not None and not _SIZE.match(v):
            raise ValueError(f"'{v}' is not a size like '512m' or '16g'")
        return v

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.match(v):
            raise ValueError(f"'{v}' is not a container name (letters, digits, '_', '.', '-')")
        return v

    @field_validator("env")
    @classmethod
    def _valid_env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not key or "=" in key:
                raise ValueError(f"'{key}' is not an environment variable name")
        return v

    @field_validator("ports")
    @classmethod
    def _valid_ports(cls, v: dict[int, int]) -> dict[int, int]:
        for container_port, host_port in v.items():
            if not 1 <= container_port <= 65535 or not 0 <= host_port <= 65535:
                raise ValueError(f"port {container_port} -> {host_port} is out of range")
        return v

    @field_validator("model_dir", "workspace_dir")
    @classmethod
    def _absolute_dir(cls, v: Path | None) -> Path | None:
        return None if v is None else v.expanduser().absolute()

    @model_validator(mode="after")
    def _consistent(self) -> ContainerSpec:
        if self.ports and self.network != "bridge":
            raise ValueError(
                f"ports: publishing a port needs network='bridge'; with network="
                f"'{self.network}' "
                + (
                    "the container has no network at all"
                    if self.network == "none"
                    else "this host reaches the container's own address"
                )
            )
        if self.model_dir is not None and not self.model_dir.name:
            raise ValueError(f"model_dir: '{self.model_dir}' has no folder name to mount it as")
        seen_host: set[Path] = set()
        seen_container: set[str] = set()
        for mount in self.all_mounts():
            if mount.host in seen_host:
                raise ValueError(f"mounts: '{mount.host}' is mounted twice")
            if mount.container in seen_container:
                raise ValueError(f"mounts: two mounts at '{mount.container}'")
            seen_host.add(mount.host)
            seen_container.add(mount.container)
        return self

    @property
    def container_model_path(self) -> str | None:
        """Where the model folder is inside the container: ``/models/<folder name>``."""
        if self.model_dir is None:
            return None
        return f"{MODELS_ROOT}/{self.model_dir.name}"

    def all_mounts(self) -> list[Mount]:
        """The model (read-only), the workspace (read-write) and the extra mounts."""
        mounts: list[Mount] = []
        if self.model_dir is not None and self.container_model_path is not None:
            mounts.append(Mount(host=self.model_dir, container=self.container_model_path))
        if self.workspace_dir is not None:
            mounts.append(Mount(host=self.workspace_dir, container=WORKSPACE, read_only=False))
        mounts.extend(self.mounts)
        return mounts


def container_kwargs(spec: ContainerSpec) -> dict[str, object]:
    """The keyword arguments of ``docker.from_env().containers.run(...)`` (or ``.create``)."""
    kwargs: dict[str, object] = {
        "image": spec.image,
        "command": list(spec.command) or None,
        "detach": True,
        "auto_remove": False,
        "init": True,  # a tiny init as PID 1: forwards SIGTERM to the server, reaps children
        "environment": dict(spec.env),
        "labels": {**spec.labels, LABEL: LABEL_VALUE, OWNER_LABEL: owner()},
        "network_mode": INTERNAL_NETWORK if spec.network == "internal" else spec.network,
        "stop_signal": "SIGTERM",
        # Mounts, not "volumes": a volume is written HOST:CONTAINER:MODE, which a host path
        # with a colon in it (a trial folder named after "claude-code:MODEL") breaks.
        "mounts": [
            docker.types.Mount(m.container, str(m.host), type="bind", read_only=m.read_only)
            for m in spec.all_mounts()
        ],
    }
    if spec.entrypoint is not None:
        kwargs["entrypoint"] = list(spec.entrypoint)
    if spec.name is not None:
        kwargs["name"] = spec.name
    if spec.user is not None:
        kwargs["user"] = spec.user
    if spec.gpus is not None:
        count = -1 if spec.gpus == "all" else spec.gpus
        kwargs["device_requests"] = [
            docker.types.DeviceRequest(count=count, capabilities=[["gpu"]])
        ]
    if spec.ports:
        kwargs["ports"] = {
            f"{c}/tcp": (spec.host_ip, h if h else None) for c, h in sorted(spec.ports.items())
        }
    if spec.mem_limit is not None:
        kwargs["mem_limit"] = spec.mem_limit
    if spec.cpus is not None:
        kwargs["nano_cpus"] = int(spec.cpus * 1e9)
    if spec.shm_size is not None:
        kwargs["shm_size"] = spec.shm_size
    return kwargs


def owner() -> str:
    """This process as a container's owner: ``HOST:PID``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(value: str) -> bool:
    """Whether the owner ``HOST:PID`` is alive: True for another host's (not ours to judge)."""
    host, _, pid = value.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


class ExitStatus(BaseModel):
    """How a container ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exit_code: int
    oom_killed: bool = False
    """The kernel's OOM killer ended it (it went past ``mem_limit``)."""
    error: str = ""
    """Docker's own error for the container, if any (e.g. it could not be started)."""


def _one_line(text: object, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _api_message(err: BaseException) -> str:
    """An engine error as one line: the engine's own explanation where it gave one."""
    return _one_line(getattr(err, "explanation", None) or err)


class RunningContainer:
    """A started container: its logs, its exit status, and how to stop it."""

    def __init__(self, container: Any, spec: ContainerSpec, log_api: Any = None) -> None:
        self._container = container
        self.spec = spec
        # A low-level client without a read timeout, for the log stream (with one, a quiet
        # server, e.g. one loading its weights, would end the stream); None: the container's.
        self._log_api = log_api
        self._final: ExitStatus | None = None
        self._log_thread: threading.Thread | None = None
        self.log_error: str | None = None
        """Why log streaming ended early, if it did."""

    @property
    def id(self) -> str:
        return str(self._container.id)

    @property
    def name(self) -> str:
        return str(self._container.name)

    def logs_tail(self, n: int = 100) -> str:
        """The last ``n`` lines of stdout and stderr ("" once the container is removed)."""
        try:
            data = self._container.logs(stdout=True, stderr=True, tail=n)
        except docker.errors.NotFound:
            return ""
        return bytes(data).decode("utf-8", errors="replace")

    def stream_logs(self, path: str | Path) -> Path:
        """Append the container's stdout and stderr to ``path`` as they come (a thread)."""
        if self._log_thread is not None:
            raise RuntimeError(f"logs of container {self.id[:12]} are already being streamed")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()  # there when this returns, before the thread's first write
        # Opened here, so that an engine error surfaces in the caller; read in the thread.
        options: dict[str, Any] = {"stdout": True, "stderr": True, "stream": True, "follow": True}
        if self._log_api is not None:
            stream = self._log_api.logs(self.id, **options)
        else:
            stream = self._container.logs(**options)
        self._log_thread = threading.Thread(
            target=self._pump, args=(stream, target), name=f"logs-{self.id[:12]}", daemon=True
        )
        self._log_thread.start()
        return target

    def _pump(self, stream: Any, target: Path) -> None:
        with target.open("ab") as out:
            try:
                for chunk in stream:
                    out.write(chunk)
                    out.flush()
            except _ENGINE_ERRORS as err:  # the engine went away or the container was removed
                self.log_error = _one_line(err)

    def host_pid(self) -> int | None:
        """The pid of the container's first process in this host's process table (None
        once it stopped, or where the engine runs elsewhere, e.g. in a VM)."""
        try:
            self._container.reload()
        except docker.errors.NotFound:
            return None
        pid = int((self._container.attrs.get("State") or {}).get("Pid") or 0)
        if pid <= 0 or not Path(f"/proc/{pid}").exists():
            return None
        return pid

    def address(self) -> str | None:
        """The container's IPv4 address on its network (None with ``network="none"``)."""
        self._container.reload()
        networks = (self._container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
        for net in networks.values():
            if (net or {}).get("IPAddress"):
                return str(net["IPAddress"])
        return None

    def exit_status(self) -> ExitStatus | None:
        """None while the container runs; else its exit code and whether it was OOM-killed."""
        if self._final is not None:
            return self._final
        try:
            self._container.reload()
        except docker.errors.NotFound:
            self._final = ExitStatus(exit_code=-1, error="the container was removed")
            return self._final
        state = self._container.attrs.get("State", {})
        if state.get("Status") not in ("exited", "dead"):
            return None
        return ExitStatus(
            exit_code=int(state.get("ExitCode", -1)),
            oom_killed=bool(state.get("OOMKilled", False)),
            error=str(state.get("Error") or ""),
        )

    def host_port(self, container_port: int) -> int | None:
        """The host port a published container port was bound to (None if not published)."""
        self._container.reload()
        bindings = (self._container.attrs.get("NetworkSettings") or {}).get("Ports") or {}
        for binding in bindings.get(f"{container_port}/tcp") or []:
            if binding.get("HostPort"):
                return int(binding["HostPort"])
        return None

    def pause(self) -> None:
        """Freeze every process of the container (``docker pause``)."""
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            self._container.pause()

    def unpause(self) -> None:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            self._container.unpause()

    def stop(self, timeout_s: float = 10.0) -> ExitStatus:
        """SIGTERM, SIGKILL if still running after ``timeout_s``, then remove; how it ended."""
        if self._final is not None:
            return self._final
        try:
            # The engine sends the stop signal (SIGTERM), then SIGKILL after the timeout.
            self._container.stop(timeout=max(0, math.ceil(timeout_s)))
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError:
            with contextlib.suppress(docker.errors.APIError):
                self._container.kill()
        status = self.exit_status() or ExitStatus(exit_code=-1, error="still running at removal")
        with contextlib.suppress(docker.errors.NotFound):
            self._container.remove(force=True, v=True)
        if self._log_thread is not None:
            self._log_thread.join(timeout=5.0)
        self._final = status
        return status

    def __enter__(self) -> RunningContainer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@register_sandbox("docker")
class DockerRunner:
    """Runs containers on the Docker engine that ``DOCKER_HOST`` (or the default socket) names.

    ``client``: a Docker SDK client to use (default: ``docker.from_env()`` on first use).
    ``pull``: fetch a missing image from its registry instead of refusing to start.
    """

    def __init__(self, client: Any = None, *, pull: bool = False, timeout_s: int = 60) -> None:
        self._own_client = client is None
        self._docker = client
        self._log_api: Any = None
        self.pull = pull
        self.timeout_s = timeout_s

    @staticmethod
    def endpoint() -> str:
        return os.environ.get("DOCKER_HOST") or DEFAULT_ENDPOINT

    def _unreachable(self, err: object) -> str:
        return f"no Docker engine answers at {self.endpoint()}: {_one_line(err)}"

    def client(self) -> Any:
        """The Docker SDK client; a :class:`UserError` when no engine answers."""
        if self._docker is None:
            try:
                self._docker = docker.from_env(timeout=self.timeout_s)
            except _ENGINE_ERRORS as err:
                raise UserError(self._unreachable(err)) from err
        return self._docker

    def available(self) -> str | None:
        """None when a Docker engine answers ``ping``; else why not, as one line."""
        try:
            self.client().ping()
        except UserError as err:
            return err.message
        except _ENGINE_ERRORS as err:
            return self._unreachable(err)
        return None

    def start(self, spec: ContainerSpec) -> RunningContainer:
        """Create and start the container; a :class:`UserError` for what the user can fix."""
        client = self.client()
        with contextlib.suppress(UserError):
            self.cleanup_orphans()
        for mount in spec.all_mounts():
            # Docker would silently create a missing host folder, empty and owned by root.
            if not mount.host.exists():
                raise UserError(f"cannot mount '{mount.host}' at '{mount.container}': not found")
        self._ensure_image(client, spec.image)
        if spec.network == "internal":
            self.ensure_internal_network()
        try:
            container = client.containers.create(**container_kwargs(spec))
        except docker.errors.ImageNotFound as err:
            raise UserError(self._missing_image(spec.image)) from err
        except docker.errors.APIError as err:
            raise UserError(
                f"docker could not create a container of '{spec.image}': {_api_message(err)}"
            ) from err
        except _ENGINE_ERRORS as err:
            raise UserError(self._unreachable(err)) from err
        try:
            container.start()
        except _ENGINE_ERRORS as err:
            message = _api_message(err)
            with contextlib.suppress(*_ENGINE_ERRORS):
                container.remove(force=True, v=True)
            raise UserError(self._start_failure(spec, message)) from err
        return RunningContainer(container, spec, self._log_stream_api())

    def ensure_internal_network(self) -> str:
        """:data:`INTERNAL_NETWORK` on the engine, made when absent; its name."""
        client = self.client()
        try:
            if client.networks.list(names=[INTERNAL_NETWORK]):
                return INTERNAL_NETWORK
            client.networks.create(
                INTERNAL_NETWORK, driver="bridge", internal=True,
                labels={LABEL: LABEL_VALUE}, check_duplicate=True,
            )  # fmt: skip
        except docker.errors.APIError as err:
            if "already exists" not in _api_message(err):  # made meanwhile by another harness
                raise UserError(
                    f"docker could not make the network {INTERNAL_NETWORK}: {_api_message(err)}"
                ) from err
        except _ENGINE_ERRORS as err:
            raise UserError(self._unreachable(err)) from err
        return INTERNAL_NETWORK

    def _log_stream_api(self) -> Any:
        """For the runner's own client: a second one without a read timeout, for log streams."""
        if self._log_api is None and self._own_client:
            try:
                self._log_api = docker.from_env(timeout=None).api
            except _ENGINE_ERRORS:
                return None
        return self._log_api

    def _ensure_image(self, client: Any, image: str) -> None:
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound as err:
            if not self.pull:
                raise UserError(self._missing_image(image)) from err
            try:
                client.images.pull(image)
            except _ENGINE_ERRORS as pull_err:
                raise UserError(
                    f"{self._missing_image(image)}; pulling it failed: {_api_message(pull_err)}"
                ) from pull_err
        except docker.errors.APIError as err:
            raise UserError(
                f"docker could not look up image '{image}': {_api_message(err)}"
            ) from err
        except _ENGINE_ERRORS as err:
            raise UserError(self._unreachable(err)) from err

    @staticmethod
    def _missing_image(image: str) -> str:
        return (
            f"image '{image}' is not on this Docker engine; build it from sandbox/ "
            f"(e.g. docker build -t servegym/vllm-cpu sandbox/cpu; see sandbox/README.md)"
        )

    @staticmethod
    def _start_failure(spec: ContainerSpec, message: object) -> str:
        text = _one_line(message)
        if spec.gpus is not None and ("device driver" in text or "gpu" in text.lower()):
            return (
                f"docker could not give '{spec.image}' GPUs (is the NVIDIA Container Toolkit "
                f"installed and the engine restarted?): {text}"
            )
        return f"docker could not start '{spec.image}': {text}"

    def cleanup_orphans(self) -> list[str]:
        """Remove the containers of this host's ServeGym processes that are gone (killed
        before they could stop their containers); their names. Those of live processes, and
        of other hosts, stay."""
        client = self.client()
        removed: list[str] = []
        try:
            found = client.containers.list(all=True, filters={"label": f"{LABEL}={LABEL_VALUE}"})
        except _ENGINE_ERRORS as err:
            raise UserError(self._unreachable(err)) from err
        for container in found:
            value = (getattr(container, "labels", None) or {}).get(OWNER_LABEL, "")
            if not value or owner_alive(value):
                continue
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                container.remove(force=True, v=True)
                removed.append(str(container.name))
        return removed

    def cleanup_leftovers(self) -> list[str]:
        """Remove every container labelled ``servegym=1``, running or not; their names."""
        client = self.client()
        removed: list[str] = []
        try:
            leftovers = client.containers.list(
                all=True, filters={"label": f"{LABEL}={LABEL_VALUE}"}
            )
        except _ENGINE_ERRORS as err:
            raise UserError(self._unreachable(err)) from err
        for container in leftovers:
            try:
                container.remove(force=True, v=True)
            except docker.errors.NotFound:
                continue
            removed.append(str(container.name))
        return removed
