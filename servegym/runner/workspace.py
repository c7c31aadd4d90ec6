"""The metered view an agent gets of its workspace on a real track.

:class:`MeteredWorkspace` is the :class:`~servegym.agents.base.Workspace` an agent uses:
commands are charged to the wall-clock budget like experiments (a command could otherwise run
a benchmark for free), and refused once the budget is spent; reading and writing files is
free. Its sandbox is the track's (:meth:`servegym.tracks.dev.DevSession.open_workspace`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from servegym.agents.base import BudgetExhausted
from servegym.runner.agent_watch import ActionLog
from servegym.sandbox.local import LocalSandbox
from servegym.sandbox.workspace import CommandResult

MAX_COMMAND_TIMEOUT_S = 1800.0


class MeteredWorkspace:
    """The agent's :class:`~servegym.agents.base.Workspace`: see the module docstring."""

    def __init__(
        self,
        sandbox: LocalSandbox,
        *,
        charge: Callable[[float], None],
        exhausted: Callable[[], bool],
    ) -> None:
        self.sandbox = sandbox
        self._charge = charge
        self._exhausted = exhausted
        self.commands = 0
        self.actions = ActionLog()
        """Every action asked for, for :mod:`servegym.runner.agent_watch`."""

    @property
    def root(self) -> Path:
        """The workspace's folder on the host."""
        return self.sandbox.root

    def run(self, command: str, timeout_s: float = 120.0) -> CommandResult:
        self.actions.add("bash", command)
        if self._exhausted():
            raise BudgetExhausted("the budget is spent; commands are no longer run")
        timeout_s = min(max(float(timeout_s), 1.0), MAX_COMMAND_TIMEOUT_S)
        started = time.monotonic()
        try:
            return self.sandbox.run(command, timeout_s)
        finally:
            self.commands += 1
            self._charge(time.monotonic() - started)

    def read_file(self, path: str, max_chars: int = 50_000) -> str:
        self.actions.add("read_file", path)
        return self.sandbox.read_file(path, max_chars)

    def write_file(self, path: str, content: str) -> int:
        self.actions.add("write_file", path)
        return self.sandbox.write_file(path, content)
