"""The baseline agents (default, random, tpe) on a tiny fake TaskEnvironment with a known
objective: they measure the baseline first, submit the best config they measured, survive
launch failures, failing experiments and BudgetExhausted, honour the accuracy gate, and tpe
beats the default within a small budget."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from servegym.agents.base import (
    BudgetExhausted,
    BudgetState,
    ExperimentResult,
    TaskDescription,
    agent_names,
    make_agent,
)
from servegym.agents.baselines import DefaultAgent, RandomAgent, TPEAgent, config_key
from servegym.engines.config import ServingConfig
from servegym.errors import UserError

ACCURACY = {"none": 1.0, "fp8": 0.997, "int8": 0.985, "int4": 0.97}


def known_objective(c: ServingConfig) -> float:
    """A smooth objective (higher is better) with its peak at max_num_seqs=128, fp8 weights,
    an fp8 KV cache, no eager mode; int4 is better still but fails a 0.99 accuracy gate."""
    seqs = c.max_num_seqs if c.max_num_seqs is not None else 1024
    value = 100.0 * math.exp(-0.5 * (math.log2(seqs / 128) / 1.5) ** 2)
    value *= {"none": 1.0, "fp8": 1.6, "int8": 1.3, "int4": 2.5}[c.quantization or "none"]
    value *= 1.2 if c.kv_cache_dtype == "fp8" else 1.0
    value *= 0.7 if c.enforce_eager else 1.0
    return value


class FakeEnv:
    """A TaskEnvironment with a known objective and an experiment budget."""

    def __init__(
        self,
        *,
        budget: int = 30,
        objective: Callable[[ServingConfig], float] = known_objective,
        fails: Callable[[ServingConfig], bool] = lambda c: (c.gpu_memory_utilization or 0) > 0.9,
        raises: Callable[[ServingConfig], bool] = lambda c: False,
        accuracy_min_ratio: float = 0.99,
        baseline: ServingConfig | None = None,
    ) -> None:
        self.budget = budget
        self.objective = objective
        self.fails = fails
        self.raises = raises
        self.accuracy_min_ratio = accuracy_min_ratio
        self.baseline = baseline if baseline is not None else ServingConfig()
        self.baseline_value = objective(self.baseline)
        self.measured: list[tuple[ServingConfig, float | None]] = []
        self.submissions: list[ServingConfig] = []
        self.exhausted_calls = 0

    def _state(self) -> BudgetState:
        n = len(self.measured)
        return BudgetState(experiments_run=n, experiments_left=max(self.budget - n, 0))

    def describe(self) -> TaskDescription:
        return TaskDescription(
            task_id="fake",
            title="fake",
            instruction="maximise the known objective",
            track="sim",
            model="llama-3.1-8b",
            hardware="h100-sxm",
            num_gpus_available=1,
            price_per_gpu_hour=1.0,
            engines=["sim"],
            baseline=self.baseline.changed(),
            knobs=[],
            workload={},
            objective="output_throughput",
            higher_is_better=True,
            sla=None,
            accuracy_min_ratio=self.accuracy_min_ratio,
            budget=self._state(),
            tuning="config",
        )

    def budget_left(self) -> BudgetState:
        return self._state()

    def run_experiment(self, config: ServingConfig, quick: bool = False) -> ExperimentResult:
        if len(self.measured) >= self.budget:
            self.exhausted_calls += 1
            raise BudgetExhausted("no budget left")
        index = len(self.measured)
        if self.raises(config):
            self.measured.append((config, None))
            raise RuntimeError("the harness tripped")
        if self.fails(config):
            self.measured.append((config, None))
            return ExperimentResult(
                index=index,
                config=config.changed(),
                ok=False,
                launch_error="torch.OutOfMemoryError: CUDA out of memory.",
                budget=self._state(),
            )
        value = self.objective(config)
        self.measured.append((config, value))
        return ExperimentResult(
            index=index,
            config=config.changed(),
            ok=True,
            objective_value=value,
            improvement=value / self.baseline_value,
            accuracy_ratio=ACCURACY[config.quantization or "none"],
            budget=self._state(),
        )

    def submit(self, config: ServingConfig) -> None:
        self.submissions.append(config)

    # helpers for the tests
    def best_legal(self) -> tuple[ServingConfig, float]:
        legal = [
            (c, v)
            for c, v in self.measured
            if v is not None and ACCURACY[c.quantization or "none"] >= self.accuracy_min_ratio
        ]
        return max(legal, key=lambda cv: cv[1])


def test_builtin_agents_are_registered() -> None:
    assert {"default", "random", "tpe"} <= set(agent_names())
    assert isinstance(make_agent("tpe"), TPEAgent)
    with pytest.raises(UserError, match="unknown agent 'nope'"):
        make_agent("nope")


def test_default_submits_the_baseline_unchanged() -> None:
    baseline = ServingConfig(max_model_len=8192)
    env = FakeEnv(baseline=baseline)
    DefaultAgent().run(env, seed=0)
    assert env.submissions and env.submissions[-1] == baseline
    assert [c for c, _ in env.measured] == [baseline]
    env = FakeEnv(budget=0)
    DefaultAgent().run(env, seed=0)  # no budget at all: still submits, never raises
    assert env.submissions[-1] == ServingConfig()
    env = FakeEnv()
    DefaultAgent(measure=False).run(env, seed=0)
    assert env.measured == [] and env.submissions == [ServingConfig()]


@pytest.mark.parametrize("name", ["random", "tpe"])
def test_search_agents_measure_the_baseline_first_and_submit_the_best(name: str) -> None:
    env = FakeEnv(budget=30)
    make_agent(name).run(env, seed=1)
    assert env.measured[0][0] == env.baseline
    assert len(env.measured) == 30  # used the whole budget
    assert env.exhausted_calls == 1  # stopped at the first BudgetExhausted
    best, value = env.best_legal()
    assert env.submissions[-1] == best
    assert value > env.baseline_value


@pytest.mark.parametrize("name", ["random", "tpe"])
def test_search_agents_are_deterministic_by_seed(name: str) -> None:
    runs = []
    for seed in (3, 3, 4):
        env = FakeEnv(budget=15)
        make_agent(name).run(env, seed=seed)
        runs.append([config_key(c) for c, _ in env.measured])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


@pytest.mark.parametrize("name", ["random", "tpe"])
def test_search_agents_honour_the_accuracy_gate(name: str) -> None:
    env = FakeEnv(budget=40, accuracy_min_ratio=0.99)
    make_agent(name).run(env, seed=0)
    measured_int4 = [v for c, v in env.measured if c.quantization == "int4" and v is not None]
    assert measured_int4, "the space offers int4, so a search of 40 should try it"
    assert env.submissions[-1].quantization not in ("int4", "int8")
    # With a loose gate the same search may submit int4.
    loose = FakeEnv(budget=40, accuracy_min_ratio=0.95)
    make_agent(name).run(loose, seed=0)
    assert loose.submissions[-1] == loose.best_legal()[0]


@pytest.mark.parametrize("name", ["random", "tpe"])
def test_search_agents_survive_launch_failures(name: str) -> None:
    # Every config but the baseline fails to launch: the baseline stands.
    env = FakeEnv(budget=12, fails=lambda c: c != ServingConfig())
    make_agent(name).run(env, seed=0)
    assert len(env.measured) == 12
    assert env.submissions[-1] == ServingConfig()


@pytest.mark.parametrize("name", ["random", "tpe"])
def test_search_agents_survive_experiments_that_raise(name: str) -> None:
    env = FakeEnv(budget=50, raises=lambda c: c.quantization == "fp8")
    make_agent(name).run(env, seed=0)  # never raises
    assert env.submissions[-1].quantization != "fp8"
    always = FakeEnv(budget=50, raises=lambda c: True)
    make_agent(name, max_consecutive_errors=5).run(always, seed=0)
    assert len(always.measured) == 5  # gave up after 5 errors in a row
    assert always.submissions[-1] == ServingConfig()


@pytest.mark.parametrize("name", ["random", "tpe"])
def test_search_agents_stop_at_their_own_cap(name: str) -> None:
    env = FakeEnv(budget=100)
    make_agent(name, max_experiments=7).run(env, seed=0)
    assert len(env.measured) == 7


def test_tpe_beats_the_default_within_a_small_budget() -> None:
    scores = {"tpe": [], "random": []}  # type: dict[str, list[float]]
    for seed in range(3):
        for name in scores:
            env = FakeEnv(budget=40)
            make_agent(name).run(env, seed=seed)
            submitted = env.submissions[-1]
            scores[name].append(known_objective(submitted) / env.baseline_value)
    assert min(scores["tpe"]) > 1.5  # well above the default's 1.0
    assert sum(scores["tpe"]) >= sum(scores["random"]) * 0.95


@pytest.mark.parametrize("cls", [RandomAgent, TPEAgent])
def test_search_agents_stop_when_a_custom_space_is_exhausted(
    cls: type[RandomAgent], tmp_path: Path
) -> None:
    space = tmp_path / "tiny.toml"
    space.write_text(
        'engine = "sim"\n'
        '[knobs.max_num_seqs]\nkind = "categorical"\nchoices = [64, 128, 256]\n'
        '[knobs.quantization]\nkind = "categorical"\nchoices = ["none", "fp8"]\n'
    )
    env = FakeEnv(budget=50)
    cls(search_space=space).run(env, seed=0)
    # Six configs in the space: once all are measured the agent stops instead of looping.
    assert len({config_key(c) for c, _ in env.measured}) <= 7
    assert env.submissions[-1] == ServingConfig(max_num_seqs=128, quantization="fp8")
