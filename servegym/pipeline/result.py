"""What a pipeline run measured, and the Amdahl arithmetic that reads it.

A pipeline answers *tasks* (questions). Each task passes through the stages in
:data:`STAGES`; the sufficiency check may send it round the retrieval loop (decompose is done
once, embed / retrieve / rerank / grade once per round, answer once), and those repeated
rounds are counted in the stage times of the repeated stages, so there is no separate
"sufficiency" stage.

:class:`PipelineResult` (schema ``servegym.pipeline/1``, written as ``pipeline.json`` next to
a trial's ``trial.json``) holds the per-task records (latency, rounds, seconds per stage), the
totals per stage, the two index metrics MLPerf's RAG benchmark reports (index build rate in
documents/s and answering rate in tasks/s), the per-task latency percentiles and, where the
track measures it, retrieval recall@k.

The Amdahl functions take *stage shares* (each stage's fraction of the time, summing to 1):

- :func:`speedup_if`: the whole pipeline's speed-up if one stage alone were ``s`` times
  faster, ``1 / ((1 - p) + p / s)``;
- :func:`amdahl_ceiling`: the same with the stage free, ``1 / (1 - p)``;
- :func:`pipeline_speedup`: the speed-up given a factor per stage (stages not named keep
  factor 1), ``1 / sum(p_i / s_i)``.

MLPerf Inference v6.1's write-up: answer generation at share 0.68 made 3x faster speeds the
pipeline up ``1 / (0.32 + 0.68 / 3) = 1.83x``; free, ``1 / 0.32 = 3.1x``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from servegym.errors import UserError

Stage = Literal["decompose", "embed", "retrieve", "rerank", "grade", "answer"]

STAGES: tuple[Stage, ...] = ("decompose", "embed", "retrieve", "rerank", "grade", "answer")
"""The pipeline's stages, in the order a task passes through them."""

SCHEMA: Literal["servegym.pipeline/1"] = "servegym.pipeline/1"
AMDAHL_FACTORS: tuple[float, ...] = (2.0, 3.0, 4.0, 10.0)
"""The per-stage speed-ups the Amdahl table shows (and the ceiling, the stage free)."""


def _check_stage_times(value: dict[str, float]) -> dict[str, float]:
    for name, seconds in value.items():
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r} (stages: {', '.join(STAGES)})")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"stage {name!r}: seconds must be finite and >= 0, got {seconds}")
    return {stage: float(value[stage]) for stage in STAGES if stage in value}


class TaskRecord(BaseModel):
    """One pipeline task (question) as measured."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0, description="the task's index in the run")
    latency_s: float = Field(ge=0, description="arrival to answer, seconds")
    rounds: int = Field(ge=1, description="retrieval rounds the sufficiency check ran")
    stage_s: dict[str, float] = Field(
        default_factory=dict, description="seconds this task spent in each stage"
    )

    _stages = field_validator("stage_s")(_check_stage_times)


class LatencyPercentiles(BaseModel):
    """Per-task latency percentiles, seconds."""

    model_config = ConfigDict(extra="forbid")

    p50: float = Field(ge=0)
    p90: float = Field(ge=0)
    p99: float = Field(ge=0)

    @classmethod
    def of(cls, latencies: Sequence[float]) -> LatencyPercentiles:
        """Percentiles of ``latencies`` (linear interpolation, as numpy's default); all 0
        when there are none."""
        if not latencies:
            return cls(p50=0.0, p90=0.0, p99=0.0)
        values = sorted(float(v) for v in latencies)
        return cls(
            p50=_quantile(values, 0.5), p90=_quantile(values, 0.9), p99=_quantile(values, 0.99)
        )


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    weight = position - low
    return sorted_values[low] * (1 - weight) + sorted_values[high] * weight


class PipelineResult(BaseModel):
    """One pipeline run: per-task records, per-stage totals and the pipeline's metrics."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_id: Literal["servegym.pipeline/1"] = Field(default=SCHEMA, alias="schema")
    track: str
    task: str | None = None
    tasks: list[TaskRecord] = Field(default_factory=list)
    stage_totals_s: dict[str, float] = Field(
        description="seconds spent in each stage, summed over tasks"
    )
    wall_s: float = Field(ge=0, description="first arrival to last answer, seconds")
    index_build_docs_per_s: float = Field(ge=0)
    answering_tasks_per_s: float = Field(ge=0)
    latency_s: LatencyPercentiles
    recall_at_k: float | None = Field(default=None, ge=0, le=1)
    k: int | None = Field(default=None, ge=1)

    _totals = field_validator("stage_totals_s")(_check_stage_times)

    @classmethod
    def from_tasks(
        cls,
        *,
        track: str,
        tasks: Sequence[TaskRecord],
        wall_s: float,
        index_build_docs_per_s: float,
        task: str | None = None,
        recall_at_k: float | None = None,
        k: int | None = None,
    ) -> PipelineResult:
        """A result whose totals, answering rate and percentiles are computed from
        ``tasks`` (answering rate: tasks / ``wall_s``)."""
        totals: dict[str, float] = {stage: 0.0 for stage in STAGES}
        for record in tasks:
            for stage, seconds in record.stage_s.items():
                totals[stage] += seconds
        return cls(
            track=track,
            task=task,
            tasks=list(tasks),
            stage_totals_s=totals,
            wall_s=wall_s,
            index_build_docs_per_s=index_build_docs_per_s,
            answering_tasks_per_s=len(tasks) / wall_s if wall_s > 0 else 0.0,
            latency_s=LatencyPercentiles.of([r.latency_s for r in tasks]),
            recall_at_k=recall_at_k,
            k=k,
        )

    def stage_shares(self) -> dict[str, float]:
        """Each stage's fraction of the summed stage time (all stages, summing to 1; all 0
        when no stage took any time)."""
        return stage_shares(self.stage_totals_s)

    def speedup_if(self, stage: str, factor: float) -> float:
        """The pipeline's speed-up if ``stage`` alone were ``factor`` times faster."""
        return speedup_if(self.stage_shares(), stage, factor)

    def ceiling(self, stage: str) -> float:
        """The pipeline's speed-up if ``stage`` took no time at all."""
        return amdahl_ceiling(self.stage_shares(), stage)

    def amdahl_rows(self, factors: Iterable[float] = AMDAHL_FACTORS) -> list[AmdahlRow]:
        """One :class:`AmdahlRow` per stage, in :data:`STAGES` order."""
        return amdahl_rows(self.stage_shares(), factors)

    def summary(self) -> dict[str, object]:
        """A compact view for an agent's experiment result (no per-task records)."""
        rounds = [r.rounds for r in self.tasks]
        return {
            "answered": len(self.tasks),
            "answering_tasks_per_s": round(self.answering_tasks_per_s, 4),
            "latency_s": self.latency_s.model_dump(),
            "recall_at_k": self.recall_at_k,
            "k": self.k,
            "mean_rounds": round(sum(rounds) / len(rounds), 3) if rounds else None,
            "index_build_docs_per_s": round(self.index_build_docs_per_s, 1),
            "stage_shares": {k: round(v, 4) for k, v in self.stage_shares().items()},
        }

    def to_json(self) -> str:
        """The JSON written as ``pipeline.json``."""
        return self.model_dump_json(by_alias=True, indent=2) + "\n"

    def write(self, path: Path) -> None:
        """Write :meth:`to_json` to ``path``."""
        path.write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> PipelineResult:
        """Read a ``pipeline.json``; a missing, malformed or invalid file is a
        :class:`UserError` naming it."""
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise UserError(
                f"{path}: not UTF-8 text (byte {exc.start}); a pipeline result is JSON"
            ) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: not JSON: {exc.msg} (line {exc.lineno})") from None
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top level)"
            raise UserError(f"{path}: not a pipeline result: {where}: {first['msg']}") from None


class AmdahlRow(BaseModel):
    """One stage's row of the Amdahl table."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    share: float
    speedups: dict[float, float] = Field(description="factor -> whole-pipeline speed-up")
    ceiling: float = Field(description="speed-up with the stage free (inf at share 1)")


def stage_shares(stage_seconds: Mapping[str, float]) -> dict[str, float]:
    """Each stage's fraction of the summed seconds (every stage of :data:`STAGES`)."""
    total = sum(stage_seconds.get(stage, 0.0) for stage in STAGES)
    if total <= 0:
        return {stage: 0.0 for stage in STAGES}
    return {stage: stage_seconds.get(stage, 0.0) / total for stage in STAGES}


def _share(shares: Mapping[str, float], stage: str) -> float:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r} (stages: {', '.join(STAGES)})")
    p = float(shares.get(stage, 0.0))
    if not 0.0 <= p <= 1.0 + 1e-9:
        raise ValueError(f"share of {stage!r} must be in [0, 1], got {p}")
    return min(p, 1.0)


def speedup_if(shares: Mapping[str, float], stage: str, s: float) -> float:
    """Amdahl: the whole pipeline's speed-up if ``stage`` (at its share ``p``) alone were
    ``s`` times faster, ``1 / ((1 - p) + p / s)``."""
    if s <= 0:
        raise ValueError(f"speed-up factor must be > 0, got {s}")
    p = _share(shares, stage)
    return 1.0 / ((1.0 - p) + p / s)


def amdahl_ceiling(shares: Mapping[str, float], stage: str) -> float:
    """Amdahl's ceiling: the speed-up if ``stage`` took no time, ``1 / (1 - p)``
    (infinite when the stage is all the time)."""
    p = _share(shares, stage)
    return math.inf if p >= 1.0 else 1.0 / (1.0 - p)


def pipeline_speedup(shares: Mapping[str, float], factors: Mapping[str, float]) -> float:
    """The whole pipeline's speed-up when each stage ``i`` is ``factors[i]`` times faster
    (stages not in ``factors`` unchanged): ``1 / sum(p_i / s_i)``, over the shares given."""
    for stage, factor in factors.items():
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r} (stages: {', '.join(STAGES)})")
        if factor <= 0:
            raise ValueError(f"speed-up factor of {stage!r} must be > 0, got {factor}")
    total = sum(_share(shares, stage) for stage in STAGES)
    if total <= 0:
        return 1.0
    remaining = sum(_share(shares, stage) / factors.get(stage, 1.0) for stage in STAGES)
    return total / remaining


def amdahl_rows(
    shares: Mapping[str, float], factors: Iterable[float] = AMDAHL_FACTORS
) -> list[AmdahlRow]:
    """The Amdahl table: per stage, its share, the speed-up at each factor and the ceiling."""
    factor_list = [float(f) for f in factors]
    return [
        AmdahlRow(
            stage=stage,
            share=_share(shares, stage),
            speedups={f: speedup_if(shares, stage, f) for f in factor_list},
            ceiling=amdahl_ceiling(shares, stage),
        )
        for stage in STAGES
    ]
