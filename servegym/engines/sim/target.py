"""The ``sim`` target: a workload run on the simulated engine, in virtual time.

``SimTarget`` turns a :class:`~servegym.workloads.model.Workload` into the same
:class:`~servegym.loadgen.records.RunResult` the HTTP target produces, so metrics and scoring
never know which one ran. The engine is launched (config checked, KV cache sized) when the
target is made, so a config the engine would refuse fails there with a
:class:`~servegym.engines.sim.launch.LaunchError`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from servegym.engines.config import ServingConfig
from servegym.engines.sim.engine import SimRun, simulate
from servegym.engines.sim.launch import LaunchedEngine, launch
from servegym.loadgen.records import LoadgenStats, RunResult
from servegym.loadgen.target import ProgressFn, RunOptions, register_target
from servegym.workloads.model import Workload


@register_target("sim")
class SimTarget:
    """The simulated engine serving ``model`` on ``hardware`` with ``config``.

    ``noise`` turns the seeded measurement noise on (default) or off; ``noise_seed``
    defaults to each workload's seed, so the same workload and seed give identical records
    and a different noise seed gives different noise.
    """

    def __init__(
        self,
        model: str,
        hardware: str,
        config: ServingConfig | None = None,
        *,
        noise: bool = True,
        noise_seed: int | None = None,
    ) -> None:
        self.model = model
        self.hardware = hardware
        self.config = config if config is not None else ServingConfig()
        self.noise = noise
        self.noise_seed = noise_seed
        self._engines: dict[str, LaunchedEngine] = {}
        self.engine = self._engine("synthetic")
        self.name = self.engine.name
        self.last_run: SimRun | None = None

    def _engine(self, family: str) -> LaunchedEngine:
        """The launched engine (one per workload kind: speculative acceptance depends on
        it; everything else is the same)."""
        if family not in self._engines:
            self._engines[family] = launch(
                self.model, self.hardware, self.config, workload_family=family
            )
        return self._engines[family]

    def simulate(self, workload: Workload) -> SimRun:
        """Run ``workload`` (synchronously) and keep the result in ``last_run``."""
        engine = self._engine(workload.spec.kind)
        run = simulate(engine, workload, noise=self.noise, noise_seed=self.noise_seed)
        self.last_run = run
        return run

    async def run(
        self, workload: Workload, options: RunOptions, progress: ProgressFn | None = None
    ) -> RunResult:
        started_at = datetime.now(UTC).isoformat(timespec="milliseconds")
        run = self.simulate(workload)
        if progress is not None:
            progress(workload.num_turns, workload.num_turns)
        return RunResult(
            target=self.name,
            model=options.model,
            workload=workload.spec.name,
            workload_hash=workload.content_hash(),
            seed=workload.seed,
            started_at=started_at,
            clock_origin_ns=0,
            duration_s=run.duration_s,
            records=run.records,
            loadgen=LoadgenStats(),
            server_metrics_delta=run.server_metrics_delta,
            stopped_early=run.stopped_early,
        )
