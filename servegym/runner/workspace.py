"""The real tracks' agent workspace: its sandbox, its first ``start_server.sh``, and the
metered view an agent gets of it.

:func:`workspace_sandbox` builds the :class:`~servegym.sandbox.local.LocalSandbox` of a task's
engine and model: the engine's runtime read-only, its programs on ``PATH``, the model at
``MODEL_PATH``, network only where the task allows it. The final evaluation builds the same
sandbox around a fresh copy of the submitted files (:func:`fresh_workspace`).

:class:`MeteredWorkspace` is the :class:`~servegym.agents.base.Workspace` an agent uses:
commands are charged to the wall-clock budget like experiments (a command could otherwise run
a benchmark for free), and refused once the budget is spent; reading and writing files is
free.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from servegym.agents.base import LAUNCHER, BudgetExhausted
from servegym.engines.base import Engine, ModelRef
from servegym.engines.config import ServingConfig
from servegym.engines.launcher import launcher_script
from servegym.runner.agent_watch import ActionLog
from servegym.sandbox.local import Isolation, LocalSandbox
from servegym.sandbox.workspace import CommandResult
from servegym.tasks.spec import Task

MAX_COMMAND_TIMEOUT_S = 1800.0


def workspace_sandbox(
    task: Task,
    engine: Engine,
    model: ModelRef,
    root: Path,
    *,
    isolation: Isolation = "auto",
) -> LocalSandbox:
    return LocalSandbox(
        root,
        model=model,
        runtime_dirs=engine.runtime_dirs(),
        tool_dirs=engine.tool_dirs(),
        network=task.agent_network,
        isolation=isolation,
        env=engine.pinned_env(),
    )


def seed_workspace(sandbox: LocalSandbox, engine: Engine, baseline: ServingConfig) -> None:
    """Write the task's baseline as the workspace's first ``start_server.sh``."""
    note = "This is the task's baseline. Change it (flags, environment, or the whole command)."
    sandbox.write_file(LAUNCHER, launcher_script(engine, baseline, note=note))


def fresh_workspace(snapshot: Path, dest: Path) -> Path:
    """A fresh copy of a submitted snapshot at ``dest`` (anything there is removed first)."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(snapshot, dest, symlinks=False)
    return dest


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
