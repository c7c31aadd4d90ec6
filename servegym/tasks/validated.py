"""Write the verdict of ``servegym task validate`` on a host of the task's track into the
task's ``task.toml``: ``validated = true | false`` and ``validated_on = "<host>, <date>"``.

The file is the author's, comments and all, so only those two top-level lines are touched
(replaced where they are, else added after the last top-level key); the result is loaded
again before it replaces the file, atomically.
"""

from __future__ import annotations

import json
import os
import re
import tempfile

from servegym.errors import UserError
from servegym.tasks.loader import TASK_FILE, LoadedTask, load_task_file

_KEY = re.compile(r"^(validated|validated_on)\s*=")
_TOP_KEY = re.compile(r"^[A-Za-z0-9_\"'-]+\s*=")


def _edited(text: str, passed: bool, host: str) -> str:
    lines = text.splitlines()
    first_table = next((i for i, line in enumerate(lines) if line.lstrip().startswith("[")),
                       len(lines))  # fmt: skip
    head = [line for line in lines[:first_table] if not _KEY.match(line)]
    last_key = max((i for i, line in enumerate(head) if _TOP_KEY.match(line)), default=-1)
    ours = [f"validated = {'true' if passed else 'false'}", f"validated_on = {json.dumps(host)}"]
    head[last_key + 1 : last_key + 1] = ours
    return "\n".join([*head, *lines[first_table:]]) + "\n"


def write_validated(loaded: LoadedTask, passed: bool, host: str) -> None:
    """Record in ``loaded``'s ``task.toml`` whether validation passed on ``host``."""
    path = loaded.path / TASK_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    new = _edited(text, passed, host)
    fd, tmp = tempfile.mkstemp(prefix=".task-", suffix=".toml", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new)
        load_task_file(path.with_name(os.path.basename(tmp)))  # still a valid task
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"{path}: cannot write the validation result ({e.strerror or e})") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
