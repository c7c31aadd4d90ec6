"""Tracks as strategies: how a config starts and is measured (see :mod:`.base`).

:func:`track_for` chooses a task's track once, by the task's ``track`` name in the
:data:`~servegym.tracks.base.TRACKS` registry: the simulator (:mod:`.sim`, and on a pipeline
task its pipeline deployment), real servers (:mod:`.real`: the cpu and gpu tracks), or the
cpu pipeline plug-in around real servers (:mod:`.cpu_pipeline`). Nothing here imports a
track's module until a task needs it.
"""

from __future__ import annotations

from pathlib import Path

from servegym.engines.base import Engine, ModelRef
from servegym.sandbox.local import Isolation
from servegym.tasks.loader import LoadedTask
from servegym.tracks.base import TRACKS, ServerPlace, Track, TrackSetup, register_track


def track_for(
    loaded: LoadedTask,
    *,
    server_logs: Path | None = None,
    engine: Engine | None = None,
    model: ModelRef | None = None,
    isolation: Isolation = "auto",
    servers: ServerPlace = "local",
) -> Track:
    """The track of ``loaded``. Real tracks write their servers' logs under
    ``server_logs`` (required there) and start ``engine`` serving ``model`` (default: the
    task's; tests pass stand-ins), ``servers`` saying where (``docker``: in containers of
    the engine's image). A track that runs no server refuses ``docker`` in one line."""
    setup = TrackSetup(
        server_logs=server_logs, engine=engine, model=model, isolation=isolation, servers=servers
    )
    return TRACKS.get(loaded.task.track).for_task(loaded, setup)


__all__ = ["TRACKS", "ServerPlace", "Track", "TrackSetup", "register_track", "track_for"]
