"""The final evaluation of a real-track submission: fresh servers, hidden workload, pairs.

As on the simulator (:mod:`servegym.runner.evaluation`): the scoring workload is the task's
spec at the hidden scoring seed; the harness launches the baseline and the submission
itself from their configs alone, and measures them in alternating pairs ``B, S, B, S, ...``
for ``task.evaluation.repeats`` repeats, on two servers that stay up for the whole
evaluation (a start-up per run would cost minutes and measure nothing more). Because the
servers stay up, each pair runs its own sample of the workload (the scoring seed for the
first pair, seeds derived from it for the others; both sides of a pair get the same one):
replaying one sample would let a server's prefix cache answer pairs 2 onwards from pair
1's prompts. The score is the geometric mean of the pairs' improvement ratios with its
bootstrap interval.

A submission is a config (the search baselines' and a model agent's on the sim track) or a
workspace snapshot (:class:`~servegym.engines.launcher.LauncherSubmission`): that one is copied
into a fresh folder and its ``start_server.sh`` started in a fresh sandbox, from the
submitted files alone; nothing of the agent's own workspace or processes is reachable.

Gates: the config's integrity (for a workspace: that it holds its launcher); the launch (a
config the engine's capability table refuses, or a server that does not start, is
``launch_failed``); the outputs' integrity (every scoring request completed with its forced
length, counted by the harness, and the stream checks of :mod:`servegym.scoring.integrity`;
on the CPU track, the probe check of :mod:`servegym.scoring.probes`: the reference model
re-scores a blind draw of the submission's answers token by token); accuracy: the agreement
of each side's outputs with the reference model's on the scoring prompts
(:func:`servegym.cpu_track.reference.agreement`), the submission's over the baseline's at
least the task's ``accuracy.min_ratio``. A submission whose server dies during the
evaluation is ``crashed``; a baseline that does not run is a broken task
(:class:`~servegym.runner.environment.HarnessError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from servegym.cpu_track.reference import REFERENCE_CONFIG, agreement
from servegym.cpu_track.rescore import ProbeReport, verify_probes
from servegym.engines.base import Engine, ModelRef, get_engine
from servegym.engines.capabilities import ConfigRejected
from servegym.engines.config import ServingConfig
from servegym.engines.launcher import ExternalServer, LauncherSubmission
from servegym.engines.models import resolve_model
from servegym.engines.process import ServerError, ServerProcess
from servegym.engines.served import AttachedServer, ManagedServer, ScriptServer, run_watched
from servegym.loadgen.records import RunResult
from servegym.loadgen.target import RunOptions
from servegym.runner.environment import HarnessError
from servegym.runner.evaluation import (
    Evaluation,
    ProgressFn,
    changed_config,
    compare_components,
    conclude,
    evaluation_header,
)
from servegym.runner.real_environment import outputs_reference
from servegym.runner.real_measure import measure_run, real_price
from servegym.runner.results import SideResult
from servegym.runner.secrets import stable_seed
from servegym.runner.workspace import fresh_workspace, workspace_sandbox
from servegym.sandbox.egress import EgressWatch, descendants
from servegym.sandbox.local import Isolation
from servegym.sandbox.pinned_env import Unpinned, unpinned
from servegym.scoring import gates
from servegym.scoring.gates import GateResult
from servegym.scoring.integrity import Finding, stream_findings
from servegym.scoring.objectives import (
    IntegrityCounts,
    ObjectiveMeasurement,
)
from servegym.tasks.loader import LoadedTask, workload_spec
from servegym.workloads.generate import materialise
from servegym.workloads.model import Workload


async def _probe_check(
    loaded: LoadedTask,
    engine: Engine,
    model: ModelRef,
    samples: list[Workload],
    runs: dict[str, list[RunResult]],
    scoring_seed: int,
    server_logs: Path,
) -> ProbeReport:
    """Re-score a blind draw of the submission's answers with the reference model (and, as
    the task's own self-check, of the baseline's: a check that flags the harness's own
    config is a broken task, not a finding)."""
    spec = loaded.task.integrity
    seed = stable_seed("probes", scoring_seed)
    server = ManagedServer(
        engine,
        REFERENCE_CONFIG,
        model,
        server_logs / "eval-reference.log",
        start_timeout_s=loaded.task.evaluation.start_timeout_s,
    )
    proc, error = await _start(server)
    if proc is None:
        raise HarnessError(f"the reference server for the probe check did not start: {error}")
    url = f"http://127.0.0.1:{proc.spec.port}"
    try:
        base = await verify_probes(
            engine, model, list(zip(samples, runs["baseline"], strict=False)), spec, seed,
            server_logs, reference_url=url,
        )  # fmt: skip
        if base.findings:
            raise HarnessError(
                "the probe check flags the task's own baseline, so its tolerance "
                f"([integrity] in task.toml) is too tight: {base.findings[0].text()}"
            )
        return await verify_probes(
            engine, model, list(zip(samples, runs["submission"], strict=False)), spec, seed,
            server_logs, reference_url=url,
        )  # fmt: skip
    finally:
        await server.stop()


def _leader(server: ManagedServer) -> int | None:
    proc = server.process.proc if server.process is not None else None
    return proc.pid if proc is not None else None


def pinned_env_finding(found: list[Unpinned], processes: int) -> Finding:
    """``pinned_environment``: the submission's server runs without the pinned environment
    (the task's hardware class), so it was measured on other hardware than the baseline."""
    return Finding(
        check="pinned_environment",
        requests=len({u.pid for u in found}),
        of=processes,
        request_id=str(found[0].pid),
        evidence=f"{found[0].text()}: the launcher changed the hardware the task measures on",
        subject="process",
    )


def egress_finding(watch: EgressWatch) -> Finding:
    """``network_egress``: the submission's server reached beyond the machine."""
    seen = list(watch.seen.values())
    return Finding(
        check="network_egress",
        requests=len(seen),
        of=len(seen),
        request_id=seen[0].remote,
        evidence=f"{seen[0].text()} during the evaluation (the submission must serve offline)",
        subject="connection",
    )


def _probe_summary(report: ProbeReport, max_gap: float) -> str:
    v = report.verdicts
    if not v:
        return "no probe to re-score"
    tokens = sum(p.tokens for p in v)
    greedy = sum(p.greedy for p in v) / tokens if tokens else 1.0
    return (
        f"{len(v)} probes ({tokens} tokens) re-scored by the reference model: {greedy:.1%} of "
        f"tokens its greedy choice, largest gap {max(p.worst_gap for p in v):.3f} nats "
        f"(tolerance {max_gap:g})"
    )


def pair_seed(scoring_seed: int, i: int) -> int:
    """The workload seed of pair ``i``: the scoring seed itself for the first pair."""
    return scoring_seed if i == 0 else stable_seed("score-pair", scoring_seed, i)


async def _start(server: ManagedServer) -> tuple[ServerProcess | None, str | None]:
    try:
        return await server.start(), None
    except ConfigRejected as e:
        return None, e.message
    except ServerError as e:
        return None, e.message


def _side(
    config: Any,
    proc: ServerProcess | None,
    error: str | None,
    measurements: list[ObjectiveMeasurement],
    accuracy: float | None,
    price: float | None,
) -> SideResult:
    integrity = IntegrityCounts()
    for m in measurements:
        integrity = integrity.add(m.integrity)
    return SideResult(
        config=changed_config(config),
        launched=proc is not None,
        launch_error=error,
        accuracy_ratio=accuracy,
        num_gpus=1 if proc is not None else None,
        startup_s=proc.ready_after_s if proc is not None else None,
        price_per_hour=price if proc is not None else None,
        objective_values=[m.value for m in measurements],
        rates=[None for _ in measurements],
        metrics=measurements[0].metrics if measurements else None,
        integrity=integrity,
    )


def evaluate_real(
    loaded: LoadedTask,
    submission: Any,
    scoring_seed: int,
    *,
    server_logs: Path,
    progress: ProgressFn | None = None,
    engine: Engine | None = None,
    model: ModelRef | None = None,
    isolation: Isolation = "auto",
    ran_in_workspace: Sequence[str] = (),
) -> Evaluation:
    """Score ``submission`` against the task's baseline on real servers (see the module
    docstring). Raises :class:`HarnessError` when the baseline does not run. ``engine`` and
    ``model`` default to the task's (tests pass stand-ins). ``ran_in_workspace``: the
    workspace digests whose launcher served a benchmark during the agent phase; a
    submission among them that does not start from its files alone depends on state
    outside them (``state_outside_submission``)."""
    engine = engine if engine is not None else get_engine(loaded.task.engines[0])
    model = model if model is not None else resolve_model(loaded.task.model)
    if loaded.task.pipeline is not None:
        from servegym.pipeline.cpu.evaluation import evaluate_pipeline_real

        return evaluate_pipeline_real(
            loaded, submission, scoring_seed, server_logs=server_logs, engine=engine,
            model=model, progress=progress,
        )  # fmt: skip
    evaluation = asyncio.run(
        _evaluate(loaded, submission, scoring_seed, server_logs, progress, engine, model, isolation)
    )
    if isinstance(submission, LauncherSubmission):
        _outside_state(evaluation, submission, ran_in_workspace)
    return evaluation


def _outside_state(
    evaluation: Evaluation, submission: LauncherSubmission, ran: Sequence[str]
) -> None:
    """Name the cause when a launcher that ran in the agent's workspace fails from the
    submitted files alone: it needs something a fresh sandbox does not have (a file outside
    the workspace or under an excluded cache folder, a process it expected running)."""
    launch = evaluation.gates.get("launch")
    failed = evaluation.outcome == "crashed" or (launch is not None and launch.passed is False)
    if not failed or launch is None or submission.digest[:16] not in {d[:16] for d in ran}:
        return
    why = launch.detail if launch.passed is False else "its server died during the evaluation"
    finding = Finding(
        check="state_outside_submission",
        requests=1,
        of=1,
        request_id=submission.script,
        subject="launcher",
        evidence=(
            f"the same files (digest {submission.digest[:16]}) served a benchmark in the "
            f"agent's workspace, but not from the submitted files alone in a fresh sandbox: "
            f"{why}"
        ),
    )
    evaluation.gates["launch"] = launch.model_copy(
        update={"findings": [*launch.findings, finding.text()]}
    )


async def _evaluate(
    loaded: LoadedTask,
    submission: Any,
    scoring_seed: int,
    server_logs: Path,
    progress: ProgressFn | None,
    engine: Engine,
    model: ModelRef,
    isolation: Isolation,
) -> Evaluation:
    task = loaded.task
    eval_workspace = server_logs.parent / "eval-workspace"
    start_timeout = task.evaluation.start_timeout_s
    repeats = task.evaluation.repeats
    spec, base_dir = workload_spec(loaded)
    samples = [
        materialise(spec, pair_seed(scoring_seed, i), base_dir=base_dir) for i in range(repeats)
    ]
    workload = samples[0]
    info, summary = evaluation_header(task, workload)
    reference = await asyncio.to_thread(outputs_reference, engine, model, workload, server_logs)
    options = RunOptions(
        model=model.served_name,
        keep_outputs=True,
        request_timeout_s=task.evaluation.request_timeout_s,
    )
    price = real_price(task)
    price_per_hour = price.price_per_hour if price is not None else None

    gate = gates.opening_gates(submission, task.engines)

    base_server = ManagedServer(
        engine, task.baseline, model, server_logs / "eval-baseline.log",
        start_timeout_s=start_timeout,
    )  # fmt: skip
    sub_server: ManagedServer | None = None
    sub_proc: ServerProcess | None = None
    sub_error: str | None = None
    pairs: list[tuple[ObjectiveMeasurement, ObjectiveMeasurement | None]] = []
    first: dict[str, RunResult] = {}
    runs: dict[str, list[RunResult]] = {}
    crashed: str | None = None
    unresponsive = "the server stopped answering"
    egress: EgressWatch | None = None
    egress_task: asyncio.Task[None] | None = None
    pinned = engine.pinned_env()
    pinned_found: list[Finding] = []
    try:
        base_proc, base_error = await _start(base_server)
        if base_proc is None:
            raise HarnessError(f"the task's baseline config does not run: {base_error}")
        if gate["integrity"].passed:
            sub_log = server_logs / "eval-submission.log"
            if isinstance(submission, ExternalServer):
                sub_server = AttachedServer(submission.base_url, model, sub_log)
            elif isinstance(submission, LauncherSubmission):
                # a fresh sandbox around a fresh copy of the submitted files alone
                root = fresh_workspace(Path(submission.path), eval_workspace)
                sandbox = workspace_sandbox(task, engine, model, root, isolation=isolation)
                sub_server = ScriptServer(
                    sandbox,
                    submission.script,
                    model,
                    sub_log,
                    start_timeout_s=start_timeout,
                )
            else:
                assert isinstance(submission, ServingConfig)
                config = ServingConfig.model_validate(submission.model_dump())
                sub_server = ManagedServer(
                    engine, config, model, sub_log, start_timeout_s=start_timeout
                )
            if not isinstance(sub_server, AttachedServer):
                egress = EgressWatch(partial(_leader, sub_server))
                egress_task = asyncio.create_task(egress.run())
            sub_proc, sub_error = await _start(sub_server)
            gate["launch"] = gates.check_launch(sub_error)
            leader = _leader(sub_server)
            if isinstance(sub_server, ScriptServer) and leader is not None and pinned:
                tree = descendants(leader)
                changed = unpinned(tree, pinned)
                if changed:
                    pinned_found.append(pinned_env_finding(changed, len(tree)))

        n_pairs = repeats if sub_proc is not None else 1
        total = n_pairs * (2 if sub_proc is not None else 1)
        done = 0

        async def measure(proc: ServerProcess, role: str, i: int) -> ObjectiveMeasurement | None:
            nonlocal done, unresponsive
            try:
                result, exit_info = await run_watched(proc, samples[i], options)
            except ServerError as e:  # alive but no longer answering
                if role == "baseline":
                    raise HarnessError(f"the baseline server failed: {e.message}") from None
                unresponsive = e.message
                return None
            done += 1
            if progress is not None:
                progress("evaluation", done, total)
            if exit_info is not None:
                if role == "baseline":
                    raise HarnessError(f"the baseline server died: {exit_info.describe()}")
                return None
            first.setdefault(role, result)
            runs.setdefault(role, []).append(result)
            return measure_run(task, result)

        for i in range(n_pairs):
            b = await measure(base_proc, "baseline", i)
            assert b is not None
            s: ObjectiveMeasurement | None = None
            if sub_proc is not None:
                s = await measure(sub_proc, "submission", i)
                if s is None:
                    exit_info = sub_proc.poll()
                    crashed = exit_info.describe() if exit_info is not None else unresponsive
                    pairs.append((b, None))
                    break
            pairs.append((b, s))
    finally:
        if egress_task is not None:
            egress_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await egress_task
        await base_server.stop()
        if sub_server is not None:
            await sub_server.stop()
        shutil.rmtree(eval_workspace, ignore_errors=True)

    base_acc = agreement(first["baseline"], reference) if reference is not None else None
    sub_acc = None
    if reference is not None and "submission" in first:
        sub_acc = agreement(first["submission"], reference)
    if sub_proc is not None and crashed is None:
        if base_acc is not None and sub_acc is not None:
            gate["accuracy"] = gates.check_accuracy(sub_acc, base_acc, task.accuracy.min_ratio)
        else:
            gate["accuracy"] = gates.not_reached("no reference outputs on this track")
    elif gate["integrity"].passed and sub_proc is None:
        gate["accuracy"] = gates.not_reached("the submission did not launch")

    summary.components = compare_components(pairs)
    subs = [s for _, s in pairs if s is not None]
    baseline_side = _side(
        task.baseline, base_proc, None, [b for b, _ in pairs], base_acc, price_per_hour
    )
    submission_side: SideResult | None = None
    if submission is not None:
        submission_side = _side(submission, sub_proc, sub_error, subs, sub_acc, price_per_hour)
    found = stream_findings(runs.get("submission", [])) + pinned_found
    if egress is not None and egress.seen:
        found.append(egress_finding(egress))
    probe_note = ""
    if reference is not None and runs.get("submission") and gate["integrity"].passed:
        if workload.spec.prompt.format != "token_ids":
            # the server tokenizes text itself; re-scoring needs the exact prompt ids
            probe_note = "; no probe check: the workload sends text, not token ids"
        else:
            probes = await _probe_check(
                loaded, engine, model, samples, runs, scoring_seed, server_logs
            )
            found += probes.findings
            probe_note = "; " + _probe_summary(probes, loaded.task.integrity.max_gap_nats)
    if found and gate["integrity"].passed:
        texts = [f.text() for f in found]
        gate["integrity"] = GateResult(passed=False, detail=texts[0], findings=texts)
    elif probe_note and gate["integrity"].passed:
        detail = gate["integrity"].detail + probe_note
        gate["integrity"] = gate["integrity"].model_copy(update={"detail": detail})

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
