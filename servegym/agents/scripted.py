"""``--agent scripted --script FILE``: replay a file of tool calls through the task's tools.

The file is JSON Lines, one tool call per line: ``{"tool": "run_experiment", "arguments":
{"config": {"max_num_seqs": 64}}}`` (``name`` works for ``tool``). A trial's own
``trajectory.jsonl`` is accepted as it is: its ``tool`` records are replayed in order and
everything else is skipped, so a researcher can re-run what a model did, on another seed or
after a harness change. Calls run through exactly the tools a model agent has (those of a
task tuned through configs, or through a workspace), and each call and its result is written
to the trial's trajectory. A call answered with an error does not stop the replay.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any

from servegym.agents.base import AgentBase, TaskEnvironment, register_agent
from servegym.agents.llm.tools import ToolOutcome, call_tool
from servegym.engines.config import ServingConfig
from servegym.errors import UserError
from servegym.providers.types import ToolCall


def load_script(path: Path) -> list[ToolCall]:
    """The tool calls in ``path``; a bad line is one error naming the file and line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise UserError(f"--script {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"--script {path}: not UTF-8 text (byte {e.start})") from None
    calls: list[ToolCall] = []
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"--script {path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise UserError(f"--script {path}:{n}: a line must be a JSON object")
        if "kind" in record and record.get("kind") != "tool":
            continue  # a trajectory's model calls and notes
        name = record.get("tool", record.get("name"))
        args = record.get("arguments", {})
        if not isinstance(name, str) or not isinstance(args, dict):
            raise UserError(
                f'--script {path}:{n}: needs "tool" (a name) and "arguments" (an object)'
            )
        calls.append(ToolCall(id=f"call-{len(calls)}", name=name, arguments=args))
    if not calls:
        raise UserError(f"--script {path}: no tool calls in it")
    return calls


class TrajectoryWriter:
    """Appends each tool call with its result to a trial's ``trajectory.jsonl``, one JSON
    line each, in the form ``--agent scripted`` replays (``path`` None: writes nothing)."""

    def __init__(self, path: Path | None) -> None:
        self._out: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._out = path.open("a", encoding="utf-8")
        self._t0 = time.monotonic()

    def tool(self, call: ToolCall, result: ToolOutcome) -> None:
        if self._out is None:
            return
        record: dict[str, Any] = {
            "t": round(time.monotonic() - self._t0, 3),
            "kind": "tool",
            "name": call.name,
            "arguments": call.arguments,
            "result": result.content,
            "is_error": result.is_error,
        }
        self._out.write(json.dumps(record, default=str) + "\n")
        self._out.flush()

    def close(self) -> None:
        if self._out is not None:
            self._out.close()


@register_agent("scripted")
class ScriptedAgent(AgentBase):
    """Replays a script of tool calls; see the module docstring."""

    def __init__(self, script: str | Path | None = None) -> None:
        if script is None:
            raise UserError("--agent scripted: needs --script FILE (JSON Lines of tool calls)")
        self.script = Path(script)
        self.calls = load_script(self.script)
        self.name = "scripted"
        self.trajectory_path: Path | None = None
        self.outcome = "not_started"

    def keep_trajectory(self, path: Path) -> bool:
        self.trajectory_path = path
        return True

    def trial_outcome(self) -> str | None:
        return self.outcome

    def run(self, env: TaskEnvironment, seed: int) -> None:
        desc = env.describe()
        baseline = ServingConfig.model_validate(desc.baseline)
        trajectory = TrajectoryWriter(self.trajectory_path)
        try:
            for call in self.calls:
                trajectory.tool(call, call_tool(env, desc.tuning, baseline, call))
            self.outcome = "finished"
        finally:
            trajectory.close()
