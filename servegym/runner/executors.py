"""Where a sweep's trials run: ``local`` (worker processes on this machine) or ``ray`` (Ray
tasks on an existing cluster, or a local one). A new executor is one class plus one
:func:`register_executor` call (or a ``servegym.executors`` entry point, or
``--executor package.module:Class``).

Both keep the tracks' resources apart. A sim trial needs one CPU. A cpu-track trial holds
the machine's one ``cpu_track`` slot (its servers would otherwise share the CPU with another
trial's and measure each other); a gpu-track trial holds one GPU (``CUDA_VISIBLE_DEVICES``
names it locally; Ray's ``num_gpus=1`` does the same on a cluster). Server ports are free
ports taken per server, so trials never share one.

Every trial runs :func:`run_one` in a worker process: an ordinary
:func:`~servegym.runner.trial.run_trial`, which skips a finished trial and restarts a
partial one. A worker's failure (anything raised) becomes a ``failed`` outcome with its
message; the sweep goes on. Local workers die with the driver (``PR_SET_PDEATHSIG``), so a
killed sweep leaves no trial running behind it.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from servegym.errors import UserError
from servegym.registry import Registry
from servegym.runner.sweep import SweepConfig, TrialSpec
from servegym.tasks.spec import TRACK_TRAITS

CPU_TRACK_RESOURCE = "cpu_track"


class TrialOutcome(BaseModel):
    """What the driver learns of one trial."""

    task: str
    agent: str
    seed: int
    track: str
    outcome: str = "failed"
    score: float | None = None
    leaderboard_score: float | None = None
    skipped: bool = False
    error: str | None = None
    wall_s: float = 0.0

    @property
    def failed(self) -> bool:
        return self.outcome in ("failed", "harness_error")


def run_one(
    spec: dict[str, Any],
    out: str,
    agent_options: dict[str, Any],
    tasks_root: str | None,
    gpu: int | None = None,
) -> dict[str, Any]:
    """Run one trial in this (worker) process; never raises."""
    from servegym.runner.trial import run_trial

    t0 = time.perf_counter()
    base = {k: spec[k] for k in ("task", "agent", "seed", "track")}
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    try:
        result = run_trial(
            spec["task"],
            spec["agent"],
            int(spec["seed"]),
            Path(out),
            tasks_root=Path(tasks_root) if tasks_root else None,
            agent_options=agent_options or None,
            in_sweep=True,
        )
    except UserError as e:
        return {**base, "outcome": "failed", "error": e.message}
    except Exception as e:  # the worker's own failure: reported, the sweep goes on
        return {**base, "outcome": "failed", "error": f"{type(e).__name__}: {e}"}
    return {
        **base,
        "outcome": result.outcome,
        "score": result.score,
        "leaderboard_score": result.leaderboard_score,
        "skipped": result.skipped,
        "error": result.error,
        "wall_s": time.perf_counter() - t0,
    }


class SweepEvents(Protocol):
    def started(self, spec: TrialSpec) -> None: ...

    def finished(self, spec: TrialSpec, outcome: TrialOutcome) -> None: ...


class Executor(Protocol):
    name: str

    def run(
        self, specs: Sequence[TrialSpec], out: Path, config: SweepConfig, events: SweepEvents
    ) -> list[TrialOutcome]: ...


def _is_executor_class(obj: object) -> bool:
    return isinstance(obj, type) and callable(getattr(obj, "run", None))


EXECUTORS: Registry[Callable[..., Executor]] = Registry(
    "executor",
    group="servegym.executors",
    builtins={"local": __name__, "ray": __name__},
    flag="--executor",
    accepts=_is_executor_class,
    kind_label="an executor class",
)
"""Every executor by name: the two below, ``servegym.executors`` entry points, and
``package.module:Class`` specs (see :mod:`servegym.registry`)."""


def register_executor(name: str) -> Callable[[Callable[..., Executor]], Callable[..., Executor]]:
    """Class decorator: make an executor usable as ``--executor name``."""
    return EXECUTORS.register(name)


def make_executor(name: str, **settings: Any) -> Executor:
    """The executor ``name`` with ``settings``; a one-line error naming the known ones."""
    return EXECUTORS.get(name)(**settings)


def _outcome(data: dict[str, Any]) -> TrialOutcome:
    return TrialOutcome.model_validate(data)


# --- local ----------------------------------------------------------------------------------


def _die_with_driver(driver: int) -> None:
    """Worker initializer: SIGKILL this worker when the driver dies, however it dies. The
    death signal is set only once the spawned worker runs this, so a driver killed during a
    worker's start-up is caught by the parent check after it (else the worker would live on,
    holding the driver's output pipes)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != driver:  # the driver died before the death signal was set
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver handles Ctrl-C


@register_executor("local")
class LocalExecutor:
    """Worker processes on this machine, at most ``max_concurrent`` trials at a time, one
    cpu-track trial at a time and one gpu-track trial per GPU."""

    name = "local"

    def __init__(
        self,
        max_concurrent: int | None = None,
        gpus: int | None = None,
        worker: Callable[..., dict[str, Any]] = run_one,
    ) -> None:
        """``worker`` (a module-level function, with :func:`run_one`'s arguments) runs one
        trial; tests pass a stand-in."""
        self.worker = worker
        self.max_concurrent = max(1, max_concurrent or os.cpu_count() or 1)
        if gpus is None:
            from servegym.engines.host import this_host

            gpus = this_host().gpus
        self.gpus = gpus

    def run(
        self, specs: Sequence[TrialSpec], out: Path, config: SweepConfig, events: SweepEvents
    ) -> list[TrialOutcome]:
        pending = list(specs)
        results: list[TrialOutcome] = []
        free_gpus = list(range(self.gpus))
        cpu_track_free = True
        running: dict[Future[dict[str, Any]], tuple[TrialSpec, int | None]] = {}
        context = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(
            self.max_concurrent,
            mp_context=context,
            initializer=_die_with_driver,
            initargs=(os.getpid(),),
        )
        try:
            while pending or running:
                i = 0
                while i < len(pending) and len(running) < self.max_concurrent:
                    spec = pending[i]
                    gpu: int | None = None
                    holds = TRACK_TRAITS[spec.track].occupies
                    if holds == "host_cpus":
                        if not cpu_track_free:
                            i += 1
                            continue
                        cpu_track_free = False
                    elif holds == "one_gpu":
                        if not free_gpus:
                            if self.gpus == 0:  # no GPU here: the trial refuses in one line
                                gpu = None
                            else:
                                i += 1
                                continue
                        else:
                            gpu = free_gpus.pop(0)
                    pending.pop(i)
                    events.started(spec)
                    future = pool.submit(
                        self.worker,
                        spec.model_dump(),
                        str(out),
                        config.agent_options,
                        config.tasks_root,
                        gpu,
                    )
                    running[future] = (spec, gpu)
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    spec, gpu = running.pop(future)
                    if TRACK_TRAITS[spec.track].occupies == "host_cpus":
                        cpu_track_free = True
                    if gpu is not None:
                        free_gpus.append(gpu)
                    try:
                        outcome = _outcome(future.result())
                    except Exception as e:  # the worker process itself died
                        outcome = TrialOutcome(
                            **spec.model_dump(), outcome="failed", error=f"worker died: {e}"
                        )
                    results.append(outcome)
                    events.finished(spec, outcome)
        except BaseException:
            # Ctrl-C or SIGTERM: stop now; a trial cut short is partial and reruns on resume
            _kill_workers(pool)
            raise
        pool.shutdown(wait=True)
        return results


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    processes = list(getattr(pool, "_processes", {}).values())  # no public handle on them
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        with contextlib.suppress(Exception):
            proc.kill()


# --- ray ------------------------------------------------------------------------------------


@register_executor("ray")
class RayExecutor:
    """Each trial a Ray task with its track's resources, on the cluster at ``address`` or a
    local one started for the sweep (with ``max_concurrent`` CPUs and one ``cpu_track``
    slot). The trial's worker writes into ``RUN_DIR`` itself, so the folder must be shared
    by the cluster's nodes (a local cluster shares this machine's)."""

    name = "ray"

    def __init__(self, max_concurrent: int | None = None, address: str | None = None) -> None:
        self.max_concurrent = max(1, max_concurrent or os.cpu_count() or 1)
        self.address = address

    def _init(self) -> Any:
        try:
            import ray
        except ImportError:
            raise UserError(
                "--executor ray: Ray is not installed (pip install 'servegym[ray]')"
            ) from None
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "configure_logging": False,
            }
            if self.address:
                kwargs["address"] = self.address
            else:
                kwargs["num_cpus"] = self.max_concurrent
                kwargs["resources"] = {CPU_TRACK_RESOURCE: 1}
            kwargs["runtime_env"] = {"env_vars": _forwarded_env()}
            try:
                ray.init(**kwargs)
            except (ConnectionError, RuntimeError, ValueError) as e:
                where = self.address or "a local Ray instance"
                raise UserError(f"--executor ray: cannot start or reach {where}: {e}") from None
        return ray

    def run(
        self, specs: Sequence[TrialSpec], out: Path, config: SweepConfig, events: SweepEvents
    ) -> list[TrialOutcome]:
        ray = self._init()
        remote = ray.remote(max_retries=0)(run_one)
        refs: dict[Any, TrialSpec] = {}
        for spec in specs:
            options: dict[str, Any] = {"num_cpus": 1}
            holds = TRACK_TRAITS[spec.track].occupies
            if holds == "host_cpus":
                options["resources"] = {CPU_TRACK_RESOURCE: 1}
            elif holds == "one_gpu":
                options["num_gpus"] = 1
            ref = remote.options(**options).remote(
                spec.model_dump(), str(out.resolve()), config.agent_options, config.tasks_root
            )
            refs[ref] = spec
            events.started(spec)
        results: list[TrialOutcome] = []
        try:
            while refs:
                done, _ = ray.wait(list(refs), num_returns=1)
                for ref in done:
                    spec = refs.pop(ref)
                    try:
                        outcome = _outcome(ray.get(ref))
                    except Exception as e:  # a worker killed under its task
                        outcome = TrialOutcome(
                            **spec.model_dump(), outcome="failed", error=f"ray task failed: {e}"
                        )
                    results.append(outcome)
                    events.finished(spec, outcome)
        finally:
            if not self.address:
                ray.shutdown()
        return results


_FORWARDED = ("SERVEGYM_SECRET", "SERVEGYM_HOME", "SERVEGYM_DATA_DIR", "XDG_CACHE_HOME")


def _forwarded_env() -> dict[str, str]:
    """What a Ray worker must share with the driver to run the same trial (the harness
    secret decides the scoring seeds; the data and cache folders where tasks and the CPU
    track live). Model API keys are forwarded too: a model agent's loop runs in the worker."""
    names = list(_FORWARDED) + [k for k in os.environ if k.endswith("_API_KEY")]
    return {k: os.environ[k] for k in names if k in os.environ}
