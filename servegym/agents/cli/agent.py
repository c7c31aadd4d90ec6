"""CLI agents: Claude Code, Codex CLI, Gemini CLI and OpenCode in Docker, on every track.

``--agent claude-code:MODEL``, ``codex:MODEL``, ``gemini-cli:MODEL``, ``opencode:PROVIDER/MODEL``.
The CLI runs in a container of its own (:mod:`servegym.agents.cli.adapters`) with the task's
workspace at ``/workspace`` (a sim task's: a folder holding its ``serving.toml``,
:mod:`servegym.agents.cli.config_folder`), and acts on the task through ``servegym-agent``
(``benchmark [--quick]``, ``submit``, ``budget``), which calls the trial's control server
(:mod:`servegym.agents.cli.control`). It reaches its model through a proxy on the harness
side that adds the API key (:mod:`servegym.agents.cli.proxy`): the key never enters the
sandbox; the proxy counts each call's tokens and dollars, the trial's ``agent_cost``.

A trial runs sessions, one container each: the first on the instruction, each later one on a
continuation prompt saying how many minutes of budget remain, until the budget is spent
(``outcome = "budget_spent"``), a session does nothing more (``finished``: it made no
control call and exited cleanly), the CLI fails without doing anything (``cli_failed``),
or ``max_sessions`` is reached. Each session's command, exit code and output tail, and every
control call, are appended to ``trajectory.jsonl`` (the trial sets :attr:`trajectory_path`);
each session's full output is kept next to it in ``cli-agent/session-N.log``.

Settings (``make_agent`` keyword arguments): ``image`` (default ``servegym/cli-agents``),
``max_sessions`` (8), ``session_timeout_s`` (3600), ``base_url`` (the provider's API root, for
a gateway), ``api_key_env`` (the harness variable holding the key), ``run_as`` (``host``: the
host user's uid:gid, so workspace files stay yours; ``image``: the image's user) and, for
opencode, ``provider``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

from servegym.agents.base import (
    AgentBase,
    TaskDescription,
    TaskEnvironment,
    WorkspaceEnvironment,
    register_agent,
)
from servegym.agents.cli.adapters import (
    ADAPTERS,
    AGENT_SCRIPT,
    DEFAULT_IMAGE,
    WRAPPER,
    WRAPPER_TEXT,
    CliAdapter,
    OpenCodeAdapter,
    SessionSetup,
    continuation_prompt,
    first_prompt,
)
from servegym.agents.cli.config_folder import ConfigFolderTask
from servegym.agents.cli.keys import read_api_key
from servegym.agents.cli.usage import CostMeter
from servegym.errors import UserError
from servegym.providers.vendors import normalise_upstream

if TYPE_CHECKING:  # aiohttp and the Docker SDK load when a trial runs, not on registration
    from servegym.agents.cli.control import ControlledTask, ControlServer

OUTPUT_TAIL_CHARS = 4000
"""A session's output kept in the trajectory (the whole of it is in its log file)."""
SUBMIT_GRACE_S = 180.0
"""Once the budget is spent, a session gets this long to submit before it is stopped."""


@dataclass
class CliSettings:
    image: str = DEFAULT_IMAGE
    max_sessions: int = 8
    session_timeout_s: float = 3600.0
    base_url: str | None = None
    api_key_env: str | None = None
    run_as: Literal["host", "image"] = "host"
    provider: str | None = None


@dataclass(frozen=True)
class SessionResult:
    """How one session's container ended."""

    exit_code: int | None
    """None when it was stopped (timed out, or stopped after the budget was spent)."""
    seconds: float
    output_tail: str
    timed_out: bool = False
    stopped: bool = False
    error: str = ""


class SessionRunner(Protocol):
    """Where sessions run: Docker (:class:`DockerSessions`), or a stand-in in tests."""

    def available(self) -> str | None:
        """None when sessions can run; else why not, in one line."""
        ...

    def ensure_image(self, image: str) -> None: ...

    def addresses(self) -> tuple[str, str]:
        """(the address the harness's servers bind, the host name a container reaches
        them by)."""
        ...

    def run(
        self,
        kwargs: dict[str, Any],
        timeout_s: float,
        log_path: Path,
        stop: Callable[[], bool],
    ) -> SessionResult:
        """Run one session's container to its end (or ``timeout_s``, or until ``stop()``)."""
        ...


def _bindable(host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, 0))
        except OSError:
            return False
    return True


def bridge_gateway(configs: list[dict[str, Any]]) -> str | None:
    """The IPv4 gateway of a Docker network's IPAM configs: the one named, else the first
    address of the subnet (what the engine gives its bridge when it names none)."""
    for config in configs:
        gateway = config.get("Gateway")
        if gateway and ":" not in gateway:
            return str(gateway)
    for config in configs:
        with contextlib.suppress(ValueError, StopIteration):
            net = ipaddress.ip_network(str(config.get("Subnet")), strict=False)
            if net.version == 4:
                return str(next(net.hosts()))
    return None


REDACTED = "[redacted]"


def redact(text: str, secrets_: list[str]) -> str:
    """``text`` with every one of ``secrets_`` replaced by :data:`REDACTED`."""
    for secret in secrets_:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def redact_file(path: Path, secrets_: list[str]) -> None:
    """Rewrite ``path`` with ``secrets_`` redacted (nothing when it holds none, or is gone)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return
    text = raw.decode("utf-8", errors="surrogateescape")
    clean = redact(text, secrets_)
    if clean != text:
        path.write_bytes(clean.encode("utf-8", errors="surrogateescape"))


def _tail(path: Path, chars: int = OUTPUT_TAIL_CHARS) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - chars * 4))
            return f.read().decode("utf-8", errors="replace")[-chars:]
    except OSError:
        return ""


class DockerSessions:
    """Sessions in containers on the local Docker engine."""

    def __init__(self, runner: Any = None, poll_s: float = 1.0) -> None:
        from servegym.sandbox.docker_runner import DockerRunner

        self.runner = runner if runner is not None else DockerRunner()
        self.poll_s = poll_s
        self._logs: Any = None
        self._logs_tried = False

    def available(self) -> str | None:
        problem: str | None = self.runner.available()
        if problem is None:  # sessions of a harness killed outright are removed here
            with contextlib.suppress(Exception):
                self.runner.cleanup_orphans()
        return problem

    def ensure_image(self, image: str) -> None:
        import docker.errors

        try:
            self.runner.client().images.get(image)
        except docker.errors.ImageNotFound:
            raise UserError(
                f"image '{image}' is not on this Docker engine: build it with "
                "`servegym setup images cli-agents` (the four CLIs and python3; see "
                "sandbox/README.md), or name another with the agent setting image"
            ) from None
        except docker.errors.APIError as e:
            raise UserError(f"docker could not look up image '{image}': {e}") from None

    def addresses(self) -> tuple[str, str]:
        """The default bridge's gateway (this host as containers see it) when it is an
        address of this machine (Linux); else loopback, reached as host.docker.internal
        (Docker Desktop). An engine that names no gateway (Debian's docker.io) gives its
        bridge the subnet's first address."""
        gateway = None
        with contextlib.suppress(Exception):
            network = self.runner.client().networks.get("bridge")
            gateway = bridge_gateway((network.attrs.get("IPAM") or {}).get("Config") or [])
        if gateway and _bindable(gateway):
            return gateway, gateway
        return "127.0.0.1", "host.docker.internal"

    def run(
        self,
        kwargs: dict[str, Any],
        timeout_s: float,
        log_path: Path,
        stop: Callable[[], bool],
    ) -> SessionResult:
        import docker.errors

        from servegym.sandbox.docker_runner import ContainerSpec, RunningContainer

        client = self.runner.client()
        t0 = time.monotonic()
        try:
            container = client.containers.create(**kwargs)
            container.start()
        except docker.errors.DockerException as e:
            raise UserError(
                f"docker could not start a session of '{kwargs.get('image')}': {e}"
            ) from None
        spec = ContainerSpec(image=str(kwargs["image"]))  # for the record only
        running = RunningContainer(container, spec, self._log_api())
        timed_out = stopped = False
        last = ""
        try:
            running.stream_logs(log_path)
            while True:
                if running.exit_status() is not None:
                    break
                if time.monotonic() - t0 > timeout_s:
                    timed_out = True
                    break
                if stop():
                    stopped = True
                    break
                time.sleep(self.poll_s)
        finally:
            with contextlib.suppress(Exception):  # the engine's own tail, should the stream fail
                last = running.logs_tail(200)
            final = running.stop(timeout_s=10.0)
        tail = _tail(log_path) if running.log_error is None else last
        return SessionResult(
            exit_code=None if (timed_out or stopped) else final.exit_code,
            seconds=time.monotonic() - t0,
            output_tail=(tail or last)[-OUTPUT_TAIL_CHARS:],
            timed_out=timed_out,
            stopped=stopped,
            error=final.error or ("killed for memory" if final.oom_killed else ""),
        )

    def _log_api(self) -> Any:
        """A low-level client without a read timeout, for log streams (a CLI thinking for
        minutes writes nothing; with a timeout the stream would end)."""
        if not self._logs_tried:
            self._logs_tried = True
            import docker

            with contextlib.suppress(Exception):
                self._logs = docker.from_env(timeout=None).api
        return self._logs


def workspace_host_dir(env: WorkspaceEnvironment) -> Path:
    """The workspace's folder on the host (to mount in the CLI's container)."""
    root = env.workspace.root
    if not str(root):
        raise UserError(
            "CLI agents mount the task's workspace in their container, but this environment's "
            "workspace has no folder on the host"
        )
    return Path(root).absolute()


class CliAgent(AgentBase):
    """A coding-agent CLI working a real-track task in Docker; see the module docstring."""

    def __init__(
        self,
        adapter: CliAdapter,
        api_key: str,
        settings: CliSettings | None = None,
        sessions: SessionRunner | None = None,
    ) -> None:
        self.adapter = adapter
        self.model = adapter.model
        self.name = f"{adapter.cli}:{adapter.label}" if adapter.label else adapter.cli
        self.settings = settings or CliSettings()
        self._api_key = api_key
        self._sessions = sessions
        self.trajectory_path: Path | None = None
        self.outcome = "not_started"
        """How the agent phase ended: ``budget_spent``, ``finished``, ``max_sessions``,
        ``cli_failed``, ``docker_unavailable`` or ``wrong_track``."""
        self.error: str | None = None
        self.sessions_run = 0
        self.control_calls = 0
        self.meter = CostMeter(self.model)
        self._trajectory: IO[str] | None = None
        self._write_lock = threading.Lock()
        self._t0 = time.monotonic()

    def __repr__(self) -> str:  # never the key
        return f"CliAgent({self.name!r}, image={self.settings.image!r})"

    # ------------------------------------------------------------------ trajectory

    def _log(self, kind: str, **data: Any) -> None:
        with self._write_lock:
            if self._trajectory is None:
                return
            record = {"t": round(time.monotonic() - self._t0, 3), "kind": kind, **data}
            self._trajectory.write(json.dumps(record, default=str) + "\n")
            self._trajectory.flush()

    def _on_call(self, record: dict[str, Any]) -> None:
        self.control_calls += 1
        kind = record.pop("kind", "tool")
        self._log(kind, **record)

    # ------------------------------------------------------------------ the run

    def keep_trajectory(self, path: Path) -> bool:
        self.trajectory_path = path
        return True

    def trial_outcome(self) -> str | None:
        return self.outcome

    def trial_cost(self) -> dict[str, Any] | None:
        """The model calls the proxy passed: calls, tokens, dollars (see
        :mod:`servegym.agents.cli.usage`)."""
        return self.meter.summary()

    def run(self, env: TaskEnvironment, seed: int) -> None:
        self._t0 = time.monotonic()
        desc = env.describe()
        ws_env = env.workspace_environment()
        if ws_env is None and desc.tuning != "config":
            self.outcome = "wrong_track"
            raise UserError(
                f"--agent {self.name}: task {desc.task_id} has neither a workspace nor a "
                "config to tune"
            )
        sessions = self._sessions if self._sessions is not None else DockerSessions()
        problem = sessions.available()
        if problem is not None:
            self.outcome, self.error = "docker_unavailable", problem
            raise UserError(f"--agent {self.name}: CLI agents run in Docker: {problem}")
        sessions.ensure_image(self.settings.image)
        bind_host, container_host = sessions.addresses()

        from servegym.agents.cli.background import BackgroundLoop
        from servegym.agents.cli.control import ControlServer
        from servegym.agents.cli.proxy import KeyProxy

        own_dir = self.trajectory_path is None
        work = (
            Path(tempfile.mkdtemp(prefix="servegym-cli-"))
            if self.trajectory_path is None
            else self.trajectory_path.parent / "cli-agent"
        )
        if self.trajectory_path is not None:
            self.trajectory_path.parent.mkdir(parents=True, exist_ok=True)
            self._trajectory = self.trajectory_path.open("a", encoding="utf-8")
        try:
            task: ControlledTask
            if ws_env is not None:
                task, workspace_dir = ws_env, workspace_host_dir(ws_env)
            else:  # a sim task: its serving.toml in a folder of the trial's
                folder = ConfigFolderTask(env, work / "workspace")
                task, workspace_dir = folder, folder.root
            bin_dir, home_dir = self._prepare(work)
            with BackgroundLoop() as loop:
                proxy = KeyProxy(
                    self.adapter.provider,
                    self._api_key,
                    upstream=self.settings.base_url,
                    client_token=f"servegym-proxy-{secrets.token_urlsafe(24)}",
                    host=bind_host,
                    meter=self.meter,
                )
                control = ControlServer(task, host=bind_host, on_call=self._on_call)
                loop.run(proxy.start())
                try:
                    loop.run(control.start())
                    setup = SessionSetup(
                        image=self.settings.image,
                        workspace_dir=workspace_dir,
                        bin_dir=bin_dir,
                        home_dir=home_dir,
                        proxy_url=proxy.url_for(container_host),
                        proxy_credential=proxy.placeholder,
                        control_url=control.url_for(container_host),
                        control_token=control.token,
                        user=self._user(),
                    )
                    self._log(
                        "start", agent=self.name, image=setup.image, proxy_upstream=proxy.upstream
                    )
                    self._work(task, ws_env, desc, setup, sessions, control, work)
                finally:
                    with contextlib.suppress(Exception):
                        loop.run(control.close())
                    with contextlib.suppress(Exception):
                        loop.run(proxy.close())
                    self._log(
                        "end",
                        outcome=self.outcome,
                        sessions=self.sessions_run,
                        proxy_requests=proxy.requests,
                        proxy_refused=proxy.refused,
                        cost=self.meter.summary(),
                    )
        finally:
            if self._trajectory is not None:
                self._trajectory.close()
                self._trajectory = None
            if own_dir:
                shutil.rmtree(work, ignore_errors=True)

    def _user(self) -> str | None:
        if self.settings.run_as == "image" or not hasattr(os, "getuid"):
            return None
        return f"{os.getuid()}:{os.getgid()}"

    def _prepare(self, work: Path) -> tuple[Path, Path]:
        """The folders mounted in the container: ``bin`` (the command) and ``home``, with the
        adapter's files (:meth:`~servegym.agents.cli.adapters.CliAdapter.home_files`)."""
        bin_dir, home_dir = work / "bin", work / "home"
        bin_dir.mkdir(parents=True, exist_ok=True)
        home_dir.mkdir(parents=True, exist_ok=True)
        for relative, text in self.adapter.home_files().items():
            path = home_dir / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        script = resources.files("servegym.agents.cli").joinpath(AGENT_SCRIPT).read_text("utf-8")
        (bin_dir / AGENT_SCRIPT).write_text(script, encoding="utf-8")
        wrapper = bin_dir / WRAPPER
        wrapper.write_text(WRAPPER_TEXT, encoding="utf-8")
        wrapper.chmod(0o755)
        return bin_dir, home_dir

    def _work(
        self,
        env: ControlledTask,
        charged: WorkspaceEnvironment | None,
        desc: TaskDescription,
        setup: SessionSetup,
        sessions: SessionRunner,
        control: ControlServer,
        work: Path,
    ) -> None:
        failures = 0
        trial_tag = secrets.token_hex(4)
        for index in range(self.settings.max_sessions):
            budget = env.budget_left()
            if budget.exhausted:
                self.outcome = "budget_spent"
                return
            prompt = (
                first_prompt(desc.instruction, budget, desc.tuning)
                if index == 0
                else continuation_prompt(desc.instruction, budget, desc.tuning)
            )
            named = replace(setup, name=f"servegym-cli-{trial_tag}-{index}")
            kwargs = self.adapter.container_kwargs(named, prompt)
            calls_before = control.calls
            spent_since: list[float] = []
            # A real track charges the session's own wall time; the simulator's budget is
            # simulated GPU time, charged by the experiments alone.
            meter = SessionMeter(charged, lambda: control.busy) if charged is not None else None

            def stop(
                spent_since: list[float] = spent_since, meter: SessionMeter | None = meter
            ) -> bool:
                if meter is not None:
                    meter.tick()
                if not env.budget_left().exhausted:
                    return False
                if not spent_since:
                    spent_since.append(time.monotonic())
                return time.monotonic() - spent_since[0] > SUBMIT_GRACE_S

            self._log("session_start", index=index, command=kwargs["command"])
            log_path = work / f"session-{index}.log"
            result = sessions.run(kwargs, self.settings.session_timeout_s, log_path, stop)
            # The session's output (a CLI may print its environment, as an agent's `env`
            # does) names the per-trial proxy and control tokens the container holds:
            # they go, with the real key should it ever show, before anything is kept.
            hidden = [setup.proxy_credential, setup.control_token, self._api_key]
            redact_file(log_path, hidden)
            result = replace(
                result,
                output_tail=redact(result.output_tail, hidden),
                error=redact(result.error, hidden),
            )
            if meter is not None:
                meter.tick(final=True)
            self.sessions_run += 1
            calls = control.calls - calls_before
            self._log(
                "session",
                index=index,
                command=kwargs["command"],
                exit_code=result.exit_code,
                timed_out=result.timed_out,
                stopped=result.stopped,
                seconds=round(result.seconds, 3),
                control_calls=calls,
                error=result.error or None,
                output_tail=result.output_tail,
            )
            if control.failure is not None:
                self.outcome = "harness_error"
                raise control.failure
            if env.budget_left().exhausted:
                self.outcome = "budget_spent"
                return
            if calls == 0:
                if result.exit_code == 0:
                    self.outcome = "finished"  # it ended a session with nothing left to do
                    return
                failures += 1
                if failures >= 2:
                    self.outcome = "cli_failed"
                    self.error = _last_line(result.output_tail) or result.error or "no output"
                    return
            else:
                failures = 0
        self.outcome = "max_sessions"


class SessionMeter:
    """Charges a CLI session's own wall time to the budget as it runs: the time between two
    ticks, less what the environment charged meanwhile (a benchmark charges itself). No
    charge is made while a benchmark or submit is in flight; its interval is settled at the
    first tick after it."""

    def __init__(self, env: WorkspaceEnvironment, busy: Callable[[], bool]) -> None:
        self.env = env
        self.busy = busy
        self.t = time.monotonic()
        self.used = env.budget_left().wall_seconds_used

    def tick(self, final: bool = False) -> None:
        if self.busy() and not final:
            return
        now = time.monotonic()
        charged = self.env.budget_left().wall_seconds_used - self.used
        own = (now - self.t) - charged
        if own > 0:
            self.env.charge_wall_seconds(own)
        self.t = now
        self.used = self.env.budget_left().wall_seconds_used


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:500] if lines else ""


# --- registration: "<cli>:<model>" ---------------------------------------------------------


def _settings(name: str, options: dict[str, Any]) -> CliSettings:
    known = [f.name for f in fields(CliSettings)]
    unknown = [k for k in options if k not in known]
    if unknown:
        raise UserError(
            f"--agent {name}: unknown setting '{unknown[0]}' (known: {', '.join(known)})"
        )
    settings = CliSettings(**options)
    if settings.provider is not None and name != "opencode":
        raise UserError(f"--agent {name}: the setting provider applies to opencode only")
    if settings.run_as not in ("host", "image"):
        raise UserError(f"--agent {name}: run_as must be 'host' or 'image'")
    if settings.max_sessions < 1:
        raise UserError(f"--agent {name}: max_sessions must be at least 1")
    return settings


def make_cli_agent(
    cli: str, model: str | None = None, sessions: SessionRunner | None = None, **options: Any
) -> CliAgent:
    """The CLI agent ``cli`` (a name of :data:`ADAPTERS`) on ``model``."""
    settings = _settings(cli, options)
    adapter: CliAdapter
    if cli == "opencode":
        adapter = OpenCodeAdapter(model, settings.provider)
    else:
        adapter = ADAPTERS[cli](model)
    key = read_api_key(adapter.provider, settings.api_key_env)
    if settings.base_url is not None:
        normalise_upstream(adapter.provider, settings.base_url)  # a bad URL fails here
    return CliAgent(adapter, key, settings, sessions)


def _register(cli: str) -> None:
    def factory(model: str | None = None, **options: Any) -> CliAgent:
        return make_cli_agent(cli, model, **options)

    factory.__name__ = f"{cli.replace('-', '_')}_agent"
    register_agent(cli)(factory)


for _cli in ADAPTERS:
    _register(_cli)
