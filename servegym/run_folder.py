"""Writing a run folder: ``run.json``, ``requests.jsonl``, ``metrics.json`` (and extras);
a trial's folder holds ``trial.json`` (:data:`TRIAL_FILE`).

Every file is written to a temporary name and renamed into place, so a reader never sees a
half-written file, and a failed write (a full disk) leaves no temporary file behind; records
are written before metrics are computed, so a failure in a later step never loses a finished
run. What the harness writes is private to its user: files 0600, folders 0700.

:func:`hold_lock` is how two processes keep out of one folder (two sweeps into one run
folder, two runs of one trial): an exclusive ``flock`` on a lock file. The kernel drops the
lock when its holder dies, however it dies, so a lock left by a killed process is never
stale: the next one simply takes it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from servegym.errors import UserError
from servegym.loadgen.records import RunResult
from servegym.paths import quoted

TRIAL_FILE = "trial.json"
"""A trial's result in its folder (:class:`~servegym.runner.results.TrialResult`)."""

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def make_folder(folder: Path, flag: str = "--out") -> None:
    """Create ``folder`` (and its parents) private to this user, or say in one line why it
    cannot be."""
    try:
        if folder.exists() and not folder.is_dir():
            raise UserError(f"{flag}: {folder} exists and is not a folder")
        folder.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{flag}: cannot create {quoted(str(folder))}: {e.strerror or e}") from None


def check_nameable(path: Path, flag: str = "--out") -> None:
    """Refuse, in one line, a path the file system cannot name (a component over 255
    bytes): every later look at it would raise ``OSError``."""
    try:
        path.exists()
    except OSError as e:
        raise UserError(f"{flag}: {quoted(str(path))}: {e.strerror or e}") from None


def prepare_out(out: Path, flag: str = "--out") -> None:
    """Create the run folder, or say in one line why it cannot be."""
    make_folder(out, flag)


def _atomic(path: Path, write: Callable[[IO[str]], object]) -> None:
    """``write`` into a private temporary file beside ``path``, then rename it into place;
    on any failure the temporary file is removed and the error raised."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _cannot_write(path: Path, e: OSError) -> UserError:
    return UserError(f"cannot write {path}: {e.strerror or e}")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; a failure is one line naming the file."""
    try:
        _atomic(path, lambda f: f.write(text))
    except OSError as e:
        raise _cannot_write(path, e) from None


def write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def write_records(result: RunResult, path: Path) -> None:
    """One :class:`~servegym.loadgen.records.RequestRecord` per line (atomically; a failure
    is one line naming the file)."""

    def lines(f: IO[str]) -> None:
        for rec in result.records:
            f.write(rec.model_dump_json())
            f.write("\n")

    try:
        _atomic(path, lines)
    except OSError as e:
        raise _cannot_write(path, e) from None


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename
    (an ``OSError`` is the caller's to word)."""
    path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    _atomic(path, lambda f: f.write(text))


def write_private(path: Path, text: str) -> bool:
    """Best effort: write a note (a traceback) readable by this user only; False when it
    could not be written (a full disk: the result's own write then says so)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        return False
    return True


class LineLog:
    """An append-only JSON Lines file that never ends in a torn line: each line is written
    whole or, when the write fails (a full disk), cut back to the last whole line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE
        )
        self._size = 0

    def append(self, line: str) -> None:
        """Append ``line`` and a newline; an ``OSError`` leaves the file as it was."""
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        data = (line + "\n").encode("utf-8")
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
                os.lseek(self._fd, self._size, os.SEEK_SET)
            raise
        self._size += len(data)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


# --------------------------------------------------------------------------- locks


def _holder(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


BUSY_RETRY_S = 0.2
"""How long a busy lock is retried before it is reported (a holder may be releasing it)."""


@contextlib.contextmanager
def hold_lock(
    path: Path, *, flag: str, busy: str, holder: str, shared: bool = False
) -> Iterator[None]:
    """Hold the lock ``path`` for the block, exclusive (or ``shared`` with other shared
    holders), or raise a one-line :class:`UserError` (``{flag}: {busy} is in use by ...``)
    when another live process holds it the other way. ``holder`` says what this process is
    doing, for the message another one may print.

    The lock file is removed by its last holder (unlinked while still locked, so a process
    that opened the old file finds it gone and tries again); one left by a killed process
    holds no lock and is taken over.
    """
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    deadline = time.monotonic() + BUSY_RETRY_S
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, PRIVATE_FILE)
        except OSError as e:
            raise UserError(f"{flag}: cannot lock {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(f"{flag}: cannot lock {path}: {e.strerror or e}") from None
            if time.monotonic() < deadline:  # its holder may be on its way out
                time.sleep(0.02)
                continue
            info = _holder(path)
            who = f"pid {info['pid']}" if "pid" in info else "another process"
            doing = f", {info['holder']} since {info['since']}" if "since" in info else ""
            raise UserError(
                f"{flag}: {busy} is in use by another servegym process ({who}{doing}); "
                f"wait for it to end, or use another {flag}"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
        except OSError:
            same = False
        if same:
            break
        os.close(fd)  # removed (or replaced) by its last holder as we opened it: again
    try:
        if not shared:  # who holds it, for the message a refused process prints
            note = {
                "pid": os.getpid(),
                "holder": holder,
                "since": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            with contextlib.suppress(OSError):  # the lock holds even if the note cannot
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps(note).encode())
        yield
    finally:
        last = True
        if shared:  # the last shared holder removes the file: it alone can lock it whole
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                last = False
        if last:
            with contextlib.suppress(OSError):
                path.unlink()
        os.close(fd)
