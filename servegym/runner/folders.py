"""A trial's folder, ``OUT/<task>__<agent>__s<seed>/``: its lock, and how a re-run replaces
a finished result without ever losing it.

- **One process per trial.** :func:`lock_trial` holds ``OUT/.<name>.lock`` (an exclusive
  kernel lock, :func:`servegym.run_folder.hold_lock`) while a trial runs: a second ``run``
  of the same trial (or a sweep's worker) is refused in one line; a lock of a killed process
  is taken over. A standalone ``run`` also holds the run folder's sweep lock shared
  (:func:`hold_run_dir`), so it never runs into a sweep's folder while the sweep runs.
- **Nothing finished is lost.** A trial folder holding a finished result is never cleared
  for a re-run (``run --force``): the re-run works in ``OUT/.<name>.new/`` and
  :func:`swap_in` puts it in place only once it is complete (its ``trial.json`` written),
  by two renames. :func:`settle`, run under the lock before anything else, finishes or
  undoes a swap that was cut short and drops a re-run that never finished, so a kill at any
  moment leaves either the old complete result or the new one.
- Trial folders are private to their user (0700).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from servegym.errors import UserError
from servegym.run_folder import PRIVATE_DIR, TRIAL_FILE, hold_lock, make_folder
from servegym.runner.results import trial_dir_name

DRIVER_LOCK = ".sweep-driver.lock"
"""The run folder's lock: a sweep's driver holds it exclusively, a standalone ``run`` shared."""
NEW_SUFFIX = ".new"
OLD_SUFFIX = ".old"


def trial_folder(out_dir: Path, task_id: str, agent: str, seed: int) -> Path:
    return out_dir / trial_dir_name(task_id, agent, seed)


def staged(final: Path) -> Path:
    """Where a re-run of the finished trial in ``final`` works until it is complete."""
    return final.with_name(f".{final.name}{NEW_SUFFIX}")


def aside(final: Path) -> Path:
    """Where the old result waits during :func:`swap_in`."""
    return final.with_name(f".{final.name}{OLD_SUFFIX}")


@contextlib.contextmanager
def hold_run_dir(out: Path, *, shared: bool) -> Iterator[None]:
    """Hold the run folder ``out`` (creating it): exclusively for a sweep's driver, shared
    for a standalone ``run``, so a sweep and a run never write into one folder at once (a
    trial re-run under a running sweep would look like tampering to its other trials)."""
    make_folder(out)
    with hold_lock(
        out / DRIVER_LOCK,
        flag="--out",
        busy=str(out),
        holder="a run" if shared else "a sweep",
        shared=shared,
    ):
        yield


@contextlib.contextmanager
def lock_trial(final: Path) -> Iterator[None]:
    """Hold the trial's lock (creating its run folder), or raise a one-line UserError."""
    make_folder(final.parent)
    with hold_lock(
        final.with_name(f".{final.name}.lock"),
        flag="--out",
        busy=f"trial {final}",
        holder="running it",
    ):
        yield


def settle(final: Path) -> None:
    """Under the trial's lock: finish or undo a swap that was cut short, and drop what an
    unfinished re-run left aside (the finished result in ``final`` stays)."""
    new, old = staged(final), aside(final)
    if not final.exists() and old.exists():
        # killed between the two renames: the new result if it is complete, else the old
        os.rename(new if (new / TRIAL_FILE).is_file() else old, final)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(new, ignore_errors=True)


def tidy(final: Path) -> None:
    """Settle what a killed re-run left beside the finished trial ``final``, if no process
    is running the trial now (else, or when the folder cannot be locked, leave it)."""
    if staged(final).exists() or aside(final).exists():
        with (
            contextlib.suppress(UserError),
            hold_run_dir(final.parent, shared=True),
            lock_trial(final),
        ):
            settle(final)


def prepare_folder(folder: Path, stale: tuple[str, ...]) -> Path:
    """``folder`` created (0700) without the ``stale`` files of an earlier, unfinished run."""
    make_folder(folder)
    try:
        os.chmod(folder, PRIVATE_DIR)
        for name in stale:
            (folder / name).unlink(missing_ok=True)
        for tmp in folder.glob(".*.tmp"):  # a write cut short by a kill
            tmp.unlink(missing_ok=True)
    except OSError as e:
        raise UserError(f"--out: cannot prepare {folder}: {e.strerror or e}") from None
    return folder


def swap_in(new: Path, final: Path) -> None:
    """Put the complete re-run ``new`` in place of ``final``, the old result aside until
    then (see :func:`settle` for a kill between the renames)."""
    old = aside(final)
    shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(final, old)
        try:
            os.rename(new, final)
        except OSError:
            os.rename(old, final)
            raise
    except OSError as e:
        raise UserError(
            f"--out: cannot put the re-run of {final} in place: {e.strerror or e}; "
            "the earlier result is kept"
        ) from None
    shutil.rmtree(old, ignore_errors=True)
