"""Real serving engines: the interface every launcher implements, and their registry.

An engine turns a :class:`~servegym.engines.config.ServingConfig` into the command line and
environment of one server process (:class:`LaunchSpec`), after checking the config against
its :class:`~servegym.engines.capabilities.CapabilityTable`. Starting, watching and stopping
that process is :mod:`servegym.engines.process`'s job; running it in a container is the
sandbox's. A new engine is one :class:`Engine` subclass plus one :func:`register_engine`.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from servegym.engines.capabilities import CapabilityTable
from servegym.engines.config import ServingConfig
from servegym.engines.host import HostInfo, this_host
from servegym.errors import UserError


class ModelRef(BaseModel):
    """The model a server loads: a local folder (or hub id) and the name it answers to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="local model folder, or a hub id where the host has it")
    served_name: str = Field(description="the name requests use (the `model` field)")


class LaunchSpec(BaseModel):
    """Everything needed to start one server: argv, environment and where it listens."""

    model_config = ConfigDict(extra="forbid")

    engine: str
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    env_unset: list[str] = Field(
        default_factory=list, description="variables removed from the inherited environment"
    )
    host: str = "127.0.0.1"
    port: int
    model: ModelRef
    needs_gpu: bool = False
    cwd: str | None = Field(default=None, description="the working folder (None: the harness's)")
    inherit_env: bool = Field(
        default=True,
        description="start from the harness's environment (False: from ``env`` alone, as a "
        "sandbox does, so no key or harness path leaks in)",
    )
    rlimits: dict[str, int] = Field(
        default_factory=dict,
        description="resource limits set in the child, by name (RLIMIT_FSIZE: bytes ...)",
    )

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def shell_line(self) -> str:
        """The command as one shell line (environment first), for logs and ``serve``."""
        import shlex

        unset = [f"-u {shlex.quote(k)}" for k in self.env_unset]
        prefix = ["env", *unset] if unset else []
        env = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join([*prefix, *env, *(shlex.quote(a) for a in self.argv)])


class Engine(ABC):
    """A serving engine on one platform."""

    name: str
    platform: str
    """``gpu`` or ``cpu``: where the engine runs."""
    table: CapabilityTable

    def check(self, config: ServingConfig, host: HostInfo | None = None) -> None:
        """Raise :class:`~servegym.engines.capabilities.ConfigRejected` for a config this
        engine is known not to run on ``host`` (default: this machine)."""
        self.table.check(config, host or this_host())

    def launch_spec(
        self,
        config: ServingConfig,
        model: ModelRef,
        port: int,
        *,
        host_addr: str = "127.0.0.1",
        host: HostInfo | None = None,
    ) -> LaunchSpec:
        """Check ``config``, then render it: the one way to get a launchable command."""
        self.check(config, host)
        argv = [*self.command(), *self.render_args(config, model, host_addr, port)]
        env = {**self.default_env(), **self.config_env(config), **config.env}
        env.update(self.pinned_env())
        return LaunchSpec(
            engine=self.name,
            argv=argv,
            env=env,
            env_unset=[k for k in self.unset_env() if k not in env],
            host=host_addr,
            port=port,
            model=model,
            needs_gpu=self.platform == "gpu",
        )

    @abstractmethod
    def command(self) -> list[str]:
        """The program and its leading arguments (e.g. ``["vllm", "serve"]``)."""

    @abstractmethod
    def render_args(
        self, config: ServingConfig, model: ModelRef, host_addr: str, port: int
    ) -> list[str]:
        """The arguments after :meth:`command`: model, address, then the config's flags and
        its ``extra_args`` last (so an engine-native flag can override a rendered one)."""

    def runtime_dirs(self) -> list[Path]:
        """Folders a sandboxed launcher needs read-only to run this engine (a venv and the
        Python it was made from); none for an engine installed in the system."""
        return []

    def tool_dirs(self) -> list[Path]:
        """Folders put first on a sandboxed launcher's ``PATH`` (where ``vllm`` lives)."""
        return []

    def default_env(self) -> dict[str, str]:
        """Environment every launch of this engine gets (a config's ``env`` wins)."""
        return {"HF_HUB_OFFLINE": "1"}

    def pinned_env(self) -> dict[str, str]:
        """Environment the harness pins on every launch and every workspace command of this
        engine (the hardware class a task is measured on): no config can change it."""
        return {}

    def unset_env(self) -> list[str]:
        """Variables a launch must not inherit from the harness (unless the config sets
        them), e.g. a legacy setting that would override a rendered flag."""
        return []

    def config_env(self, config: ServingConfig) -> dict[str, str]:
        """Environment variables that knobs render to (most render to flags)."""
        return {}


def find_program(name: str, preferred: Path | None = None) -> str:
    """``preferred`` when it exists, else ``name`` from ``PATH``, else ``name`` as is (the
    launch then fails with the engine's own 'not found', reported as a launch failure)."""
    if preferred is not None and preferred.exists():
        return str(preferred)
    return shutil.which(name) or name


_ENGINES: dict[str, Callable[[], Engine]] = {}
_BUILTIN_MODULES = {
    "vllm": "servegym.engines.vllm",
    "vllm-cpu": "servegym.engines.vllm",
    "sglang": "servegym.engines.sglang",
}


def register_engine(name: str) -> Callable[[type[Engine]], type[Engine]]:
    """Class decorator: make an engine available by ``name``."""

    def deco(cls: type[Engine]) -> type[Engine]:
        cls.name = name
        _ENGINES[name] = cls
        return cls

    return deco


def engine_names() -> list[str]:
    import importlib

    for module in set(_BUILTIN_MODULES.values()):
        importlib.import_module(module)
    return sorted(_ENGINES)


def get_engine(name: str) -> Engine:
    """The engine called ``name``; a clear error naming the known ones otherwise."""
    if name not in _ENGINES and name in _BUILTIN_MODULES:
        import importlib

        importlib.import_module(_BUILTIN_MODULES[name])
    if name not in _ENGINES:
        raise UserError(f"unknown engine '{name}' (known: {', '.join(engine_names())})")
    return _ENGINES[name]()
