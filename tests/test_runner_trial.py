"""Trials end to end: every outcome, trial.json's layout and determinism, skipping, the
command. The agents here are tiny scripted ones, registered while this module runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from servegym.agents import base as agents_base
from servegym.agents.base import AgentBase, BudgetExhausted, TaskEnvironment, register_agent
from servegym.cli.run import run_trial_command
from servegym.engines.config import ServingConfig
from servegym.errors import UserError
from servegym.run_folder import TRIAL_FILE
from servegym.runner import trial as trial_module
from servegym.runner.results import (
    EXPERIMENTS_FILE,
    VOLATILE_KEYS,
    TrialResult,
    read_trial,
    strip_volatile,
)
from servegym.runner.trial import AGENT_ERROR_FILE, run_trial, trial_folder

TASKS = Path(__file__).parent / "data" / "tasks"


# --------------------------------------------------------------------------- scripted agents


class SubmitBaseline(AgentBase):
    name = "t-baseline"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        env.submit(ServingConfig.model_validate(env.describe().baseline))


class SubmitBetter(AgentBase):
    """Tries two configs, submits the better one (64 sequences beats the baseline's 8)."""

    name = "t-better"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        a = env.run_experiment(ServingConfig(max_num_seqs=64))
        b = env.run_experiment(ServingConfig(max_num_seqs=2), quick=True)
        best = a if (a.improvement or 0) >= (b.improvement or 0) else b
        env.submit(ServingConfig.model_validate(best.config))


class SubmitUnlaunchable(AgentBase):
    name = "t-nolaunch"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        r = env.run_experiment(ServingConfig(gpu_memory_utilization=0.999))
        assert not r.ok
        env.submit(ServingConfig(gpu_memory_utilization=0.999))


class SubmitInt4(AgentBase):
    name = "t-int4"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        env.submit(ServingConfig(max_num_seqs=64, quantization="int4"))


class SubmitForged(AgentBase):
    """Submits a config that bypassed validation."""

    name = "t-forged"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        env.submit(ServingConfig.model_construct(max_num_seqs=-5))


class SubmitShortContext(AgentBase):
    """A context too short for the prompts: the server refuses requests (dropping work)."""

    name = "t-short"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        env.submit(ServingConfig(max_model_len=64))


class RaiseAtOnce(AgentBase):
    name = "t-raise"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        env.run_experiment(ServingConfig(), quick=True)
        raise RuntimeError("the agent fell over")


class ExitAtOnce(AgentBase):
    name = "t-exit"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        sys.exit(3)


class RaiseAfterSubmit(AgentBase):
    name = "t-raise-after-submit"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        env.submit(ServingConfig(max_num_seqs=64))
        raise KeyError("late failure")


class NeverSubmit(AgentBase):
    name = "t-none"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        env.run_experiment(ServingConfig(max_num_seqs=64), quick=True)


class SpendEverything(AgentBase):
    """Experiments until the budget says no (BudgetExhausted escapes: that is fine)."""

    name = "t-spender"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        env.submit(ServingConfig(max_num_seqs=16))
        n = 8
        while True:
            env.run_experiment(ServingConfig(max_num_seqs=n + seed))
            n *= 2


class SwallowBudget(AgentBase):
    """Catches BudgetExhausted itself and submits the best it saw."""

    name = "t-swallow"

    def run(self, env: TaskEnvironment, seed: int) -> None:
        best: tuple[float, dict[str, object]] = (0.0, {})
        for n in (4, 32, 64, 128, 256, 512):
            try:
                r = env.run_experiment(ServingConfig(max_num_seqs=n), quick=True)
            except BudgetExhausted:
                break
            if r.improvement is not None and r.improvement > best[0]:
                best = (r.improvement, r.config)
        env.submit(ServingConfig.model_validate(best[1]))


TEST_AGENTS: dict[str, type] = {
    "t-baseline": SubmitBaseline,
    "t-better": SubmitBetter,
    "t-nolaunch": SubmitUnlaunchable,
    "t-int4": SubmitInt4,
    "t-forged": SubmitForged,
    "t-short": SubmitShortContext,
    "t-raise": RaiseAtOnce,
    "t-raise-after-submit": RaiseAfterSubmit,
    "t-exit": ExitAtOnce,
    "t-none": NeverSubmit,
    "t-spender": SpendEverything,
    "t-swallow": SwallowBudget,
}


@pytest.fixture(autouse=True, scope="module")
def _registered() -> Iterator[None]:
    """Register the scripted agents for this module only (agent listings elsewhere stay
    as shipped)."""
    for name, cls in TEST_AGENTS.items():
        register_agent(name)(cls)
    yield
    for name in TEST_AGENTS:
        agents_base.AGENTS.unregister(name)


def trial(agent: str, out: Path, task: str = "tiny-throughput", seed: int = 0) -> TrialResult:
    return run_trial(task, agent, seed, out, tasks_root=TASKS)


# --------------------------------------------------------------------------- outcomes


def test_baseline_submission_scores_one_within_its_interval(tmp_path: Path) -> None:
    r = trial("t-baseline", tmp_path)
    assert r.outcome == "scored" and r.score is not None and r.score_ci is not None
    lo, hi = r.score_ci
    assert lo <= 1.0 <= hi and 0.95 < r.score < 1.05
    assert r.leaderboard_score == r.score and r.raw_score == r.score
    assert all(g.passed for g in r.gates.values())
    assert r.process.experiments == 0 and r.best_seen is None
    assert r.objective is not None and len(r.objective.pairs) == 5  # repeats
    assert r.baseline is not None and r.submission is not None
    assert r.baseline.config == r.submission.config == {"max_num_seqs": 8}


def test_better_config_scores_above_one(tmp_path: Path) -> None:
    r = trial("t-better", tmp_path)
    assert r.outcome == "scored" and r.score is not None and r.score_ci is not None
    assert r.score > 2.0 and r.score_ci[0] > 1.5
    assert r.submission is not None and r.submission.config == {"max_num_seqs": 64}
    imp = r.improvement
    assert imp["output_throughput"].improvement is not None
    assert imp["output_throughput"].improvement == pytest.approx(r.score, rel=1e-9)
    assert {"ttft_p90", "ttft_p99", "tpot_p90", "e2e_p90", "cost_per_mtok"} <= set(imp)
    assert imp["cost_per_mtok"].higher_is_better is False
    # Process analytics of the agent phase.
    p = r.process
    assert (p.experiments, p.quick_experiments, p.distinct_configs) == (2, 1, 2)
    assert p.launch_failures == 0 and p.submissions == 1
    assert r.best_seen is not None and r.best_seen.index == 0
    assert r.best_seen.config == {"max_num_seqs": 64}
    assert p.time_to_best.experiment == 0
    assert p.time_to_best.budget_fraction is not None and 0 < p.time_to_best.budget_fraction < 1
    assert p.dev_baseline_value is not None
    assert r.budget.used > 0 and r.budget.limit == 2000 and r.budget.experiments == 2


def test_launch_failure(tmp_path: Path) -> None:
    r = trial("t-nolaunch", tmp_path)
    assert r.outcome == "launch_failed" and r.score is None and r.leaderboard_score == 1.0
    assert r.gates["launch"].passed is False and "memory" in r.gates["launch"].detail
    assert r.gates["accuracy"].passed is None
    assert r.submission is not None and not r.submission.launched
    assert r.submission.launch_error is not None
    assert r.baseline is not None and r.baseline.metrics is not None  # still reported
    assert r.process.launch_failures == 1 and r.raw_score is None


def test_accuracy_failure_keeps_the_measured_ratio(tmp_path: Path) -> None:
    r = trial("t-int4", tmp_path)
    assert r.outcome == "accuracy_failed" and r.score is None and r.leaderboard_score == 1.0
    g = r.gates["accuracy"]
    assert g.passed is False and g.value is not None and g.value < 0.98
    assert r.raw_score is not None and r.raw_score > 1.0  # fast, but not allowed


def test_forged_config_is_flagged(tmp_path: Path) -> None:
    r = trial("t-forged", tmp_path)
    assert r.outcome == "integrity_flagged" and r.score is None
    assert r.gates["integrity"].passed is False
    assert "max_num_seqs" in r.gates["integrity"].detail
    assert r.gates["launch"].passed is None


def test_refused_requests_are_flagged(tmp_path: Path) -> None:
    r = trial("t-short", tmp_path)
    assert r.outcome == "integrity_flagged"
    assert "did not complete" in r.gates["integrity"].detail
    assert r.submission is not None and r.submission.integrity.failed > 0


def test_agent_that_raises_before_submitting_crashed(tmp_path: Path) -> None:
    r = trial("t-raise", tmp_path)
    assert r.outcome == "crashed" and r.score is None and r.leaderboard_score == 1.0
    assert r.agent_error == "RuntimeError: the agent fell over"
    folder = trial_folder(tmp_path, "tiny-throughput", "t-raise", 0)
    assert "the agent fell over" in (folder / AGENT_ERROR_FILE).read_text()
    assert r.process.experiments == 1


def test_agent_that_exits_crashed(tmp_path: Path) -> None:
    r = trial("t-exit", tmp_path)
    assert r.outcome == "crashed" and r.agent_error == "SystemExit: 3"


def test_agent_that_raises_after_submitting_is_still_scored(tmp_path: Path) -> None:
    r = trial("t-raise-after-submit", tmp_path)
    assert r.outcome == "scored" and r.score is not None and r.score > 2.0
    assert r.agent_error is not None and r.agent_error.startswith("KeyError")


def test_no_submission(tmp_path: Path) -> None:
    r = trial("t-none", tmp_path)
    assert r.outcome == "no_submission" and r.score is None and r.leaderboard_score == 1.0
    assert r.agent_error is None and r.submission is None
    assert all(g.passed is None for g in r.gates.values())
    assert r.baseline is not None and r.baseline.metrics is not None


def test_budget_exhaustion_ends_the_agent_phase_and_the_last_submission_stands(
    tmp_path: Path,
) -> None:
    r = trial("t-spender", tmp_path)
    assert r.outcome == "scored" and r.agent_error is None
    assert r.budget.exhausted and r.budget.experiments == 12  # max_experiments
    assert r.submission is not None and r.submission.config == {"max_num_seqs": 16}
    lines = trial_folder(tmp_path, "tiny-throughput", "t-spender", 0) / EXPERIMENTS_FILE
    assert len(lines.read_text().splitlines()) == 12
    s = trial("t-swallow", tmp_path)
    assert s.outcome == "scored" and s.budget.experiments == 6


def test_harness_error_is_recorded_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object, **kwargs: object) -> object:
        raise ZeroDivisionError("harness bug")

    monkeypatch.setattr(trial_module, "evaluate", boom)
    r = trial("t-baseline", tmp_path)
    assert r.outcome == "harness_error" and r.error == "ZeroDivisionError: harness bug"
    assert r.score is None and r.leaderboard_score == 1.0
    folder = trial_folder(tmp_path, "tiny-throughput", "t-baseline", 0)
    assert (folder / "harness_error.txt").exists()


def test_objectives_of_other_kinds_score(tmp_path: Path) -> None:
    for task in ("tiny-latency", "tiny-composite"):
        r = trial("t-baseline", tmp_path, task=task)
        assert r.outcome == "scored" and r.score_ci is not None
        assert r.score_ci[0] <= 1.0 <= r.score_ci[1], task
    assert r.objective is not None
    assert list(r.objective.components) == ["output_throughput", "ttft p90"]
    better = trial("t-better", tmp_path, task="tiny-composite")
    assert better.objective is not None and better.score is not None
    parts = better.objective.components
    tput, ttft = parts["output_throughput"].improvement, parts["ttft p90"].improvement
    assert tput is not None and ttft is not None and tput > 2 and ttft > 2  # less queueing
    assert better.score == pytest.approx(math.sqrt(tput * ttft), rel=0.05)


def test_rate_objectives_score(tmp_path: Path) -> None:
    for task in ("tiny-maxrate", "tiny-cost"):
        r = trial("t-baseline", tmp_path, task=task)
        assert r.outcome == "scored" and r.score is not None
        assert r.baseline is not None and all(x is not None for x in r.baseline.rates)


# --------------------------------------------------------------------------- trial.json


def test_trial_json_layout(tmp_path: Path) -> None:
    trial("t-better", tmp_path)
    folder = trial_folder(tmp_path, "tiny-throughput", "t-better", 0)
    data = json.loads((folder / TRIAL_FILE).read_text())
    for key in (
        "schema", "task", "agent", "seed", "outcome", "score", "score_ci", "leaderboard_score",
        "improvement", "gates", "baseline", "submission", "best_seen", "process", "budget",
        "scoring_seed", "evaluation", "versions", "started_at", "finished_at", "timing",
    ):  # fmt: skip
        assert key in data, key
    assert data["schema"] == "servegym.trial/1"
    assert data["task"] == "tiny-throughput" and data["agent"] == "t-better" and data["seed"] == 0
    assert data["scoring_seed"] != 3  # never the dev seed
    assert set(data["gates"]) == {"launch", "accuracy", "integrity"}
    assert data["baseline"]["metrics"]["completed"] == 40
    assert data["evaluation"]["repeats"] == 5 and data["evaluation"]["workload_hash"]
    # Every pair draws its own sample of the scoring workload; the first is workload_hash.
    hashes = data["evaluation"]["pair_workload_hashes"]
    assert len(hashes) == 5 == len(set(hashes))
    assert hashes[0] == data["evaluation"]["workload_hash"]
    assert read_trial(folder / TRIAL_FILE).score == data["score"]
    assert not list(folder.glob("*.tmp"))


def test_same_seed_same_trial_json(tmp_path: Path) -> None:
    a = trial("t-better", tmp_path / "a", seed=5)
    b = trial("t-better", tmp_path / "b", seed=5)
    c = trial("t-better", tmp_path / "c", seed=6)

    def load(root: Path, seed: int) -> dict[str, object]:
        path = trial_folder(root, "tiny-throughput", "t-better", seed) / TRIAL_FILE
        return strip_volatile(json.loads(path.read_text()))

    assert load(tmp_path / "a", 5) == load(tmp_path / "b", 5)
    assert load(tmp_path / "a", 5) != load(tmp_path / "c", 6)
    assert a.scoring_seed == b.scoring_seed != c.scoring_seed
    assert set(VOLATILE_KEYS) == {"started_at", "finished_at", "timing"}
    for root, seed in ((tmp_path / "a", 5), (tmp_path / "b", 5)):
        log = trial_folder(root, "tiny-throughput", "t-better", seed) / EXPERIMENTS_FILE
        assert (
            log.read_text()
            == (
                trial_folder(tmp_path / "a", "tiny-throughput", "t-better", 5) / EXPERIMENTS_FILE
            ).read_text()
        )


def test_finished_trials_are_skipped_unless_forced(tmp_path: Path) -> None:
    first = trial("t-better", tmp_path)
    assert not first.skipped
    path = trial_folder(tmp_path, "tiny-throughput", "t-better", 0) / TRIAL_FILE
    before = path.read_text()
    again = trial("t-better", tmp_path)
    assert again.skipped and path.read_text() == before
    assert again.started_at == first.started_at
    forced = run_trial("tiny-throughput", "t-better", 0, tmp_path, force=True, tasks_root=TASKS)
    assert not forced.skipped and forced.started_at != first.started_at
    assert strip_volatile(json.loads(path.read_text())) == strip_volatile(json.loads(before))


def test_unknown_agent_and_task_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown agent 'nope'"):
        trial("nope", tmp_path)
    with pytest.raises(UserError, match="unknown task 'no-such-task'"):
        trial("t-baseline", tmp_path, task="no-such-task")
    with pytest.raises(UserError, match="--seed"):
        trial("t-baseline", tmp_path, seed=-1)
    assert not list(tmp_path.iterdir())  # nothing written


# --------------------------------------------------------------------------- the command


def test_command_prints_the_table(tmp_path: Path) -> None:
    console = Console(record=True, width=160)
    rc = run_trial_command(
        "tiny-throughput", "t-better", 0, tmp_path, False, console, tasks_root=TASKS
    )
    assert rc == 0
    text = console.export_text()
    for needle in ("objective: output_throughput", "ttft_p90", "cost_per_mtok", "gates",
                   "integrity", "outcome: scored", "score", "95% CI", "wrote"):  # fmt: skip
        assert needle in text, needle
    console = Console(record=True, width=160)
    run_trial_command("tiny-throughput", "t-better", 0, tmp_path, False, console, tasks_root=TASKS)
    assert "already finished" in console.export_text()


def test_command_shows_non_scored_outcomes(tmp_path: Path) -> None:
    console = Console(record=True, width=160)
    run_trial_command("tiny-throughput", "t-int4", 0, tmp_path, False, console, tasks_root=TASKS)
    text = console.export_text()
    assert "accuracy_failed" in text and "FAIL" in text and "leaderboard 1.000x" in text


def test_command_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(UserError) as e:
        run_trial_command("tiny-throughput", "nope", 0, tmp_path, False, Console(),
                          tasks_root=TASKS)  # fmt: skip
    assert "\n" not in str(e.value)
    with pytest.raises(UserError):
        run_trial_command("nope", "t-baseline", 0, tmp_path, False, Console(), tasks_root=TASKS)


def test_servegym_run_on_the_command_line(tmp_path: Path) -> None:
    task = str(TASKS / "tiny-throughput")
    base = [sys.executable, "-m", "servegym", "run", "--task", task, "--out", str(tmp_path)]
    proc = subprocess.run([*base, "--agent", "default"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "outcome: scored" in proc.stdout
    assert (tmp_path / "tiny-throughput__default__s0" / TRIAL_FILE).is_file()
    bad = subprocess.run([*base, "--agent", "nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "unknown agent 'nope'" in bad.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "servegym", "run", "--task", "nope", "--agent", "default"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert missing.returncode == 2 and "unknown task 'nope'" in missing.stderr
