"""``servegym score --task ID --base-url URL``: the final evaluation of a task against a
server that is already running (bring your own server).

The same hidden scoring workload, gates and paired comparison with the task's baseline as
a trial's final evaluation (:func:`~servegym.runner.evaluation.evaluate`); the
harness launches the baseline itself and measures the running server as the submission. It
writes ``DIR/<task>__external__s<seed>/trial.json`` with the fields that apply (no agent
phase: no experiments, no budget) and ``latencies.json``. Sim tasks have no server to
attach to and are refused.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

from servegym.engines.base import Engine, ModelRef
from servegym.engines.launcher import ExternalServer
from servegym.errors import BrokenTask, UserError
from servegym.run_folder import make_folder, write_private
from servegym.runner.evaluation import evaluate
from servegym.runner.folders import lock_trial
from servegym.runner.preflight import broken_task_error
from servegym.runner.results import (
    Timing,
    TrialResult,
    write_latencies,
    write_trial,
)
from servegym.runner.trial import (
    HARNESS_ERROR_FILE,
    SERVER_LOGS,
    check_track_ready,
    fold_evaluation,
    now_iso,
    trial_folder,
    versions,
)
from servegym.tasks.loader import LoadedTask, load_task
from servegym.tasks.secrets import scoring_seed
from servegym.tracks import track_for

AGENT = "external"


def score_server(
    task: str | Path | LoadedTask,
    base_url: str,
    out: Path,
    *,
    seed: int = 0,
    tasks_root: Path | None = None,
    engine: Engine | None = None,
    model: ModelRef | None = None,
) -> TrialResult:
    """Score the server at ``base_url`` on ``task`` (see the module docstring). ``engine``
    and ``model`` (the baseline's) default to the task's; tests pass stand-ins."""
    loaded = task if isinstance(task, LoadedTask) else load_task(task, tasks_root)
    if loaded.task.traits.simulated:
        raise UserError(
            f"--task {loaded.id}: a sim-track task has no server to score; --base-url scores "
            "cpu- and gpu-track tasks"
        )
    if engine is None:
        check_track_ready(loaded)
    folder = trial_folder(out, loaded.id, AGENT, seed)
    with lock_trial(folder):  # one scoring of a trial folder at a time
        make_folder(folder)
        return _score(loaded, base_url, folder, seed, engine, model)


def _score(
    loaded: LoadedTask,
    base_url: str,
    folder: Path,
    seed: int,
    engine: Engine | None,
    model: ModelRef | None,
) -> TrialResult:
    started_at = now_iso()
    t0 = time.perf_counter()
    scoring = scoring_seed(loaded.id, seed, avoid=loaded.task.workload.dev_seed)
    submission = ExternalServer(base_url=base_url)
    result = TrialResult(
        task=loaded.id,
        task_title=loaded.task.title,
        track=loaded.task.track,
        agent=AGENT,
        seed=seed,
        outcome="harness_error",
        scoring_seed=scoring,
        versions=versions(),
        started_at=started_at,
    )
    evaluation = None
    try:
        track = track_for(loaded, server_logs=folder / SERVER_LOGS, engine=engine, model=model)
        evaluation = evaluate(loaded, submission, scoring, track=track)
    except UserError:
        raise
    except BrokenTask as e:
        raise broken_task_error(loaded, str(e)) from None
    except Exception as e:
        result.error = f"{type(e).__name__}: {e}"
        write_private(folder / HARNESS_ERROR_FILE, traceback.format_exc())
    if evaluation is not None:
        result.outcome = evaluation.outcome
        fold_evaluation(result, evaluation)
    result.finished_at = now_iso()
    elapsed = time.perf_counter() - t0
    result.timing = Timing(wall_s=elapsed, agent_wall_s=0.0, evaluation_wall_s=elapsed)
    if evaluation is not None:
        write_latencies(folder, evaluation.latencies)
    write_trial(result, folder)
    return result
