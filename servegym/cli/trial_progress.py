"""A trial's progress bars: the agent phase (budget) and the evaluation (paired runs).

Its own module because it subclasses :class:`servegym.runner.trial.TrialProgress`, which
pulls in the runner: ``servegym run`` imports it when a trial starts, ``--help`` never.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.progress import Progress, TaskID

from servegym.runner.trial import TrialProgress

if TYPE_CHECKING:
    from servegym.agents.base import ExperimentResult
    from servegym.tasks.loader import LoadedTask


class RichTrialProgress(TrialProgress):
    """Progress bars: the agent phase (budget) and the evaluation (runs)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.agent_bar: TaskID | None = None
        self.eval_bar: TaskID | None = None
        self.best: float | None = None
        self.failures = 0

    def start(self, loaded: LoadedTask, agent: str, seed: int) -> None:
        b = loaded.task.budget
        limit = b.sim_gpu_seconds if loaded.task.traits.simulated else b.wall_seconds
        self.agent_bar = self.progress.add_task(
            f"{agent}: 0 experiments", total=limit if limit else 1.0
        )

    def experiment(self, result: ExperimentResult, budget_limit: float | None) -> None:
        if self.agent_bar is None:
            return
        if result.ok and result.improvement is not None:
            imp = result.improvement
            self.best = imp if self.best is None else max(self.best, imp)
        if not result.ok:
            self.failures += 1
        best = f", best {self.best:.3f}x" if self.best is not None else ""
        fails = f", {self.failures} failed" if self.failures else ""
        used = result.budget.sim_gpu_seconds_used or result.budget.wall_seconds_used
        self.progress.update(
            self.agent_bar,
            completed=min(used, budget_limit) if budget_limit else used,
            description=f"experiments: {result.index + 1}{fails}{best}",
        )

    def stage(self, stage: str, done: int, total: int) -> None:
        if self.agent_bar is not None and self.eval_bar is None:
            task = self.progress.tasks[self.agent_bar]
            if task.total is not None:
                self.progress.update(self.agent_bar, completed=task.total)
        if self.eval_bar is None:
            self.eval_bar = self.progress.add_task(f"{stage} (paired runs)", total=total)
        self.progress.update(self.eval_bar, completed=done, total=total)
