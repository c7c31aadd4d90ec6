"""What a workspace sandbox answers the agent: one command's result, and the error of a
request the agent can correct. The agent protocol (:class:`servegym.agents.base.Workspace`)
speaks these types; the sandboxes that run the commands produce them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CommandResult(BaseModel):
    """One command run in an agent's workspace sandbox (the ``bash`` tool)."""

    model_config = ConfigDict(extra="forbid")

    command: str
    exit_code: int | None = Field(description="None when it was killed at its timeout")
    output: str = Field(description="stdout and stderr together, cut to the cap")
    timed_out: bool = False
    truncated: bool = False
    seconds: float = 0.0


class WorkspaceError(Exception):
    """A workspace request the agent can correct (a path outside it, a missing file)."""
