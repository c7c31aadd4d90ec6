"""ServeGym tasks as Inspect AI tasks: :func:`servegym_task`.

One Inspect sample is one ServeGym trial (:class:`.session.TrialSession`): the trial runs as
``servegym run`` runs it and writes its folder as usual, its agent phase driven by
Inspect's agent.

- **setup** (run even when ``--solver`` replaces the agent): starts the trial on seed
  ``seed + epoch - 1`` and gives the sample the task's opening (the system prompt and first
  message ServeGym's own model agents get) and its tools;
- **solver**: Inspect's ``react`` agent with ServeGym's tools, ending when the model stops
  calling tools (its own ``submit`` tool is off: ``submit`` is ServeGym's);
- **tools**: ``describe_task``, ``run_experiment``, ``submit`` on tasks tuned through
  configs, the workspace tools on tasks tuned through a workspace
  (:mod:`servegym.agents.llm.tools`), each call served by the trial, its budget charged
  and refused by ServeGym;
- **scorer**: ends the agent phase and waits for the trial's final evaluation (hidden
  scoring workload, gates): the score's value is the trial's ``leaderboard_score`` (the
  score when scored, else 1.0) and its metadata the score, its interval, the outcome, the
  gates and the trial folder;
- **cleanup**: a sample that ends without being scored (cancelled) still finishes its
  trial, the agent's error recorded.

A task's caps on agent tokens and dollars become Inspect's ``token_limit`` and
``cost_limit``.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import anyio
from inspect_ai import Task, task
from inspect_ai.agent import react
from inspect_ai.dataset import Sample
from inspect_ai.event import ErrorEvent, ModelEvent, SampleLimitEvent
from inspect_ai.log import transcript
from inspect_ai.model import ChatMessageSystem, ChatMessageUser
from inspect_ai.scorer import (
    Metric,
    SampleScore,
    Score,
    Scorer,
    Target,
    mean,
    metric,
    scorer,
)
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import Tool, ToolDef, ToolError, ToolParams
from inspect_ai.util import store

from servegym.agents.llm.agent import opening_message, system_prompt
from servegym.agents.llm.tools import tools_for
from servegym.errors import UserError
from servegym.integrations.inspect.session import TrialSession
from servegym.providers.types import ToolSpec
from servegym.runner.results import TrialResult
from servegym.tasks.loader import load_task

DEFAULT_OUT = "runs"
"""Where trial folders go unless ``-T out=DIR`` says otherwise (``servegym run``'s default)."""

_SESSION_KEY = "servegym_trial"
"""The sample store's key naming its trial (the trial itself is no JSON value)."""

_SESSIONS: dict[str, TrialSession] = {}
"""The trials of the samples running in this process, by sample uuid."""

_REFUSED: dict[str, Exception] = {}
"""Why a sample's trial did not start (its scorer, which runs on errors, raises it again)."""

_LIMIT_OUTCOMES = {
    "message": "max_turns",
    "turn": "max_turns",
    "token": "token_budget",
    "cost": "dollar_budget",
}
"""Inspect's limits as the trial's ``agent_outcome`` (others: ``<type>_limit``)."""


def servegym_task(
    task: str,
    seed: int = 0,
    out: str = DEFAULT_OUT,
    agent: str | None = None,
    force: bool = False,
    tasks_root: str | None = None,
) -> Task:
    """The Inspect task of ServeGym task ``task`` (an id, or a task folder's path): one
    sample, one trial per epoch, on seeds ``seed``, ``seed + 1``, ... Trial folders go to
    ``out``; the trial's agent is named ``agent`` (default ``inspect:<model>``); ``force``
    re-runs a trial that has finished (else it is refused, its result kept)."""
    root = Path(tasks_root) if tasks_root else None
    loaded = load_task(task, root, flag="-T task")
    if seed < 0:
        raise UserError(f"-T seed must be a non-negative integer, got {seed}")
    spec = loaded.task
    out_dir = Path(out).expanduser().resolve()
    return Task(
        dataset=[
            Sample(
                id=loaded.id,
                input=loaded.instruction,
                metadata={"task": loaded.id, "track": spec.track, "title": spec.title},
            )
        ],
        setup=open_trial(str(loaded.path), seed, str(out_dir), agent, force, tasks_root),
        solver=react(tools=[SessionTools()], submit=False, prompt=None),
        scorer=final_evaluation(),
        cleanup=_cleanup,
        score_on_error=True,
        token_limit=spec.budget.max_agent_tokens,
        cost_limit=spec.budget.max_agent_dollars,
        metadata={"servegym_task": loaded.id, "track": spec.track, "out": str(out_dir)},
    )


@task(name="trial")
def trial(
    task: str,
    seed: int = 0,
    out: str = DEFAULT_OUT,
    agent: str | None = None,
    force: bool = False,
    tasks_root: str | None = None,
) -> Task:
    """Any ServeGym task by id or path: ``inspect eval servegym/trial -T task=ID``."""
    return servegym_task(task, seed, out, agent, force, tasks_root)


# --------------------------------------------------------------------------- setup


@solver
def open_trial(
    task: str,
    seed: int,
    out: str,
    agent: str | None,
    force: bool,
    tasks_root: str | None,
) -> Solver:
    """Start the sample's trial and give the sample its opening and tools."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        session = TrialSession(
            task,
            seed + state.epoch - 1,
            Path(out),
            agent or f"inspect:{state.model}",
            force=force,
            tasks_root=Path(tasks_root) if tasks_root else None,
        )
        try:
            desc = await anyio.to_thread.run_sync(session.start)
        except Exception as e:
            _REFUSED[state.uuid] = e  # the scorer, run on errors too, says this again
            raise
        _SESSIONS[state.uuid] = session
        state.store.set(_SESSION_KEY, state.uuid)
        state.messages = [
            ChatMessageSystem(content=system_prompt(desc)),
            ChatMessageUser(content=opening_message(desc)),
        ]
        state.tools = session_tools(session)
        return state

    return solve


# --------------------------------------------------------------------------- tools


def _session_of(uuid: str | None) -> TrialSession:
    session = _SESSIONS.get(uuid or "")
    if session is None:
        raise RuntimeError("no ServeGym trial is open for this sample (its setup did not run)")
    return session


def _tool(session: TrialSession, spec: ToolSpec) -> Tool:
    async def execute(**kwargs: Any) -> str:
        outcome = await anyio.to_thread.run_sync(session.call, spec.name, kwargs)
        if outcome.is_error:
            raise ToolError(outcome.content)
        return outcome.content

    return ToolDef(
        execute,
        name=spec.name,
        description=spec.description,
        parameters=ToolParams.model_validate(spec.parameters),
    ).as_tool()


def session_tools(session: TrialSession) -> list[Tool]:
    """The trial's tools as Inspect tools (those of its task's tuning)."""
    assert session.description is not None
    return [_tool(session, spec) for spec in tools_for(session.description.tuning)]


class SessionTools:
    """The tools of the current sample's trial (an Inspect ``ToolSource``: the agent is
    made with the task, before any sample's trial exists)."""

    async def tools(self) -> list[Tool]:
        return session_tools(_session_of(store().get(_SESSION_KEY)))


# --------------------------------------------------------------------------- scoring


@metric
def geomean() -> Metric:
    """The geometric mean of the samples' values (ServeGym's leaderboard aggregate)."""

    def compute(scores: list[SampleScore]) -> float:
        values = [s.score.as_float() for s in scores]
        if not values or any(v <= 0 for v in values):
            return math.nan
        return math.exp(sum(math.log(v) for v in values) / len(values))

    return compute


def _agent_phase() -> tuple[str, dict[str, Any], str | None]:
    """How Inspect's agent ended (as ServeGym's ``agent_outcome``), what its model calls
    cost, and the sample's error if it raised; read from the sample's transcript."""
    outcome, error = "finished", None
    calls = input_tokens = output_tokens = 0
    dollars: float | None = None
    model = ""
    for event in transcript().events:
        if isinstance(event, ModelEvent):
            calls += 1
            model = event.model
            usage = event.output.usage
            if usage is not None:
                input_tokens += usage.input_tokens
                output_tokens += usage.output_tokens
                if usage.total_cost is not None:
                    dollars = (dollars or 0.0) + usage.total_cost
        elif isinstance(event, SampleLimitEvent):
            outcome = _LIMIT_OUTCOMES.get(event.type, f"{event.type}_limit")
        elif isinstance(event, ErrorEvent):
            outcome, error = "crashed", event.error.message
    cost = {
        "model": model,
        "calls": calls,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "dollars": dollars,
    }
    return outcome, cost, error


def trial_score(result: TrialResult, folder: Path) -> Score:
    """A finished trial as an Inspect score."""
    score = f"{result.score:.3f}x" if result.score is not None else "no score"
    return Score(
        value=result.leaderboard_score,
        answer=result.outcome,
        explanation=f"{result.task} seed {result.seed}: {result.outcome}, {score} "
        f"(trial folder {folder})",
        metadata={
            "score": result.score,
            "score_ci": list(result.score_ci) if result.score_ci is not None else None,
            "outcome": result.outcome,
            "gates": {k: g.model_dump(mode="json") for k, g in result.gates.items()},
            "leaderboard_score": result.leaderboard_score,
            "agent_outcome": result.agent_outcome,
            "task": result.task,
            "seed": result.seed,
            "agent": result.agent,
            "trial_folder": str(folder),
        },
    )


@scorer(metrics=[mean(), geomean()])
def final_evaluation() -> Scorer:
    """End the agent phase and score the submission in ServeGym's final evaluation."""

    async def score(state: TaskState, target: Target) -> Score:
        refused = _REFUSED.get(state.uuid)
        if refused is not None:
            raise refused
        session = _session_of(state.store.get(_SESSION_KEY))
        outcome, cost, error = _agent_phase()
        result = await anyio.to_thread.run_sync(session.finish, outcome, cost, error)
        return trial_score(result, session.folder)

    return score


async def _cleanup(state: TaskState) -> None:
    """Finish the trial of a sample that ended unscored (its agent's error recorded)."""
    _REFUSED.pop(state.uuid, None)
    session = _SESSIONS.pop(state.uuid, None)
    if session is None or session.result is not None:
        return
    # the trial's own error is in its folder; the sample's is Inspect's
    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
        await anyio.to_thread.run_sync(
            session.finish, "crashed", None, "the Inspect sample ended before scoring"
        )
