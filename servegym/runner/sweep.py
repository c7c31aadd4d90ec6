"""Sweeps: many trials (tasks x agents x seeds) into one run folder, resumable.

``servegym sweep --tasks PATTERN[,PATTERN...] --agents A,B --seeds N --out RUN_DIR``
expands the grid (:func:`expand_grid`) and runs each trial once through an executor
(:mod:`servegym.runner.executors`). Every trial is an ordinary
:func:`~servegym.runner.trial.run_trial` in ``RUN_DIR/<task>__<agent>__s<seed>/``, so a
finished trial is one whose ``trial.json`` exists (written atomically, last), and a trial
folder without it is a partial trial that is restarted from scratch.

``RUN_DIR/sweep.lock`` holds the sweep's configuration and its hash. Re-running the same
command resumes: finished trials (a readable ``trial.json``) are skipped, partial ones (and
ones whose ``trial.json`` is unreadable) restarted. A different configuration against the
same folder is refused with one line saying what differs. The lock is written before any
trial starts, so a sweep killed at any moment (SIGKILL of the driver included) resumes
under the same lock. Nothing finished is ever run again.

One driver at a time: :func:`hold_run_dir` holds ``RUN_DIR/.sweep-driver.lock`` (a kernel
lock, :func:`servegym.run_folder.hold_lock`) for the whole sweep, so a second driver (or a
standalone ``run``) on the same folder is refused in one line (exit 2) while the first
lives, and takes over at once from one that was killed.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servegym.agents.base import make_agent
from servegym.errors import UserError
from servegym.run_folder import make_folder, write_text_atomic
from servegym.runner import folders
from servegym.runner.trial import finished_trial
from servegym.tasks.loader import list_tasks, load_task

LOCK_FILE = "sweep.lock"
DRIVER_LOCK = folders.DRIVER_LOCK
SWEEP_SCHEMA = "servegym.sweep/1"

Track = str


class TrialSpec(BaseModel):
    """One cell of the grid."""

    model_config = ConfigDict(frozen=True)

    task: str
    agent: str
    seed: int
    track: Track

    @property
    def key(self) -> str:
        return f"{self.task}__{self.agent}__s{self.seed}"


class SweepConfig(BaseModel):
    """What a sweep runs: the part of the command that decides its results. The executor
    and the concurrency do not (a sim trial is deterministic by seed wherever it runs), so
    a sweep may be resumed with another of either."""

    model_config = ConfigDict(extra="forbid")

    schema_: str = Field(default=SWEEP_SCHEMA, alias="schema")
    tasks: list[str] = Field(description="the task ids the patterns matched, sorted")
    agents: list[str]
    seeds: list[int]
    agent_options: dict[str, Any] = Field(default_factory=dict)
    tasks_root: str | None = None

    def digest(self) -> str:
        text = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def grid(self, tracks: dict[str, Track]) -> list[TrialSpec]:
        """Every trial, task-major (all agents and seeds of a task together)."""
        return [
            TrialSpec(task=t, agent=a, seed=s, track=tracks[t])
            for t in self.tasks
            for s in self.seeds
            for a in self.agents
        ]


class SweepLock(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hash: str
    config: SweepConfig


def match_tasks(
    patterns: Sequence[str], root: Path | None = None, track: Track | None = None
) -> tuple[list[str], dict[str, Track]]:
    """The task ids matching any of ``patterns`` (shell globs over ids), optionally of one
    track; a pattern that matches nothing is an error naming it."""
    infos = {i.id: i for i in list_tasks(root)}
    tracks: dict[str, Track] = {
        tid: info.task.track for tid, info in infos.items() if info.task is not None
    }
    chosen: set[str] = set()
    for pattern in patterns:
        hits = [tid for tid in infos if fnmatch.fnmatchcase(tid, pattern)]
        for tid in hits:
            if infos[tid].task is None:
                raise UserError(f"--tasks: task {tid} does not load: {infos[tid].error}")
        if track is not None:
            hits = [tid for tid in hits if tracks[tid] == track]
        if not hits:
            where = f" on the {track} track" if track else ""
            raise UserError(f"--tasks: '{pattern}' matches no task{where} (see servegym task list)")
        chosen.update(hits)
    ids = sorted(chosen)
    return ids, {tid: tracks[tid] for tid in ids}


def build_config(
    task_patterns: Sequence[str],
    agents: Sequence[str],
    seeds: int,
    *,
    track: Track | None = None,
    agent_options: dict[str, Any] | None = None,
    tasks_root: Path | None = None,
) -> tuple[SweepConfig, dict[str, Track]]:
    """Check everything a sweep needs before it starts (tasks load, agents exist)."""
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    names = [a.strip() for a in agents if a.strip()]
    if not names:
        raise UserError("--agents: name at least one agent")
    if len(set(names)) != len(names):
        raise UserError("--agents: an agent is named twice")
    patterns = [p.strip() for p in task_patterns if p.strip()]
    if not patterns:  # else: an empty sweep that claims its folder and exits 0
        raise UserError("--tasks: name at least one task id or pattern (e.g. '*')")
    ids, tracks = match_tasks(patterns, tasks_root, track)
    for tid in ids:
        load_task(tid, tasks_root)  # a broken task file fails here, not mid-sweep
    for name in names:
        try:
            make_agent(name, **(agent_options or {}))
        except UserError as e:
            raise UserError(e.message.replace("--agent:", "--agents:", 1)) from None
    config = SweepConfig(
        tasks=ids,
        agents=names,
        seeds=list(range(seeds)),
        agent_options={
            k: str(v) if isinstance(v, Path) else v for k, v in (agent_options or {}).items()
        },
        tasks_root=str(tasks_root) if tasks_root is not None else None,
    )
    return config, tracks


def _differences(old: SweepConfig, new: SweepConfig) -> str:
    parts = []
    for field in ("tasks", "agents", "seeds", "agent_options", "tasks_root"):
        a, b = getattr(old, field), getattr(new, field)
        if a != b:
            if isinstance(a, list) and isinstance(b, list):
                gone = [x for x in a if x not in b]
                added = [x for x in b if x not in a]
                bits = []
                if added:
                    bits.append(f"adds {', '.join(map(str, added))}")
                if gone:
                    bits.append(f"drops {', '.join(map(str, gone))}")
                parts.append(f"{field} ({'; '.join(bits) or 'reordered'})")
            else:
                parts.append(f"{field} ({a!r} -> {b!r})")
    return ", ".join(parts) or "the configuration schema"


def claim_run_dir(out: Path, config: SweepConfig) -> bool:
    """Write ``out/sweep.lock`` for ``config``, or check the one there; returns whether the
    sweep resumes an earlier one. A different configuration raises :class:`UserError`."""
    lock_path = out / LOCK_FILE
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a folder")
    if lock_path.exists():
        try:
            lock = SweepLock.model_validate_json(lock_path.read_text())
        except (OSError, ValueError, ValidationError):
            raise UserError(
                f"--out: {lock_path} is unreadable; remove it only if no sweep uses this folder"
            ) from None
        if lock.hash != config.digest():
            raise UserError(
                f"--out: {out} holds another sweep; this one differs in "
                f"{_differences(lock.config, config)} (use another --out, or the same command)"
            )
        return True
    make_folder(out)
    lock = SweepLock(hash=config.digest(), config=config)
    write_text_atomic(lock_path, lock.model_dump_json(indent=2, by_alias=True))
    return False


def is_finished(out: Path, spec: TrialSpec) -> bool:
    """Whether the trial has a readable ``trial.json`` (an unreadable one is run again)."""
    return finished_trial(out, spec.task, spec.agent, spec.seed) is not None


@contextlib.contextmanager
def hold_run_dir(out: Path) -> Iterator[None]:
    """Be the one sweep driver of ``out`` for the block (see the module docstring)."""
    with folders.hold_run_dir(out, shared=False):
        yield
