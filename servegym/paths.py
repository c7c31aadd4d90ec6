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


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path``, every symlink followed, lies inside ``folder`` (also resolved).

    A task's files, and the workloads and traces it names, are data someone else wrote:
    one that resolves outside its folder (a symlink to ``/etc/shadow``, ``../`` in a name,
    an absolute path) is refused rather than read, shown, or sent to a model provider.
    A path that cannot be resolved (a loop, a name too long) is not inside.
    """
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False


def quoted(text: str, limit: int = 80) -> str:
    """``text`` for a one-line message, cut to ``limit`` characters (a 5,000-character name
    is quoted by its start and its length)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"
