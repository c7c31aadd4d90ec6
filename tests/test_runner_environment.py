"""The task environment on the sim track: what the agent sees, the budget, the log."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from servegym.agents.base import BudgetExhausted, TaskEnvironment
from servegym.engines.config import ServingConfig
from servegym.engines.sim.launch import launch
from servegym.runner.environment import TrackEnvironment
from servegym.tasks.loader import LoadedTask, load_task
from servegym.tasks.secrets import DEFAULT_SECRET, scoring_seed, stable_seed
from servegym.tracks.sim import (
    INVALID_CONFIG_SIM_SECONDS,
    LAUNCH_FAILURE_SIM_SECONDS,
    TRUNCATED_NOTE,
)

TASKS = Path(__file__).parent / "data" / "tasks"


@pytest.fixture(scope="module")
def tiny() -> LoadedTask:
    return load_task("tiny-throughput", TASKS)


def with_budget(loaded: LoadedTask, **budget: object) -> LoadedTask:
    task = loaded.task.model_copy(update={"budget": loaded.task.budget.model_copy(update=budget)})
    return LoadedTask(task=task, instruction=loaded.instruction, oracle=loaded.oracle,
                      path=loaded.path)  # fmt: skip


def test_is_a_task_environment(tiny: LoadedTask) -> None:
    env: TaskEnvironment = TrackEnvironment(tiny)
    assert env.budget_left().experiments_run == 0


def test_describe_shows_the_public_task_and_hides_seeds_and_oracle(tiny: LoadedTask) -> None:
    env = TrackEnvironment(tiny, trial_seed=0)
    d = env.describe()
    assert d.task_id == "tiny-throughput" and d.model == "llama-3.1-8b"
    assert d.instruction.startswith("Maximise output token throughput")
    assert d.objective == "output_throughput" and d.higher_is_better
    assert d.baseline == {"max_num_seqs": 8}
    assert d.price_per_gpu_hour > 0 and d.accuracy_min_ratio == 0.98
    assert d.budget.sim_gpu_seconds_left == 2000 and d.budget.experiments_left == 12
    knobs = {k.name: k for k in d.knobs}
    assert knobs["max_num_seqs"].default == "1024"  # resolved for an H100
    assert "batch" in knobs["max_num_seqs"].help
    assert d.workload["dev_seed"] == 3 and d.workload["summary"]["sessions"] == 40
    assert d.workload["quick_requests"] == 12
    text = d.model_dump_json()
    for seed in (scoring_seed("tiny-throughput", s, avoid=3) for s in range(3)):
        assert str(seed) not in text
    assert "oracle" not in text and "64" not in json.dumps(d.baseline)


def test_scoring_seed_is_secret_keyed_and_never_the_dev_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SERVEGYM_SECRET", raising=False)
    a = scoring_seed("t", 0)
    assert a == scoring_seed("t", 0) and a != scoring_seed("t", 1) != scoring_seed("u", 0)
    assert a >= 0 and a != 0
    assert scoring_seed("t", 0, avoid=a) != a
    monkeypatch.setenv("SERVEGYM_SECRET", "leaderboard-" + DEFAULT_SECRET)
    assert scoring_seed("t", 0) != a
    assert stable_seed("x", 1) == stable_seed("x", 1) != stable_seed("x", 2)


def test_an_experiment_charges_startup_plus_simulated_time_times_gpus(tiny: LoadedTask) -> None:
    env = TrackEnvironment(tiny)
    r = env.run_experiment(ServingConfig(max_num_seqs=32, tensor_parallel_size=2))
    assert r.ok and r.index == 0 and r.metrics is not None
    engine = launch(tiny.task.model, tiny.task.hardware, ServingConfig(tensor_parallel_size=2))
    assert r.cost_sim_gpu_seconds > 2 * engine.startup_s
    assert r.budget.sim_gpu_seconds_used == pytest.approx(r.cost_sim_gpu_seconds)
    assert r.budget.experiments_run == 1 and r.budget.experiments_left == 11
    assert env.budget_left().sim_gpu_seconds_left == pytest.approx(2000 - r.cost_sim_gpu_seconds)
    assert r.config == {"max_num_seqs": 32, "tensor_parallel_size": 2}
    assert r.objective_value is not None and r.improvement is not None and r.improvement > 1.5
    assert r.accuracy_ratio == 1.0


def test_the_baseline_config_scores_about_one_and_repeats_vary(tiny: LoadedTask) -> None:
    env = TrackEnvironment(tiny)
    runs = [env.run_experiment(tiny.task.baseline) for _ in range(3)]
    imps = [r.improvement for r in runs]
    assert all(i is not None and 0.9 < i < 1.1 for i in imps)
    assert len({r.objective_value for r in runs}) == 3  # noise differs per experiment
    # ... yet a fresh environment with the same trial seed sees the same numbers.
    again = TrackEnvironment(tiny)
    assert [again.run_experiment(tiny.task.baseline).objective_value for _ in range(3)] == [
        r.objective_value for r in runs
    ]
    other = TrackEnvironment(tiny, trial_seed=9)
    assert other.run_experiment(tiny.task.baseline).objective_value != runs[0].objective_value


def test_quick_experiments_run_fewer_requests(tiny: LoadedTask) -> None:
    env = TrackEnvironment(tiny)
    full = env.run_experiment(ServingConfig(), quick=False)
    quick = env.run_experiment(ServingConfig(), quick=True)
    assert full.metrics is not None and quick.metrics is not None
    assert (full.metrics.completed, quick.metrics.completed) == (40, 12)
    assert quick.quick and quick.improvement is not None


def test_launch_failure_is_a_result_with_the_error_and_a_fixed_cost(tiny: LoadedTask) -> None:
    env = TrackEnvironment(tiny)
    r = env.run_experiment(ServingConfig(gpu_memory_utilization=0.999, tensor_parallel_size=2))
    assert not r.ok and r.metrics is None and r.improvement is None
    assert r.launch_error is not None and "memory" in r.launch_error
    assert r.log_tail is not None and r.launch_error.splitlines()[0] in r.log_tail
    assert "ERROR" in r.log_tail
    assert r.cost_sim_gpu_seconds == 2 * LAUNCH_FAILURE_SIM_SECONDS
    assert env.budget_left().experiments_run == 1


def test_an_invalid_config_is_refused_cheaply(tiny: LoadedTask) -> None:
    env = TrackEnvironment(tiny)
    r = env.run_experiment(ServingConfig.model_construct(max_num_seqs=0))
    assert not r.ok and r.launch_error is not None and "max_num_seqs" in r.launch_error
    assert r.cost_sim_gpu_seconds == INVALID_CONFIG_SIM_SECONDS


def test_experiment_cap_exhausts_the_budget(tiny: LoadedTask) -> None:
    env = TrackEnvironment(with_budget(tiny, max_experiments=2))
    env.run_experiment(ServingConfig(), quick=True)
    last = env.run_experiment(ServingConfig(), quick=True)
    assert last.budget.experiments_left == 0 and last.budget.exhausted
    with pytest.raises(BudgetExhausted):
        env.run_experiment(ServingConfig(), quick=True)
    assert len(env.experiments) == 2


def test_gpu_seconds_the_crossing_experiment_completes_then_none_start(
    tiny: LoadedTask,
) -> None:
    env = TrackEnvironment(with_budget(tiny, sim_gpu_seconds=100.0, max_experiments=None))
    first = env.run_experiment(ServingConfig())  # ~50 s start-up + a few seconds
    assert first.ok and not first.budget.exhausted
    second = env.run_experiment(ServingConfig())  # crosses 100: completes, charged in full
    assert second.ok and second.budget.exhausted
    assert env.budget_used == pytest.approx(
        first.cost_sim_gpu_seconds + second.cost_sim_gpu_seconds
    )
    assert env.budget_used > 100.0
    assert env.budget_left().sim_gpu_seconds_left == 0.0
    with pytest.raises(BudgetExhausted):
        env.run_experiment(ServingConfig())
    with pytest.raises(BudgetExhausted):
        env.run_experiment(ServingConfig(), quick=True)


def test_a_rate_search_stops_when_the_budget_runs_out() -> None:
    loaded = with_budget(load_task("tiny-maxrate", TASKS), sim_gpu_seconds=60.0)
    # Probes of 150 requests (the default 1,200 make one probe cost what this bound allows).
    objective = loaded.task.objective.model_copy(update={"rate_requests": 150})
    task = loaded.task.model_copy(update={"objective": objective})
    env = TrackEnvironment(dataclasses.replace(loaded, task=task))
    # One GPU-slot per request: low rates only, so every probe is long.
    r = env.run_experiment(ServingConfig(max_num_seqs=1))
    assert r.ok and r.log_tail == TRUNCATED_NOTE
    assert r.objective_value == 0.0 and r.improvement is not None and r.improvement <= 0.01
    # It overspent by at most one probe, not by the whole search.
    assert r.cost_sim_gpu_seconds < 1000


def test_experiments_jsonl_is_written_as_it_goes(tiny: LoadedTask, tmp_path: Path) -> None:
    log = tmp_path / "experiments.jsonl"
    seen: list[int] = []
    env = TrackEnvironment(tiny, log_path=log, on_experiment=lambda r: seen.append(r.index))
    env.run_experiment(ServingConfig(), quick=True)
    lines = log.read_text().splitlines()  # flushed while the environment is still open
    assert len(lines) == 1
    env.run_experiment(ServingConfig(gpu_memory_utilization=0.999))
    env.close()
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1] == seen
    assert rows[0]["ok"] and not rows[1]["ok"] and rows[1]["launch_error"]
    assert rows[0]["metrics"]["completed"] == 12


def test_submit_records_the_last_config_as_a_copy(tiny: LoadedTask) -> None:
    env = TrackEnvironment(tiny)
    cfg = ServingConfig(max_num_seqs=16)
    env.submit(ServingConfig(max_num_seqs=4))
    env.submit(cfg)
    cfg.max_num_seqs = 99
    assert env.submission == ServingConfig(max_num_seqs=16) and env.submissions == 2
    env.submit({"max_num_seqs": 12})  # type: ignore[arg-type]
    assert env.submission == ServingConfig(max_num_seqs=12)
    with pytest.raises(ValueError):
        env.submit({"max_num_seqs": -1})  # type: ignore[arg-type]
    assert env.submission == ServingConfig(max_num_seqs=12)


def test_a_baseline_that_does_not_launch_is_a_broken_task(tiny: LoadedTask) -> None:
    from servegym.errors import BrokenTask, HarnessError

    broken = LoadedTask(
        task=tiny.task.model_copy(update={"baseline": ServingConfig(gpu_memory_utilization=0.999)}),
        instruction=tiny.instruction,
        oracle=None,
        path=tiny.path,
    )
    env = TrackEnvironment(broken)
    with pytest.raises(BrokenTask) as info:  # a HarnessError: no tool call swallows it
        env.run_experiment(ServingConfig())
    assert isinstance(info.value, HarnessError)
    assert env.harness_error is not None and "baseline" in env.harness_error
    assert env.broken_task == env.harness_error


def test_tensor_parallel_beyond_the_tasks_gpus_fails_at_launch(tiny: LoadedTask) -> None:
    """A task grants max_gpus; asking for more is the engine's own launch failure."""
    one_gpu = LoadedTask(
        task=tiny.task.model_copy(update={"max_gpus": 1}),
        instruction=tiny.instruction,
        oracle=tiny.oracle,
        path=tiny.path,
    )
    env = TrackEnvironment(one_gpu)
    assert env.describe().num_gpus_available == 1
    r = env.run_experiment(ServingConfig(tensor_parallel_size=2))
    assert not r.ok and r.launch_error is not None
    assert "available GPUs: 1" in r.launch_error
