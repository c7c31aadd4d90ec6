"""The non-LLM baselines every agent is compared with: ``default``, ``random`` and ``tpe``.

- ``default`` submits the task's baseline config unchanged (and measures it once).
- ``random`` draws legal configs from the engine's search space
  (``agents/search_spaces/<engine>.toml``) until the budget runs out.
- ``tpe`` lets Optuna's TPE sampler (seeded by the trial seed) choose them instead.

Both searches measure the baseline first, treat a launch failure, a failed experiment or a
config below the task's accuracy gate as a very bad result, submit each new best measured
config as they go (so the best stands whenever the budget runs out), and never raise on a
bad experiment: they stop on :class:`~servegym.agents.base.BudgetExhausted`, on their own
``max_experiments``, or after ``max_consecutive_errors`` experiments that raised.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from servegym.agents.base import (
    AgentBase,
    BudgetExhausted,
    ExperimentResult,
    TaskDescription,
    TaskEnvironment,
    register_agent,
)
from servegym.agents.search_space import IllegalConfig, Params, SearchSpace, load_search_space
from servegym.engines.config import ServingConfig
from servegym.errors import HarnessError, UserError

log = logging.getLogger(__name__)

FAILED_SCORE = 0.0
"""What a launch failure, a failed experiment or a gate failure scores (improvement ratios
of real results are > 0)."""


class _Stop(Exception):
    """The search is over (budget, experiment cap or repeated errors)."""


def config_key(config: ServingConfig) -> str:
    """A canonical key of a config (two configs with the same knobs have the same key)."""
    return config.model_dump_json(exclude_defaults=True)


def score_of(result: ExperimentResult, accuracy_min_ratio: float | None = None) -> float:
    """The improvement an experiment showed, or :data:`FAILED_SCORE` when it failed to
    launch, measured nothing, or fell below the accuracy gate."""
    if not result.ok or result.improvement is None:
        return FAILED_SCORE
    if not math.isfinite(result.improvement) or result.improvement <= 0:
        return FAILED_SCORE
    if (
        accuracy_min_ratio is not None
        and result.accuracy_ratio is not None
        and result.accuracy_ratio < accuracy_min_ratio
    ):
        return FAILED_SCORE
    return float(result.improvement)


@dataclass
class Tracker:
    """Runs experiments for a search agent: charges nothing itself, keeps the best measured
    config, submits each new best, remembers every config's score."""

    env: TaskEnvironment
    baseline: ServingConfig
    accuracy_min_ratio: float | None = None
    max_experiments: int | None = None
    max_consecutive_errors: int = 10
    best_config: ServingConfig | None = None
    best_score: float = -math.inf
    experiments: int = 0
    scores: dict[str, float] = field(default_factory=dict)
    _errors_in_a_row: int = 0

    def measure(self, config: ServingConfig) -> float:
        """Run one experiment of ``config`` and return its score; raise :class:`_Stop` when
        the search must end. A config measured before returns its earlier score."""
        key = config_key(config)
        if key in self.scores:
            return self.scores[key]
        if self.max_experiments is not None and self.experiments >= self.max_experiments:
            raise _Stop("experiment cap reached")
        try:
            result = self.env.run_experiment(config)
        except BudgetExhausted:
            raise _Stop("budget exhausted") from None
        except HarnessError:  # the harness's failure (a full disk), not the config's: stop
            raise
        except Exception as e:  # an agent never raises on a bad experiment
            self.experiments += 1
            self._errors_in_a_row += 1
            log.warning("experiment raised %s: %s", type(e).__name__, e)
            if self._errors_in_a_row >= self.max_consecutive_errors:
                raise _Stop(f"{self._errors_in_a_row} experiments in a row raised") from None
            self.scores[key] = FAILED_SCORE
            return FAILED_SCORE
        self.experiments += 1
        self._errors_in_a_row = 0
        score = score_of(result, self.accuracy_min_ratio)
        self.scores[key] = score
        if score > FAILED_SCORE and score > self.best_score:
            self.best_score = score
            self.best_config = config
            self._submit(config)
        return score

    def _submit(self, config: ServingConfig) -> None:
        try:
            self.env.submit(config)
        except Exception as e:
            log.warning("submit raised %s: %s", type(e).__name__, e)

    def finish(self) -> ServingConfig:
        """Submit the best measured config (the baseline when nothing measured beat it or
        nothing could be measured) and return it."""
        final = self.best_config if self.best_config is not None else self.baseline
        self._submit(final)
        return final


def search_space_name(desc: TaskDescription) -> str:
    """The search space for the task: its engine's (``sim``), or ``<engine>-pipeline`` on a
    pipeline task (whose knobs include ``pipeline.<knob>`` ones)."""
    engine = desc.engines[0]
    if any(k.name.startswith("pipeline.") for k in desc.knobs):
        return f"{engine}-pipeline"
    return engine


def _baseline_of(desc: TaskDescription) -> ServingConfig:
    return ServingConfig.model_validate(desc.baseline)


def start_search(
    env: TaskEnvironment, search_space_path: Path | None, **tracker_options: Any
) -> tuple[TaskDescription, ServingConfig, SearchSpace, Tracker]:
    """What every search baseline does first: read the task, submit its baseline (so a
    search cut short still submits something), load the task's search space and track the
    experiments (``tracker_options``: :class:`Tracker`'s)."""
    desc = env.describe()
    baseline = _baseline_of(desc)
    env.submit(baseline)
    space = load_search_space(
        search_space_name(desc),
        model=desc.model,
        num_gpus=desc.num_gpus_available,
        path=search_space_path,
    )
    tracker = Tracker(env, baseline, accuracy_min_ratio=desc.accuracy_min_ratio, **tracker_options)
    return desc, baseline, space, tracker


@register_agent("default")
class DefaultAgent(AgentBase):
    """Submits the task's baseline config unchanged; ``measure`` runs it once first (so a
    trial records what the baseline did on the dev workload)."""

    name = "default"

    def __init__(self, measure: bool = True) -> None:
        self.measure = measure

    def run(self, env: TaskEnvironment, seed: int) -> None:
        desc = env.describe()
        baseline = _baseline_of(desc)
        env.submit(baseline)
        if not self.measure:
            return
        tracker = Tracker(env, baseline, accuracy_min_ratio=None, max_experiments=1)
        with contextlib.suppress(_Stop):
            tracker.measure(baseline)
        env.submit(baseline)


class SearchAgent(AgentBase):
    """What ``random`` and ``tpe`` share: load the space, measure the baseline, search,
    submit the best. Subclasses implement :meth:`search`."""

    name = "search"

    def __init__(
        self,
        *,
        search_space: str | Path | None = None,
        max_experiments: int | None = None,
        max_consecutive_errors: int = 10,
        max_draws: int = 1000,
    ) -> None:
        self.search_space_path = Path(search_space) if search_space is not None else None
        self.max_experiments = max_experiments
        self.max_consecutive_errors = max_consecutive_errors
        self.max_draws = max_draws
        self.tracker: Tracker | None = None

    def run(self, env: TaskEnvironment, seed: int) -> None:
        _, baseline, space, tracker = start_search(
            env,
            self.search_space_path,
            max_experiments=self.max_experiments,
            max_consecutive_errors=self.max_consecutive_errors,
        )
        self.tracker = tracker
        try:
            tracker.measure(baseline)
            self.search(space, baseline, tracker, seed)
        except _Stop as e:
            log.info("%s: search ended: %s", self.name, e)
        tracker.finish()

    def search(
        self, space: SearchSpace, baseline: ServingConfig, tracker: Tracker, seed: int
    ) -> None:
        raise NotImplementedError

    def fresh_draw(
        self, space: SearchSpace, rng: np.random.Generator, baseline: ServingConfig,
        tracker: Tracker,
    ) -> tuple[Params, ServingConfig]:  # fmt: skip
        """A legal draw not measured yet; raises :class:`_Stop` when ``max_draws`` draws
        find none (the space is exhausted) or the space has no legal config at all."""
        for _ in range(self.max_draws):
            try:
                params, config = space.sample_config(rng, baseline, self.max_draws)
            except UserError as e:
                raise _Stop(e.message) from None
            if config_key(config) not in tracker.scores:
                return params, config
        raise _Stop(f"{self.max_draws} draws in a row were measured before: space exhausted")


@register_agent("random")
class RandomAgent(SearchAgent):
    """Random search: uniform draws from the search space until the budget runs out."""

    name = "random"

    def search(
        self, space: SearchSpace, baseline: ServingConfig, tracker: Tracker, seed: int
    ) -> None:
        rng = np.random.default_rng(seed)
        while True:
            _, config = self.fresh_draw(space, rng, baseline, tracker)
            tracker.measure(config)


@register_agent("tpe")
class TPEAgent(SearchAgent):
    """Optuna's TPE sampler over the search space (multivariate, grouped for conditional
    knobs), seeded by the trial seed. Failed experiments tell Optuna
    :data:`FAILED_SCORE`; forbidden draws are told as pruned (TPE ranks them below every
    completed trial) and drawn again without spending budget. A draw measured before is
    told its earlier score. After ``max_repeats`` forbidden draws or repeats in a row, a
    random legal draw not measured yet is enqueued instead (the search ends when there is
    none left)."""

    name = "tpe"

    def __init__(
        self,
        *,
        search_space: str | Path | None = None,
        max_experiments: int | None = None,
        max_consecutive_errors: int = 10,
        max_draws: int = 1000,
        n_startup_trials: int = 10,
        max_repeats: int = 20,
    ) -> None:
        super().__init__(
            search_space=search_space,
            max_experiments=max_experiments,
            max_consecutive_errors=max_consecutive_errors,
            max_draws=max_draws,
        )
        self.n_startup_trials = n_startup_trials
        self.max_repeats = max_repeats

    def search(
        self, space: SearchSpace, baseline: ServingConfig, tracker: Tracker, seed: int
    ) -> None:
        import optuna
        from optuna.trial import TrialState

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        rng = np.random.default_rng(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=seed,
                n_startup_trials=self.n_startup_trials,
                multivariate=True,
                group=True,
            )
            study = optuna.create_study(direction="maximize", sampler=sampler)
            illegal_in_a_row = 0
            repeats_in_a_row = 0
            while True:
                trial = study.ask()
                params = space.suggest(trial)
                try:
                    config = space.to_config(params, baseline)
                except IllegalConfig:
                    study.tell(trial, state=TrialState.PRUNED)
                    illegal_in_a_row += 1
                    if illegal_in_a_row >= self.max_repeats:
                        study.enqueue_trial(dict(self.fresh_draw(space, rng, baseline, tracker)[0]))
                        illegal_in_a_row = 0
                    continue
                illegal_in_a_row = 0
                repeated = config_key(config) in tracker.scores
                study.tell(trial, tracker.measure(config))
                repeats_in_a_row = repeats_in_a_row + 1 if repeated else 0
                if repeats_in_a_row >= self.max_repeats:
                    study.enqueue_trial(dict(self.fresh_draw(space, rng, baseline, tracker)[0]))
                    repeats_in_a_row = 0
