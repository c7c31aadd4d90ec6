"""Tracks as strategies: how a config starts and is measured (see :mod:`.base`).

:func:`track_for` chooses a task's track once: the simulator (:mod:`.sim`; a sim pipeline
task's deployment is the simulator's too), real servers (:mod:`.real`: the cpu and gpu
tracks), or the cpu pipeline plug-in around real servers (:mod:`.cpu_pipeline`).
"""

from __future__ import annotations

from pathlib import Path

from servegym.engines.base import Engine, ModelRef
from servegym.sandbox.local import Isolation
from servegym.tasks.loader import LoadedTask
from servegym.tracks.base import Track
from servegym.tracks.cpu_pipeline import CpuPipelineTrack
from servegym.tracks.real import RealServerTrack
from servegym.tracks.sim import SimTrack


def track_for(
    loaded: LoadedTask,
    *,
    server_logs: Path | None = None,
    engine: Engine | None = None,
    model: ModelRef | None = None,
    isolation: Isolation = "auto",
) -> Track:
    """The track of ``loaded``. Real tracks write their servers' logs under
    ``server_logs`` (required there) and start ``engine`` serving ``model`` (default: the
    task's; tests pass stand-ins)."""
    traits = loaded.task.traits
    if traits.simulated:
        return SimTrack()
    if server_logs is None:
        raise ValueError(f"task {loaded.id}: a {loaded.task.track}-track needs server_logs")
    servers = RealServerTrack(
        loaded, server_logs=server_logs, engine=engine, model=model, isolation=isolation
    )
    if loaded.task.pipeline is not None:
        return CpuPipelineTrack(servers)
    return servers


__all__ = ["Track", "track_for"]
