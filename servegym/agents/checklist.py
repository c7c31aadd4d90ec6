"""The ``checklist`` baseline: the generic wins a non-reasoning agent would try, in order.

It reads nothing of the task but its search space (``agents/search_spaces/<engine>.toml``,
made concrete for the task's model and GPUs) and the accuracy gate, and never looks at the
workload or the objective. First it measures the baseline and then each generic move on its
own, laid over the baseline (:data:`MOVES`, each choice the space offers):

1. quantized weights, at every precision the space lists (a precision the hardware lacks
   fails to launch and is dropped);
2. an fp8 KV cache;
3. prefix caching on; chunked prefill on;
4. speculation: every preset (n-gram, draft model, EAGLE, EAGLE-3) the model has;
5. larger batch limits (``max_num_seqs`` and ``max_num_batched_tokens`` at the larger
   values of :data:`LARGER`, within the space's range);
6. tensor parallelism at every size the task's GPUs allow.

Then it combines them greedily: the best option of every move that beat the baseline, best
move first, each kept only when the combination measures better than without it. It keeps
what helps on the dev workload within the budget (a move below the accuracy gate, or one
that fails, counts as no help) and submits the best config it measured, as the search
baselines do (:class:`~servegym.agents.baselines.Tracker`). There is no randomness: for a
trial seed its experiments and submission are fixed. It is the bar an agent must clear to
show reasoning: ``servegym task validate`` fails a task where it reaches 90% of the oracle.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servegym.agents.base import AgentBase, TaskDescription, TaskEnvironment, register_agent
from servegym.agents.baselines import FAILED_SCORE, Tracker, _Stop, start_search
from servegym.agents.search_space import (
    SPECULATIVE_KNOB,
    SPECULATIVE_OFF,
    TP_KNOB,
    IllegalConfig,
    Params,
    Scalar,
    SearchSpace,
)
from servegym.engines.config import ServingConfig

log = logging.getLogger(__name__)

LARGER: dict[str, tuple[int, ...]] = {
    "max_num_seqs": (512, 1024),
    "max_num_batched_tokens": (16384, 65536),
}
"""The batch limits the checklist tries (those inside the space's range)."""


@dataclass(frozen=True, slots=True)
class Move:
    """One generic move: its name and the knob settings it may take (tried one by one)."""

    name: str
    options: tuple[Params, ...]


def _choices(space: SearchSpace, knob: str) -> list[Scalar]:
    spec = space.knobs.get(knob)
    return list(spec.choices) if spec is not None and spec.choices is not None else []


def _number(value: Scalar | None) -> float:
    """A numeric knob value (0 when unset or not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value)


def _in_range(space: SearchSpace, knob: str, values: tuple[int, ...]) -> list[int]:
    spec = space.knobs.get(knob)
    if spec is None or spec.low is None or spec.high is None:
        return []
    return [v for v in values if spec.low <= v <= spec.high]


def _parse(text: str) -> Scalar:
    """A knob default as :class:`~servegym.engines.knob_info.KnobInfo` states it."""
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    try:
        return int(text)
    except ValueError:
        return text


def effective_baseline(desc: TaskDescription) -> dict[str, Scalar | None]:
    """The baseline's knob values with the engine's defaults where the baseline sets none
    (so a move that only restates a default is not tried)."""
    base: dict[str, Scalar | None] = {k.name: _parse(k.default) for k in desc.knobs}
    for name, value in desc.baseline.items():
        if isinstance(value, bool | int | float | str) or value is None:
            base[name] = value
    return base


def moves(space: SearchSpace, base: Mapping[str, Scalar | None]) -> list[Move]:
    """The checklist for this space and baseline (``base``: knob values, see
    :func:`effective_baseline`), in the order it is tried; a move whose knob the space lacks,
    or whose every option is the baseline's value, is left out."""

    def differs(knob: str, value: Scalar) -> bool:
        return base.get(knob) != value

    def switch_on(knob: str) -> tuple[Params, ...]:
        offered = True in _choices(space, knob) and base.get(knob) is not True
        return ({knob: True},) if offered else ()

    listed: list[Move] = [
        Move(
            "quantized weights",
            tuple(
                {"quantization": q}
                for q in _choices(space, "quantization")
                if q not in ("none", None) and differs("quantization", q)
            ),
        ),
        Move(
            "fp8 KV cache",
            tuple(
                {"kv_cache_dtype": d}
                for d in _choices(space, "kv_cache_dtype")
                if d != "auto" and differs("kv_cache_dtype", d)
            ),
        ),
        Move("prefix caching", switch_on("enable_prefix_caching")),
        Move("chunked prefill", switch_on("enable_chunked_prefill")),
        Move(
            "speculation",
            tuple(
                {SPECULATIVE_KNOB: p}
                for p in _choices(space, SPECULATIVE_KNOB)
                if p != SPECULATIVE_OFF
            ),
        ),
        Move(
            "larger batch limits",
            tuple(
                {knob: v}
                for knob, values in LARGER.items()
                for v in _in_range(space, knob, values)
                if _number(base.get(knob)) < v
            ),
        ),
        Move(
            "tensor parallelism",
            tuple(
                {TP_KNOB: tp}
                for tp in _choices(space, TP_KNOB)
                if isinstance(tp, int) and tp > max(_number(base.get(TP_KNOB)), 1)
            ),
        ),
    ]
    return [m for m in listed if m.options]


@register_agent("checklist")
class ChecklistAgent(AgentBase):
    """Generic wins one at a time, then greedily combined (see the module docstring)."""

    name = "checklist"

    def __init__(
        self, *, search_space: str | Path | None = None, max_experiments: int | None = None
    ) -> None:
        self.search_space_path = Path(search_space) if search_space is not None else None
        self.max_experiments = max_experiments
        self.tracker: Tracker | None = None
        self.base: dict[str, Scalar | None] = {}
        self.kept: list[str] = []
        """The moves the final combination kept, in order (for reports and tests)."""

    def run(self, env: TaskEnvironment, seed: int) -> None:
        desc, baseline, space, tracker = start_search(
            env, self.search_space_path, max_experiments=self.max_experiments
        )
        self.tracker = tracker
        self.base = effective_baseline(desc)
        try:
            self._run(space, baseline, tracker)
        except _Stop as e:
            log.info("checklist: ended early: %s", e)
        tracker.finish()

    def checklist_moves(self, space: SearchSpace) -> list[Move]:
        """The moves to try, in order (a variant may add its own: see
        ``benchmarks/checklist_threat.py``)."""
        return moves(space, self.base)

    def _run(self, space: SearchSpace, baseline: ServingConfig, tracker: Tracker) -> None:
        base_score = tracker.measure(baseline)

        def measure(params: Params) -> float:
            try:
                config = space.to_config(params, baseline)
            except IllegalConfig:
                return FAILED_SCORE
            return tracker.measure(config)

        helped: list[tuple[float, str, Params]] = []
        for move in self.checklist_moves(space):
            best: tuple[float, Params] | None = None
            for option in move.options:
                score = measure(option)
                if score > base_score and (best is None or score > best[0]):
                    best = (score, option)
            if best is not None:
                helped.append((best[0], move.name, best[1]))
        helped.sort(key=lambda h: -h[0])
        current: Params = {}
        current_score = base_score
        for _, name, option in helped:
            trial = {**current, **option}
            score = measure(trial)
            if score > current_score:
                current, current_score = trial, score
                self.kept.append(name)
