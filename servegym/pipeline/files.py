"""Where a trial keeps its pipeline results, and finding one from what a user names.

Beside ``trial.json`` a pipeline task's trial writes ``pipeline.json`` (the submission's
first scoring run, a :class:`~servegym.pipeline.result.PipelineResult`) and
``pipeline_baseline.json`` (the baseline's run of the same pair); each only when that side
was measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from servegym.errors import UserError
from servegym.paths import quoted
from servegym.pipeline.result import PipelineResult
from servegym.run_folder import TRIAL_FILE, write_atomic
from servegym.scoring.objectives import ObjectiveMeasurement

PIPELINE_FILE = "pipeline.json"
PIPELINE_BASELINE_FILE = "pipeline_baseline.json"


def write_pipeline_files(
    folder: Path,
    pairs: Sequence[tuple[ObjectiveMeasurement, ObjectiveMeasurement | None]],
) -> list[Path]:
    """Write the first pair's pipeline results (atomically); nothing for other tasks."""
    if not pairs:
        return []
    written: list[Path] = []
    baseline, submission = pairs[0]
    for name, m in ((PIPELINE_BASELINE_FILE, baseline), (PIPELINE_FILE, submission)):
        if m is not None and m.pipeline is not None:
            path = folder / name
            write_atomic(path, m.pipeline.to_json())
            written.append(path)
    return written


def resolve_result(target: Path, *, baseline: bool = False) -> Path:
    """The pipeline result file ``target`` names: the file itself, or in a trial folder
    (or beside its ``trial.json``) ``pipeline.json`` (``pipeline_baseline.json`` with
    ``baseline``). A missing file is a :class:`UserError` naming it."""
    name = PIPELINE_BASELINE_FILE if baseline else PIPELINE_FILE
    try:
        is_dir = target.is_dir()
    except OSError as e:  # a name too long for the file system, ...
        raise UserError(f"{quoted(str(target))}: {e.strerror or e}") from None
    if is_dir:
        path = target / name
    elif target.name == TRIAL_FILE:
        path = target.parent / name
    else:
        if baseline:
            raise UserError(f"{target}: --baseline takes a trial folder or its {TRIAL_FILE}")
        path = target
    if not path.is_file():
        where = f"{path}: no such file"
        if path.name in (PIPELINE_FILE, PIPELINE_BASELINE_FILE):
            where += " (a pipeline task's trial writes it beside trial.json)"
        raise UserError(where)
    return path


def load_result(target: Path, *, baseline: bool = False) -> tuple[Path, PipelineResult]:
    """:func:`resolve_result`, read and validated."""
    path = resolve_result(target, baseline=baseline)
    return path, PipelineResult.load(path)
