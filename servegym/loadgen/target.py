"""Targets: where a workload's requests go.

A target turns a :class:`~servegym.workloads.model.Workload` into a
:class:`~servegym.loadgen.records.RunResult`. ``HttpTarget`` drives any OpenAI-compatible
streaming server; the simulator plugs in as another target. Metrics and scoring never know
which one ran. A new target is one class plus one :func:`register_target` call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from servegym.loadgen.records import RunResult
from servegym.workloads.model import Workload

ProgressFn = Callable[[int, int], None]
"""Called with (requests finished, requests in the workload) as a run goes."""


class RunOptions(BaseModel):
    """How to drive a workload (everything but the workload itself)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="model name sent in every request")
    request_timeout_s: float = Field(default=600.0, gt=0)
    ignore_eos: bool = Field(default=True, description="send ignore_eos (vLLM, SGLang)")
    send_min_tokens: bool = Field(default=True, description="send min_tokens = max_tokens")
    return_token_ids: bool = Field(
        default=True, description="ask the server for output token ids (vLLM's return_token_ids)"
    )
    keep_outputs: bool = Field(default=False, description="store output text and ids")
    max_send_lag_ms: float = Field(default=5.0, gt=0)
    scrape_metrics: bool = True
    tokenizer: str | None = Field(
        default=None, description="tokenizer.json (or a folder holding one) for recounts"
    )


class Target(Protocol):
    """Anything that can run a workload and record every request."""

    name: str

    async def run(
        self, workload: Workload, options: RunOptions, progress: ProgressFn | None = None
    ) -> RunResult: ...


_TARGETS: dict[str, Callable[..., Target]] = {}

_BUILTIN_MODULES = {
    "http": "servegym.loadgen.http_target",
    "sim": "servegym.engines.sim.target",
}
"""Modules that register a built-in target, imported on first use (keeps imports light)."""


def register_target(kind: str) -> Callable[[Callable[..., Target]], Callable[..., Target]]:
    """Class decorator: make a target constructible by ``kind``."""

    def deco(cls: Callable[..., Target]) -> Callable[..., Target]:
        _TARGETS[kind] = cls
        return cls

    return deco


def make_target(kind: str, **kwargs: object) -> Target:
    from servegym.errors import UserError

    if kind not in _TARGETS and kind in _BUILTIN_MODULES:
        import importlib

        importlib.import_module(_BUILTIN_MODULES[kind])
    if kind not in _TARGETS:
        raise UserError(f"unknown target '{kind}' (known: {', '.join(sorted(_TARGETS))})")
    return _TARGETS[kind](**kwargs)
