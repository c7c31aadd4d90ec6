"""Command-line options several commands share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a workload field: key=value (repeatable)"),
]
SeedOption = Annotated[int, typer.Option("--seed", help="workload seed")]
RequestsOption = Annotated[
    int | None,
    typer.Option("--requests", min=1, help="number of requests (sessions, for agentic)"),
]
ScaleOption = Annotated[
    float | None,
    typer.Option("--scale", min=0.0, help="multiply every token length (0.05: 1000 -> 50)"),
]


def given(**settings: object) -> dict[str, object]:
    """The agent settings given on the command line (flags left out are not passed on)."""
    return {k: v for k, v in settings.items() if v is not None}


ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="ServingConfig TOML (knobs at top level)")
]
KnobSetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="serving knob override: knob=value (repeatable)"),
]

ProviderTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--provider-timeout",
        min=0.001,
        max=3600.0,
        help="model agents: seconds one request to the provider may take (default 120)",
    ),
]
ProviderTriesOption = Annotated[
    int | None,
    typer.Option(
        "--provider-tries",
        min=1,
        max=100,
        help="model agents: requests per model call, the first and its retries (default 3)",
    ),
]
