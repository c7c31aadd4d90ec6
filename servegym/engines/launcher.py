"""``start_server.sh``: the launcher an agent edits on the real tracks.

A real-track workspace starts with the task's baseline rendered as a shell script
(:func:`launcher_script`). The harness runs it with ``PORT``, ``HOST``, ``MODEL_PATH`` and
``SERVED_MODEL_NAME`` set (:meth:`servegym.sandbox.local.LocalSandbox.launch_spec`); the
script must start a server that answers the OpenAI API there, serving the model under that
name. The agent may change the flags or replace the command entirely.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from servegym.engines.base import Engine, ModelRef
from servegym.engines.config import ServingConfig

_PORT_SENTINEL = 1  # an impossible listening port, replaced by "$PORT"
_MODEL_SENTINEL = "@@MODEL_PATH@@"
_NAME_SENTINEL = "@@SERVED_MODEL_NAME@@"
_HOST_SENTINEL = "@@HOST@@"
_VARIABLES = {
    _MODEL_SENTINEL: '"$MODEL_PATH"',
    _NAME_SENTINEL: '"$SERVED_MODEL_NAME"',
    _HOST_SENTINEL: '"$HOST"',
    str(_PORT_SENTINEL): '"$PORT"',
}


def launcher_script(engine: Engine, config: ServingConfig, *, note: str = "") -> str:
    """``config`` on ``engine`` as a ``start_server.sh`` (the engine's table checks it)."""
    model = ModelRef(path=_MODEL_SENTINEL, served_name=_NAME_SENTINEL)
    spec = engine.launch_spec(config, model, _PORT_SENTINEL, host_addr=_HOST_SENTINEL)
    program = Path(spec.argv[0]).name  # on PATH inside the sandbox
    words = [program, *spec.argv[1:]]
    rendered: list[str] = []
    after_port_flag = False
    for w in words:
        if w in _VARIABLES and (w != str(_PORT_SENTINEL) or after_port_flag):
            rendered.append(_VARIABLES[w])
        else:
            rendered.append(shlex.quote(w))
        after_port_flag = w == "--port"
    lines = [
        "#!/usr/bin/env bash",
        "# Starts the server the harness benchmarks and scores. The harness sets PORT, HOST,",
        "# MODEL_PATH and SERVED_MODEL_NAME; the server must answer the OpenAI API on",
        "# HOST:PORT and serve the model under SERVED_MODEL_NAME.",
    ]
    if note:
        lines += [f"# {line}" for line in note.splitlines()]
    lines.append("set -euo pipefail")
    for key in spec.env_unset:
        lines.append(f"unset {key}")
    # (the compile caches are the harness's folders, which a sandbox cannot see: a workspace
    # gets its own from its environment, Engine.workspace_env)
    harness_caches = engine.compile_cache_env()
    for key, value in sorted(spec.env.items()):
        if key in harness_caches and value == harness_caches[key]:
            continue
        lines.append(f"export {key}={shlex.quote(value)}")
    # one flag per line: easy to read, easy to edit
    parts: list[str] = []
    for w in rendered:
        if w.startswith("--") or not parts:
            parts.append(w)
        else:
            parts[-1] += f" {w}"
    lines.append("exec " + " \\\n  ".join(parts))
    return "\n".join(lines) + "\n"


class LauncherSubmission(BaseModel):
    """A real-track submission: a snapshot of the agent's workspace, started by its
    ``start_server.sh`` in a fresh sandbox (the files alone, nothing else of the run)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="the snapshot folder (the trial's `submission/`)")
    script: str = "start_server.sh"
    files: int
    bytes: int
    digest: str = Field(description="SHA-256 over every file's path and bytes")

    def record(self) -> dict[str, Any]:
        """What results show of it (where a config shows its knobs)."""
        return {"launcher": self.script, "files": self.files, "digest": self.digest[:16]}


class ExternalServer(BaseModel):
    """A submission that is already running (``servegym score --base-url``): the harness
    measures it as it measures a server it started, but did not start it and cannot stop
    it or see its process."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="http://HOST:PORT of an OpenAI-compatible server")

    def record(self) -> dict[str, Any]:
        return {"external": self.base_url}
