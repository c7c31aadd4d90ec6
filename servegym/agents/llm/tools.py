"""The tools an agent calls, as an LLM sees them, and how each call runs.

Tool names and arguments are fixed by the benchmark. Tasks tuned through configs (the sim
track; real-track pipeline tasks): ``describe_task``, ``run_experiment`` (``config``: knob ->
value, ``quick``: bool) and ``submit`` (``config``). Tasks tuned through a workspace (the
other real-track tasks): ``bash`` (``command``, ``timeout``), ``read_file``
(``path``), ``write_file`` (``path``, ``content``), ``run_benchmark`` (``quick``: starts
the workspace's ``start_server.sh``, runs the dev workload, returns metrics and the server
log's tail) and ``submit`` (no arguments: the workspace as it is now is the submission).
Every result is text (JSON where it is data) and ends with a line saying
what is left of the budget. A bad call (unknown tool, malformed arguments, an invalid
config) is answered with an error the model can read and correct, never raised.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from servegym.agents.base import (
    LAUNCHER,
    BudgetExhausted,
    BudgetState,
    ExperimentResult,
    TaskEnvironment,
    Tuning,
    WorkspaceEnvironment,
)
from servegym.engines.config import ServingConfig
from servegym.providers.types import ToolCall, ToolSpec
from servegym.sandbox.workspace import WorkspaceError

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "knob -> value (the ServingConfig knobs describe_task lists); knobs left "
    "out keep the baseline's value",
    "additionalProperties": True,
}

CONFIG_TOOLS = [
    ToolSpec(
        name="describe_task",
        description="The task: model, hardware, knobs and defaults, workload, objective, SLA, "
        "accuracy rule and budget.",
        parameters={"type": "object", "properties": {}},
    ),
    ToolSpec(
        name="run_experiment",
        description="Launch a serving config and measure the task's objective on the dev "
        "workload. Costs budget.",
        parameters={
            "type": "object",
            "properties": {
                "config": CONFIG_SCHEMA,
                "quick": {"type": "boolean", "description": "a shorter, cheaper run"},
            },
            "required": ["config"],
        },
    ),
    ToolSpec(
        name="submit",
        description="Declare a config your final answer (the last submission stands).",
        parameters={
            "type": "object",
            "properties": {"config": CONFIG_SCHEMA},
            "required": ["config"],
        },
    ),
]

MAX_LOG_TAIL_CHARS = 2000
MAX_RESULT_CHARS = 12_000
"""A tool result's body longer than this is cut (the budget line always follows)."""


class ToolOutcome:
    """A tool call's result text and whether it was an error."""

    def __init__(self, content: str, *, is_error: bool = False) -> None:
        self.content = content
        self.is_error = is_error


def budget_line(b: BudgetState) -> str:
    parts = [f"{b.experiments_run} experiments run"]
    if b.experiments_left is not None:
        parts.append(f"{b.experiments_left} experiments left")
    if b.sim_gpu_seconds_left is not None:
        parts.append(f"{b.sim_gpu_seconds_left:,.0f} simulated GPU-seconds left")
    if b.wall_seconds_left is not None:
        parts.append(f"{b.wall_seconds_left:,.0f} wall seconds left")
    return "budget: " + ", ".join(parts)


def _config(base: ServingConfig, raw: Any) -> ServingConfig:
    """The baseline with the call's knobs set (raises ValidationError or TypeError)."""
    if not isinstance(raw, dict):
        raise TypeError(f"config must be an object of knob -> value, got {type(raw).__name__}")
    data = base.model_dump(exclude_defaults=True)
    data.update(raw)
    return ServingConfig.model_validate(data)


def _validation_text(e: ValidationError) -> str:
    first = e.errors()[0]
    loc = ".".join(str(x) for x in first["loc"]) or "config"
    return f"invalid config: {loc}: {first['msg']}"


def _experiment_text(env: TaskEnvironment, config: ServingConfig, quick: bool) -> str:
    return experiment_text(env.run_experiment(config, quick=quick))


def experiment_summary(
    r: ExperimentResult, log_tail_chars: int = MAX_LOG_TAIL_CHARS
) -> dict[str, Any]:
    """What an agent is told of one experiment (the tools' and the CLI agents' alike)."""
    out: dict[str, Any] = {"experiment": r.index, "config": r.config, "quick": r.quick, "ok": r.ok}
    if r.ok:
        out["objective_value"] = r.objective_value
        out["improvement"] = r.improvement
        out["accuracy_ratio"] = r.accuracy_ratio
        if r.metrics is not None:
            m = r.metrics
            out["metrics"] = {
                "ttft_ms_p50": m.ttft_ms.p50,
                "ttft_ms_p99": m.ttft_ms.p99,
                "tpot_ms_p50": m.tpot_ms.p50,
                "tpot_ms_p99": m.tpot_ms.p99,
                "e2e_ms_p50": m.e2e_ms.p50,
                "e2e_ms_p99": m.e2e_ms.p99,
                "output_throughput": m.output_throughput,
                "request_throughput": m.request_throughput,
                "completed": m.completed,
                "failed": m.failed,
            }
        if r.pipeline is not None:
            out["pipeline"] = r.pipeline
    else:
        out["launch_error"] = r.launch_error
    if r.log_tail:
        out["log_tail"] = r.log_tail[-log_tail_chars:]
    return out


def experiment_text(r: ExperimentResult) -> str:
    """An experiment's result as the agent reads it (JSON)."""
    out = experiment_summary(r)
    return json.dumps(out, indent=1, default=str)


def run_tool(env: TaskEnvironment, baseline: ServingConfig, call: ToolCall) -> ToolOutcome:
    """Run one tool call against ``env``; see the module docstring."""
    if call.arguments_error is not None:
        return _with_budget(env, ToolOutcome(f"error: {call.arguments_error}", is_error=True))
    args = call.arguments
    try:
        if call.name == "describe_task":
            desc = env.describe()
            outcome = ToolOutcome(desc.model_dump_json(indent=1, exclude={"budget"}))
        elif call.name == "run_experiment":
            config = _config(baseline, args.get("config"))
            outcome = ToolOutcome(_experiment_text(env, config, bool(args.get("quick", False))))
        elif call.name == "submit":
            config = _config(baseline, args.get("config"))
            env.submit(config)
            outcome = ToolOutcome(f"submitted: {json.dumps(config.changed(), default=str)}")
        else:
            names = ", ".join(t.name for t in CONFIG_TOOLS)
            outcome = ToolOutcome(
                f"error: unknown tool '{call.name}' (tools: {names})", is_error=True
            )
    except ValidationError as e:
        outcome = ToolOutcome(f"error: {_validation_text(e)}", is_error=True)
    except TypeError as e:
        outcome = ToolOutcome(f"error: {e}", is_error=True)
    except BudgetExhausted as e:
        outcome = ToolOutcome(f"error: the budget is spent ({e}); submit now", is_error=True)
    return _with_budget(env, outcome)


def _with_budget(env: TaskEnvironment, outcome: ToolOutcome) -> ToolOutcome:
    state = env.budget_left()
    note = " (spent: submit your best config)" if state.exhausted else ""
    body = outcome.content
    if len(body) > MAX_RESULT_CHARS:
        body = body[:MAX_RESULT_CHARS] + "\n[... result cut ...]"
    outcome.content = f"{body}\n\n{budget_line(state)}{note}"
    return outcome


WORKSPACE_TOOLS = [
    ToolSpec(
        name="bash",
        description="Run a bash command in your workspace (the current folder; the model is "
        "at $MODEL_PATH, read-only). Output is cut to 30,000 characters. Its seconds count "
        "against the wall-clock budget.",
        parameters={
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout": {"type": "number", "description": "seconds (default 120)"},
            },
            "required": ["command"],
        },
    ),
    ToolSpec(
        name="read_file",
        description="Read a text file in the workspace.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string", "description": "relative to the workspace"}},
            "required": ["path"],
        },
    ),
    ToolSpec(
        name="write_file",
        description="Write a text file in the workspace (created or replaced; .sh files are "
        "made executable).",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    ),
    ToolSpec(
        name="run_benchmark",
        description=f"Start the workspace's {LAUNCHER}, run the dev workload against it, stop "
        "it; returns the objective, its improvement over the baseline, accuracy, metrics and "
        "the server log's tail. Costs budget.",
        parameters={
            "type": "object",
            "properties": {"quick": {"type": "boolean", "description": "a shorter, cheaper run"}},
        },
    ),
    ToolSpec(
        name="submit",
        description=f"Declare the workspace as it is now your final answer: the final "
        f"evaluation starts its {LAUNCHER} in a fresh sandbox from these files alone (the "
        "last submission stands).",
        parameters={"type": "object", "properties": {}},
    ),
]


def tools_for(tuning: Tuning) -> list[ToolSpec]:
    """The tools of a task tuned through configs or through a workspace (see
    :data:`~servegym.agents.base.Tuning`)."""
    return CONFIG_TOOLS if tuning == "config" else WORKSPACE_TOOLS


def _text_arg(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise TypeError(f"argument '{name}' must be a string")
    return value


def run_real_tool(env: WorkspaceEnvironment, call: ToolCall) -> ToolOutcome:
    """Run one real-track tool call; errors go back to the model as text."""
    if call.arguments_error is not None:
        return _with_budget(env, ToolOutcome(f"error: {call.arguments_error}", is_error=True))
    args = call.arguments
    ws = env.workspace
    try:
        if call.name == "bash":
            timeout = args.get("timeout", 120)
            if not isinstance(timeout, int | float) or isinstance(timeout, bool):
                raise TypeError("argument 'timeout' must be a number of seconds")
            r = ws.run(_text_arg(args, "command"), float(timeout))
            status = "timed out" if r.timed_out else f"exit code {r.exit_code}"
            outcome = ToolOutcome(f"{r.output}\n[{status}, {r.seconds:.1f} s]")
        elif call.name == "read_file":
            outcome = ToolOutcome(ws.read_file(_text_arg(args, "path")))
        elif call.name == "write_file":
            n = ws.write_file(_text_arg(args, "path"), _text_arg(args, "content"))
            outcome = ToolOutcome(f"wrote {n} bytes to {args['path']}")
        elif call.name == "run_benchmark":
            outcome = ToolOutcome(experiment_text(env.run_benchmark(bool(args.get("quick")))))
        elif call.name == "submit":
            outcome = ToolOutcome(env.submit_workspace())
        elif call.name == "describe_task":
            outcome = ToolOutcome(env.describe().model_dump_json(indent=1, exclude={"budget"}))
        else:
            names = ", ".join(t.name for t in WORKSPACE_TOOLS)
            outcome = ToolOutcome(
                f"error: unknown tool '{call.name}' (tools: {names})", is_error=True
            )
    except (TypeError, WorkspaceError) as e:
        outcome = ToolOutcome(f"error: {e}", is_error=True)
    except BudgetExhausted as e:
        outcome = ToolOutcome(f"error: the budget is spent ({e}); submit now", is_error=True)
    return _with_budget(env, outcome)


def call_tool(
    env: TaskEnvironment, tuning: Tuning, baseline: ServingConfig, call: ToolCall
) -> ToolOutcome:
    """A call to the tools of a task tuned as ``tuning`` (see :func:`tools_for`)."""
    if tuning == "config":
        return run_tool(env, baseline, call)
    workspace = env.workspace_environment()
    if workspace is None:
        return ToolOutcome("error: this task has no workspace", is_error=True)
    return run_real_tool(workspace, call)
