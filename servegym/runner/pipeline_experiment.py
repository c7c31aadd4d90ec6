"""The agent's experiments on a cpu-track pipeline task (the hook of
:class:`~servegym.runner.real_environment.RealTaskEnvironment`, in the runner beside it).

An experiment deploys the config's LLM server(s), starts a retrieval worker and builds its
index with the config's ``[pipeline]`` knobs, runs the dev questions (the task's dev seed;
``quick``: ``workload.quick_requests`` of them) through the pipeline, and stops everything.
It is charged its wall seconds, start-ups and index build included. It reports the
objective, the improvement over the baseline's run of the same questions (measured once, on
first need, not charged), the recall ratio to the baseline's as ``accuracy_ratio`` and the
run's summary (answering rate, latency percentiles, recall@k, stage shares) as ``pipeline``.
Agents that work through files reach it through the workspace's ``serving.toml``
(:mod:`servegym.runner.workspace_config`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from servegym.agents.base import ExperimentResult
from servegym.engines.base import Engine, ModelRef
from servegym.engines.config import ServingConfig
from servegym.engines.process import read_tail
from servegym.errors import HarnessError, UserError
from servegym.pipeline.cpu.deploy import (
    CpuPipelineTask,
    Deployment,
    IndexPool,
    deploy,
    measure_run,
    run_side,
)
from servegym.pipeline.cpu.runner import CpuPipelineRun
from servegym.runner.environment import changed_knobs
from servegym.scoring.objectives import ObjectiveMeasurement, measurement_improvement
from servegym.tasks.loader import LoadedTask

if TYPE_CHECKING:
    from servegym.runner.real_environment import RealTaskEnvironment


async def dev_run(
    loaded: LoadedTask,
    engine: Engine,
    model: ModelRef,
    config: ServingConfig,
    *,
    quick: bool,
    log_dir: Path,
    name: str,
) -> tuple[CpuPipelineRun | None, str | None, str | None]:
    """One run of the dev questions through ``config``: ``(run, None, None)``, or ``(None,
    error, log tail)`` when a server did not start, died or the pipeline failed."""
    cpu = CpuPipelineTask(loaded)
    questions = cpu.questions(loaded.task.workload.dev_seed, quick)
    log_dir.mkdir(parents=True, exist_ok=True)
    pool = IndexPool(cpu.spec, cpu.corpus, log_dir / f"{name}-retrieval.log", max_workers=1)
    warm = asyncio.create_task(pool.warm())
    dep: Deployment | None = None
    try:
        dep = await deploy(loaded, engine, model, config, log_dir, name)
        if not dep.up:
            tail = read_tail(log_dir / f"{name}.log", 40)
            return None, dep.error, tail
        await warm
        return await run_side(pool, loaded, model, dep, config, questions), None, None
    except UserError as e:
        died = dep.died() if dep is not None else None
        error = f"a server died: {died}" if died else e.message
        return None, error, read_tail(log_dir / f"{name}.log", 40)
    finally:
        if not warm.done():
            warm.cancel()
        with contextlib.suppress(asyncio.CancelledError, UserError):
            await warm
        await pool.close()
        if dep is not None:
            await dep.stop()


def describe_questions(loaded: LoadedTask) -> dict[str, Any]:
    """What an agent is told of the pipeline's questions and corpus."""
    cpu = CpuPipelineTask(loaded)
    spec = cpu.spec
    return {
        "questions": cpu.count(False),
        "quick_questions": cpu.count(True),
        "arrival": "all at once (a closed loop of pipeline.concurrency)",
        "corpus_passages": len(cpu.corpus.passages),
        "passages_kept": spec.passages_kept,
        "min_recall": spec.min_recall,
    }


def baseline_dev(
    env: RealTaskEnvironment, quick: bool
) -> tuple[ObjectiveMeasurement, float | None]:
    """The baseline's measurement and recall@k on the dev questions (once; not charged)."""
    if quick not in env._baseline:
        run, error, _ = asyncio.run(
            dev_run(
                env.loaded, env.engine, env.model, env.task.baseline, quick=quick,
                log_dir=env.server_logs, name=f"dev-baseline{'-quick' * quick}",
            )
        )  # fmt: skip
        if run is None:
            env.harness_error = f"the task's baseline pipeline does not run: {error}"
            raise HarnessError(env.harness_error)
        env._baseline[quick] = (measure_run(env.task.objective, run), run.result.recall_at_k)
    return env._baseline[quick]


def run_experiment(
    env: RealTaskEnvironment, config: ServingConfig | dict[str, Any], quick: bool
) -> ExperimentResult:
    """One experiment (see the module docstring); the caller checked the budget."""
    baseline, base_recall = baseline_dev(env, quick)
    index = len(env.experiments)
    started = time.monotonic()
    raw = config.model_dump() if isinstance(config, ServingConfig) else config
    try:
        parsed = ServingConfig.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "config"
        message = f"error: argument {loc}: {first['msg']}"
        return _finish(env, index, started, raw, quick, error=message, tail=message)
    record = changed_knobs(parsed)
    run, error, tail = asyncio.run(
        dev_run(
            env.loaded, env.engine, env.model, parsed, quick=quick,
            log_dir=env.server_logs, name=f"experiment-{index:03d}",
        )
    )  # fmt: skip
    if run is None:
        return _finish(env, index, started, record, quick, error=error, tail=tail)
    m = measure_run(env.task.objective, run)
    recall = run.result.recall_at_k
    ratio = recall / base_recall if recall is not None and base_recall else None
    return _finish(
        env,
        index,
        started,
        record,
        quick,
        measurement=m,
        improvement=measurement_improvement(env.task.objective, baseline, m),
        recall_ratio=ratio,
    )


def _finish(
    env: RealTaskEnvironment,
    index: int,
    started: float,
    config: Any,
    quick: bool,
    *,
    error: str | None = None,
    tail: str | None = None,
    measurement: ObjectiveMeasurement | None = None,
    improvement: float | None = None,
    recall_ratio: float | None = None,
) -> ExperimentResult:
    spent = time.monotonic() - started
    env.charge_wall_seconds(spent)
    m = measurement
    result = ExperimentResult(
        index=index,
        config=config if isinstance(config, dict) else {"value": repr(config)},
        quick=quick,
        ok=m is not None,
        launch_error=error,
        log_tail=tail,
        objective_value=m.value if m is not None else None,
        improvement=improvement,
        accuracy_ratio=recall_ratio,
        cost_wall_seconds=spent,
        budget=env._state_after(index),
        pipeline=m.pipeline.summary() if m is not None and m.pipeline is not None else None,
    )
    return env._record(result)
