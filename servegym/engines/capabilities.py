"""Capability tables: what an engine on a platform is known to refuse or crash on.

Each engine checks a :class:`~servegym.engines.config.ServingConfig` against its table
before it launches anything, so a config that cannot work fails in a second with one line
that names the knob, instead of after a minute of start-up with a traceback in a log. A
rule holds a fact that was measured or documented, never a guess; a config the table lets
through can still fail at launch, and that is reported as a launch failure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servegym.engines.config import ServingConfig
from servegym.engines.host import HostInfo
from servegym.errors import UserError

Violation = Callable[[ServingConfig, HostInfo], str | None]
"""A rule: the reason ``config`` cannot run on ``host``, or ``None`` when it can."""


@dataclass(frozen=True)
class Rule:
    """One fact about an engine: the knob it concerns and how to tell a config breaks it."""

    knob: str
    violation: Violation


class ConfigRejected(UserError):
    """A config an engine's capability table refuses, before any launch."""

    def __init__(self, engine: str, reasons: Sequence[str]) -> None:
        self.engine = engine
        self.reasons = list(reasons)
        super().__init__(f"{engine} cannot run this config: {'; '.join(self.reasons)}")


@dataclass(frozen=True)
class CapabilityTable:
    """An engine's rules on one platform (``gpu`` or ``cpu``)."""

    engine: str
    platform: str
    rules: tuple[Rule, ...]

    def violations(self, config: ServingConfig, host: HostInfo) -> list[str]:
        """Every reason ``config`` cannot run, each starting with the knob's name."""
        out: list[str] = []
        for rule in self.rules:
            why = rule.violation(config, host)
            if why is not None:
                out.append(f"{rule.knob}: {why}")
        return out

    def check(self, config: ServingConfig, host: HostInfo) -> None:
        """Raise :class:`ConfigRejected` when any rule is broken."""
        reasons = self.violations(config, host)
        if reasons:
            raise ConfigRejected(self.engine, reasons)


def allowed_values(knob: str, allowed: Sequence[object], why: str = "") -> Rule:
    """A rule: ``knob``, when set, is one of ``allowed``."""

    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        value = getattr(config, knob)
        if value is None or value in allowed:
            return None
        listed = ", ".join(str(a) for a in allowed)
        return f"{value} is not supported (supported: {listed}){why}"

    return Rule(knob, violation)


def tensor_parallel_fits_gpus() -> Rule:
    """A rule: tensor parallelism needs as many GPUs as it names, where the count is known."""

    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        tp = config.tensor_parallel_size
        if tp is None or tp <= 1 or host.gpus == 0 or tp <= host.gpus:
            return None
        return f"{tp} needs {tp} GPUs; this host has {host.gpus}"

    return Rule("tensor_parallel_size", violation)


def one_kv_cache_size() -> Rule:
    """A rule: the KV cache is sized by a memory fraction or by bytes, not both."""

    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        if config.gpu_memory_utilization is not None and config.kv_cache_memory_bytes:
            return "set either gpu_memory_utilization or kv_cache_memory_bytes, not both"
        return None

    return Rule("kv_cache_memory_bytes", violation)


def no_pipeline_table() -> Rule:
    """A rule: a ``[pipeline]`` table configures a retrieval pipeline, not a server (a
    pipeline harness takes it off before starting the server)."""

    def violation(config: ServingConfig, host: HostInfo) -> str | None:
        if config.pipeline is None:
            return None
        return "the [pipeline] table is for pipeline tasks, not a server's command line"

    return Rule("pipeline", violation)
