"""A real engine's server in a container of its sandbox image (``--sandbox docker``).

:class:`ContainerServer` is a :class:`~servegym.engines.served.ManagedServer` whose process is a
container (:class:`ContainerProcess`): the same check of the config against the engine's
table, the same wait for ``/health`` and ``/v1/models``, the same exit reports (an OOM kill
included) and the same stop, so a track measures it exactly as it measures a server started
from the host's environment. The container:

- runs the engine's image (:data:`ENGINE_IMAGES`; built by ``servegym setup images``), whose
  entrypoint is ``vllm serve``: its command is what the engine renders for the config, with
  the model at ``/models/<name>`` (the host's folder, mounted read-only) and the server on
  port :data:`CONTAINER_PORT` of every address;
- is on the internal network (``network="internal"`` of
  :class:`~servegym.sandbox.docker_runner.ContainerSpec`): nothing beyond this host is
  reachable from it; the harness measures it at its own address;
- has limits (:class:`ContainerLimits`): memory (past it the kernel's OOM killer ends it,
  reported as out of memory), CPUs (default: as many as this machine has, the cores a local
  server gets) and ``/dev/shm``;
- keeps the engine's compile caches in a harness-owned folder of their own, mounted at
  ``/cache`` and scrubbed of torn entries before each start like a local server's (a
  second start loads compiled graphs instead of compiling anew);
- gets the engine's environment: its defaults, the config's, the pinned hardware class;
- runs at the harness's own CPU priority (its niceness), as a local server, the harness's
  child, would: the engine does not pass it on, so the harness renices the container's
  processes once they start and again when the server is ready (a server started by
  ``nice -n 19 servegym run`` must not outrun, on a busy machine, the same server run
  locally).

The gpu images take the same path (their GPUs granted with ``gpus="all"``); SGLang's image has
no ``vllm serve`` entrypoint, so it is not offered here yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import time
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from servegym.engines.base import Engine, LaunchSpec, ModelRef
from servegym.engines.compile_cache import harness_compile_cache
from servegym.engines.config import ServingConfig
from servegym.engines.process import (
    OOM_PATTERNS,
    ExitInfo,
    Phase,
    ServerCrashed,
    ServerProcess,
    read_tail,
)
from servegym.engines.served import ManagedServer
from servegym.errors import UserError
from servegym.sandbox.docker_runner import (
    INTERNAL_NETWORK,
    MODELS_ROOT,
    WORKSPACE,
    ContainerSpec,
    DockerRunner,
    Mount,
    RunningContainer,
)
from servegym.sandbox.egress import descendants
from servegym.sandbox.images import IMAGES

ENGINE_IMAGES: dict[str, str] = {"vllm-cpu": IMAGES["cpu"].tag, "vllm": IMAGES["vllm"].tag}
"""The image each engine's server runs in, by engine name (entrypoint: ``vllm serve``)."""
ENGINE_IMAGE_NAMES: dict[str, str] = {"vllm-cpu": "cpu", "vllm": "vllm"}
"""The ``servegym setup images`` name that builds each engine's image."""
CONTAINER_PORT = 8000
CACHE_ROOT = "/cache"
"""Where the container's compile-cache folder is mounted."""
POLL_INTERVAL_S = 0.5
"""How often a watcher asks the engine whether the container still runs."""
HOST_USER_ENV = {"USER": "servegym", "LOGNAME": "servegym"}
"""The host user has no entry in the image's passwd: its name for ``getpass.getuser()``."""


def host_user() -> str | None:
    """``UID:GID`` of this process (what a container writes into mounted folders is then
    the host user's); None where there is no such thing."""
    if not hasattr(os, "getuid"):
        return None
    return f"{os.getuid()}:{os.getgid()}"


class ContainerLimits(BaseModel):
    """A server container's limits (Docker's ``--memory``, ``--cpus``, ``--shm-size``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory: str = Field(default="8g", description="memory limit, e.g. '8g' (OOM-killed past it)")
    cpus: float | None = Field(
        default=None, gt=0, description="CPUs (None: as many as this machine has)"
    )
    shm_size: str = Field(default="1g", description="size of /dev/shm")

    def cpus_here(self) -> float:
        return self.cpus if self.cpus is not None else float(os.cpu_count() or 1)


def engine_image(engine: Engine) -> str:
    """The image ``engine``'s servers run in; a UserError for an engine without one."""
    image = ENGINE_IMAGES.get(engine.name)
    if image is None:
        raise UserError(
            f"--sandbox docker: no container image runs the {engine.name} engine yet "
            f"(images: {', '.join(f'{e} -> {i}' for e, i in ENGINE_IMAGES.items())})"
        )
    return image


def check_docker_ready(engine: Engine, model: ModelRef, runner: DockerRunner | None = None) -> str:
    """The image ``engine``'s servers run in (``TAG@ID``, the id cut to 12 digits), once it
    is known that they can: a Docker engine answers, the image is on it, the model is a
    local folder. A one-line UserError saying what to do otherwise."""
    image = engine_image(engine)
    if not Path(model.path).is_dir():
        raise UserError(
            f"--sandbox docker: the model '{model.path}' is not a folder on this machine (a "
            "container sees the model only through a read-only mount of its folder)"
        )
    runner = runner or DockerRunner()
    problem = runner.available()
    if problem is not None:
        raise UserError(f"--sandbox docker: {problem}")
    import docker.errors

    try:
        found = runner.client().images.get(image)
    except docker.errors.ImageNotFound:
        name = ENGINE_IMAGE_NAMES.get(engine.name, engine.name)
        raise UserError(
            f"--sandbox docker: the image {image} is not on this Docker engine: build it "
            f"with `servegym setup images {name}` (see sandbox/README.md)"
        ) from None
    except docker.errors.APIError as err:
        raise UserError(f"--sandbox docker: docker could not look up {image}: {err}") from None
    image_id = str(getattr(found, "id", "") or "").removeprefix("sha256:")[:12]
    return f"{image}@{image_id}" if image_id else image


def _signal_of(exit_code: int) -> str | None:
    """The signal a container's exit code 128+N says ended it."""
    if exit_code <= 128:
        return None
    try:
        return signal.Signals(exit_code - 128).name
    except ValueError:
        return f"signal {exit_code - 128}"


class ContainerProcess(ServerProcess):
    """A server running in a container (see the module docstring). ``spec`` is the server
    as the harness reaches it (its host becomes the container's address once started);
    ``container`` what the runner starts."""

    def __init__(
        self,
        spec: LaunchSpec,
        container: ContainerSpec,
        log_path: Path,
        *,
        runner: DockerRunner,
        start_timeout_s: float = 300.0,
    ) -> None:
        super().__init__(spec, log_path, start_timeout_s=start_timeout_s)
        self.container = container
        self.runner = runner
        self.running_container: RunningContainer | None = None

    @property
    def started(self) -> bool:
        return self.running_container is not None

    def leader_pid(self) -> int | None:
        """The container's first process (its init) in this machine's process table."""
        if self.running_container is None:
            return None
        return self.running_container.host_pid()

    def docker_line(self) -> str:
        """The container as a ``docker run`` line, for the log."""
        c = self.container
        network = INTERNAL_NETWORK if c.network == "internal" else c.network
        parts = ["docker", "run", "--init", f"--network={network}"]
        if c.user:
            parts.append(f"--user={c.user}")
        if c.entrypoint:
            parts.append(f"--entrypoint={' '.join(c.entrypoint)}")
        if c.mem_limit:
            parts.append(f"--memory={c.mem_limit}")
        if c.cpus:
            parts.append(f"--cpus={c.cpus:g}")
        if c.shm_size:
            parts.append(f"--shm-size={c.shm_size}")
        for m in c.all_mounts():
            ro = ",readonly" if m.read_only else ""
            parts.append(f"--mount=type=bind,source={m.host},target={m.container}{ro}")
        parts += [f"-e={k}={v}" for k, v in sorted(c.env.items())]
        return " ".join(shlex.quote(p) for p in [*parts, c.image, *c.command])

    def start(self) -> None:
        with self.begin_log(self.docker_line()):
            pass
        try:
            running = self.runner.start(self.container)
        except UserError as e:
            info = ExitInfo(returncode=125, phase="start", log_tail=e.message)
            self._exit = info
            raise ServerCrashed(
                f"{self.spec.engine} could not be started in a container: {e.message}",
                info,
                self.log_path,
            ) from None
        self.running_container = running
        self._started_at = time.monotonic()
        running.stream_logs(self.log_path)
        address = running.address()
        if address is None:
            running.stop(timeout_s=0)
            info = ExitInfo(returncode=125, phase="start", log_tail="the container has no address")
            self._exit = info
            raise ServerCrashed(
                f"{self.spec.engine}: its container has no network address", info, self.log_path
            )
        self.spec = self.spec.model_copy(update={"host": address})
        self.match_niceness()

    def match_niceness(self, niceness: int | None = None) -> int:
        """Give the container's processes ``niceness`` (default: this process's, which a
        local server inherits) where theirs is lower; how many were changed."""
        own = os.getpriority(os.PRIO_PROCESS, 0) if niceness is None else niceness
        leader = self.leader_pid()
        if own <= 0 or leader is None:
            return 0
        changed = 0
        for pid in descendants(leader):
            with contextlib.suppress(OSError):
                if os.getpriority(os.PRIO_PROCESS, pid) < own:
                    os.setpriority(os.PRIO_PROCESS, pid, own)
                    changed += 1
        return changed

    async def wait_ready(self) -> float:
        ready = await super().wait_ready()
        await asyncio.to_thread(self.match_niceness)  # processes started since
        return ready

    def poll(self, phase: Phase = "run") -> ExitInfo | None:
        if self._exit is not None:
            return self._exit
        if self.running_container is None:
            return None
        status = self.running_container.exit_status()
        if status is None:
            return None
        tail = read_tail(self.log_path)
        self._exit = ExitInfo(
            returncode=status.exit_code,
            signal=_signal_of(status.exit_code),
            oom=status.oom_killed or bool(OOM_PATTERNS.search(tail)),
            stopped_by_harness=self._stopping,
            phase=phase,
            log_tail=tail or status.error,
        )
        return self._exit

    async def wait_exit(self, interval_s: float = POLL_INTERVAL_S) -> ExitInfo:
        while (info := await asyncio.to_thread(self.poll)) is None:
            await asyncio.sleep(max(interval_s, POLL_INTERVAL_S))
        return info

    def pause(self) -> None:
        """``docker pause`` (the cgroup freezer) until :meth:`resume`."""
        if self.running_container is not None and self.running and not self.paused:
            self.running_container.pause()
            self.paused = True

    def resume(self) -> None:
        if self.running_container is not None and self.paused:
            self.running_container.unpause()
            self.paused = False

    def stop(self, grace_s: float = 15.0) -> ExitInfo | None:
        """SIGTERM the container's server, SIGKILL after ``grace_s``, remove the container."""
        running = self.running_container
        if running is None:
            return self._exit
        self.resume()
        if self._exit is None and running.exit_status() is None:
            self._stopping = True
        running.stop(timeout_s=grace_s)
        return self.poll()


class ContainerServer(ManagedServer):
    """A config's server in a container of the engine's image (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        config: ServingConfig,
        model: ModelRef,
        log_path: Path,
        *,
        start_timeout_s: float = 300.0,
        limits: ContainerLimits | None = None,
        runner: DockerRunner | None = None,
    ) -> None:
        super().__init__(
            engine, config, model, log_path, port=CONTAINER_PORT, start_timeout_s=start_timeout_s
        )
        self.image = engine_image(engine)
        self.limits = limits or ContainerLimits()
        self.runner = runner or DockerRunner()
        self.cache_dir = harness_compile_cache(f"{engine.name}-container")
        """The compile caches' host folder: its own, apart from local servers' (whose
        entries were compiled by another Python installation)."""

    @property
    def container_model(self) -> ModelRef:
        folder = Path(self.model.path)
        return ModelRef(path=f"{MODELS_ROOT}/{folder.name}", served_name=self.model.served_name)

    def _cache_paths(self) -> dict[str, tuple[str, Path]]:
        """Each compile-cache variable: its path in the container, its folder on the host."""
        local_root = harness_compile_cache(self.engine.name)
        out: dict[str, tuple[str, Path]] = {}
        for key, value in self.engine.compile_cache_env().items():
            rel = Path(value).relative_to(local_root)
            out[key] = (str(PurePosixPath(CACHE_ROOT) / rel.as_posix()), self.cache_dir / rel)
        return out

    def spec(self, port: int) -> LaunchSpec:
        """The server as the harness reaches it, its argv the container's command."""
        launch = self.engine.launch_spec(
            self.config, self.container_model, CONTAINER_PORT, host_addr="0.0.0.0"
        )
        caches = self._cache_paths()
        env = dict(launch.env)
        for key, (inside, _host) in caches.items():
            if env.get(key) == self.engine.compile_cache_env()[key]:
                env[key] = inside
        return launch.model_copy(
            update={
                "argv": launch.argv[len(self.engine.command()) :],
                "env": env,
                "inherit_env": False,
                "env_unset": [],
                "compile_caches": [str(host) for _inside, host in caches.values()],
            }
        )

    def container_spec(self, spec: LaunchSpec) -> ContainerSpec:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        return ContainerSpec(
            image=self.image,
            command=list(spec.argv),
            env={**HOST_USER_ENV, "HOME": f"{CACHE_ROOT}/home", **spec.env},
            model_dir=Path(self.model.path),
            mounts=[Mount(host=self.cache_dir, container=CACHE_ROOT, read_only=False)],
            **self._common(),
        )

    def _common(self) -> dict[str, Any]:
        """What every server container of this engine shares: network, limits, user."""
        return {
            "network": "internal",
            "gpus": "all" if self.engine.platform == "gpu" else None,
            "mem_limit": self.limits.memory,
            "cpus": self.limits.cpus_here(),
            "shm_size": self.limits.shm_size,
            "labels": {"servegym.engine": self.engine.name},
            "user": host_user(),
        }

    def new_process(self, spec: LaunchSpec) -> ServerProcess:
        return ContainerProcess(
            spec,
            self.container_spec(spec),
            self.log_path,
            runner=self.runner,
            start_timeout_s=self.start_timeout_s,
        )


class ContainerLauncherServer(ContainerServer):
    """A workspace's launcher (``start_server.sh``) run by ``bash`` in a container of the
    engine's image: the workspace folder mounted read-write at ``/workspace`` (its working
    folder and ``HOME``), ``PORT``, ``HOST``, ``MODEL_PATH`` and ``SERVED_MODEL_NAME`` set
    as a local sandbox sets them, ``env`` (the pinned hardware class) on top; the image's
    ``vllm`` first on ``PATH``. No capability table is asked: what the script runs is the
    agent's business, whether it serves honestly is measured."""

    runs_launcher = True

    def __init__(
        self,
        engine: Engine,
        workspace: Path,
        script: str,
        model: ModelRef,
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 300.0,
        limits: ContainerLimits | None = None,
        runner: DockerRunner | None = None,
    ) -> None:
        super().__init__(
            engine, ServingConfig(), model, log_path,
            start_timeout_s=start_timeout_s, limits=limits, runner=runner,
        )  # fmt: skip
        self.workspace = workspace
        self.script = script
        self.extra_env = dict(env or {})

    @property
    def label(self) -> str:
        return self.script

    def check(self) -> None:
        return None

    def spec(self, port: int) -> LaunchSpec:
        ws = WORKSPACE
        env = {
            **HOST_USER_ENV,
            "HOME": ws,
            "XDG_CACHE_HOME": f"{ws}/.cache",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "WORKSPACE": ws,
            "PYTHONDONTWRITEBYTECODE": "1",
            "MODEL_PATH": self.container_model.path,
            "SERVED_MODEL_NAME": self.model.served_name,
            **self.extra_env,
            "PORT": str(CONTAINER_PORT),
            "HOST": "0.0.0.0",
        }
        return LaunchSpec(
            engine=self.script,
            argv=["bash", self.script],
            env=env,
            host="0.0.0.0",
            port=CONTAINER_PORT,
            model=self.container_model,
            inherit_env=False,
            # the workspace's own cache, which a start killed mid-compile may have left torn
            compile_caches=[str(self.workspace / ".cache")],
        )

    def container_spec(self, spec: LaunchSpec) -> ContainerSpec:
        return ContainerSpec(
            image=self.image,
            entrypoint=[spec.argv[0]],
            command=list(spec.argv[1:]),
            env=dict(spec.env),
            model_dir=Path(self.model.path),
            workspace_dir=self.workspace,
            **self._common(),
        )
