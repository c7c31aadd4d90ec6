"""The real tracks' workspace sandbox, and its first ``start_server.sh``.

:func:`workspace_sandbox` builds the :class:`~servegym.sandbox.local.LocalSandbox` of a task's
engine and model: the engine's runtime read-only, its programs on ``PATH``, the model at
``MODEL_PATH``, network only where the task allows it. The final evaluation builds the same
sandbox around a fresh copy of the submitted files (:func:`fresh_workspace`).

The agent's metered view of it is :class:`servegym.runner.workspace.MeteredWorkspace`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from servegym.agents.base import LAUNCHER
from servegym.engines.base import Engine, ModelRef
from servegym.engines.config import ServingConfig
from servegym.engines.launcher import launcher_script
from servegym.sandbox.local import Isolation, LocalSandbox
from servegym.tasks.spec import Task


def workspace_sandbox(
    task: Task,
    engine: Engine,
    model: ModelRef,
    root: Path,
    *,
    isolation: Isolation = "auto",
) -> LocalSandbox:
    """The sandbox of a workspace at ``root``: the engine's runtime, programs and pinned
    environment, its launch defaults and compile caches inside the workspace's ``.cache``
    (:meth:`~servegym.engines.base.Engine.workspace_env`)."""
    sandbox = LocalSandbox(
        root,
        model=model,
        runtime_dirs=engine.runtime_dirs(),
        tool_dirs=engine.tool_dirs(),
        network=task.agent_network,
        isolation=isolation,
    )
    sandbox.extra_env = workspace_engine_env(engine, sandbox.workspace_path)
    return sandbox


def workspace_engine_env(engine: Engine, workspace: str) -> dict[str, str]:
    """What every process in a workspace (at ``workspace``, as its sandbox or container sees
    it) gets of its engine: the launch defaults and compile caches under the workspace's
    ``.cache`` (:meth:`~servegym.engines.base.Engine.workspace_env`), which its own exports
    may change, and the pinned environment, which the harness checks was kept."""
    return {**engine.workspace_env(f"{workspace}/.cache"), **engine.pinned_env()}


def seed_workspace(sandbox: LocalSandbox, engine: Engine, baseline: ServingConfig) -> None:
    """Write the task's baseline as the workspace's first ``start_server.sh``, and give its
    ``.cache`` what the engine seeds there
    (:meth:`~servegym.engines.base.Engine.seed_workspace_cache`)."""
    note = "This is the task's baseline. Change it (flags, environment, or the whole command)."
    sandbox.write_file(LAUNCHER, launcher_script(engine, baseline, note=note))
    engine.seed_workspace_cache(sandbox.root / ".cache", evaluation=False)


def fresh_workspace(snapshot: Path, dest: Path, engine: Engine | None = None) -> Path:
    """A fresh copy of a submitted snapshot at ``dest`` (anything there is removed first),
    its ``.cache`` seeded by ``engine`` for an evaluation
    (:meth:`~servegym.engines.base.Engine.seed_workspace_cache`)."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(snapshot, dest, symlinks=False)
    if engine is not None:
        engine.seed_workspace_cache(dest / ".cache", evaluation=True)
    return dest
