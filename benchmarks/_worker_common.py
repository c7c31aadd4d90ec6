"""The line protocol between ``loadgen_capacity.py`` and one tool's worker process.

A worker runs in the tool's own Python environment (vLLM's, guidellm's or ServeGym's), so it
imports nothing from ServeGym and needs only the standard library and its tool. It is
started as ``python _worker_<tool>.py CONFIG_JSON`` and speaks JSON lines:

- on its protocol channel (the original stdout), first ``{"ready": true, "version": ...}``
  (or ``{"ready": false, "error": ...}``), then one reply per job;
- on stdin, one job per line: ``{"rate": R, "num_requests": N, "seed": S}``; the worker
  runs its tool at constant rate ``R`` for ``N`` requests and replies with what the tool
  itself reported (``completed``, ``failed``, anything else it knows) or ``{"error": ...}``.

Everything the tool prints goes to stderr (fd 1 is pointed at fd 2), which the driver keeps
in a log file, so the protocol channel carries nothing but protocol. One process serves
every trial of a tool, so interpreter start-up and imports are paid once, not per trial.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

Job = dict[str, Any]
Reply = dict[str, Any]
Handler = Callable[[Job], Reply]
Setup = Callable[[dict[str, Any]], tuple[dict[str, Any], Handler]]


def serve(setup: Setup) -> None:
    """Run the protocol: ``setup(config)`` gives ``(ready info, job handler)``."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(2, 1)
    config: dict[str, Any] = json.loads(sys.argv[1])
    try:
        info, handle = setup(config)
    except BaseException as e:  # an import error is the usual reason: report, never hang
        traceback.print_exc()
        proto.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
        return
    proto.write(json.dumps({"ready": True, **info}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        job: Job = json.loads(line)
        try:
            reply = handle(job)
        except BaseException as e:  # SystemExit from a tool's argument parser included
            traceback.print_exc()
            reply = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.flush()
        sys.stderr.flush()
        proto.write(json.dumps(reply) + "\n")


def dist_version(*names: str) -> str:
    """The installed version of the first distribution of ``names`` that is installed."""
    from importlib.metadata import PackageNotFoundError, version

    for name in names:
        try:
            return f"{version(name)}" if name == names[0] else f"{version(name)} ({name})"
        except PackageNotFoundError:
            continue
    return "unknown"
