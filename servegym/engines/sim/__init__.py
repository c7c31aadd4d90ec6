"""The simulator track: a discrete-event simulator of a vLLM-v1-style engine on a modelled GPU.

Public API:

- :func:`launch` checks a :class:`~servegym.engines.config.ServingConfig` for a model on a
  GPU as the engine would and returns a :class:`LaunchedEngine` (KV capacity, start-up time,
  cost model), or raises :class:`LaunchError` with an engine-like message;
- :func:`simulate` runs a workload on a launched engine: a :class:`SimRun` of
  ``RequestRecord``s in virtual time and :class:`SimStats`;
- :class:`SimTarget` (registered as the ``sim`` target) wraps both for the load-generator
  interface;
- :mod:`servegym.engines.sim.defaults` holds vLLM's defaults (``KNOBS``, ``knob_defaults``).

Submodules import lazily so that reading profiles does not pull in the simulator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servegym.engines.sim.engine import SimRun, SimStats, simulate
    from servegym.engines.sim.launch import LaunchedEngine, LaunchError, launch
    from servegym.engines.sim.target import SimTarget

__all__ = [
    "LaunchError",
    "LaunchedEngine",
    "SimRun",
    "SimStats",
    "SimTarget",
    "launch",
    "simulate",
]

_WHERE = {
    "SimRun": "engine",
    "SimStats": "engine",
    "simulate": "engine",
    "LaunchedEngine": "launch",
    "LaunchError": "launch",
    "launch": "launch",
    "SimTarget": "target",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"servegym.engines.sim.{_WHERE[name]}"), name)
    raise AttributeError(name)
