"""Where ServeGym's data folders (workloads/, tasks/, ...) are found.

In a source checkout (and an editable install) they sit at the repository root beside the
package; a wheel carries a copy under ``servegym/_data``. ``SERVEGYM_DATA_DIR`` overrides both.
"""

from __future__ import annotations

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
