"""Where ServeGym's data folders (workloads/, tasks/, ...) are found, and its data directory.

In a source checkout (and an editable install) the data folders sit at the repository root
beside the package; a wheel carries a copy under ``servegym/_data``. ``SERVEGYM_DATA_DIR``
overrides both. The data directory (:func:`servegym_home`) is where ServeGym keeps what it
installs and builds: ``$SERVEGYM_HOME`` when set, else ``$XDG_CACHE_HOME/servegym``
(``~/.cache/servegym``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """Return the data folder ``name`` (e.g. ``"workloads"``)."""
    override = os.environ.get("SERVEGYM_DATA_DIR")
    if override:
        return Path(override) / name
    bundled = _PACKAGE_DIR / "_data" / name
    if bundled.is_dir():
        return bundled
    return _PACKAGE_DIR.parent / name


def servegym_home() -> Path:
    """The ServeGym data directory (not created here)."""
    if home := os.environ.get("SERVEGYM_HOME"):
        return Path(home).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "servegym"


def python_runtime_dirs(venv: Path) -> list[Path]:
    """The folders a virtual environment's interpreter needs: the venv and the prefix of
    the Python it was made from (``home`` in ``pyvenv.cfg``)."""
    out = [venv]
    cfg = venv / "pyvenv.cfg"
    with contextlib.suppress(OSError):
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                out.append(Path(value.strip()).parent)
    return out
