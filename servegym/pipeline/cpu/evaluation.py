"""The final evaluation of a cpu-track pipeline task: the whole pipeline, scored in pairs.

As :mod:`servegym.runner.real_evaluation` does for a server: the baseline's and the
submission's servers (each side's answer server, and its grader's with
``grade_server = "dedicated"``) start fresh from their configs and stay up; they are measured
in alternating pairs ``B, S, B, S, ...`` for ``evaluation.repeats`` repeats, each pair on its
own question set (the hidden scoring seed for the first pair, seeds derived from it for the
others; both sides of a pair get the same questions). Before the pairs each side runs
:data:`WARMUP_QUESTIONS` questions of a warm-up seed, not measured: it builds the side's
index and warms its servers and the worker (the first calls into a fresh server or a fresh
embedder are slower, which would favour whichever side runs second). A run is
:func:`~servegym.pipeline.cpu.runner.run_pipeline` with that side's ``[pipeline]`` knobs
over one retrieval worker's index, built once per set of index knobs and reused across the
repeats (:class:`~servegym.pipeline.cpu.deploy.IndexPool`); index building is not timed in
the objective. The objective is valued as on the sim track.

Gates: integrity as any config (a workspace submission is refused: a pipeline task takes a
config with a ``[pipeline]`` table); the launch; accuracy is retrieval quality: the
submission's mean recall@k over its runs must be at least the task's
``pipeline.min_recall`` (without one, ``accuracy.min_ratio`` of the baseline's), or the trial
is ``accuracy_failed`` with the recall in the gate's detail. A submission whose server dies
or stops answering mid-evaluation is ``crashed``; a baseline that does not run is a broken
task (:class:`~servegym.runner.environment.HarnessError`).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from servegym.engines.base import Engine, ModelRef
from servegym.engines.config import ServingConfig
from servegym.errors import UserError
from servegym.pipeline.cpu.corpus import Question
from servegym.pipeline.cpu.deploy import (
    CpuPipelineTask,
    Deployment,
    IndexPool,
    deploy,
    measure_run,
    questions_digest,
    run_side,
)
from servegym.pipeline.cpu.runner import CpuPipelineRun
from servegym.runner.environment import HarnessError
from servegym.runner.evaluation import (
    Evaluation,
    ProgressFn,
    changed_config,
    compare_components,
    conclude,
)
from servegym.runner.real_measure import real_price
from servegym.runner.results import EvaluationInfo, ObjectiveSummary, SideResult
from servegym.runner.secrets import stable_seed
from servegym.scoring import gates
from servegym.scoring.gates import GateResult
from servegym.scoring.objectives import UNITS, IntegrityCounts, ObjectiveMeasurement
from servegym.tasks.loader import LoadedTask
from servegym.tasks.pipeline_spec import PipelineSpec

WARMUP_QUESTIONS = 2
NOT_A_CONFIG = (
    "a pipeline task takes a config submission (server knobs and a [pipeline] table), "
    "not a launcher workspace or a running server"
)


def pair_seed(scoring_seed: int, i: int) -> int:
    """Pair ``i``'s question seed: the scoring seed itself for the first pair (as
    :func:`servegym.runner.real_evaluation.pair_seed`)."""
    return scoring_seed if i == 0 else stable_seed("score-pair", scoring_seed, i)


def recall_gate(sub: float, base: float, spec: PipelineSpec, min_ratio: float) -> GateResult:
    """Retrieval quality as the accuracy gate: ``sub`` (the submission's mean recall@k)
    against ``spec.min_recall``, or, without one, ``min_ratio`` of the baseline's ``base``."""
    k = spec.passages_kept
    if spec.min_recall is not None:
        ok = sub >= spec.min_recall - 1e-12
        verb = ">=" if ok else "<"
        return GateResult(
            passed=ok,
            detail=(
                f"recall@{k} {sub:.3f} {verb} the minimum {spec.min_recall:.3f} "
                f"(baseline {base:.3f})"
            ),
            value=sub,
            threshold=spec.min_recall,
        )
    g = gates.check_accuracy(sub, base, min_ratio)
    return g.model_copy(update={"detail": f"recall@{k} {sub:.3f}, baseline {base:.3f}: {g.detail}"})


def _mean_recall(runs: list[CpuPipelineRun]) -> float | None:
    values = [r.result.recall_at_k for r in runs if r.result.recall_at_k is not None]
    return sum(values) / len(values) if values else None


def _side(
    config: Any,
    dep: Deployment | None,
    error: str | None,
    measurements: list[ObjectiveMeasurement],
    recall: float | None,
    price: float | None,
) -> SideResult:
    integrity = IntegrityCounts()
    for m in measurements:
        integrity = integrity.add(m.integrity)
    up = dep is not None and dep.up
    return SideResult(
        config=changed_config(config),
        launched=up,
        launch_error=error,
        accuracy_ratio=recall,
        num_gpus=None,
        startup_s=dep.main.ready_after_s if dep is not None and up else None,
        price_per_hour=price if up else None,
        objective_values=[m.value for m in measurements],
        rates=[None for _ in measurements],
        metrics=None,
        integrity=integrity,
    )


def evaluate_pipeline_real(
    loaded: LoadedTask,
    submission: Any,
    scoring_seed: int,
    *,
    server_logs: Path,
    engine: Engine,
    model: ModelRef,
    progress: ProgressFn | None = None,
) -> Evaluation:
    """Score ``submission`` on a cpu-track pipeline task (see the module docstring)."""
    return asyncio.run(
        _evaluate(loaded, submission, scoring_seed, server_logs, engine, model, progress)
    )


async def _evaluate(
    loaded: LoadedTask,
    submission: Any,
    scoring_seed: int,
    server_logs: Path,
    engine: Engine,
    model: ModelRef,
    progress: ProgressFn | None,
) -> Evaluation:
    task = loaded.task
    cpu = CpuPipelineTask(loaded)
    spec = cpu.spec
    repeats = task.evaluation.repeats
    samples = [cpu.questions(pair_seed(scoring_seed, i)) for i in range(repeats)]
    info = EvaluationInfo(
        repeats=repeats,
        workload=f"{task.id} questions",
        requests=len(samples[0]),
        workload_hash=questions_digest(samples[0]),
        bootstrap_samples=task.evaluation.bootstrap_samples,
    )
    objective = task.objective
    summary = ObjectiveSummary(
        label=objective.label(),
        kind=objective.kind,
        unit=UNITS[objective.kind],
        higher_is_better=objective.higher_is_better,
    )
    price = real_price(task)
    price_per_hour = price.price_per_hour if price is not None else None

    gate = gates.opening_gates(submission, task.engines)
    server_logs.mkdir(parents=True, exist_ok=True)
    pool = IndexPool(spec, cpu.corpus, server_logs / "eval-retrieval.log")
    base: Deployment | None = None
    sub: Deployment | None = None
    sub_error: str | None = None
    pairs: list[tuple[ObjectiveMeasurement, ObjectiveMeasurement | None]] = []
    runs: dict[str, list[CpuPipelineRun]] = {"baseline": [], "submission": []}
    crashed: str | None = None
    warm = asyncio.create_task(pool.warm())
    try:
        base = await deploy(loaded, engine, model, task.baseline, server_logs, "eval-baseline")
        if not base.up:
            raise HarnessError(f"the task's baseline config does not run: {base.error}")
        if gate["integrity"].passed:
            if isinstance(submission, ServingConfig):
                config = ServingConfig.model_validate(submission.model_dump())
                sub = await deploy(loaded, engine, model, config, server_logs, "eval-submission")
                sub_error = sub.error
            else:
                sub_error = NOT_A_CONFIG
            gate["launch"] = gates.check_launch(sub_error)
        try:
            await warm
        except UserError as e:
            raise HarnessError(f"the retrieval worker did not start: {e.message}") from None

        n_pairs = repeats if sub is not None and sub.up else 1
        total = n_pairs * (2 if sub is not None and sub.up else 1)
        done = 0

        async def run_once(
            dep: Deployment, config: ServingConfig, role: str, questions: list[Question]
        ) -> CpuPipelineRun | None:
            nonlocal crashed
            try:
                return await run_side(pool, loaded, model, dep, config, questions)
            except UserError as e:
                died = dep.died()
                if role == "baseline":
                    why = f"died: {died}" if died else f"failed: {e.message}"
                    raise HarnessError(f"the baseline's pipeline {why}") from None
                crashed = died or e.message
                return None

        async def measure(
            dep: Deployment, config: ServingConfig, role: str, i: int
        ) -> ObjectiveMeasurement | None:
            nonlocal done
            run = await run_once(dep, config, role, samples[i])
            if run is None:
                return None
            done += 1
            if progress is not None:
                progress("evaluation", done, total)
            runs[role].append(run)
            return measure_run(objective, run)

        warmup = cpu.questions(stable_seed("pipeline-warmup", scoring_seed), count=WARMUP_QUESTIONS)
        await run_once(base, task.baseline, "baseline", warmup)
        if sub is not None and sub.up:
            assert isinstance(submission, ServingConfig)
            if await run_once(sub, submission, "submission", warmup) is None:
                n_pairs = 1
        for i in range(n_pairs):
            b = await measure(base, task.baseline, "baseline", i)
            assert b is not None
            s: ObjectiveMeasurement | None = None
            if sub is not None and sub.up and crashed is None:
                assert isinstance(submission, ServingConfig)
                s = await measure(sub, submission, "submission", i)
                if s is None:
                    pairs.append((b, None))
                    break
            pairs.append((b, s))
    finally:
        if not warm.done():
            warm.cancel()
        with contextlib.suppress(asyncio.CancelledError, UserError):
            await warm
        await pool.close()
        if base is not None:
            await base.stop()
        if sub is not None:
            await sub.stop()

    base_recall = _mean_recall(runs["baseline"])
    sub_recall = _mean_recall(runs["submission"])
    if sub is not None and sub.up and crashed is None:
        if base_recall is not None and sub_recall is not None:
            gate["accuracy"] = recall_gate(sub_recall, base_recall, spec, task.accuracy.min_ratio)
        else:
            gate["accuracy"] = gates.not_reached("no recall measured")

    summary.components = compare_components(pairs)
    baseline_side = _side(
        task.baseline, base, None, [b for b, _ in pairs], base_recall, price_per_hour
    )
    submission_side: SideResult | None = None
    if submission is not None:
        subs = [s for _, s in pairs if s is not None]
        submission_side = _side(submission, sub, sub_error, subs, sub_recall, price_per_hour)
    return conclude(
        loaded,
        submission,
        scoring_seed,
        gate=gate,
        summary=summary,
        info=info,
        pairs=pairs,
        baseline_side=baseline_side,
        submission_side=submission_side,
        crashed=crashed,
    )
