"""A task tuned through configs alone (the simulator's) as a CLI agent works it: a folder.

A CLI agent acts through files and ``servegym-agent``. On a real track the workspace is the
task's own; a sim task has none, so the agent gets a folder of its trial holding the task's
``serving.toml`` (the baseline above the list of every knob, as a real-track pipeline task's
workspace starts: :mod:`servegym.agents.workspace_config`). ``servegym-agent benchmark`` runs
the file as it is as an experiment, ``submit`` submits it: the environment's own
``run_experiment`` and ``submit``, which charge the simulated budget as for any agent.
"""

from __future__ import annotations

import json
from pathlib import Path

from servegym.agents.base import CONFIG_FILE, BudgetState, ExperimentResult, TaskEnvironment
from servegym.agents.workspace_config import read_workspace_config, write_workspace_config
from servegym.engines.config import ServingConfig


class ConfigFolderTask:
    """What the control server drives on a sim task (see the module docstring)."""

    def __init__(self, env: TaskEnvironment, root: Path) -> None:
        self.env = env
        self.root = root
        desc = env.describe()
        root.mkdir(parents=True, exist_ok=True)
        if not (root / CONFIG_FILE).exists():
            baseline = ServingConfig.model_validate(desc.baseline)
            write_workspace_config(root, baseline, desc.knobs)

    def run_benchmark(self, quick: bool = False) -> ExperimentResult:
        return self.env.run_experiment(read_workspace_config(self.root), quick)

    def submit_workspace(self) -> str:
        config = read_workspace_config(self.root)
        self.env.submit(config)
        knobs = config.model_dump(mode="json", exclude_defaults=True)
        return f"submitted {CONFIG_FILE}: {json.dumps(knobs, default=str)}"

    def budget_left(self) -> BudgetState:
        return self.env.budget_left()
