"""Published reference measurements the simulator is compared against (``calibration.toml``).

Each point is one figure someone measured on real hardware and published, with the setting
needed to reproduce it in the simulator: model and hardware profile ids, tensor parallel
size, weight format, engine, the workload (lengths, prompts, arrival) and the engine knobs
that were set. ``benchmarks/sim_calibration.py`` simulates every point marked ``simulable``
and writes the published-vs-simulated table of ``docs/simulator.md``.
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


class CalibrationPoint(_Data):
    """One published measurement and the setting it was taken in."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    source: str = Field(min_length=1, description="title of the publication")
    url: str = Field(pattern=r"^https?://")
    date: str | None = Field(default=None, description="publication date, YYYY-MM[-DD]")
    model: str = Field(description="model profile id")
    hardware: str = Field(description="hardware profile id")
    tensor_parallel: int = Field(default=1, ge=1)
    weights: WeightFormat = "bf16"
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    engine: Engine
    engine_version: str | None = None
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
    notes: str = ""

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


class _CalibrationFile(_Data):
    point: list[CalibrationPoint]


def load_calibration(path: Path | None = None) -> list[CalibrationPoint]:
    """Read and check ``calibration.toml``: schema, unique ids, known model/hardware ids."""
    path = path or CALIBRATION_FILE
    return list(_load(path))


@cache
def _load(path: Path) -> tuple[CalibrationPoint, ...]:
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"{path}: no such calibration file") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: malformed TOML: {e}") from None
    try:
        points = _CalibrationFile.model_validate(raw).point
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise UserError(f"{path}: field '{loc}': {err['msg']}") from None
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
    return tuple(points)
