"""How a knob of a :class:`~servegym.engines.config.ServingConfig` is described to an agent."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class KnobInfo(BaseModel):
    """One tunable knob as the agent is told about it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    default: str
    help: str
