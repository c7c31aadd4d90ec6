"""The local sandbox: an agent's workspace folder, and the commands and servers run in it.

A real-track trial gives the agent a fresh workspace folder. Everything the agent runs there
(``bash`` tool calls, its ``start_server.sh``) runs through :class:`LocalSandbox`:

- in its own process group, killed as a group when the command ends or times out, so no
  process a command started outlives it;
- under resource limits (:class:`Limits`: CPU time, address space, file size, processes);
- with an environment built from scratch (:meth:`LocalSandbox.environment`): ``PATH``,
  locale, ``HOME`` and the task's variables, and nothing of the harness's: no API key, no
  harness secret, no path to the harness's data (the scoring seed's secret, reference
  outputs, task folders with their oracle configs, trial results);
- with bubblewrap (``bwrap``, Debian's ``bubblewrap``) when it is installed: the system
  read-only, the workspace the only writable folder (at ``/workspace``), the model read-only
  (at ``/model``), the runtime the server needs read-only at its own path, a private ``/tmp``
  and no network unless the task allows it. Without bwrap the limits and the scrubbed
  environment still hold, and the sandbox says once that isolation is reduced.

Servers started from ``start_server.sh`` share the host's network (the harness must reach
their port); ``bash`` commands get none unless the task allows it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from servegym.engines.base import LaunchSpec, ModelRef
from servegym.engines.process import child_setup, rlimit_pairs
from servegym.sandbox.registry import register_sandbox
from servegym.sandbox.workspace import CommandResult, WorkspaceError

log = logging.getLogger(__name__)

SANDBOX_WORKSPACE = "/workspace"
SANDBOX_MODEL = "/model"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_OUTPUT_CHARS = 30_000
"""A command's output beyond this keeps its head and tail."""
SNAPSHOT_EXCLUDE = (".cache", ".tmp", ".config", ".local", ".triton")
"""Workspace folders a snapshot (and a digest) leaves out: what engines and libraries write
under ``HOME``, which a fresh sandbox does not have either."""
MAX_SNAPSHOT_BYTES = 64 * 2**20

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc", "/opt")
_warned_reduced = False

Isolation = Literal["auto", "bwrap", "none"]


class Limits(BaseModel):
    """Resource limits of one sandboxed process (``None``: the harness's own limit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_seconds: int | None = 600
    memory_bytes: int | None = 16 * 2**30
    file_size_bytes: int | None = 4 * 2**30
    max_processes: int | None = 4096

    def rlimits(self) -> dict[str, int]:
        pairs = {
            "RLIMIT_CPU": self.cpu_seconds,
            "RLIMIT_AS": self.memory_bytes,
            "RLIMIT_FSIZE": self.file_size_bytes,
            "RLIMIT_NPROC": self.max_processes,
        }
        return {k: v for k, v in pairs.items() if v is not None}


COMMAND_LIMITS = Limits()
SERVER_LIMITS = Limits(cpu_seconds=None, memory_bytes=None)
"""A server runs for as long as its benchmark and maps what its engine needs; its files and
processes are still capped."""


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


SOCKET_NAME_ROOM = 48
"""What an unisolated sandbox's ``TMPDIR`` leaves for a socket's name (and the slash) within
the 107 bytes a Unix socket's path may hold: vLLM's ZMQ IPC sockets are named by a UUID,
36 characters."""


def unisolated_tmp(root: Path) -> Path:
    """``TMPDIR`` for the processes of an unisolated sandbox rooted at ``root``: the
    workspace's own ``.tmp``, or, where that path is too long to bind a Unix socket in, a
    short folder of the workspace's own in ``/tmp``.

    Servers bind Unix sockets in ``TMPDIR`` (vLLM's engine binds a ZMQ IPC socket there),
    and a socket's path holds at most 107 bytes: under a trial folder such as
    ``runs/cpu-prefill-ttft__claude-code:claude-sonnet-4-5__s0/workspace/.tmp`` that limit
    is passed, and every launcher's server died at start-up on a machine without bwrap
    (whose sandboxes get a private ``/tmp``). The short folder is named by the workspace, so
    one workspace's commands share it, and belongs to this user alone; where it cannot be
    had so, the workspace's ``.tmp`` is used anyway."""
    inside = root / ".tmp"
    if len(os.fsencode(inside)) + SOCKET_NAME_ROOM > 107:
        digest = hashlib.sha256(os.fsencode(root)).hexdigest()[:12]
        short = Path("/tmp") / f"servegym-{os.getuid()}-{digest}"
        with contextlib.suppress(OSError):
            short.mkdir(mode=0o700, exist_ok=True)
            st = short.lstat()
            if not short.is_symlink() and st.st_uid == os.getuid() and not st.st_mode & 0o077:
                return short
    inside.mkdir(exist_ok=True)
    return inside


def _inside(root: Path, path: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


@register_sandbox("local")
class LocalSandbox:
    """One workspace folder and the way commands run in it (see the module docstring).

    ``runtime_dirs`` are mounted read-only at their own paths (a venv's scripts name their
    interpreter by absolute path); ``tool_dirs`` go first on ``PATH``; ``env`` are the
    task's variables for every process."""

    name = "local"

    def __init__(
        self,
        workspace: Path,
        *,
        model: ModelRef | None = None,
        runtime_dirs: list[Path] | None = None,
        tool_dirs: list[Path] | None = None,
        env: dict[str, str] | None = None,
        network: bool = False,
        isolation: Isolation = "auto",
        command_limits: Limits = COMMAND_LIMITS,
        server_limits: Limits = SERVER_LIMITS,
    ) -> None:
        workspace.mkdir(parents=True, exist_ok=True)
        self.root = workspace.resolve()
        self.model = model
        self.runtime_dirs = [p.resolve() for p in runtime_dirs or [] if p.exists()]
        self.tool_dirs = list(tool_dirs or [])
        self.extra_env = dict(env or {})
        self.network = network
        self.command_limits = command_limits
        self.server_limits = server_limits
        bwrap = bwrap_path()
        if isolation == "bwrap" and bwrap is None:
            raise RuntimeError("isolation 'bwrap' asked for, but bwrap is not installed")
        self.bwrap = bwrap if isolation != "none" else None
        if self.bwrap is None:
            _say_reduced_once()

    # --- what this sandbox can do ---------------------------------------------------------

    def available(self) -> str | None:
        return None

    @property
    def isolated(self) -> bool:
        """Whether commands run under bwrap (filesystem and network isolation)."""
        return self.bwrap is not None

    @property
    def workspace_path(self) -> str:
        """The workspace as commands see it."""
        return SANDBOX_WORKSPACE if self.isolated else str(self.root)

    @property
    def model_path(self) -> str | None:
        if self.model is None:
            return None
        return SANDBOX_MODEL if self.isolated else self.model.path

    # --- environment and wrapping ---------------------------------------------------------

    def environment(self) -> dict[str, str]:
        """The whole environment of a sandboxed process: nothing is inherited."""
        ws = self.workspace_path
        path = ":".join([*(str(p) for p in self.tool_dirs), SYSTEM_PATH])
        env = {
            "PATH": path,
            "HOME": ws,
            "XDG_CACHE_HOME": f"{ws}/.cache",
            "TMPDIR": "/tmp" if self.isolated else str(unisolated_tmp(self.root)),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "WORKSPACE": ws,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if self.model is not None:
            env["MODEL_PATH"] = self.model_path or ""
            env["SERVED_MODEL_NAME"] = self.model.served_name
        env.update(self.extra_env)
        return env

    def wrap(self, argv: list[str], *, network: bool) -> list[str]:
        """``argv`` as run in the sandbox (under bwrap when there is one)."""
        if self.bwrap is None:
            return argv
        out = [self.bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc"]
        out += ["--unshare-uts", "--unshare-cgroup-try"]
        if not network:
            out.append("--unshare-net")
        for d in _SYSTEM_DIRS:
            out += ["--ro-bind-try", d, d]
        out += ["--ro-bind-try", "/sys", "/sys"]
        out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
        for runtime in self.runtime_dirs:
            out += ["--ro-bind", str(runtime), str(runtime)]
        if self.model is not None:
            out += ["--ro-bind", str(Path(self.model.path).resolve()), SANDBOX_MODEL]
        out += ["--bind", str(self.root), SANDBOX_WORKSPACE, "--chdir", SANDBOX_WORKSPACE]
        return [*out, "--", *argv]

    # --- commands -------------------------------------------------------------------------

    def run(self, command: str, timeout_s: float = 120.0) -> CommandResult:
        """Run ``command`` with bash in the workspace; kill its whole group when it ends or
        its timeout passes. Never raises for what the command does."""
        started = time.monotonic()
        argv = self.wrap(["bash", "-c", command], network=self.network)
        limits = self.command_limits
        if limits.cpu_seconds is not None:
            limits = limits.model_copy(
                update={"cpu_seconds": max(limits.cpu_seconds, int(timeout_s * 2) + 5)}
            )
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=self.root,
                start_new_session=True,
                preexec_fn=child_setup(os.getpid(), rlimit_pairs(limits.rlimits())),
            )
        except OSError as e:
            return CommandResult(command=command, exit_code=127, output=f"cannot run: {e}")
        chunks: list[bytes] = []
        reader = threading.Thread(target=_drain, args=(proc, chunks), daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc.pid)
            proc.wait()
        reader.join(timeout=2.0)
        text = b"".join(chunks).decode("utf-8", "replace")
        truncated = len(text) > MAX_OUTPUT_CHARS
        if truncated:
            half = MAX_OUTPUT_CHARS // 2
            cut = len(text) - MAX_OUTPUT_CHARS
            text = f"{text[:half]}\n[... {cut} characters cut ...]\n{text[-half:]}"
        if timed_out:
            text += f"\n[killed: the command ran past its {timeout_s:g} s timeout]"
        return CommandResult(
            command=command,
            exit_code=None if timed_out else proc.returncode,
            output=text,
            timed_out=timed_out,
            truncated=truncated,
            seconds=round(time.monotonic() - started, 3),
        )

    def launch_spec(self, script: str, port: int, *, engine: str = "launcher") -> LaunchSpec:
        """How the harness starts ``script`` (``start_server.sh``) as a server on ``port``:
        the script gets ``PORT``, ``HOST``, ``MODEL_PATH`` and ``SERVED_MODEL_NAME``."""
        if self.model is None:
            raise ValueError("a server sandbox needs the model")
        env = {**self.environment(), "PORT": str(port), "HOST": "127.0.0.1"}
        served = ModelRef(path=self.model_path or "", served_name=self.model.served_name)
        return LaunchSpec(
            engine=engine,
            argv=self.wrap(["bash", script], network=True),
            env=env,
            port=port,
            model=served,
            cwd=str(self.root),
            inherit_env=False,
            rlimits=self.server_limits.rlimits(),
            # the workspace's own cache (HOME/.cache: vLLM's compile cache among others),
            # which a start the agent killed mid-compile may have left torn
            compile_caches=[str(self.root / ".cache")],
        )

    # --- files ----------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """A workspace path as a host path; one that leaves the workspace is refused."""
        p = Path(path)
        if p.is_absolute():
            try:
                p = p.relative_to(self.workspace_path)
            except ValueError:
                raise WorkspaceError(
                    f"{path}: outside the workspace ({self.workspace_path})"
                ) from None
        full = (self.root / p).resolve()
        if not _inside(self.root, full):
            raise WorkspaceError(f"{path}: outside the workspace ({self.workspace_path})")
        return full

    def read_file(self, path: str, max_chars: int = 50_000) -> str:
        full = self.resolve(path)
        if not full.is_file():
            raise WorkspaceError(f"{path}: no such file in the workspace")
        text = full.read_text("utf-8", errors="replace")
        if len(text) > max_chars:
            text = text[:max_chars] + f"\n[... {len(text) - max_chars} characters cut ...]"
        return text

    def write_file(self, path: str, content: str) -> int:
        full = self.resolve(path)
        if full.is_dir():
            raise WorkspaceError(f"{path}: is a folder")
        full.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode("utf-8")
        limit = self.command_limits.file_size_bytes
        if limit is not None and len(data) > limit:
            raise WorkspaceError(f"{path}: {len(data)} bytes is over the file-size limit")
        full.write_bytes(data)
        if full.name.endswith(".sh"):
            full.chmod(0o755)
        return len(data)

    # --- snapshots ------------------------------------------------------------------------

    def snapshot(self, dest: Path) -> tuple[int, int, str]:
        """Copy the workspace (less :data:`SNAPSHOT_EXCLUDE`) to ``dest``, replacing what is
        there; returns (files, bytes, digest). Symbolic links that leave the workspace are
        refused: the submission is the files alone."""
        files = workspace_files(self.root)
        total = sum(f.stat().st_size for f in files)
        if total > MAX_SNAPSHOT_BYTES:
            raise WorkspaceError(
                f"the workspace holds {total / 2**20:.1f} MiB; a submission may hold "
                f"{MAX_SNAPSHOT_BYTES // 2**20} MiB (move caches under .cache/)"
            )
        tmp = dest.with_name(dest.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        for f in files:
            target = tmp / f.relative_to(self.root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
        tmp.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        return len(files), total, tree_digest(dest)


def workspace_files(root: Path) -> list[Path]:
    """Regular files under ``root`` (sorted), leaving out :data:`SNAPSHOT_EXCLUDE`."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d not in SNAPSHOT_EXCLUDE]
        dirnames.sort()
        linked = [d for d in dirnames if (here / d).is_symlink()]
        dirnames[:] = [d for d in dirnames if d not in linked]
        for name in sorted([*filenames, *linked]):
            f = here / name
            if f.is_symlink():
                if not _inside(root, f.resolve()):
                    raise WorkspaceError(
                        f"{f.relative_to(root)}: a link out of the workspace; submit files"
                    )
                continue
            if f.is_file():
                out.append(f)
    return out


def tree_digest(root: Path) -> str:
    """SHA-256 over every file's relative path and bytes (the submission's identity)."""
    h = hashlib.sha256()
    for f in workspace_files(root):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def _drain(proc: subprocess.Popen[bytes], chunks: list[bytes]) -> None:
    assert proc.stdout is not None
    size = 0
    for block in iter(lambda: proc.stdout.read(65536), b""):  # type: ignore[union-attr]
        size += len(block)
        if size <= 8 * MAX_OUTPUT_CHARS:
            chunks.append(block)
        else:  # keep the tail only
            chunks.append(block)
            while sum(len(c) for c in chunks) > 8 * MAX_OUTPUT_CHARS and len(chunks) > 2:
                del chunks[1]


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _say_reduced_once() -> None:
    global _warned_reduced
    if not _warned_reduced:
        _warned_reduced = True
        log.warning(
            "bwrap (Debian's bubblewrap) is not installed: agent commands run with resource "
            "limits and a scrubbed environment, but without filesystem or network isolation"
        )
