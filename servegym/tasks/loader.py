"""Finding and loading tasks: ``tasks/<id>/task.toml`` + ``instruction.md`` (+ ``oracle.toml``).

A task is named by its folder under the shipped ``tasks/`` data folder
(:func:`servegym.paths.data_dir`), or given as a path to a task folder (or to its
``task.toml``). :func:`load_task` reads and validates all of it; every problem is a one-line
:class:`~servegym.errors.UserError` naming the file and, where there is one, the field:

- ``task.toml``: TOML syntax, the :class:`~servegym.tasks.spec.Task` schema, ``id`` equal to
  the folder's name, and (sim track) the model, hardware and workload it names;
- ``instruction.md``: must exist and say something (it is what the agent reads);
- ``oracle.toml``: optional here (``task validate`` requires it); when present, a valid
  :class:`~servegym.engines.config.ServingConfig` (knobs at the top level, a
  ``[speculative]`` table). It is never shown to an agent.

A workload named by a relative path (``name = "workload.toml"``) is read from the task's
folder; a bare name is a shipped workload.

A task is data someone else wrote, so nothing it names may reach outside its folder: every
task file (``task.toml``, ``instruction.md``, ``oracle.toml``), the workload file it names
and that workload's trace must resolve, symlinks followed, inside the task's folder (the
shipped ``workloads/`` folder for a shipped workload). A symlink out, ``../`` in
``[workload] name`` or an absolute path is refused in one line naming the file or field,
before anything is read: nothing outside is shown, written to a trajectory or sent to a
model provider.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from servegym.engines.config import ServingConfig
from servegym.errors import UserError
from servegym.overrides import validation_message
from servegym.paths import data_dir, inside, quoted
from servegym.tasks.spec import Task
from servegym.tomlfile import read_toml
from servegym.workloads.spec import WorkloadSpec

TASK_FILE = "task.toml"
INSTRUCTION_FILE = "instruction.md"
ORACLE_FILE = "oracle.toml"


@dataclass(frozen=True, slots=True)
class LoadedTask:
    """A task as the harness holds it: the spec, the agent's instruction, the expert config.

    ``oracle`` is for ``task validate`` and reports only; nothing hands it to an agent.
    """

    task: Task
    instruction: str
    oracle: ServingConfig | None
    path: Path
    """The task's folder."""

    @property
    def id(self) -> str:
        return self.task.id


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """One task folder, as ``servegym task list`` shows it (``error`` when it does not load)."""

    id: str
    path: Path
    task: Task | None
    error: str | None


def tasks_dir() -> Path:
    """The shipped tasks folder (``$SERVEGYM_DATA_DIR/tasks`` when that is set)."""
    return data_dir("tasks")


def task_folders(root: Path | None = None) -> list[Path]:
    """Every folder under ``root`` (default: the shipped tasks) holding a ``task.toml``. A
    ``root`` given (``--root``) that is not a folder is refused, not listed as empty."""
    base = root if root is not None else tasks_dir()
    try:
        is_dir = base.is_dir()
    except OSError as e:
        raise UserError(f"--root: '{quoted(str(base))}': {e.strerror or e}") from None
    if not is_dir:
        if root is not None:
            what = "not a folder" if base.exists() else "no such folder"
            raise UserError(f"--root: {quoted(str(root))}: {what}")
        return []
    return sorted(p.parent for p in base.glob(f"*/{TASK_FILE}"))


def task_ids(root: Path | None = None) -> list[str]:
    """The ids (folder names) of the tasks under ``root``, sorted."""
    return [p.name for p in task_folders(root)]


def list_tasks(root: Path | None = None) -> list[TaskInfo]:
    """Every task under ``root``, loaded; one that fails to load is listed with its error."""
    infos: list[TaskInfo] = []
    for folder in task_folders(root):
        try:
            loaded = load_task_folder(folder)
        except UserError as e:
            infos.append(TaskInfo(folder.name, folder, None, e.message))
            continue
        infos.append(TaskInfo(folder.name, folder, loaded.task, None))
    return infos


def resolve_task_folder(
    id_or_path: str | Path, root: Path | None = None, flag: str = "--task"
) -> Path:
    """The folder of a task named by id (under ``root``) or by a path to it or its task.toml."""
    text = str(id_or_path)
    base = root if root is not None else tasks_dir()
    looks_like_path = isinstance(id_or_path, Path) or "/" in text or "\\" in text
    try:
        p = Path(text).expanduser()
        if not looks_like_path and (base / text / TASK_FILE).is_file():
            return base / text
        if p.is_file() and p.name == TASK_FILE:
            return p.parent
        if p.is_dir() and (p / TASK_FILE).is_file():
            return p
    except (OSError, RuntimeError) as e:  # a name too long for the file system, ...
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise UserError(f"{flag}: '{quoted(text)}': {why}") from None
    if looks_like_path:
        raise UserError(
            f"{flag}: no task at {quoted(text)} (expected a folder holding {TASK_FILE})"
        )
    known = task_ids(root)
    listing = ", ".join(known) if known else f"none in {base}"
    raise UserError(f"{flag}: unknown task '{quoted(text)}' (known: {listing})")


def task_file(folder: Path, name: str) -> Path:
    """``folder / name``, refused in one line when it resolves outside ``folder`` (a
    symlink out) or is not a regular file (a folder is left to the reader to name; a FIFO
    or a device would hang or never end)."""
    path = folder / name
    if not path.is_symlink() and not path.exists():
        return path  # missing: the reader says so
    if not inside(path, folder):
        try:
            target = str(path.resolve())
        except (OSError, RuntimeError):
            target = "a path that does not resolve"
        raise UserError(
            f"{path}: resolves outside the task's folder (to {quoted(target)}); every file "
            "of a task must lie inside its folder"
        )
    if path.exists() and not path.is_file() and not path.is_dir():
        raise UserError(f"{path}: not a regular file")
    return path


def load_task_file(path: Path) -> Task:
    """Read and validate one ``task.toml`` (schema only; :func:`load_task_folder` also
    confines it to its folder)."""
    raw = read_toml(path)
    try:
        return Task.model_validate(raw)
    except ValidationError as e:
        raise UserError(validation_message(e, str(path), (), "the task")) from None


def load_oracle(path: Path) -> ServingConfig:
    """Read and validate an ``oracle.toml`` (a ServingConfig)."""
    raw = read_toml(path)
    try:
        return ServingConfig.model_validate(raw)
    except ValidationError as e:
        raise UserError(validation_message(e, str(path), (), "the config")) from None


def workload_spec(loaded: LoadedTask, *, requests: int | None = None) -> tuple[WorkloadSpec, Path]:
    """The task's workload spec (overrides, request count and scale applied) and the folder
    a relative trace path is read from; ``requests`` replaces the task's request count (a
    quick experiment's). Errors name ``task.toml`` and ``workload``."""
    from servegym.workloads.registry import is_workload_path, load_spec, workloads_dir
    from servegym.workloads.trace import resolve_path

    ref = loaded.task.workload
    where = loaded.path / TASK_FILE
    name = ref.name
    if is_workload_path(name) or name.startswith("~"):
        p = Path(name)
        if p.is_absolute() or name.startswith("~"):
            raise UserError(
                f"{where}: workload.name: '{quoted(name)}' is an absolute path; name a "
                "shipped workload or a file inside the task's folder"
            )
        if not inside(loaded.path / p, loaded.path):
            raise UserError(
                f"{where}: workload.name: '{quoted(name)}' resolves outside the task's "
                "folder; a task's workload file must lie inside it"
            )
        name, root, root_name = str(loaded.path / p), loaded.path, "the task's folder"
    else:
        root, root_name = workloads_dir(), "the shipped workloads folder"
    try:
        count = requests if requests is not None else ref.requests
        spec, base_dir = load_spec(
            name, ref.overrides, requests=count, scale=ref.scale, flag="workload.overrides"
        )
    except UserError as e:
        raise UserError(f"{where}: workload: {e.message}") from None
    if spec.trace is not None and not inside(resolve_path(spec.trace, base_dir), root):
        raise UserError(
            f"{where}: workload: trace.path '{quoted(spec.trace.path)}' resolves outside "
            f"{root_name}; a task's trace must lie inside it"
        )
    return spec, base_dir


def _check_references(loaded: LoadedTask) -> None:
    """A sim task's model, hardware and workload must exist."""
    from servegym.engines.sim.profiles import get_engine, get_hardware, get_model

    task = loaded.task
    where = loaded.path / TASK_FILE
    if task.traits.simulated:
        try:
            get_model(task.model, "model")
            get_hardware(task.hardware, "hardware")
            get_engine(task.sim_engine, "sim_engine")
        except UserError as e:
            raise UserError(f"{where}: {e.message}") from None
    workload_spec(loaded)


def load_task_folder(folder: Path) -> LoadedTask:
    """Load the task in ``folder`` (see the module docstring for what is checked)."""
    spec_file = task_file(folder, TASK_FILE)
    task = load_task_file(spec_file)
    if task.id != folder.name:
        raise UserError(
            f"{spec_file}: bad value for 'id': '{task.id}' must equal the folder name "
            f"'{folder.name}'"
        )
    instruction_file = task_file(folder, INSTRUCTION_FILE)
    try:
        instruction = instruction_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(
            f"{instruction_file}: missing (every task needs the instruction shown to the agent)"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{instruction_file}: cannot read ({e})") from None
    if not instruction.strip():
        raise UserError(f"{instruction_file}: empty (the agent needs an instruction)")
    oracle_file = task_file(folder, ORACLE_FILE)
    oracle = load_oracle(oracle_file) if oracle_file.is_file() else None
    loaded = LoadedTask(task=task, instruction=instruction, oracle=oracle, path=folder)
    _check_references(loaded)
    return loaded


def load_task(id_or_path: str | Path, root: Path | None = None, flag: str = "--task") -> LoadedTask:
    """Load a task by id (under ``root``, default the shipped tasks) or by path."""
    return load_task_folder(resolve_task_folder(id_or_path, root, flag))
