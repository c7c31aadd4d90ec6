"""The ``serving.toml`` of a workspace on a task tuned through configs (a real-track pipeline
task, or a sim task worked by a CLI agent): how an agent that works through files (a CLI
agent, a model with a shell) tunes it.

The workspace starts with the task's baseline config, above a commented list of every knob
the agent may set. ``run_benchmark`` measures the file as it is and ``submit_workspace``
submits it; both read it with :func:`read_workspace_config`, whose every complaint is one
line naming ``serving.toml`` and, where it is to blame, the knob.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import ValidationError

from servegym.agents.base import CONFIG_FILE
from servegym.engines.config import ServingConfig
from servegym.engines.knob_info import KnobInfo
from servegym.overrides import validation_message
from servegym.sandbox.workspace import WorkspaceError

HEADER = """\
# The serving config this workspace submits: the LLM server's knobs at the top level, the
# retrieval pipeline's in [pipeline] (speculative decoding's in [speculative]). A knob left
# out takes its default. Benchmarking the workspace measures this file as it is; submitting
# the workspace submits it. It starts as the task's baseline.
"""


def config_file_text(baseline: ServingConfig, knobs: list[KnobInfo]) -> str:
    """The first ``serving.toml``: the header, ``baseline``'s knobs, then the knob list."""
    body = tomli_w.dumps(baseline.model_dump(mode="json", exclude_defaults=True))
    listing = ["", "# Knobs (pipeline.<knob> goes in the [pipeline] table):"]
    for k in knobs:
        if k.name == "pipeline":
            continue  # the table, listed knob by knob
        default = "" if "default:" in k.help else f" (default: {k.default})"
        listing.append(f"#   {k.name}: {k.help}{default}")
    return HEADER + "\n" + body + "\n".join(listing) + "\n"


def write_workspace_config(root: Path, baseline: ServingConfig, knobs: list[KnobInfo]) -> None:
    (root / CONFIG_FILE).write_text(config_file_text(baseline, knobs), encoding="utf-8")


def read_workspace_config(root: Path) -> ServingConfig:
    """The workspace's ``serving.toml`` as a config; :class:`WorkspaceError` (one line, for
    the agent to correct) when it is missing, not TOML, or not a valid config."""
    path = root / CONFIG_FILE
    try:
        raw: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkspaceError(f"the workspace has no {CONFIG_FILE}: write it, then retry") from None
    except IsADirectoryError:
        raise WorkspaceError(f"{CONFIG_FILE} is a folder, not the config file") from None
    except UnicodeDecodeError:
        raise WorkspaceError(f"{CONFIG_FILE}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise WorkspaceError(f"{CONFIG_FILE}: malformed TOML: {e}") from None
    try:
        return ServingConfig.model_validate(raw)
    except ValidationError as e:
        raise WorkspaceError(validation_message(e, CONFIG_FILE, [], "the config")) from None
