"""LLM agents: a model calls the task's tools in a loop (sim and real tracks).

``--agent anthropic:MODEL``, ``--agent openai:MODEL`` and ``--agent openai-compatible:MODEL``
(with ``--base-url``). The loop runs in the harness process: the model sees the system
prompt and the task's instruction, and every tool call it makes runs against the
:class:`~servegym.agents.base.TaskEnvironment` (no key ever reaches it). On a task tuned
through configs (the sim track, real-track pipeline tasks) the tools are ``describe_task``,
``run_experiment`` and ``submit`` (``prompts/system_config.md``); on one tuned through a
workspace they are ``bash``, ``read_file``, ``write_file``, ``run_benchmark`` and ``submit``
in the task's workspace sandbox (``prompts/system_workspace.md``).
Near the model's context limit, older tool results are shortened
(:mod:`servegym.agents.llm.context`); the task's and the settings' caps on tokens and dollars
end the loop once reached (the call that crosses a cap completes).
The loop ends when the model answers without a tool call, after ``max_turns`` model calls,
or when the provider stays down (the last submission stands and is scored as usual).

A model call waits at most ``provider_timeout_s`` a request (``--provider-timeout``, 120 s by
default) and sends at most ``provider_tries`` requests (``--provider-tries``, 3): a hung
provider, a 5xx or a garbage answer is retried, then the provider is unavailable and the
phase ends ``provider_unavailable``. The time spent waiting on the provider (answers,
timeouts and backoff alike) is charged to a wall-clock budget: on a real track through the
environment's ``charge_wall_seconds``; on the sim track a ``budget.wall_seconds`` counts wall
time anyway.

Every model call and tool call is appended to ``trajectory.jsonl`` as it happens (the trial
sets :attr:`LLMAgent.trajectory_path`); tokens and dollars are summed in
:attr:`LLMAgent.cost`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel

from servegym.agents.base import (
    LAUNCHER,
    AgentBase,
    TaskDescription,
    TaskEnvironment,
    register_agent,
)
from servegym.agents.llm.context import needs_trimming, shorten_old_results
from servegym.agents.llm.tools import call_tool, tools_for
from servegym.engines.config import ServingConfig
from servegym.errors import UserError
from servegym.providers.choose import choose_provider
from servegym.providers.clients import (
    DEFAULT_PROVIDER_TIMEOUT_S,
    DEFAULT_PROVIDER_TRIES,
    MAX_PROVIDER_TIMEOUT_S,
    Provider,
    ProviderError,
    ProviderUnavailable,
    RetryPolicy,
)
from servegym.providers.cost import cost_of
from servegym.providers.types import (
    Message,
    ToolResult,
    ToolResultsMessage,
    Usage,
    UserMessage,
)


def load_prompt(name: str) -> str:
    return resources.files("servegym.agents.llm").joinpath("prompts", name).read_text("utf-8")


def system_prompt(desc: TaskDescription) -> str:
    """The system prompt of a model working the task (its tools depend on the tuning)."""
    return load_prompt(f"system_{desc.tuning}.md")


def opening_message(desc: TaskDescription) -> str:
    """The first user message a model gets: the instruction, where to start, the objective.
    Every model agent starts from this text (ServeGym's own loop and the Inspect AI tasks)."""
    first = (
        "Start with describe_task."
        if desc.tuning == "config"
        else f"Start by reading {LAUNCHER} (describe_task gives the task's details)."
    )
    return (
        f"{desc.instruction}\n\n{first} The objective is {desc.objective} "
        f"({'higher' if desc.higher_is_better else 'lower'} is better)."
    )


@dataclass
class Settings:
    max_turns: int = 40
    max_tokens: int = 4096
    temperature: float | None = None
    reasoning_effort: str | None = None
    provider_timeout_s: float = DEFAULT_PROVIDER_TIMEOUT_S
    """Seconds one request to the provider may take before it is abandoned (and retried)."""
    provider_tries: int = DEFAULT_PROVIDER_TRIES
    """Requests sent for one model call at most (the first and its retries); then the
    provider is unavailable and the agent phase ends."""
    retry_base_delay_s: float = 1.0
    context_tokens: int = 128_000
    """The model's context window: older tool results are shortened near it."""
    max_agent_tokens: int | None = None
    """A cap on tokens (input + output, all calls); the task's own cap applies as well."""
    max_agent_dollars: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.provider_tries, int) and self.provider_tries >= 1):
            raise UserError(f"--provider-tries must be at least 1, got {self.provider_tries}")
        if not (0 < self.provider_timeout_s <= MAX_PROVIDER_TIMEOUT_S):
            raise UserError(
                f"--provider-timeout must be in (0, {MAX_PROVIDER_TIMEOUT_S:g}] seconds, "
                f"got {self.provider_timeout_s}"
            )

    def retry(self) -> RetryPolicy:
        return RetryPolicy(
            max_retries=self.provider_tries - 1, base_delay_s=self.retry_base_delay_s
        )


class AgentCost(BaseModel):
    """What the agent's model calls cost (``dollars``: ``None`` for a model with no price)."""

    model: str
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    dollars: float | None = 0.0


class LLMAgent(AgentBase):
    """The tool loop; ``make_provider`` builds the provider when the trial starts."""

    def __init__(
        self, name: str, model: str, make_provider: Callable[[], Provider], settings: Settings
    ) -> None:
        self.name = name
        self.model = model
        self.make_provider = make_provider
        self.settings = settings
        self.trajectory_path: Path | None = None
        self.cost = AgentCost(model=model)
        self.outcome = "not_started"
        """How the agent phase ended: ``finished`` (the model stopped calling tools),
        ``max_turns``, ``provider_unavailable`` (retries spent), ``provider_error`` (the
        provider refused the request: a bad key, a bad request), ``token_budget``,
        ``dollar_budget``, or ``crashed`` (the loop raised)."""
        self.error: str | None = None
        self._trajectory: IO[str] | None = None
        self._t0 = 0.0

    def keep_trajectory(self, path: Path) -> bool:
        self.trajectory_path = path
        return True

    def trial_outcome(self) -> str | None:
        return self.outcome

    def trial_cost(self) -> dict[str, Any] | None:
        data: dict[str, Any] = self.cost.model_dump()
        return data

    def run(self, env: TaskEnvironment, seed: int) -> None:
        if self.trajectory_path is not None:
            self.trajectory_path.parent.mkdir(parents=True, exist_ok=True)
            self._trajectory = self.trajectory_path.open("a", encoding="utf-8")
        try:
            asyncio.run(self._run(env))
        finally:
            if self._trajectory is not None:
                self._trajectory.close()
                self._trajectory = None

    def _log(self, kind: str, **data: Any) -> None:
        if self._trajectory is None:
            return
        record = {"t": round(time.monotonic() - self._t0, 3), "kind": kind, **data}
        self._trajectory.write(json.dumps(record, default=str) + "\n")
        self._trajectory.flush()

    def _count(self, usage: Usage) -> None:
        c = self.cost
        c.calls += 1
        c.input_tokens += usage.input_tokens
        c.output_tokens += usage.output_tokens
        dollars = cost_of(usage, self.model)
        c.dollars = None if dollars is None or c.dollars is None else c.dollars + dollars

    def _over_budget(self, desc: TaskDescription) -> str | None:
        """``token_budget`` or ``dollar_budget`` once a cap is reached, else None."""
        caps = [c for c in (self.settings.max_agent_tokens, desc.max_agent_tokens) if c]
        used = self.cost.input_tokens + self.cost.output_tokens
        if caps and used >= min(caps):
            return "token_budget"
        dollar_caps = [c for c in (self.settings.max_agent_dollars, desc.max_agent_dollars) if c]
        if dollar_caps and self.cost.dollars is not None and self.cost.dollars >= min(dollar_caps):
            return "dollar_budget"
        return None

    async def _run(self, env: TaskEnvironment) -> None:
        self._t0 = time.monotonic()
        desc = env.describe()
        system = system_prompt(desc)
        messages: list[Message] = [UserMessage(text=opening_message(desc))]
        self.outcome = "max_turns"
        provider = self.make_provider()
        try:
            await self._loop(env, provider, desc, system, messages)
        except ProviderError as e:  # refused for good (a bad key, a bad request)
            self.outcome, self.error = "provider_error", str(e)
            self._log("provider_error", error=str(e))
            raise
        except BaseException:
            self.outcome = "crashed"  # agent_outcome agrees with the trial's ``crashed``
            raise
        finally:
            await provider.aclose()

    def _charge_wait(self, env: TaskEnvironment, seconds: float) -> None:
        """Charge the time spent waiting on the provider to the task's wall-clock budget,
        where the environment keeps one apart from the clock (a real track's counts its
        experiments' seconds; the sim track's ``budget.wall_seconds`` is the clock's)."""
        charge = getattr(env, "charge_wall_seconds", None)
        if callable(charge):
            charge(seconds)

    async def _loop(
        self,
        env: TaskEnvironment,
        provider: Provider,
        desc: TaskDescription,
        system: str,
        messages: list[Message],
    ) -> None:
        s = self.settings
        tuning = desc.tuning
        tools = tools_for(tuning)
        baseline = ServingConfig.model_validate(desc.baseline)
        for _ in range(s.max_turns):
            if (spent := self._over_budget(desc)) is not None:
                self.outcome = spent
                self._log(spent, cost=self.cost.model_dump())
                return
            self._log("request", messages=len(messages))
            asked = time.monotonic()
            try:
                turn = await provider.complete(
                    system,
                    messages,
                    tools,
                    max_tokens=s.max_tokens,
                    temperature=s.temperature,
                    reasoning_effort=s.reasoning_effort,
                )
            except ProviderUnavailable as e:
                self.outcome, self.error = "provider_unavailable", str(e)
                self._log("provider_unavailable", error=str(e))
                return
            finally:
                self._charge_wait(env, time.monotonic() - asked)
            self._count(turn.usage)
            self._log(
                "model",
                text=turn.text,
                tool_calls=[c.model_dump() for c in turn.tool_calls],
                usage=turn.usage.model_dump(),
                latency_s=turn.latency_s,
                attempts=turn.attempts,
                stop_reason=turn.stop_reason,
            )
            messages.append(turn.to_message())
            if not turn.tool_calls:
                self.outcome = "finished"
                return
            results = []
            for call in turn.tool_calls:
                out = await asyncio.to_thread(call_tool, env, tuning, baseline, call)
                content = out.content
                self._log(
                    "tool", name=call.name, arguments=call.arguments, result=content,
                    is_error=out.is_error,
                )  # fmt: skip
                results.append(
                    ToolResult(tool_call_id=call.id, content=content, is_error=out.is_error)
                )
            messages.append(ToolResultsMessage(results=results))
            context = turn.usage.input_tokens + turn.usage.output_tokens
            if needs_trimming(context, s.context_tokens):
                messages[:], removed = shorten_old_results(messages)
                self._log("context_trimmed", context_tokens=context, chars_removed=removed)


# --- registration: "<provider>:<model>" ----------------------------------------------------


def _settings(options: dict[str, Any]) -> Settings:
    known = Settings.__dataclass_fields__
    unknown = [k for k in options if k not in known]
    if unknown:
        raise UserError(f"--agent: unknown setting '{unknown[0]}' (known: {', '.join(known)})")
    return Settings(**options)


@register_agent("anthropic")
def anthropic_agent(
    model: str | None = None,
    base_url: str | None = None,
    api_key_env: str | None = None,
    **options: Any,
) -> LLMAgent:
    return _model_agent("anthropic", model, base_url, api_key_env, options)


@register_agent("openai")
def openai_agent(
    model: str | None = None,
    base_url: str | None = None,
    api_key_env: str | None = None,
    **options: Any,
) -> LLMAgent:
    return _model_agent("openai", model, base_url, api_key_env, options)


@register_agent("openai-compatible")
def openai_compatible_agent(
    model: str | None = None,
    base_url: str | None = None,
    api_key_env: str | None = None,
    **options: Any,
) -> LLMAgent:
    return _model_agent("openai-compatible", model, base_url, api_key_env, options)


def _model_agent(
    kind: str,
    model: str | None,
    base_url: str | None,
    api_key_env: str | None,
    options: dict[str, Any],
) -> LLMAgent:
    """The agent of ``kind:model``: the spec and the key are checked now, the settings next,
    and the provider is made when the trial starts."""
    choice = choose_provider(kind, model, base_url, api_key_env)
    settings = _settings(options)
    return LLMAgent(
        f"{kind}:{choice.model}",
        choice.model,
        lambda: choice.make(settings.retry(), timeout_s=settings.provider_timeout_s),
        settings,
    )
