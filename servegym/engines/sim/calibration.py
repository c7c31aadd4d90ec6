"""Published reference measurements the simulator is compared against (``calibration.toml``).

Each point is one figure someone measured on real hardware and published, with the setting
needed to reproduce it in the simulator: model and hardware profile ids, tensor parallel
size, weight format, engine, the workload (lengths, prompts, arrival) and the engine knobs
that were set. ``benchmarks/sim_calibration.py`` simulates every point marked ``simulable``
and writes the published-vs-simulated table of ``docs/simulator.md``.

Where a source gives natural (dataset) lengths rather than fixed ones, a point may carry
*stand-in* lengths (``stand_in_input_tokens`` / ``stand_in_output_tokens``): fixed lengths the
simulation uses instead, chosen where the published figure hardly depends on them (batch-1
throughput, where prefill is a few percent of the time) and marked as judgment in the notes.

A *ratio* (``[[ratio]]``) compares two points through the ratio of their figures when
neither can be simulated on its own but both were measured on the same workload: both
settings are simulated on the same stand-in workload, and the simulated ratio is compared
with the published one. Either the dataset's lengths are unknown (the stand-in is judgment,
and its prompt length can be varied, ``sensitivity_input_tokens``, to show how little the
ratio depends on it), or the workload is published but the absolute figures carry a cost the
model does not price (an old engine version's host work, one machine's CPU), which the ratio
of two GPUs measured by the same harness cancels (``published_workload``: the stand-in is the
published workload itself).
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from servegym.engines.config import ServingConfig
from servegym.engines.sim.profiles import WeightFormat, hardware_profiles, model_profiles
from servegym.errors import UserError

CALIBRATION_FILE = Path(__file__).resolve().parent / "calibration.toml"

Engine = Literal["vllm", "sglang", "tensorrt-llm"]
Metric = Literal[
    "output_throughput",  # generated tokens per second, all GPUs together
    "total_throughput",  # prompt + generated tokens per second
    "request_throughput",  # requests per second
    "tpot_ms",  # mean time per output token after the first
    "ttft_ms",  # mean time to first token
    "itl_ms",  # mean inter-token latency
    "itl_median_ms",  # median inter-token latency (in a long run: one decode step's time)
    "ttft_median_ms",  # median time to first token
    "e2e_ms",  # mean request latency, send to last token
]
Arrival = Literal["offline", "concurrency", "poisson", "mlperf-server"]
Regime = Literal["memory-bound", "compute-bound", "mixed"]


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CalibrationWorkload(_Data):
    """What was sent: lengths, how many, how they arrived."""

    dataset: str = Field(description="'random' (fixed lengths), 'MT-Bench', 'CNN-DailyMail' ...")
    input_tokens: int | None = Field(
        default=None, ge=1, description="prompt tokens per request; None: natural lengths"
    )
    output_tokens: int | None = Field(
        default=None, ge=1, description="generated tokens per request (forced or capped)"
    )
    output_is_cap: bool = Field(
        default=False, description="output_tokens is max_tokens; replies may stop earlier"
    )
    num_prompts: int | None = Field(default=None, ge=1)
    arrival: Arrival
    concurrency: int | None = Field(
        default=None, ge=1, description="closed-loop concurrency (1 = one request at a time)"
    )
    rate: float | None = Field(default=None, gt=0, description="requests/s (poisson, server)")
    range_ratio: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="lengths drawn uniformly from [(1 - r) L, (1 + r) L] around input_tokens "
        "and output_tokens (vllm bench serve --random-range-ratio); 0: fixed lengths",
    )
    stand_in_input_tokens: int | None = Field(
        default=None,
        ge=1,
        description="fixed prompt length the simulation uses where the source's are natural "
        "lengths (judgment; see the point's notes)",
    )
    stand_in_output_tokens: int | None = Field(
        default=None,
        ge=1,
        description="fixed output length the simulation uses where the source's are natural "
        "(default: output_tokens, i.e. every reply reaches the cap)",
    )

    def simulated_lengths(self) -> tuple[int | None, int | None]:
        """(prompt, output) tokens per request as simulated; None where unknown."""
        inp = self.input_tokens if self.input_tokens is not None else self.stand_in_input_tokens
        out = (
            self.stand_in_output_tokens
            if self.stand_in_output_tokens is not None
            else self.output_tokens
        )
        return inp, out

    @property
    def uses_stand_in(self) -> bool:
        """Whether the simulated lengths are stand-ins rather than the published ones."""
        return (self.input_tokens is None and self.stand_in_input_tokens is not None) or (
            self.stand_in_output_tokens is not None
        )


class CalibrationPoint(_Data):
    """One published measurement and the setting it was taken in."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    source: str = Field(min_length=1, description="title of the publication")
    short_source: str | None = Field(
        default=None, description="a few words naming the source, for tables"
    )
    group: str | None = Field(
        default=None,
        description="the independent source (publisher and measurement campaign) the point "
        "belongs to, for leave-one-source-out checks; default: the short source name",
    )
    url: str = Field(pattern=r"^https?://")
    date: str | None = Field(default=None, description="publication date, YYYY-MM[-DD]")
    model: str = Field(description="model profile id")
    hardware: str = Field(description="hardware profile id")
    tensor_parallel: int = Field(default=1, ge=1)
    weights: WeightFormat = "bf16"
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    engine: Engine
    engine_version: str | None = None
    endpoint: Literal["completions", "chat", "offline"] = Field(
        default="completions",
        description="how requests reached the engine: the OpenAI completions endpoint, the "
        "chat endpoint (chat template rendered by the API server), or offline (LLM.generate)",
    )
    serving: dict[str, int | float | bool | str] = Field(
        default_factory=dict,
        description="ServingConfig knobs the publication set (the rest: engine defaults)",
    )
    workload: CalibrationWorkload
    metric: Metric
    value: float = Field(gt=0, description="the published figure")
    per_gpu: bool = Field(default=False, description="value is per GPU rather than in total")
    regime: Regime
    simulable: bool = Field(
        default=True,
        description="False: the setting cannot be reproduced from the source alone (e.g. "
        "the dataset's length distribution is not published); kept for reference",
    )
    not_simulable_reason: str | None = Field(
        default=None, description="one line: why the point is not simulable"
    )
    notes: str = ""

    @property
    def label(self) -> str:
        """The short source name (``short_source``, else the title up to its first comma)."""
        return self.short_source or self.source.split(",")[0]

    @property
    def source_group(self) -> str:
        """The independent source this point is held out with (``group``, else the label)."""
        return self.group or self.label

    @property
    def engine_profile(self) -> str:
        """The simulated engine profile for this point: TensorRT-LLM's own; vLLM for vLLM and
        for SGLang (the same kind of scheduler and kernels; one SGLang point is too few to
        fit a profile of its own)."""
        return "tensorrt-llm" if self.engine == "tensorrt-llm" else "vllm"

    @field_validator("serving")
    @classmethod
    def _serving_knobs(
        cls, v: dict[str, int | float | bool | str]
    ) -> dict[str, int | float | bool | str]:
        ServingConfig.model_validate(v)
        return v

    def serving_config(self) -> ServingConfig:
        """The knobs as a ServingConfig (tensor parallel and quantization included)."""
        knobs: dict[str, object] = dict(self.serving)
        knobs.setdefault("tensor_parallel_size", self.tensor_parallel)
        if self.weights != "bf16":
            knobs.setdefault("quantization", self.weights)
        if self.kv_cache_dtype == "fp8":
            knobs.setdefault("kv_cache_dtype", "fp8")
        return ServingConfig.model_validate(knobs)


class CalibrationRatio(_Data):
    """The ratio of two published figures measured on the same (unreproducible) workload,
    checked by simulating both settings on one stand-in workload."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    numerator: str = Field(description="calibration point id")
    denominator: str = Field(description="calibration point id")
    stand_in: CalibrationWorkload = Field(
        description="the workload both settings are simulated on (fixed lengths)"
    )
    published_workload: bool = Field(
        default=False,
        description="the stand-in is the published workload itself (the ratio stands in for "
        "absolute figures the model cannot reproduce, not for unknown lengths)",
    )
    sensitivity_input_tokens: list[int] = Field(
        default_factory=list,
        description="other stand-in prompt lengths to simulate, to show the ratio's spread",
    )
    group: str | None = Field(
        default=None,
        description="the independent source the ratio belongs to, for the fit's per-source "
        "weights and leave-one-source-out checks; default: the ratio's own id",
    )
    notes: str = ""

    @property
    def source_group(self) -> str:
        """The independent source this ratio is held out with (``group``, else its id)."""
        return self.group or self.id


class _CalibrationFile(_Data):
    point: list[CalibrationPoint]
    ratio: list[CalibrationRatio] = Field(default_factory=list)


def load_calibration(path: Path | None = None) -> list[CalibrationPoint]:
    """Read and check ``calibration.toml``: schema, unique ids, known model/hardware ids."""
    path = path or CALIBRATION_FILE
    return list(_load(path)[0])


def load_ratios(path: Path | None = None) -> list[CalibrationRatio]:
    """The ``[[ratio]]`` checks of ``calibration.toml`` (their point ids checked to exist)."""
    path = path or CALIBRATION_FILE
    return list(_load(path)[1])


@cache
def _load(path: Path) -> tuple[tuple[CalibrationPoint, ...], tuple[CalibrationRatio, ...]]:
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"{path}: no such calibration file") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: malformed TOML: {e}") from None
    try:
        data = _CalibrationFile.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise UserError(f"{path}: field '{loc}': {err['msg']}") from None
    points = data.point
    models, hardware = model_profiles(), hardware_profiles()
    seen: set[str] = set()
    for p in points:
        if p.id in seen:
            raise UserError(f"{path}: duplicate calibration point id '{p.id}'")
        seen.add(p.id)
        if p.model not in models:
            raise UserError(f"{path}: point '{p.id}': unknown model '{p.model}'")
        if p.hardware not in hardware:
            raise UserError(f"{path}: point '{p.id}': unknown hardware '{p.hardware}'")
    for r in data.ratio:
        for ref in (r.numerator, r.denominator):
            if ref not in seen:
                raise UserError(f"{path}: ratio '{r.id}': unknown calibration point '{ref}'")
        if r.stand_in.input_tokens is None or r.stand_in.output_tokens is None:
            raise UserError(f"{path}: ratio '{r.id}': the stand-in needs fixed lengths")
    return tuple(points), tuple(data.ratio)
