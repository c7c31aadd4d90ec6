"""Checking that a submission's server runs with the environment the harness pins.

A task's engine can pin variables on every launch and workspace command (the CPU track pins
its hardware class, :mod:`servegym.engines.cpu_isa`); a config cannot change them, but a
workspace launcher is a script, and a script can ``export`` another value or ``unset`` one.
Once the server answers, :func:`unpinned` reads the environment every process of its tree
started with (``/proc/PID/environ``) and reports each process that does not carry the pinned
values: the submission was measured on other hardware than the baseline. A variable set to
another value is found in any process; a missing one only where the environment is still
readable (see :func:`unpinned`), so a launcher that clears the whole environment
(``env -i``) before starting its server is not seen.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from servegym.sandbox.egress import PROC


@dataclass(frozen=True, slots=True)
class Unpinned:
    """A process of the server's tree whose environment differs from the pinned one."""

    pid: int
    command: str
    variable: str
    value: str | None
    """What the process has (None: unset)."""
    pinned: str

    def text(self) -> str:
        has = "unset" if self.value is None else f"{self.variable}={self.value}"
        return (
            f"{self.command} (pid {self.pid}) runs with {has}; the task pins "
            f"{self.variable}={self.pinned}"
        )


def environ_of(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` started with, or None when it cannot be read (gone)."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def unpinned(tree: list[int], pinned: dict[str, str]) -> list[Unpinned]:
    """Every (process, variable) of ``tree`` (a server's processes, ``egress.descendants`` of
    its leader) that does not carry ``pinned``."""
    found = []
    for pid in tree:
        env = environ_of(pid)
        if env is None:
            continue
        command = "?"
        with contextlib.suppress(OSError):
            command = (PROC / str(pid) / "comm").read_text().strip()
        for key, want in sorted(pinned.items()):
            have = env.get(key)
            if have == want:
                continue
            if have is None and "PATH" not in env:
                # a process that renamed itself (setproctitle: vLLM's EngineCore and
                # workers) reuses its environment's memory for the title, and /proc then
                # shows only what it set since; every process the sandbox starts has PATH
                continue
            found.append(Unpinned(pid, command, key, have, want))
    return found
