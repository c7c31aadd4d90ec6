"""One trial end to end: an agent works a task within its budget, then its submission is
scored in a fresh evaluation on the hidden scoring workload.

:func:`run_trial` writes ``DIR/<task>__<agent>__s<seed>/``:

- ``experiments.jsonl``: every experiment of the agent phase, one
  :class:`~servegym.agents.base.ExperimentResult` per line, appended as they happen;
- ``latencies.json``: the first evaluation pair's per-request latencies (sorted, capped;
  :class:`~servegym.runner.results.TrialLatencies`), when the evaluation measured anything;
- ``pipeline.json`` / ``pipeline_baseline.json``: a pipeline task's first evaluation
  pair's :class:`~servegym.pipeline.result.PipelineResult` s (per-question records, stage
  times; :mod:`servegym.pipeline.files`);
- ``trial.json``: the :class:`~servegym.runner.results.TrialResult` (written atomically,
  last; a readable one marks the trial finished, and a finished trial is skipped unless
  ``force``, whose re-run replaces it only once complete: :mod:`servegym.runner.folders`);
- ``agent_error.txt`` / ``harness_error.txt``: the traceback, when the agent or the
  harness raised.

Outcomes: the evaluation's (``scored``, ``accuracy_failed``, ``integrity_flagged``,
``launch_failed``) when there is a submission, whether or not the agent raised afterwards
(the last submission stands; ``agent_error`` keeps what it raised); ``crashed`` when the
agent raised before submitting anything; ``no_submission`` when it returned without one
(``provider_unavailable`` when a model agent's provider stayed down through every retry);
``harness_error`` when the harness itself failed (the message is in ``error``, never a
traceback on the console). A task whose own baseline does not start is no trial at all: it
is refused in one line naming the task (:mod:`servegym.runner.preflight`, exit code 2) and
no ``trial.json`` is written, so no leaderboard counts it. A non-scored trial keeps
``score`` null and ``leaderboard_score`` 1.0.

Everything but ``started_at``, ``finished_at`` and ``timing`` is a function of the task, the
agent, the seed, the code and the harness secret: the same seed gives the same trial.json.
"""

from __future__ import annotations

import json
import platform
import shutil
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pydantic

import servegym
from servegym.agents.base import Agent, BudgetExhausted, ExperimentResult, make_agent
from servegym.engines.config import ServingConfig
from servegym.engines.launcher import LauncherSubmission
from servegym.errors import BrokenTask, HarnessError, UserError
from servegym.pipeline.files import write_pipeline_files
from servegym.reference.outputs import references_dir
from servegym.run_folder import TRIAL_FILE, check_nameable, write_private
from servegym.runner.agent_watch import AgentWatch, forbidden_patterns
from servegym.runner.environment import TrackEnvironment, changed_knobs
from servegym.runner.evaluation import Evaluation, evaluate
from servegym.runner.folders import hold_run_dir, lock_trial, settle, staged, swap_in, tidy
from servegym.runner.folders import prepare_folder as prepare_trial_folder
from servegym.runner.folders import trial_folder as trial_folder  # imported from here too
from servegym.runner.preflight import broken_task_error, check_task_runs
from servegym.runner.results import (
    EXPERIMENTS_FILE,
    LATENCIES_FILE,
    BudgetSummary,
    Outcome,
    ProcessStats,
    TimeToBest,
    Timing,
    TrialResult,
    flag_trial,
    read_trial,
    write_latencies,
    write_trial,
)
from servegym.scoring.integrity import Finding
from servegym.tasks.loader import LoadedTask, load_task
from servegym.tasks.secrets import scoring_seed
from servegym.tracks import track_for
from servegym.tracks.base import ServerPlace, Track

TRAJECTORY_FILE = "trajectory.jsonl"
SERVER_LOGS = "servers"
"""Real tracks: the folder of a trial's server logs (one per experiment and side)."""
AGENT_ERROR_FILE = "agent_error.txt"
HARNESS_ERROR_FILE = "harness_error.txt"


class TrialProgress:
    """Callbacks a caller (the command line) gets during a trial; the defaults do nothing."""

    def start(self, loaded: LoadedTask, agent: str, seed: int) -> None:
        """The agent phase begins."""

    def experiment(self, result: ExperimentResult, budget_limit: float | None) -> None:
        """An experiment finished."""

    def stage(self, stage: str, done: int, total: int) -> None:
        """Progress of a later stage (``evaluation``)."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def versions() -> dict[str, str]:
    return {
        "servegym": servegym.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pydantic": pydantic.VERSION,
    }


def finished_trial(out_dir: Path, task_id: str, agent: str, seed: int) -> TrialResult | None:
    """The finished trial in ``out_dir``, or None (also when its trial.json is unreadable,
    which a re-run then replaces)."""
    path = trial_folder(out_dir, task_id, agent, seed) / TRIAL_FILE
    if not path.is_file():
        return None
    try:
        return read_trial(path)
    except (OSError, ValueError):
        return None


def process_stats(env: TrackEnvironment) -> tuple[ProcessStats, ExperimentResult | None]:
    """Process analytics of the agent phase, and its best dev experiment (among those whose
    accuracy would pass the task's gate)."""
    exps = env.experiments
    best: ExperimentResult | None = None
    min_accuracy = env.task.accuracy.min_ratio
    for e in exps:
        if (
            e.ok
            and e.improvement is not None
            # a config the accuracy gate would fail is no one's best
            and (e.accuracy_ratio is None or e.accuracy_ratio >= min_accuracy)
            and (best is None or best.improvement is None or e.improvement > best.improvement)
        ):
            best = e
    limit = env.budget_limit
    ttb = TimeToBest(experiment=None, budget_fraction=None)
    if best is not None:
        wall = env.budget_unit == "wall_seconds"
        used = best.budget.wall_seconds_used if wall else best.budget.sim_gpu_seconds_used
        ttb = TimeToBest(
            experiment=best.index,
            budget_fraction=used / limit if limit else None,
            sim_gpu_seconds=None if wall else used,
            wall_seconds=used if wall else None,
        )
    dev = env.measured_baseline(quick=False)
    dev_value = dev.value if dev is not None else None
    stats = ProcessStats(
        experiments=len(exps),
        quick_experiments=sum(1 for e in exps if e.quick),
        distinct_configs=len({json.dumps(e.config, sort_keys=True) for e in exps}),
        launch_failures=sum(1 for e in exps if not e.ok),
        submissions=env.submissions,
        dev_baseline_value=dev_value,
        time_to_best=ttb,
        shipped_best=_shipped_best(env.submission, best),
        commands=env.workspace_commands(),
    )
    return stats, best


def _shipped_best(
    submission: ServingConfig | LauncherSubmission | None, best: ExperimentResult | None
) -> bool | None:
    """Whether ``submission`` is what ``best`` measured (a config's knobs; a workspace's
    digest)."""
    if submission is None or best is None:
        return None
    if isinstance(submission, LauncherSubmission):
        return best.config.get("digest") == submission.digest[:16]
    try:
        return bool(changed_knobs(submission) == best.config)
    except Exception:  # a submission that does not even serialise
        return False


def _budget(env: TrackEnvironment) -> BudgetSummary:
    state = env.budget_left()
    return BudgetSummary(
        unit=env.budget_unit,
        used=env.budget_used,
        limit=env.budget_limit,
        experiments=len(env.experiments),
        max_experiments=env.task.budget.max_experiments,
        exhausted=state.exhausted,
    )


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def run_trial(
    task: str | Path | LoadedTask,
    agent_name: str,
    seed: int,
    out_dir: Path,
    force: bool = False,
    *,
    progress: TrialProgress | None = None,
    tasks_root: Path | None = None,
    agent_options: dict[str, Any] | None = None,
    in_sweep: bool = False,
    agent: Agent | None = None,
    servers: ServerPlace = "local",
) -> TrialResult:
    """Run one trial (or return the finished one, unless ``force``): prepare, the agent
    phase, the final evaluation, the results.

    ``task`` is a task id (under ``tasks_root``, default the shipped tasks), a path to a
    task folder, or a loaded task. Unknown tasks and agents, and bad task files, raise
    :class:`~servegym.errors.UserError` before anything is written. The trial holds its
    folder's lock while it runs (another process running it is a one-line UserError), and a
    re-run of a finished trial replaces its result only once the new one is complete
    (:mod:`servegym.runner.folders`). Outside a sweep (``in_sweep`` false) it also holds the
    run folder, shared (exclusively when it replaces a result), so it is refused while a
    sweep's driver holds it, and a re-run never changes a result under another running
    trial's watch.

    ``agent``, when given, is the agent already made (an integration that drives the agent
    from outside, such as the Inspect AI tasks); ``agent_name`` then only names the trial.

    ``servers`` is where a real track runs its servers (``docker``: containers of the
    engine's image; ``versions`` in ``trial.json`` then names the image). The trial's folder
    does not say it: give a docker trial its own ``out_dir``.
    """
    loaded = task if isinstance(task, LoadedTask) else load_task(task, tasks_root)
    check_track_ready(loaded)
    check_task_runs(loaded)
    if seed < 0:
        raise UserError(f"--seed must be a non-negative integer, got {seed}")
    if agent is None:
        agent = make_agent(agent_name, **(agent_options or {}))
    final = trial_folder(out_dir, loaded.id, agent_name, seed)
    check_nameable(final)
    if not force:
        done = finished_trial(out_dir, loaded.id, agent_name, seed)
        if done is not None:
            tidy(final)
            done.mark_skipped()
            return done
    # A sweep's worker runs under its driver's hold of the folder; a standalone run shares
    # it, unless it replaces a result the folder's other running trials would see change.
    replacing = (final / TRIAL_FILE).exists()
    holding = nullcontext() if in_sweep else hold_run_dir(out_dir, shared=not replacing)
    with holding, lock_trial(final):
        settle(final)
        done = finished_trial(out_dir, loaded.id, agent_name, seed)
        if done is not None and not force:  # finished by another process meanwhile
            done.mark_skipped()
            return done
        # a finished result stays in place until the re-run is complete
        folder = staged(final) if done is not None else final
        try:
            result = _run_in(loaded, agent, agent_name, seed, out_dir, folder, progress, servers)
        except BaseException:
            if folder != final:  # the re-run did not finish: the old result stands
                shutil.rmtree(folder, ignore_errors=True)
            raise
        if folder != final:
            swap_in(folder, final)
        return result


def _run_in(
    loaded: LoadedTask,
    agent: Agent,
    agent_name: str,
    seed: int,
    out_dir: Path,
    folder: Path,
    progress: TrialProgress | None,
    servers: ServerPlace = "local",
) -> TrialResult:
    """The trial, written to ``folder`` (``trial.json`` last)."""
    prepare_folder(folder)
    prog = progress or TrialProgress()
    if agent.keep_trajectory(folder / TRAJECTORY_FILE):
        (folder / TRAJECTORY_FILE).unlink(missing_ok=True)

    started_at = now_iso()
    t0 = time.perf_counter()
    track = track_for(loaded, server_logs=folder / SERVER_LOGS, servers=servers)
    phase = agent_phase(loaded, track, agent, agent_name, seed, out_dir, folder, prog)
    t_agent = time.perf_counter() - t0
    env = phase.env
    if env.broken_task is not None:  # the baseline did not start: no trial to record
        raise broken_task_error(loaded, env.broken_task)
    if env.write_error is not None:  # experiments.jsonl could not be written: not recorded
        raise env.write_error
    scoring = scoring_seed(loaded.id, seed, avoid=loaded.task.workload.dev_seed)
    t1 = time.perf_counter()
    try:
        evaluation, error = final_evaluation(loaded, env, scoring, folder, prog)
    except BrokenTask as e:
        raise broken_task_error(loaded, str(e)) from None
    t_eval = time.perf_counter() - t1

    process, best = process_stats(env)
    outcome: Outcome
    if error is not None or evaluation is None:
        outcome = "harness_error"
    elif env.submission is None:
        if phase.agent_error is not None:
            outcome = "crashed"
        elif agent.trial_outcome() == "provider_unavailable":
            outcome = "provider_unavailable"  # the provider failed, not the agent
        else:
            outcome = "no_submission"
    else:
        outcome = evaluation.outcome

    result = TrialResult(
        task=loaded.id,
        task_title=loaded.task.title,
        track=loaded.task.track,
        agent=agent_name,
        seed=seed,
        outcome=outcome,
        agent_error=phase.agent_error,
        error=error,
        best_seen=best,
        process=process,
        budget=_budget(env),
        scoring_seed=scoring,
        versions={**versions(), **track.server_versions()},
        started_at=started_at,
        agent_outcome=agent.trial_outcome(),
        agent_cost=agent.trial_cost(),
    )
    if evaluation is not None:
        fold_evaluation(result, evaluation)
    if phase.watched:
        flag_trial(result, [f.text() for f in phase.watched])
    result.finished_at = now_iso()
    result.timing = Timing(
        wall_s=time.perf_counter() - t0, agent_wall_s=t_agent, evaluation_wall_s=t_eval
    )
    write_results(folder, result, evaluation)
    return result


STALE_FILES = (
    TRIAL_FILE,
    EXPERIMENTS_FILE,
    LATENCIES_FILE,
    AGENT_ERROR_FILE,
    HARNESS_ERROR_FILE,
)
"""What an earlier, unfinished run of a trial may have left in its folder."""


def prepare_folder(folder: Path) -> Path:
    """The trial's folder, created (0700), without the files of an earlier run of it."""
    return prepare_trial_folder(folder, STALE_FILES)


@dataclass
class AgentPhase:
    """What the agent phase left: the environment (experiments, submission, budget), what
    the agent raised, and what the watch on the harness's files found."""

    env: TrackEnvironment
    agent_error: str | None
    watched: list[Finding]


def task_environment(
    loaded: LoadedTask, track: Track, seed: int, folder: Path, prog: TrialProgress
) -> TrackEnvironment:
    """The agent's environment on the task's track, logging to ``folder``."""
    env = TrackEnvironment(loaded, track, trial_seed=seed, log_path=folder / EXPERIMENTS_FILE)
    limit = env.budget_limit
    env.on_experiment = lambda r: prog.experiment(r, limit)
    return env


def agent_phase(
    loaded: LoadedTask,
    track: Track,
    agent: Agent,
    agent_name: str,
    seed: int,
    out_dir: Path,
    folder: Path,
    prog: TrialProgress,
) -> AgentPhase:
    """The agent works the task within its budget, watched, on ``track``."""
    env = task_environment(loaded, track, seed, folder, prog)
    prog.start(loaded, agent_name, seed)
    watch = agent_watch(loaded, out_dir, folder)
    watch.start()
    agent_error: str | None = None
    try:
        agent.run(env, seed)
    except BudgetExhausted:
        pass
    except HarnessError:
        pass  # env.harness_error says what happened
    except (Exception, SystemExit) as e:  # an agent calling sys.exit() crashed too
        if env.harness_error is None:
            agent_error = _error_text(e)
            write_private(folder / AGENT_ERROR_FILE, traceback.format_exc())
    finally:
        env.close()
    return AgentPhase(env, agent_error, watch.findings(env.workspace_actions()))


def final_evaluation(
    loaded: LoadedTask,
    env: TrackEnvironment,
    scoring: int,
    folder: Path,
    prog: TrialProgress,
) -> tuple[Evaluation | None, str | None]:
    """The submission scored on the hidden workload, on the track the agent worked on
    (unless the harness already failed): the evaluation, or the harness's error (its
    traceback in ``harness_error.txt``)."""
    if env.harness_error is not None:
        return None, env.harness_error
    try:
        evaluation = evaluate(
            loaded,
            env.submission,
            scoring,
            track=env.track,
            progress=lambda stage, d, n: prog.stage(stage, d, n),
            ran_in_workspace=[
                str(e.config["digest"]) for e in env.experiments if e.ok and "digest" in e.config
            ],
        )
    except BrokenTask:
        raise  # the task's fault, not the harness's: run_trial refuses it in one line
    except Exception as e:
        write_private(folder / HARNESS_ERROR_FILE, traceback.format_exc())
        return None, _error_text(e)
    return evaluation, None


def write_results(folder: Path, result: TrialResult, evaluation: Evaluation | None) -> None:
    """``latencies.json`` and the pipeline files, then ``trial.json`` (the finished mark)."""
    try:
        if evaluation is not None:
            write_latencies(folder, evaluation.latencies)  # before trial.json, the finished mark
            write_pipeline_files(folder, evaluation.measurements)
        write_trial(result, folder)
    except OSError as e:  # a full disk, a folder gone read-only: say so, and what was found
        score = f" {result.score:.3f}x" if result.score is not None else ""
        raise UserError(
            f"--out: cannot write {folder / TRIAL_FILE}: {e.strerror or e}; the trial "
            f"({result.outcome}{score}) is not recorded and runs again next time"
        ) from None


def agent_watch(loaded: LoadedTask, out_dir: Path, folder: Path) -> AgentWatch:
    """What an agent phase must leave alone (see :mod:`servegym.runner.agent_watch`): the
    harness's code, the task's folder, the other trials' finished results, the reference
    outputs (which the harness itself may add to)."""
    others = sorted(  # finished results only: an unreadable one is due for a re-run
        p
        for p in out_dir.glob(f"*/{TRIAL_FILE}")
        if not p.parent.name.startswith(".")  # a re-run's work, not a result
        and p.parent.resolve() != folder.resolve()
        and _readable(p)
    )
    growing: list[Path] = []
    extra: list[tuple[Path, str]] = []
    if not loaded.task.traits.simulated:
        references = references_dir()
        growing.append(references)
        extra.append((references, "the reference outputs"))
    return AgentWatch(
        roots=[Path(servegym.__file__).parent, loaded.path, *others],
        forbidden=forbidden_patterns(extra),
        growing=growing,
    )


def _readable(path: Path) -> bool:
    try:
        read_trial(path)
    except (OSError, ValueError):
        return False
    return True


def fold_evaluation(result: TrialResult, evaluation: Evaluation) -> None:
    """Copy a final evaluation's findings into ``result`` (its outcome already set)."""
    paired = evaluation.paired
    result.objective = evaluation.objective
    result.improvement = evaluation.improvement
    result.gates = evaluation.gates
    result.baseline = evaluation.baseline
    result.submission = evaluation.submission
    result.evaluation = evaluation.info
    if paired is not None:
        result.raw_score = paired.score
        result.raw_score_ci = paired.ci
        if result.outcome == "scored":
            result.score = paired.score
            result.score_ci = paired.ci
            result.leaderboard_score = paired.score


def check_track_ready(loaded: LoadedTask) -> None:
    """Refuse, in one line, a task whose track this machine cannot run."""
    readiness = loaded.task.traits.readiness
    if readiness == "cpu_engine":
        from servegym.cpu_track.setup import require_cpu_track

        try:
            require_cpu_track()
        except UserError as e:
            raise UserError(f"--task {loaded.id}: {e.message}") from None
    elif readiness == "nvidia_gpus":
        # the doctor's checks (servegym.runner.doctor), the trial's first step on a GPU host
        from servegym.runner.doctor import require_gpu_host

        require_gpu_host(loaded)


def clear_trial(out_dir: Path, task_id: str, agent: str, seed: int) -> None:
    """Remove a trial's folder (tests and ``--force`` callers that want a clean slate)."""
    shutil.rmtree(trial_folder(out_dir, task_id, agent, seed), ignore_errors=True)
