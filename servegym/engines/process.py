"""One server process, from start to a clean stop: the lifecycle every real engine shares.

The server runs in a process group of its own (vLLM and SGLang start worker processes), its
output goes to a log file whose tail is kept for messages, and readiness means both
``/health`` and ``/v1/models`` answer. A server that exits is reported as such, with its
exit code or signal and whether it ran out of memory, whether that happens during start-up
or in the middle of a run. Stopping sends SIGTERM to the whole group, then SIGKILL, and does
not return while any process of the group is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Literal

import aiohttp
from pydantic import BaseModel

from servegym.engines.base import LaunchSpec
from servegym.engines.compile_cache import scrub

_log = logging.getLogger(__name__)

READY_PATHS = ("/health", "/v1/models")
PR_SET_PDEATHSIG = 1
STOP_GIVE_UP_S = 30.0
"""How long after SIGKILL a stop waits for the process group before it gives up."""
LOG_TAIL_LINES = 40
OOM_PATTERNS = re.compile(
    r"out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory|oom-kill",
    re.IGNORECASE,
)

Phase = Literal["start", "run"]


class ExitInfo(BaseModel):
    """How a server process ended."""

    returncode: int
    signal: str | None = None
    oom: bool = False
    stopped_by_harness: bool = False
    phase: Phase = "run"
    log_tail: str = ""

    def describe(self) -> str:
        """One line: what happened, e.g. 'crashed during start-up: exit code 1'."""
        if self.stopped_by_harness:
            return "stopped by the harness"
        when = "during start-up" if self.phase == "start" else "mid-run"
        how = f"killed by {self.signal}" if self.signal else f"exit code {self.returncode}"
        if self.oom:
            how += " (out of memory)"
        elif self.signal == "SIGKILL":
            how += " (not by the harness: the kernel's OOM killer or another process)"
        return f"server crashed {when}: {how}"


class ServerError(Exception):
    """A server that could not start, or that died; carries the log's tail."""

    def __init__(self, message: str, exit_info: ExitInfo | None, log_path: Path) -> None:
        super().__init__(message)
        self.message = message
        self.exit_info = exit_info
        self.log_path = log_path

    def __str__(self) -> str:
        return self.message


class ServerStartTimeout(ServerError):
    """The server did not answer within the start-up timeout (it has been stopped)."""


class ServerCrashed(ServerError):
    """The server process exited on its own, at start-up or mid-run."""


class ServerUnresponsive(ServerError):
    """The server process runs but no longer answers HTTP."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def read_tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 64_000) -> str:
    """The last ``lines`` lines of a log file (reads at most ``max_bytes`` from its end)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class ServerProcess:
    """A server started from a :class:`~servegym.engines.base.LaunchSpec`.

    Use as ``async with ServerProcess(spec, log) as server:`` (start, wait until ready; stop
    on the way out), or call :meth:`start`, :meth:`wait_ready` and :meth:`stop` yourself.
    """

    def __init__(self, spec: LaunchSpec, log_path: Path, *, start_timeout_s: float = 300.0):
        self.spec = spec
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None
        self.ready_after_s: float | None = None
        self._stopping = False
        self.leftover: str | None = None
        """Set when a stop gave up on processes that survived SIGKILL."""
        self._exit: ExitInfo | None = None
        self._started_at = 0.0
        self.paused = False
        """Whether :meth:`pause` stopped it (until :meth:`resume`)."""
        self.discarded: list[str] = []
        """Torn compile-cache entries discarded before the start (one line each)."""

    # --- start ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the process in a new process group, its output to the log file; first
        discard any torn entry of its compile caches (one line each, in the log too)."""
        inherited = {k: v for k, v in os.environ.items() if k not in self.spec.env_unset}
        env = {**inherited, **self.spec.env} if self.spec.inherit_env else dict(self.spec.env)
        with self.begin_log(self.spec.shell_line()) as log:
            try:
                self.proc = subprocess.Popen(
                    self.spec.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.spec.cwd,
                    start_new_session=True,
                    preexec_fn=child_setup(os.getpid(), rlimit_pairs(self.spec.rlimits)),
                )
            except OSError as e:
                info = ExitInfo(returncode=127, phase="start", log_tail=str(e))
                self._exit = info
                raise ServerCrashed(
                    f"{self.spec.engine} could not be started: {e.strerror or e}",
                    info,
                    self.log_path,
                ) from None
        self.pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        self._started_at = time.monotonic()

    @contextlib.contextmanager
    def begin_log(self, command: str) -> Iterator[BinaryIO]:
        """The log file, open for appending, after the torn entries of the compile caches
        were discarded (one line each) and ``command`` was written as ``$ COMMAND``."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            for folder in self.spec.compile_caches:
                for discarded in scrub(Path(folder)):
                    line = discarded.describe()
                    self.discarded.append(line)
                    _log.warning("%s", line)
                    log.write(f"servegym: {line}\n".encode())
            log.write(f"$ {command}\n".encode())
            log.flush()
            yield log

    async def wait_ready(self) -> float:
        """Wait until every :data:`READY_PATHS` answers 200; return the seconds it took.

        Raises :class:`ServerCrashed` if the process exits first, and
        :class:`ServerStartTimeout` (after stopping it) if the timeout passes.
        """
        assert self.started, "start() first"
        deadline = self._started_at + self.start_timeout_s
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                if (info := self.poll("start")) is not None:
                    raise ServerCrashed(
                        f"{self.spec.engine}: {info.describe()}; log: {self.log_path}",
                        info,
                        self.log_path,
                    )
                if await self._answers(http):
                    self.ready_after_s = time.monotonic() - self._started_at
                    return self.ready_after_s
                if time.monotonic() >= deadline:
                    await asyncio.to_thread(self.stop)
                    raise ServerStartTimeout(
                        f"{self.spec.engine} did not become ready within "
                        f"{self.start_timeout_s:g} s; log: {self.log_path}",
                        None,
                        self.log_path,
                    )
                await asyncio.sleep(0.5)

    async def _answers(self, http: aiohttp.ClientSession) -> bool:
        for path in READY_PATHS:
            try:
                async with http.get(self.spec.base_url + path) as resp:
                    await resp.read()
                    if resp.status != 200:
                        return False
            except (aiohttp.ClientError, TimeoutError, OSError):
                return False
        return True

    # --- watch ----------------------------------------------------------------------------

    def poll(self, phase: Phase = "run") -> ExitInfo | None:
        """How the process ended, or ``None`` while it runs."""
        if self._exit is not None:
            return self._exit
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is None:
            return None
        tail = read_tail(self.log_path)
        sig = _signal_name(rc)
        oom = bool(OOM_PATTERNS.search(tail))
        self._exit = ExitInfo(
            returncode=rc,
            signal=sig,
            oom=oom,
            stopped_by_harness=self._stopping,
            phase=phase,
            log_tail=tail,
        )
        return self._exit

    def leader_pid(self) -> int | None:
        """The pid, in this machine's process table, of the server's first process (its
        tree is what the harness inspects); None before it started."""
        return self.proc.pid if self.proc is not None else None

    @property
    def started(self) -> bool:
        """Whether :meth:`start` started it (a subclass may run it elsewhere than ``proc``)."""
        return self.proc is not None

    @property
    def running(self) -> bool:
        return self.started and self.poll() is None

    async def wait_exit(self, interval_s: float = 0.2) -> ExitInfo:
        """Return when the process exits (for a watcher running beside a benchmark)."""
        while (info := self.poll()) is None:
            await asyncio.sleep(interval_s)
        return info

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return read_tail(self.log_path, lines)

    # --- pause ----------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop every process of the group (SIGSTOP) until :meth:`resume`: a server that
        would not go quiet while another is measured (:mod:`servegym.sandbox.quiet`)."""
        if self.pgid is not None and self.running and not self.paused:
            _signal_group(self.pgid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """Continue a paused group (SIGCONT)."""
        if self.pgid is not None and self.paused:
            _signal_group(self.pgid, signal.SIGCONT)
            self.paused = False

    # --- stop -----------------------------------------------------------------------------

    def stop(self, grace_s: float = 15.0) -> ExitInfo | None:
        """SIGTERM the group, SIGKILL it after ``grace_s``, and wait until no process of the
        group is left. Safe to call twice; returns how the leader ended."""
        if self.proc is None or self.pgid is None:
            return self._exit
        self.resume()  # a stopped process would hold SIGTERM until continued
        if self.proc.poll() is None:
            self._stopping = True
        _signal_group(self.pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(self.pgid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=STOP_GIVE_UP_S)
            except subprocess.TimeoutExpired:
                self.leftover = f"process {self.proc.pid} survived SIGKILL"
        # Workers may outlive the leader: the group is gone only when none answers.
        deadline = time.monotonic() + grace_s
        give_up = deadline + STOP_GIVE_UP_S
        killed = False
        while _group_alive(self.pgid):
            now = time.monotonic()
            if now >= give_up:
                # Unkillable (uninterruptible sleep in a driver, say): say so, do not hang.
                self.leftover = f"process group {self.pgid} survived SIGKILL"
                break
            if now >= deadline and not killed:
                _signal_group(self.pgid, signal.SIGKILL)
                killed = True
            time.sleep(0.05)
        return self.poll()

    async def __aenter__(self) -> ServerProcess:
        self.start()
        try:
            await self.wait_ready()
        except BaseException:
            await asyncio.to_thread(self.stop)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)


def _load_prctl() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()
"""prctl(2), looked up here in the parent: the child, between fork and exec, must not load
libraries (another thread may have held the loader's lock at the fork)."""


def rlimit_pairs(limits: dict[str, int]) -> list[tuple[int, int]]:
    """``{"RLIMIT_FSIZE": n}`` as ``(resource.RLIMIT_FSIZE, n)`` pairs, resolved in the
    parent (an unknown name is a ValueError here, not a failure in the child)."""
    out = []
    for name, value in limits.items():
        which = getattr(resource, name, None)
        if not name.startswith("RLIMIT_") or not isinstance(which, int):
            raise ValueError(f"unknown resource limit {name!r}")
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)  # only root may raise a hard limit
        out.append((which, value))
    return out


def child_setup(parent: int, rlimits: list[tuple[int, int]] | None = None) -> Callable[[], None]:
    """For the child, before exec: ask Linux to SIGTERM it when the harness dies, even by
    SIGKILL, so a killed harness leaves no server behind (its workers follow their parent).
    If the harness died before the request was made, exit at once.

    Linux ties this to the thread that started the child: servers are started from the
    event loop's thread, which lives as long as the harness does. Elsewhere a no-op.
    """
    prctl = _PRCTL

    limits = rlimits or []

    def child() -> None:
        for which, value in limits:
            resource.setrlimit(which, (value, value))
        if prctl is None:
            return
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))  # type: ignore[operator]
        if os.getppid() != parent:
            os._exit(1)

    return child


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    """Whether any process is left in the group (zombies of ours are reaped first)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _has_live_member(pgid)


def _has_live_member(pgid: int) -> bool:
    """``killpg(0)`` also finds zombies nobody has reaped yet; look at their states."""
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields: state ppid pgrp ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
