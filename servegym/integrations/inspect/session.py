"""One ServeGym trial driven from outside, call by call: :class:`TrialSession`.

An outside agent loop (Inspect AI's) cannot be an :class:`~servegym.agents.base.Agent`,
whose ``run(env, seed)`` owns the loop. So the trial runs as usual
(:func:`servegym.runner.trial.run_trial`, in a thread of its own) with a
:class:`RelayAgent`, whose ``run`` serves the tool calls the outside loop sends until it
is told the loop is over; then the trial goes on to the final evaluation and writes its
folder (``trial.json`` last), exactly as ``servegym run`` does. Every tool call runs on the
trial's thread through the tools ServeGym's own model agents have
(:func:`servegym.agents.llm.tools.call_tool`), so the budget, the refusals and the
experiment log are ServeGym's; each call and its result go to ``trajectory.jsonl`` as the
scripted agent writes them, so the trajectory replays with ``--agent scripted``.

Nothing here imports Inspect: the Inspect side (:mod:`.tasks`) only calls :meth:`start`,
:meth:`call` and :meth:`finish` from worker threads.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegym.agents.base import AgentBase, TaskDescription, TaskEnvironment
from servegym.agents.llm.tools import ToolOutcome, call_tool
from servegym.agents.scripted import TrajectoryWriter
from servegym.engines.config import ServingConfig
from servegym.errors import UserError
from servegym.providers.types import ToolCall
from servegym.runner.folders import trial_folder
from servegym.runner.results import TrialResult
from servegym.runner.trial import run_trial

ONE_TRIAL_AT_A_TIME = threading.Lock()
"""Trials of one process run one after another, as ``servegym run`` runs them: an outside
framework's concurrent samples (Inspect's epochs) would otherwise share the machine's
cores between measurements (and a re-run replacing a result holds the run folder alone)."""


class AgentStopped(Exception):
    """The outside agent loop ended with an error; the trial records it as the agent's."""


@dataclass
class _Finish:
    outcome: str
    cost: dict[str, Any] | None
    error: str | None


@dataclass
class _Call:
    call: ToolCall
    reply: Future[ToolOutcome] = field(default_factory=Future)


class RelayAgent(AgentBase):
    """The agent of a driven trial: serves tool calls from a queue until told to stop."""

    def __init__(self, name: str, session: TrialSession) -> None:
        self.name = name
        self.session = session
        self.requests: queue.Queue[_Call | _Finish] = queue.Queue()
        self.trajectory_path: Path | None = None
        self.outcome = "not_started"
        self.cost: dict[str, Any] | None = None

    def keep_trajectory(self, path: Path) -> bool:
        self.trajectory_path = path
        return True

    def trial_outcome(self) -> str | None:
        return self.outcome

    def trial_cost(self) -> dict[str, Any] | None:
        return self.cost

    def run(self, env: TaskEnvironment, seed: int) -> None:
        desc = env.describe()
        baseline = ServingConfig.model_validate(desc.baseline)
        trajectory = TrajectoryWriter(self.trajectory_path)
        self.outcome = "crashed"  # until the outside loop says how it ended
        last = time.monotonic()
        self.session.opened(desc)
        try:
            while True:
                item = self.requests.get()
                if isinstance(item, _Finish):
                    self.outcome, self.cost = item.outcome, item.cost
                    if item.error is not None:
                        raise AgentStopped(item.error)
                    return
                # the model's time between calls counts where the budget is wall-clock
                self._charge(env, time.monotonic() - last)
                try:
                    result = call_tool(env, desc.tuning, baseline, item.call)
                except BaseException as e:  # the harness failed: the caller hears it too
                    item.reply.set_exception(e)
                    raise
                item.reply.set_result(result)
                last = time.monotonic()
                trajectory.tool(item.call, result)
        finally:
            trajectory.close()
            self.session.closed()

    @staticmethod
    def _charge(env: TaskEnvironment, seconds: float) -> None:
        workspace = env.workspace_environment()
        if workspace is not None:  # a real track's wall-clock budget; the sim's is the clock
            workspace.charge_wall_seconds(seconds)


class TrialSession:
    """A trial of ``task`` on ``seed`` under ``agent_name`` in ``out``, its agent phase
    driven by :meth:`call`, ended by :meth:`finish`. Each method blocks: call them from a
    worker thread, never from an event loop."""

    def __init__(
        self,
        task: str,
        seed: int,
        out: Path,
        agent_name: str,
        *,
        force: bool = False,
        tasks_root: Path | None = None,
    ) -> None:
        self.task = task
        self.seed = seed
        self.out = out
        self.agent_name = agent_name
        self.force = force
        self.tasks_root = tasks_root
        self.agent = RelayAgent(agent_name, self)
        self.description: TaskDescription | None = None
        self.result: TrialResult | None = None
        self.error: BaseException | None = None
        self._opened = threading.Event()
        self._ended = threading.Event()
        self._finished = False  # the driver has ended the agent phase
        self._closed = False  # the agent serves no more calls
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._main, name=f"servegym-trial-{task}-s{seed}", daemon=True
        )

    # ------------------------------------------------------------------ the driver's side

    def start(self) -> TaskDescription:
        """Start the trial and wait for its agent phase: the task as the agent sees it.
        Raises what the trial raised before the agent phase (an unknown task: a
        :class:`UserError`), and a UserError when the trial has finished already."""
        self._thread.start()
        self._opened.wait()
        if self.description is not None:
            return self.description
        self._ended.wait()
        if self.error is not None:
            raise self.error
        raise UserError(
            f"{self.task} seed {self.seed}: the trial of {self.agent_name} in {self.out} has "
            "finished already (pass -T force=true to run it again, or another -T seed or -T out)"
        )

    def call(self, name: str, arguments: dict[str, Any], call_id: str = "") -> ToolOutcome:
        """Run one tool call on the trial's thread; its result as the agent reads it."""
        item = _Call(ToolCall(id=call_id, name=name, arguments=arguments))
        with self._lock:
            if self._finished or self._closed:
                return ToolOutcome("error: the agent phase is over", is_error=True)
            self.agent.requests.put(item)
        return item.reply.result()

    def finish(
        self,
        outcome: str = "finished",
        cost: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> TrialResult:
        """End the agent phase (``outcome``: how the outside loop ended; ``error``: what it
        raised, recorded as the agent's error) and wait for the final evaluation: the
        finished trial. Raises what the trial raised. Calling it again returns the same."""
        with self._lock:
            if not self._finished:
                self._finished = True
                self.agent.requests.put(_Finish(outcome, cost, error))
        self._ended.wait()
        if self.result is None:
            raise self.error if self.error is not None else RuntimeError("the trial did not end")
        return self.result

    @property
    def folder(self) -> Path:
        """The trial's folder (named by the task's id once the task is loaded)."""
        task_id = self.description.task_id if self.description is not None else self.task
        return trial_folder(self.out, task_id, self.agent_name, self.seed)

    # ------------------------------------------------------------------ the trial's side

    def opened(self, desc: TaskDescription) -> None:
        """Called by the agent on the trial's thread once its environment is ready."""
        self.description = desc
        self._opened.set()

    def closed(self) -> None:
        """Called by the agent on the trial's thread when it serves no more calls: a call
        still queued (after a harness failure) is answered, never left waiting."""
        with self._lock:
            self._closed = True
        while True:
            try:
                item = self.agent.requests.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Call):
                item.reply.set_result(ToolOutcome("error: the agent phase is over", is_error=True))

    def _main(self) -> None:
        try:
            with ONE_TRIAL_AT_A_TIME:
                self.result = run_trial(
                    self.task,
                    self.agent_name,
                    self.seed,
                    self.out,
                    force=self.force,
                    tasks_root=self.tasks_root,
                    agent=self.agent,
                )
            if self.description is None:  # a finished trial, returned as it was
                self.result = None
        except BaseException as e:
            self.error = e
        finally:
            self._opened.set()
            self._ended.set()
