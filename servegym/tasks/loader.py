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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from servegym.engines.config import ServingConfig
from servegym.errors import UserError
from servegym.overrides import validation_message
from servegym.paths import data_dir
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
    """Every folder under ``root`` (default: the shipped tasks) holding a ``task.toml``."""
    base = root if root is not None else tasks_dir()
    if not base.is_dir():
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
    p = Path(text).expanduser()
    base = root if root is not None else tasks_dir()
    looks_like_path = isinstance(id_or_path, Path) or "/" in text or "\\" in text
    if not looks_like_path and (base / text / TASK_FILE).is_file():
        return base / text
    if p.is_file() and p.name == TASK_FILE:
        return p.parent
    if p.is_dir() and (p / TASK_FILE).is_file():
        return p
    if looks_like_path:
        raise UserError(f"{flag}: no task at {text} (expected a folder holding {TASK_FILE})")
    known = task_ids(root)
    listing = ", ".join(known) if known else f"none in {base}"
    raise UserError(f"{flag}: unknown task '{text}' (known: {listing})")


def load_task_file(path: Path) -> Task:
    """Read and validate one ``task.toml`` (schema only)."""
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
    from servegym.workloads.registry import load_spec

    ref = loaded.task.workload
    name = ref.name
    p = Path(name)
    if (p.suffix == ".toml" or "/" in name) and not p.is_absolute():
        name = str(loaded.path / p)
    try:
        count = requests if requests is not None else ref.requests
        return load_spec(name, ref.overrides, requests=count, scale=ref.scale)
    except UserError as e:
        raise UserError(f"{loaded.path / TASK_FILE}: workload: {e.message}") from None


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
    task_file = folder / TASK_FILE
    task = load_task_file(task_file)
    if task.id != folder.name:
        raise UserError(
            f"{task_file}: bad value for 'id': '{task.id}' must equal the folder name "
            f"'{folder.name}'"
        )
    instruction_file = folder / INSTRUCTION_FILE
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
    oracle_file = folder / ORACLE_FILE
    oracle = load_oracle(oracle_file) if oracle_file.is_file() else None
    loaded = LoadedTask(task=task, instruction=instruction, oracle=oracle, path=folder)
    _check_references(loaded)
    return loaded


def load_task(id_or_path: str | Path, root: Path | None = None, flag: str = "--task") -> LoadedTask:
    """Load a task by id (under ``root``, default the shipped tasks) or by path."""
    return load_task_folder(resolve_task_folder(id_or_path, root, flag))
