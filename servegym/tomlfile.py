"""Reading a TOML file a user wrote (a task, an oracle, a workload, a serving config).

Every problem is one :class:`~servegym.errors.UserError` line naming the file: missing, a
folder, unreadable, not UTF-8 (TOML files are UTF-8 by definition), or malformed TOML.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from servegym.errors import UserError


def read_toml(path: Path, *, missing: str | None = None) -> dict[str, Any]:
    """The table in ``path``; ``missing`` replaces the message for a file that is not there."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UserError(missing or f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, expected a TOML file") from None
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}: not UTF-8 text (byte {e.start} is {e.object[e.start : e.start + 1]!r}); "
            "TOML files are UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: malformed TOML: {e}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
