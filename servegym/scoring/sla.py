"""Service-level objectives and prices: the two inputs that turn latencies into goodput and cost.

``SLA`` is what a task's objective or the ``--sla`` flag sets; ``Price`` is what
``--price-per-hour`` and ``--gpus`` (or a task's hardware profile) set. Both are echoed in
``metrics.json`` so a result says what it was scored against.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servegym.errors import UserError

_SLA_EXAMPLE = "ttft_ms=200,tpot_ms=50"


class SLA(BaseModel):
    """Per-request latency objectives, in milliseconds; an unset one is not checked.

    A request meets the SLA when it completed and each given objective holds with ``<=``
    (a request exactly at the limit meets it, as in vLLM's ``--goodput``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    ttft_ms: float | None = Field(default=None, gt=0, description="time to first token limit")
    tpot_ms: float | None = Field(default=None, gt=0, description="time per output token limit")
    e2e_ms: float | None = Field(default=None, gt=0, description="end-to-end latency limit")

    @property
    def is_empty(self) -> bool:
        """True when no objective is set (such an SLA constrains nothing)."""
        return self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None

    def to_flag(self) -> str:
        """The ``--sla`` flag form of this SLA (``SLA.parse(s.to_flag()) == s``)."""
        return ",".join(
            f"{key}={value:g}" for key, value in self.model_dump().items() if value is not None
        )

    @classmethod
    def parse(cls, text: str) -> SLA:
        """Parse the ``--sla`` flag form, e.g. ``"ttft_ms=200,tpot_ms=50"``.

        Parts are comma-separated ``KEY=VALUE`` pairs; keys are ``ttft_ms``, ``tpot_ms`` and
        ``e2e_ms``, values positive finite numbers of milliseconds, each key at most once.
        Raises :class:`UserError` naming ``--sla`` and the part at fault.
        """
        keys = tuple(cls.model_fields)
        parts = [p.strip() for p in text.split(",")]
        if not any(parts):
            raise UserError(f"--sla: no objectives given (expected e.g. '{_SLA_EXAMPLE}')")
        values: dict[str, float] = {}
        for part in parts:
            if not part:
                raise UserError(f"--sla: empty part in '{text}' (expected e.g. '{_SLA_EXAMPLE}')")
            key, sep, raw = (s.strip() for s in part.partition("="))
            if not sep:
                raise UserError(
                    f"--sla: bad part '{part}': expected KEY=VALUE, e.g. '{_SLA_EXAMPLE}'"
                )
            if key not in keys:
                raise UserError(
                    f"--sla: bad part '{part}': unknown key '{key}' (known: {', '.join(keys)})"
                )
            if key in values:
                raise UserError(f"--sla: bad part '{part}': '{key}' given more than once")
            try:
                value = float(raw)
            except ValueError:
                raise UserError(
                    f"--sla: bad part '{part}': '{raw}' is not a number of milliseconds"
                ) from None
            if not math.isfinite(value) or value <= 0:
                raise UserError(f"--sla: bad part '{part}': the limit must be a positive number")
            values[key] = value
        try:
            return cls(**values)
        except ValidationError as exc:  # pragma: no cover - the checks above catch it first
            raise UserError(f"--sla: {exc.errors()[0]['msg']}") from None


class Price(BaseModel):
    """What the measured server costs to run: a price per GPU-hour and the GPUs it used."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    price_per_hour: float = Field(ge=0, description="dollars per GPU per hour")
    gpus: int = Field(default=1, ge=1, description="GPUs the server occupies")
