"""Agents for the run-folder safety tests (imported by ``module:Class`` spec from a
subprocess whose ``PYTHONPATH`` holds this folder).

:class:`GateAgent` runs one real experiment, then waits until the file named by
``$SERVEGYM_TEST_GATE`` exists (two minutes at most) before it submits the default config:
a test holds a trial mid-agent-phase for as long as it needs, without timing guesses.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from servegym.agents.base import TaskEnvironment
from servegym.engines.config import ServingConfig

GATE_ENV = "SERVEGYM_TEST_GATE"
GATE_AGENT = "safety_agents:GateAgent"


class GateAgent:
    name = "gate"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        env.run_experiment(ServingConfig())
        gate = Path(os.environ.get(GATE_ENV, "/nonexistent"))
        deadline = time.monotonic() + 120
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        env.submit(ServingConfig())
