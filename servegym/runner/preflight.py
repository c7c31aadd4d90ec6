"""What a trial checks of its task before anything runs or is written.

A task whose own baseline does not start is broken: not the agent's work, not the harness's
failure, and no score (not even the 1.0x a harness error counts) belongs on a leaderboard.
On the sim track a launch is a pure function of the config, the model and the hardware, so
:func:`check_task_runs` tries the baseline's launch before the agent starts (``servegym run``,
``sweep`` and ``task validate`` share it); on a real track the baseline's server is only
known not to start when it is started, and :func:`broken_task_error` turns the
:class:`~servegym.errors.BrokenTask` raised then into the same one line.

The budget is checked too: a sim task's ``budget.sim_gpu_seconds`` must cover one start-up
of its baseline (start-up seconds x GPUs). Below that no experiment can run within it, and
since the experiment that crosses the limit completes (``runner/environment.py``), a budget
of 1 GPU-second would be overspent about 60x by the first experiment; it is refused instead. Above
it, the budget is honoured as documented: the one experiment that crosses it completes.
"""

from __future__ import annotations

from servegym.errors import UserError
from servegym.tasks.loader import TASK_FILE, LoadedTask, workload_spec


def broken_task_error(loaded: LoadedTask, message: str) -> UserError:
    """The one line a broken task (its baseline does not start) ends in, exit code 2."""
    return UserError(
        f"{loaded.path / TASK_FILE}: baseline: {message}; the task is broken, no trial is "
        f"recorded (`servegym task validate {loaded.id}` checks it)"
    )


def check_task_runs(loaded: LoadedTask) -> None:
    """Refuse a sim task whose baseline does not launch, or whose budget does not cover one
    start-up of it (one line each, naming the field). Real tracks: nothing to check here
    without starting a server."""
    from servegym.engines.sim.launch import LaunchError
    from servegym.engines.sim.profiles import get_hardware, get_model
    from servegym.pipeline.engine import launch_task

    task = loaded.task
    if not task.traits.simulated:
        return
    spec, _ = workload_spec(loaded)
    try:
        engine = launch_task(
            task,
            get_model(task.model, "model"),
            get_hardware(task.hardware, "hardware"),
            task.baseline,
            workload_family=spec.kind,
        )
    except LaunchError as e:
        raise broken_task_error(
            loaded, f"the task's baseline config does not launch: {e.message}"
        ) from None
    startup = engine.startup_s * engine.num_gpus
    limit = task.budget.sim_gpu_seconds
    if limit is not None and limit < startup:
        raise UserError(
            f"{loaded.path / TASK_FILE}: budget.sim_gpu_seconds = {limit:g} does not cover one "
            f"start-up of the baseline ({startup:.1f} simulated GPU-seconds): no experiment "
            "could run within it"
        )
