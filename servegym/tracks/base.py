"""What a track is: a strategy for starting a config and measuring it.

A track (``sim``, ``cpu``, ``gpu``, and a pipeline task on either) is chosen once per task
(:func:`servegym.tracks.track_for`). The final evaluation
(:func:`servegym.runner.evaluation.evaluate`) owns the order of things (gates, baseline,
submission, warm-up, pairs in alternating order, crash handling, accuracy, integrity,
conclusion) and asks the track's :class:`EvaluationSession` for each step: start a side, warm
it up, measure it on pair ``i``'s workload sample, its accuracy, the integrity findings of
the submission's runs, stop. Adding a track is one module that implements these.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, TypeVar

from servegym.engines.base import Engine, ModelRef
from servegym.registry import Registry
from servegym.sandbox.local import Isolation
from servegym.sandbox.quiet import QuietRuns
from servegym.scoring import gates
from servegym.scoring.gates import GateResult
from servegym.scoring.integrity import Finding
from servegym.scoring.objectives import ObjectiveMeasurement
from servegym.tasks.loader import LoadedTask
from servegym.tasks.secrets import stable_seed
from servegym.tasks.spec import TRACK_TRAITS, TRACKS_GROUP, TrackTraits

if TYPE_CHECKING:
    from servegym.tracks.dev import DevSession

Role = Literal["baseline", "submission"]


def pair_seed(scoring_seed: int, i: int) -> int:
    """The workload seed of pair ``i`` on tracks that measure a fresh sample per pair: the
    scoring seed itself for the first pair, seeds derived from it for the others."""
    return scoring_seed if i == 0 else stable_seed("score-pair", scoring_seed, i)


class SampleInfo(NamedTuple):
    """The scoring workload as the trial records it: the first pair's sample, and every
    pair's sample hash (``pair_hashes[i]`` for pair ``i``; all distinct)."""

    name: str
    requests: int
    workload_hash: str
    pair_hashes: tuple[str, ...] = ()


@dataclass
class StartedSide:
    """A side the track started, or tried to (``up`` False: ``error`` says why). A track
    keeps its own handle (an engine, a server process, a deployment) in a subclass."""

    up: bool
    error: str | None = None
    startup_s: float | None = None
    num_gpus: int | None = None
    price_per_hour: float | None = None
    """What the side costs per hour, all its GPUs together (None: not stated)."""


@dataclass(frozen=True)
class DevBaseline:
    """The baseline on the dev workload, as every track's agent phase measures it (once per
    workload size, never charged): its objective, and its accuracy where the track has one
    (the simulator's modelled accuracy, the agreement with reference outputs, a pipeline's
    recall@k)."""

    measurement: ObjectiveMeasurement
    accuracy: float | None


class SideCrashed(Exception):
    """The submission's server died or stopped answering during a measurement."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EvaluationSession(ABC):
    """One final evaluation on a track: see the module docstring. Methods run in the order
    :func:`~servegym.runner.evaluation.evaluate` calls them; :meth:`close` always runs."""

    sample: SampleInfo
    quiet: QuietRuns | None = None
    """Real tracks: how the runs waited for the other side's servers to go quiet
    (:mod:`servegym.sandbox.quiet`); None where sides share no machine (the simulator)."""

    @abstractmethod
    async def start_baseline(self) -> StartedSide:
        """Start the task's baseline; raise :class:`~servegym.errors.BrokenTask` when it
        does not start (a broken task)."""

    @abstractmethod
    async def start_submission(self, submission: Any) -> StartedSide:
        """Start the submission (its config integrity passed)."""

    async def warm_up(self, baseline: StartedSide, submission: StartedSide | None) -> str | None:
        """Warm both sides before the pairs (not measured); the submission's crash reason
        if it died doing so. Default: no warm-up."""
        return None

    @abstractmethod
    async def measure(self, side: StartedSide, role: Role, i: int) -> ObjectiveMeasurement:
        """Measure ``side`` on pair ``i``. The submission failing raises
        :class:`SideCrashed`; the baseline failing raises
        :class:`~servegym.errors.HarnessError`."""

    async def after_pairs(self, baseline: StartedSide, submission: StartedSide) -> None:
        """Checks of both live sides once every pair is measured and the submission ran to
        the end (the real tracks ask the quality set here). Default: none."""
        return None

    async def prepare_checks(self) -> None:
        """Get what the accuracy and integrity checks need, after :meth:`close` stopped the
        measured sides (the real tracks' reference outputs). Default: nothing."""
        return None

    async def finish_checks(self) -> None:
        """Stop what :meth:`prepare_checks` or the checks started; always runs after them.
        Default: nothing."""
        return None

    @abstractmethod
    def accuracy(self, side: StartedSide | None, role: Role) -> float | None:
        """The side's accuracy as recorded (None: not measured)."""

    def accuracy_gate(self, submission: float | None, baseline: float | None) -> GateResult:
        """The accuracy gate of a submission that ran to the end."""
        if submission is None or baseline is None:
            return gates.not_reached(self.no_accuracy)
        return gates.check_accuracy(submission, baseline, self.min_accuracy)

    min_accuracy: float = 0.0
    no_accuracy: str = "no reference outputs on this track"

    async def integrity_findings(self, passed: bool) -> tuple[list[Finding], str]:
        """What the submission's outputs and processes showed (``passed``: the integrity
        gate so far), and a note for the gate's detail. Default: nothing beyond the
        records' own counts."""
        return [], ""

    @abstractmethod
    async def close(self) -> None:
        """Stop everything the session started."""


ServerPlace = Literal["local", "docker"]
"""Where a real track runs its servers: from the host's environment, or in containers."""


@dataclass(frozen=True)
class TrackSetup:
    """Where and with what a track runs, as the caller says: real tracks write their
    servers' logs under ``server_logs`` (a trial's ``servers/`` folder) and start ``engine``
    serving ``model`` (None: the task's; tests pass stand-ins), a workspace submission in a
    sandbox of ``isolation``; ``servers`` says where their servers run. The simulator needs
    none of it."""

    server_logs: Path | None = None
    engine: Engine | None = None
    model: ModelRef | None = None
    isolation: Isolation = "auto"
    servers: ServerPlace = "local"


class Track(ABC):
    """A track: chosen once per task (:func:`servegym.tracks.track_for`), it serves both
    phases of a trial: the agent's experiments (:meth:`dev_session`, asked by the one task
    environment) and the final evaluation (:meth:`evaluation`, asked by the one
    ``evaluate()``). A track class is registered under its track's name
    (:data:`TRACKS`)."""

    name: str
    traits: ClassVar[TrackTraits | None] = None
    """What the track allows and how it counts, declared by a plug-in track (a built-in's
    are its row of :data:`servegym.tasks.spec.TRACK_TRAITS`, read without importing it)."""

    @classmethod
    def for_task(cls, loaded: LoadedTask, setup: TrackSetup) -> Track:
        """The track of ``loaded`` as :func:`~servegym.tracks.track_for` makes it (a
        pipeline task's: wrapped with the pipeline plug-in that runs on it). Default: the
        class made without arguments."""
        return cls()

    def server_versions(self) -> dict[str, str]:
        """What the track ran its servers in, where that is not the host's environment (a
        docker trial's image), for ``versions`` in ``trial.json``. Default: nothing."""
        return {}

    @classmethod
    def preflight(cls, loaded: LoadedTask) -> None:
        """Check ``loaded`` before a trial runs anything or writes anything: raise
        :class:`~servegym.errors.BrokenTask` when its baseline cannot start, a
        :class:`~servegym.errors.UserError` for a budget no experiment fits in. Default:
        nothing to check without starting a server (a real track learns that its baseline
        does not start only when it starts it)."""
        return None

    @abstractmethod
    def dev_session(self, loaded: LoadedTask, trial_seed: int) -> DevSession:
        """The agent phase of ``loaded`` (see :mod:`servegym.tracks.dev`); ``trial_seed``
        seeds what varies between trials (the simulator's measurement noise)."""

    @abstractmethod
    def evaluation(self, loaded: LoadedTask, scoring_seed: int) -> EvaluationSession:
        """A final evaluation of ``loaded`` on the scoring workload of ``scoring_seed``."""


def _is_track_class(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, Track)


TRACKS: Registry[type[Track]] = Registry(
    "track",
    group=TRACKS_GROUP,
    builtins={
        "sim": "servegym.tracks.sim",
        "cpu": "servegym.tracks.real",
        "gpu": "servegym.tracks.real",
    },
    accepts=_is_track_class,
)
"""Every track class by its track's name (a task's ``track``): the built-ins, and
``servegym.tracks`` entry points of installed plug-ins (see :mod:`servegym.registry`)."""

T = TypeVar("T", bound=type[Track])


def register_track(*names: str) -> Callable[[T], T]:
    """Class decorator: the class is the track of tasks on each of ``names`` (its
    ``traits``, where it declares them, are what those tasks are validated against)."""

    def deco(cls: T) -> T:
        for name in names:
            TRACKS.register(name)(cls)
            if cls.traits is not None:
                TRACK_TRAITS.setdefault(name, cls.traits)
        return cls

    return deco
