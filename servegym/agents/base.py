"""The agent protocol: what an agent sees of a task, and how it acts.

An agent gets a :class:`TaskEnvironment` and acts only through it: it reads the task
(``describe``), runs experiments (each charged to the budget), and submits a config. The
environment logs every experiment; when the budget runs out, the last submission stands.
A new agent is one class: named ``--agent package.module:Class``, declared as a
``servegym.agents`` entry point by an installed package, or registered here with one
:func:`register_agent` call (see :data:`AGENTS` and :mod:`servegym.registry`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from servegym.engines.config import ServingConfig
from servegym.engines.knob_info import KnobInfo
from servegym.errors import UserError
from servegym.registry import Registry
from servegym.sandbox.workspace import CommandResult
from servegym.scoring.metrics import Metrics


class BudgetState(BaseModel):
    """What is spent and what is left (``None``: no limit of that kind)."""

    model_config = ConfigDict(extra="forbid")

    experiments_run: int = 0
    experiments_left: int | None = None
    sim_gpu_seconds_used: float = 0.0
    sim_gpu_seconds_left: float | None = None
    wall_seconds_used: float = 0.0
    wall_seconds_left: float | None = None

    @property
    def exhausted(self) -> bool:
        return any(
            left is not None and left <= 0
            for left in (self.experiments_left, self.sim_gpu_seconds_left, self.wall_seconds_left)
        )


LAUNCHER = "start_server.sh"
"""On real tracks tuned through a workspace, the submission is the workspace, started by
this script."""

CONFIG_FILE = "serving.toml"
"""On real tracks tuned through configs, the workspace's serving config (knobs at the top
level, ``[pipeline]`` and ``[speculative]`` tables): what ``run_benchmark`` measures and
``submit_workspace`` submits, for agents that work through files (CLI agents)."""

Tuning = Literal["config", "workspace"]
"""How a task is tuned and what its submission is: ``config``, a serving config (knob ->
value; the sim track, and real-track pipeline tasks, whose servers and retrieval stages the
harness deploys from the config); ``workspace``, a folder whose ``start_server.sh`` starts
the server (the other real-track tasks)."""


class TaskDescription(BaseModel):
    """Everything an agent may know about its task (never the scoring seed or the oracle)."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    title: str
    instruction: str
    track: str
    model: str
    hardware: str
    num_gpus_available: int = 8
    price_per_gpu_hour: float
    engines: list[str]
    baseline: dict[str, Any] = Field(description="the baseline config (knobs set)")
    knobs: list[KnobInfo]
    workload: dict[str, Any] = Field(description="the dev workload's shape (counts, lengths)")
    objective: str
    higher_is_better: bool
    sla: dict[str, Any] | None
    accuracy_min_ratio: float
    budget: BudgetState
    tuning: Tuning = Field(
        description="config: run_experiment and submit take knob -> value configs (on a "
        f"real track the workspace's {CONFIG_FILE!r} is that config too); workspace: the "
        f"submission is the workspace, started by {LAUNCHER!r}",
    )
    max_agent_tokens: int | None = Field(
        default=None, description="a cap on the agent's model tokens (input + output)"
    )
    max_agent_dollars: float | None = Field(
        default=None, description="a cap on the agent's model calls, in US dollars"
    )


class ExperimentResult(BaseModel):
    """One experiment: the config, and its dev metrics or why it failed to launch."""

    model_config = ConfigDict(extra="forbid")

    index: int
    config: dict[str, Any] = Field(description="the knobs set")
    quick: bool = False
    ok: bool
    launch_error: str | None = None
    log_tail: str | None = None
    objective_value: float | None = Field(
        default=None, description="the task objective on the dev workload"
    )
    improvement: float | None = Field(
        default=None, description="objective vs the baseline's on the same dev workload (>1 better)"
    )
    accuracy_ratio: float | None = None
    metrics: Metrics | None = None
    pipeline: dict[str, Any] | None = Field(
        default=None,
        description="pipeline tasks: answering rate, latency percentiles, recall, stage shares",
    )
    cost_sim_gpu_seconds: float = 0.0
    cost_wall_seconds: float = 0.0
    budget: BudgetState


class TaskEnvironment(Protocol):
    """The agent's only window on its task."""

    def describe(self) -> TaskDescription: ...

    def run_experiment(self, config: ServingConfig, quick: bool = False) -> ExperimentResult:
        """Launch ``config``, run the dev workload (a shorter one when ``quick``), charge the
        budget, and return the metrics, or the launch error with the log tail. Raises
        :class:`BudgetExhausted` when nothing is left."""
        ...

    def budget_left(self) -> BudgetState: ...

    def submit(self, config: ServingConfig) -> None:
        """Declare ``config`` the submission (the last call stands)."""
        ...

    def workspace_environment(self) -> WorkspaceEnvironment | None:
        """This environment with its workspace tools (:class:`WorkspaceEnvironment`) where
        the task has a workspace (the real tracks), else None (the sim track). The one way
        an agent learns whether it has a workspace: it never probes for attributes. Whether
        it tunes configs or a launcher is ``describe().tuning``."""
        ...


class Workspace(Protocol):
    """The agent's working folder on a real track, inside its sandbox. Paths are relative
    to the workspace root; one that leaves it is refused with :class:`WorkspaceError`."""

    @property
    def root(self) -> Path:
        """The folder on the host (a CLI agent mounts it in its container)."""
        ...

    def run(self, command: str, timeout_s: float = 120.0) -> CommandResult: ...

    def read_file(self, path: str, max_chars: int = 50_000) -> str: ...

    def write_file(self, path: str, content: str) -> int:
        """Write ``content`` (UTF-8); returns the bytes written."""
        ...


class WorkspaceEnvironment(TaskEnvironment, Protocol):
    """A real-track task with a workspace: the agent edits files (``start_server.sh`` and
    whatever it calls), benchmarks the workspace's launcher, and submits the workspace. On a
    task tuned through configs (:data:`Tuning`) the workspace's ``serving.toml`` stands in
    for the launcher: it is what is benchmarked and submitted, as a config.

    The search baselines use only :class:`TaskEnvironment` (configs); model and CLI agents
    use this, from :meth:`TaskEnvironment.workspace_environment`."""

    @property
    def workspace(self) -> Workspace: ...

    def run_benchmark(self, quick: bool = False) -> ExperimentResult:
        """Start the workspace's ``start_server.sh`` in the sandbox, run the dev workload
        against it, stop it, charge the budget; the result carries the server log's tail.
        Raises :class:`BudgetExhausted` when nothing is left."""
        ...

    def submit_workspace(self) -> str:
        """Snapshot the workspace as the submission (the last call stands); returns a
        one-line summary (files, bytes, digest). Raises :class:`WorkspaceError` when there
        is no ``start_server.sh``."""
        ...

    def charge_wall_seconds(self, seconds: float) -> None:
        """Charge time the agent spent outside the environment's own calls (a coding CLI's
        session, which runs its commands in its own container) to the wall-clock budget."""
        ...


class BudgetExhausted(Exception):
    """Raised by ``run_experiment`` when the budget has run out."""


class Agent(Protocol):
    """Anything that can work a task through a :class:`TaskEnvironment` (an
    :class:`AgentBase` gives the defaults of everything but :meth:`run`)."""

    name: str

    def run(self, env: TaskEnvironment, seed: int) -> None: ...

    def keep_trajectory(self, path: Path) -> bool:
        """Append the agent's trajectory to ``path`` from now on; False: it keeps none."""
        ...

    def trial_outcome(self) -> str | None:
        """How the agent's own loop ended (``finished``, ``max_turns`` ...), for the trial."""
        ...

    def trial_cost(self) -> dict[str, Any] | None:
        """What the agent spent on its model (tokens, dollars), for the trial."""
        ...


class AgentBase:
    """What a trial asks of an agent besides :meth:`Agent.run`, with the defaults of an
    agent that keeps no trajectory, reports no outcome of its own and spends nothing on a
    model."""

    def keep_trajectory(self, path: Path) -> bool:
        return False

    def trial_outcome(self) -> str | None:
        return None

    def trial_cost(self) -> dict[str, Any] | None:
        return None


class PlainAgent(AgentBase):
    """An agent made by a class that does not derive from :class:`AgentBase` (an outside
    class with just ``name`` and ``run``): the trial sees it through the defaults, so it
    never probes the object for what it lacks."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.name = str(getattr(agent, "name", type(agent).__name__))

    def run(self, env: TaskEnvironment, seed: int) -> None:
        self.agent.run(env, seed)


def _is_agent_factory(obj: object) -> bool:
    """A class with a ``run`` method, or a factory function (whose product is checked)."""
    if isinstance(obj, type):
        return callable(getattr(obj, "run", None))
    return callable(obj)


AGENTS: Registry[Callable[..., Agent]] = Registry(
    "agent",
    group="servegym.agents",
    builtins={
        **dict.fromkeys(("default", "random", "tpe"), "servegym.agents.baselines"),
        "checklist": "servegym.agents.checklist",
        **dict.fromkeys(("anthropic", "openai", "openai-compatible"), "servegym.agents.llm.agent"),
        **dict.fromkeys(
            ("claude-code", "codex", "gemini-cli", "opencode"), "servegym.agents.cli.agent"
        ),
        "scripted": "servegym.agents.scripted",
    },
    flag="--agent",
    accepts=_is_agent_factory,
    kind_label="an agent class",
)
"""Every agent by name: the built-ins, ``servegym.agents`` entry points, and
``package.module:Class`` specs (see :mod:`servegym.registry`)."""


def register_agent(name: str) -> Callable[[Callable[..., Agent]], Callable[..., Agent]]:
    """Class decorator: make an agent constructible by ``name``."""
    return AGENTS.register(name)


def agent_names() -> list[str]:
    return AGENTS.names()


MODEL_AGENTS = (
    "anthropic",
    "openai",
    "openai-compatible",
    "claude-code",
    "codex",
    "gemini-cli",
    "opencode",
)
"""Agents named ``<kind>:<model>`` (an LLM behind a provider, or a coding-agent CLI on one)."""


def _known_agents() -> list[str]:
    return sorted(
        [n for n in AGENTS.names() if n not in MODEL_AGENTS] + [f"{k}:MODEL" for k in MODEL_AGENTS]
    )


def make_agent(name: str, **kwargs: object) -> Agent:
    """The agent called ``name``, with ``kwargs`` as its settings. ``name`` is one of:

    - ``<kind>:<model>`` for the model agents (:data:`MODEL_AGENTS`), e.g.
      ``anthropic:claude-sonnet-4-5``: the kind decides, so these never import a module;
    - a registered name (``tpe``), a built-in's or an installed plug-in's (an entry point of
      the ``servegym.agents`` group);
    - ``package.module:Class``: any other name with a dotted module path left of its ``:``
      (:func:`servegym.registry.is_spec`) is imported and the class taken, so an outside
      agent runs without being registered or installed.
    """
    kind, sep, model = name.partition(":")
    if sep and kind in MODEL_AGENTS:
        return AGENTS.get(kind)(model=model, **kwargs)
    if name in MODEL_AGENTS:
        raise AGENTS.unknown(name, _known_agents())
    factory = AGENTS.get(name, known=_known_agents)
    try:
        agent = factory(**kwargs)
    except TypeError as e:
        if not kwargs:  # an outside class that needs arguments: say which
            raise UserError(f"--agent {name}: cannot be made without settings: {e}") from None
        raise UserError(
            f"--agent {name}: does not take the settings {', '.join(sorted(kwargs))} "
            "(model settings apply to the model agents)"
        ) from None
    if not callable(getattr(agent, "run", None)):
        raise UserError(f"--agent: '{name}' is not an agent class (it makes no agent)")
    return agent if isinstance(agent, AgentBase) else PlainAgent(agent)
