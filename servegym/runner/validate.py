"""The checks ``servegym task validate`` runs on a task, as plain results.

Every task (or the ones named) loads and has an oracle; then the **nop check** (the
baseline config scores 1.0 within ``evaluation.nop_tolerance``) and the **oracle check**
(the oracle scores at least ``evaluation.oracle_min_score``), both through the task's
final evaluation (:func:`servegym.runner.evaluation.evaluate`, on the task's track) on the scoring
workloads of trial seeds ``0 .. seeds-1``. A real-track task on a machine without its track
gets the two checks skipped, saying why.

Then the **checklist check** (:func:`check_checklist`): the ``checklist`` baseline agent
(:mod:`servegym.agents.checklist`: generic wins tried one at a time, then combined) runs a
whole trial per seed, and the task fails when its score reaches :data:`CHECKLIST_MAX_SHARE`
of the oracle's (geometric means over the seeds): a task a checklist nearly solves does not
measure reasoning. It runs on simulated tasks only (on a real track an agent phase takes
hours); elsewhere it is skipped, saying why.

A real-track task that mirrors a sim task (``mirror_of``) gets the **mirror check**
(:func:`check_mirror`) on any machine: the model, hardware, workload, objective, SLA and
budget are the sim task's, and its oracle scores at least ``evaluation.oracle_min_score`` on
the simulator. A real-track task that tracks its validation (``validated``) has the verdict
of its nop and oracle checks, run on a host of its track, written into its ``task.toml``
(:func:`servegym.tasks.validated.write_validated`); checks skipped for want of the track
write nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from servegym.errors import UserError
from servegym.runner.preflight import check_task_runs
from servegym.tasks.loader import (
    ORACLE_FILE,
    LoadedTask,
    load_task_folder,
    resolve_task_folder,
    task_folders,
    tasks_dir,
)

if TYPE_CHECKING:
    from servegym.engines.config import ServingConfig
    from servegym.runner.evaluation import Evaluation
    from servegym.tasks.spec import Task


def folders_to_validate(task_ids: list[str], root: Path | None, seeds: int) -> list[Path]:
    """The folders of the named tasks (all under ``root`` when none). Bad input (unknown
    ids, no tasks, fewer than one seed) raises :class:`UserError`."""
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    if task_ids:
        return [resolve_task_folder(t, root, flag="task validate") for t in task_ids]
    folders = task_folders(root)
    if not folders:
        raise UserError(f"task validate: no tasks in {root or tasks_dir()}")
    return folders


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check of one task."""

    task: str
    check: str
    passed: bool
    detail: str
    skipped: bool = False
    short: str = ""
    """What the summary table shows in the check's cell (e.g. the scores)."""


def _scoring_seeds(loaded: LoadedTask, seeds: int) -> list[tuple[int, int]]:
    from servegym.tasks.secrets import scoring_seed

    dev = loaded.task.workload.dev_seed
    return [(s, scoring_seed(loaded.task.id, s, avoid=dev)) for s in range(seeds)]


def _evaluate(loaded: LoadedTask, submission: ServingConfig, seed: int) -> Evaluation:
    """The final evaluation of the task's track (real servers for cpu and gpu tasks)."""
    import tempfile

    from servegym.runner.evaluation import evaluate
    from servegym.tracks import track_for

    logs = None
    if not loaded.task.traits.simulated:
        logs = Path(tempfile.mkdtemp(prefix=f"servegym-validate-{loaded.id}-"))
    return evaluate(loaded, submission, seed, track=track_for(loaded, server_logs=logs))


def _real_track_missing(loaded: LoadedTask) -> str | None:
    """Why this machine cannot run the task's nop and oracle checks, if it cannot."""
    from servegym.runner.trial import check_track_ready

    if loaded.task.traits.readiness == "none":
        return None
    try:
        check_track_ready(loaded)
    except UserError as e:
        return e.message
    return None


def check_nop(loaded: LoadedTask, seeds: int = 1) -> CheckResult:
    """The baseline config, submitted, scores 1.0 within ``evaluation.nop_tolerance``."""
    from servegym.errors import HarnessError

    t = loaded.task
    tol = t.evaluation.nop_tolerance
    scores: list[str] = []
    ok = True
    for trial_seed, seed in _scoring_seeds(loaded, seeds):
        try:
            ev = _evaluate(loaded, t.baseline.model_copy(deep=True), seed)
        except HarnessError as e:
            return CheckResult(t.id, "nop", False, str(e))
        score = ev.score
        if ev.outcome != "scored" or score is None:
            return CheckResult(
                t.id, "nop", False, f"seed {trial_seed}: outcome {ev.outcome}", short=ev.outcome
            )
        scores.append(f"{score:.3f}")
        ok = ok and abs(score - 1.0) <= tol
    detail = f"baseline scores {', '.join(scores)} (1.0 +- {tol:g})"
    return CheckResult(t.id, "nop", ok, detail, short=", ".join(scores))


def check_oracle(loaded: LoadedTask, seeds: int = 1) -> CheckResult:
    """The oracle config scores at least ``evaluation.oracle_min_score``."""
    from servegym.errors import HarnessError

    t = loaded.task
    if loaded.oracle is None:
        return CheckResult(t.id, "oracle", False, f"no {ORACLE_FILE} (every task needs one)")
    need = t.evaluation.oracle_min_score
    scores: list[str] = []
    ok = True
    for trial_seed, seed in _scoring_seeds(loaded, seeds):
        try:
            ev = _evaluate(loaded, loaded.oracle.model_copy(deep=True), seed)
        except HarnessError as e:
            return CheckResult(t.id, "oracle", False, str(e))
        if ev.outcome != "scored" or ev.score is None:
            why = next((g.detail for g in ev.gates.values() if g.passed is False), "")
            return CheckResult(
                t.id,
                "oracle",
                False,
                f"seed {trial_seed}: outcome {ev.outcome}" + (f" ({why})" if why else ""),
                short=ev.outcome,
            )
        scores.append(f"{ev.score:.3f}")
        ok = ok and ev.score >= need
    return CheckResult(
        t.id,
        "oracle",
        ok,
        f"oracle scores {', '.join(scores)} (>= {need:g})",
        short=f"{', '.join(scores)} (>= {need:g})",
    )


CHECKLIST_MAX_SHARE = 0.9
"""A task fails the checklist check when the checklist agent scores at least this share of
the oracle's score."""


def _geomean(values: list[float]) -> float:
    import math

    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


def check_checklist(loaded: LoadedTask, seeds: int = 1) -> CheckResult:
    """The ``checklist`` agent's trial scores below :data:`CHECKLIST_MAX_SHARE` of the
    oracle's score (each the geometric mean over trial seeds ``0 .. seeds-1``; a trial that
    is not scored counts 1.0, as on the leaderboard)."""
    import tempfile

    from servegym.errors import HarnessError
    from servegym.runner.trial import run_trial

    t = loaded.task
    if not t.traits.simulated:
        note = "runs on simulated tasks only (an agent phase on real servers takes hours)"
        return CheckResult(t.id, "checklist", True, note, skipped=True, short="skipped")
    if loaded.oracle is None:
        return CheckResult(t.id, "checklist", False, f"no {ORACLE_FILE} to compare with")
    ours: list[float] = []
    theirs: list[float] = []
    with tempfile.TemporaryDirectory(prefix=f"servegym-checklist-{t.id}-") as tmp:
        for trial_seed, seed in _scoring_seeds(loaded, seeds):
            try:
                oracle = _evaluate(loaded, loaded.oracle.model_copy(deep=True), seed)
            except HarnessError as e:
                return CheckResult(t.id, "checklist", False, str(e))
            if oracle.score is None:
                why = f"the oracle is not scored on seed {trial_seed} ({oracle.outcome})"
                return CheckResult(t.id, "checklist", False, why, short="no oracle score")
            result = run_trial(loaded, "checklist", trial_seed, Path(tmp), force=True)
            ours.append(result.leaderboard_score)
            theirs.append(oracle.score)
    mine, best = _geomean(ours), _geomean(theirs)
    share = mine / best
    ok = share < CHECKLIST_MAX_SHARE
    verdict = "below" if ok else "reaches"
    detail = (
        f"checklist scores {', '.join(f'{s:.3f}' for s in ours)}, the oracle "
        f"{', '.join(f'{s:.3f}' for s in theirs)}: {share:.0%} of the oracle ({verdict} "
        f"{CHECKLIST_MAX_SHARE:.0%})"
    )
    return CheckResult(t.id, "checklist", ok, detail, short=f"{mine:.3f} = {share:.0%} of oracle")


def _mirror_differences(task: Task, sim: Task) -> list[str]:
    """What of ``task`` is not the same as the sim task ``sim`` it mirrors."""
    from servegym.engines.sim.profiles import model_profiles

    found: list[str] = []
    profile = model_profiles().get(sim.model)
    if profile is None or profile.hf_name != task.model:
        want = profile.hf_name if profile is not None else sim.model
        found.append(f"model {task.model} (the sim task's is {want})")
    pairs: list[tuple[str, object, object]] = [
        ("hardware", task.hardware, sim.hardware),
        ("workload", task.workload, sim.workload),
        ("objective", task.objective, sim.objective),
        ("sla", task.sla, sim.sla),
        ("accuracy.min_ratio", task.accuracy.min_ratio, sim.accuracy.min_ratio),
        ("budget.max_experiments", task.budget.max_experiments, sim.budget.max_experiments),
        ("budget in GPU-seconds", task.budget.wall_seconds, sim.budget.sim_gpu_seconds),
    ]
    for name, ours, theirs in pairs:
        if ours != theirs:
            found.append(f"{name} differs")
    return found


def check_mirror(loaded: LoadedTask, seeds: int = 1) -> CheckResult:
    """The task is its sim task's mirror, and its oracle scores at least
    ``evaluation.oracle_min_score`` there (on the simulator: any machine runs it)."""
    from servegym.errors import HarnessError

    t = loaded.task
    assert t.mirror_of is not None
    folder = loaded.path.parent / t.mirror_of
    try:
        sim = load_task_folder(folder if folder.is_dir() else resolve_task_folder(t.mirror_of))
    except UserError as e:
        return CheckResult(t.id, "mirror", False, f"mirror_of {t.mirror_of}: {e.message}")
    if not sim.task.traits.simulated:
        return CheckResult(t.id, "mirror", False, f"mirror_of {t.mirror_of}: not a sim task")
    differences = _mirror_differences(t, sim.task)
    if differences:
        return CheckResult(
            t.id, "mirror", False, f"not a mirror of {sim.id}: {'; '.join(differences)}"
        )
    if loaded.oracle is None:
        return CheckResult(t.id, "mirror", False, f"no {ORACLE_FILE} to check on the simulator")
    need = t.evaluation.oracle_min_score
    scores: list[str] = []
    ok = True
    for trial_seed, seed in _scoring_seeds(sim, seeds):
        try:
            ev = _evaluate(sim, loaded.oracle.model_copy(deep=True), seed)
        except HarnessError as e:
            return CheckResult(t.id, "mirror", False, str(e))
        if ev.outcome != "scored" or ev.score is None:
            why = f"the oracle on the simulator (as {sim.id}), seed {trial_seed}: {ev.outcome}"
            return CheckResult(t.id, "mirror", False, why, short=ev.outcome)
        scores.append(f"{ev.score:.3f}")
        ok = ok and ev.score >= need
    return CheckResult(
        t.id,
        "mirror",
        ok,
        f"mirrors {sim.id}; its oracle scores {', '.join(scores)} on the simulator (>= {need:g})",
        short=f"{', '.join(scores)} (sim)",
    )


def validate_task(
    folder: Path, *, seeds: int = 1, schema_only: bool = False, checklist: bool = True
) -> list[CheckResult]:
    """Every check of the task in ``folder`` (schema first; the rest only if it loads);
    ``checklist``: run the checklist check too."""
    try:
        loaded = load_task_folder(folder)
    except UserError as e:
        return [CheckResult(folder.name, "schema", False, e.message)]
    if loaded.oracle is None:
        return [
            CheckResult(
                loaded.id,
                "schema",
                False,
                f"{folder / ORACLE_FILE}: missing (every task needs one)",
            )
        ]
    try:
        check_task_runs(loaded)  # the baseline launches (sim), the budget covers a start-up
    except UserError as e:
        return [CheckResult(loaded.id, "schema", False, e.message)]
    results = [
        CheckResult(
            loaded.id, "schema", True, "task.toml, instruction.md, oracle.toml load", short="ok"
        )
    ]
    if schema_only:
        return results
    if loaded.task.mirror_of is not None:
        results.append(check_mirror(loaded, seeds))
    missing = _real_track_missing(loaded)
    if missing is not None:
        note = f"nop and oracle checks need the {loaded.task.track} track: {missing}"
        results.append(CheckResult(loaded.id, "nop", True, note, skipped=True, short="skipped"))
        results.append(CheckResult(loaded.id, "oracle", True, note, skipped=True, short="skipped"))
        return results
    results.append(check_nop(loaded, seeds))
    results.append(check_oracle(loaded, seeds))
    if loaded.task.validated is not None:
        from servegym.tasks.validated import write_validated

        passed = all(r.passed for r in results[-2:])
        write_validated(loaded, passed, _host_line())
    if checklist:
        results.append(check_checklist(loaded, seeds))
    return results


def _host_line() -> str:
    """The host a validation ran on, for ``validated_on``: its GPUs (or CPU) and the date."""
    import datetime

    from servegym.engines.host import this_host
    from servegym.runner.doctor import probe_gpus

    gpus = probe_gpus()
    if gpus:
        names = sorted({g.name for g in gpus})
        what = f"{len(gpus)} x {' / '.join(names)}"
    else:
        host = this_host()
        what = f"{host.cpus} CPUs ({host.isa})"
    return f"{what}, {datetime.date.today().isoformat()}"


CHECKS: tuple[str, ...] = ("schema", "mirror", "nop", "oracle", "checklist")
