"""What a trial checks of its task before anything runs or is written.

A task whose own baseline does not start is broken: not the agent's work, not the harness's
failure, and no score (not even the 1.0x a harness error counts) belongs on a leaderboard.
A track checks what it can before the agent starts (:func:`check_task_runs`, shared by
``servegym run``, ``sweep`` and ``task validate``): the simulator tries the baseline's launch,
a pure function of the config, the model and the hardware; on a real track the baseline's
server is only known not to start when it is started, and :func:`broken_task_error` turns the
:class:`~servegym.errors.BrokenTask` raised then into the same one line.

The simulator checks the budget too: it must cover one start-up of the baseline.
"""

from __future__ import annotations

from servegym.errors import BrokenTask, UserError
from servegym.tasks.loader import TASK_FILE, LoadedTask
from servegym.tracks import TRACKS


def broken_task_error(loaded: LoadedTask, message: str) -> UserError:
    """The one line a broken task (its baseline does not start) ends in, exit code 2."""
    return UserError(
        f"{loaded.path / TASK_FILE}: baseline: {message}; the task is broken, no trial is "
        f"recorded (`servegym task validate {loaded.id}` checks it)"
    )


def check_task_runs(loaded: LoadedTask) -> None:
    """Refuse a task its track can tell is broken before anything runs (its
    :meth:`~servegym.tracks.base.Track.preflight`: on the simulator, a baseline that does not
    launch or a budget below one start-up of it), in one line naming the field."""
    try:
        TRACKS.get(loaded.task.track).preflight(loaded)
    except BrokenTask as e:
        raise broken_task_error(loaded, str(e)) from None
