"""The search space of the search baselines: which knobs, over what ranges, which combinations
are illegal. It is data (``agents/search_spaces/<engine>.toml``); this module loads it,
validates it, and turns draws into :class:`~servegym.engines.config.ServingConfig` s.

A space is made concrete for one task with :func:`load_search_space`: speculative presets
whose draft model the task's model lacks are dropped, and tensor-parallel sizes above the
GPUs available are too. :meth:`SearchSpace.sample` draws with numpy;
:meth:`SearchSpace.suggest` asks an Optuna trial (define-by-run, so conditional knobs are
only suggested when their condition holds). :meth:`SearchSpace.to_config` lays the drawn
knobs over the task's baseline config and raises :class:`IllegalConfig` for a combination
the file forbids or a ServingConfig refuses.
"""

from __future__ import annotations

import math
import operator
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servegym.engines.config import ServingConfig, SpeculativeConfig
from servegym.engines.pipeline_knobs import PipelineKnobs
from servegym.errors import UserError
from servegym.paths import data_dir

if TYPE_CHECKING:
    import optuna

Scalar = bool | int | float | str
Params = dict[str, Scalar]
"""One draw: knob name -> value (``speculative``: a preset name or ``"off"``)."""

SPECULATIVE_KNOB = "speculative"
SPECULATIVE_OFF = "off"
TP_KNOB = "tensor_parallel_size"
PLACEHOLDERS: tuple[str, ...] = ("draft_model", "eagle_head", "eagle3_head")
"""Names a speculative preset's ``draft_model`` may use as ``{name}``."""

_PLACEHOLDER_RE = re.compile(r"\{([a-z0-9_]+)\}")
_RELATION_RE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|==|!=|<|>)\s*(\S+)\s*$")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


PIPELINE_PREFIX = "pipeline."
"""Knobs named ``pipeline.<knob>`` set a field of the config's ``[pipeline]`` table."""


def is_config_knob(name: str) -> bool:
    """Whether a search space may name ``name``: a ServingConfig knob (not ``extra_args``,
    ``env`` or the ``pipeline`` table as a whole), or ``pipeline.<knob>``."""
    if name.startswith(PIPELINE_PREFIX):
        return name.removeprefix(PIPELINE_PREFIX) in PipelineKnobs.model_fields
    fields = ServingConfig.model_fields
    return name in fields and name not in ("extra_args", "env", "pipeline")


class IllegalConfig(ValueError):
    """A drawn combination the search space forbids or the ServingConfig refuses."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _same(a: Scalar, b: Scalar) -> bool:
    """Equality that keeps booleans apart from numbers (``True != 1`` here)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def _matches(value: Scalar | None, wanted: Scalar | list[Scalar]) -> bool:
    if value is None:
        return False
    if isinstance(wanted, list):
        return any(_same(value, w) for w in wanted)
    return _same(value, wanted)


Condition = dict[str, Scalar | list[Scalar]]


class KnobSpec(_Strict):
    """One knob of the space (``[knobs.<name>]``)."""

    kind: Literal["int", "float", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = Field(default=None, gt=0, description="grid step (not with log)")
    choices: list[Scalar] | None = None
    when: Condition = Field(
        default_factory=dict, description="set only when these knobs have these values"
    )

    @model_validator(mode="after")
    def _check(self) -> KnobSpec:
        if self.kind == "categorical":
            if not self.choices:
                raise ValueError("a categorical knob needs a non-empty 'choices' list")
            if self.low is not None or self.high is not None or self.log or self.step:
                raise ValueError("a categorical knob takes 'choices', not low/high/log/step")
            return self
        if self.choices is not None:
            raise ValueError(f"an {self.kind} knob takes low/high, not 'choices'")
        if self.low is None or self.high is None:
            raise ValueError(f"an {self.kind} knob needs 'low' and 'high'")
        if self.low >= self.high:
            raise ValueError(f"'low' ({self.low:g}) must be below 'high' ({self.high:g})")
        if self.kind == "int" and not (self.low.is_integer() and self.high.is_integer()):
            raise ValueError("an int knob needs whole-number 'low' and 'high'")
        if self.log and self.low <= 0:
            raise ValueError("a log-scale knob needs 'low' > 0")
        if self.log and self.step is not None:
            raise ValueError("'step' cannot be combined with 'log'")
        return self


class ForbiddenClause(_Strict):
    """A combination the engine refuses (``[[forbidden]]``): it matches when every knob in
    ``when`` has its value and ``relation`` (if given) holds."""

    description: str = ""
    when: Condition = Field(default_factory=dict)
    relation: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ForbiddenClause:
        if not self.when and self.relation is None:
            raise ValueError("a forbidden clause needs 'when', 'relation' or both")
        if self.relation is not None and _RELATION_RE.match(self.relation) is None:
            raise ValueError(
                f"relation '{self.relation}' must read 'knob OP knob-or-number' with OP one "
                "of < <= > >= == !="
            )
        return self

    def parts(self) -> tuple[str, str, str] | None:
        if self.relation is None:
            return None
        m = _RELATION_RE.match(self.relation)
        assert m is not None
        return m.group(1), m.group(2), m.group(3)

    def knobs(self) -> list[str]:
        names = list(self.when)
        parts = self.parts()
        if parts is not None:
            names.append(parts[0])
            if _number(parts[2]) is None:
                names.append(parts[2])
        return names

    def matches(self, params: Mapping[str, Scalar]) -> bool:
        if not all(_matches(params.get(k), v) for k, v in self.when.items()):
            return False
        parts = self.parts()
        if parts is None:
            return True
        left_name, op, right_text = parts
        left = params.get(left_name)
        number = _number(right_text)
        right = number if number is not None else params.get(right_text)
        if left is None or right is None:
            return False
        try:
            return bool(_OPS[op](left, right))
        except TypeError:
            return False


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class SearchSpaceFile(_Strict):
    """``agents/search_spaces/<engine>.toml`` as written."""

    engine: str
    description: str = ""
    knobs: dict[str, KnobSpec] = Field(min_length=1)
    speculative_presets: dict[str, dict[str, Any]] = Field(default_factory=dict)
    forbidden: list[ForbiddenClause] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> SearchSpaceFile:
        seen: list[str] = []
        for name, knob in self.knobs.items():
            if not is_config_knob(name):
                raise ValueError(f"knobs.{name}: not a ServingConfig knob")
            for cond_name, wanted in knob.when.items():
                if cond_name not in seen:
                    raise ValueError(
                        f"knobs.{name}.when: '{cond_name}' must be a knob listed before it"
                    )
                self._check_values(f"knobs.{name}.when.{cond_name}", cond_name, wanted)
            seen.append(name)
        for preset, table in self.speculative_presets.items():
            if preset == SPECULATIVE_OFF:
                raise ValueError(f"speculative_presets.{preset}: '{SPECULATIVE_OFF}' is reserved")
            try:
                _preset_config(table, dict.fromkeys(PLACEHOLDERS, "x"))
            except (ValidationError, KeyError, ValueError) as e:
                raise ValueError(f"speculative_presets.{preset}: {_reason(e)}") from None
        spec_knob = self.knobs.get(SPECULATIVE_KNOB)
        if spec_knob is not None:
            for choice in spec_knob.choices or []:
                if choice != SPECULATIVE_OFF and choice not in self.speculative_presets:
                    raise ValueError(
                        f"knobs.speculative: choice '{choice}' is neither '{SPECULATIVE_OFF}' "
                        "nor a [speculative_presets] table"
                    )
        for i, clause in enumerate(self.forbidden):
            for name in clause.knobs():
                if name not in self.knobs:
                    raise ValueError(f"forbidden[{i}]: '{name}' is not a knob of this space")
            for name, wanted in clause.when.items():
                self._check_values(f"forbidden[{i}].when.{name}", name, wanted)
        return self

    def _check_values(self, where: str, knob: str, wanted: Scalar | list[Scalar]) -> None:
        spec = self.knobs[knob]
        if spec.kind != "categorical":
            return
        choices = spec.choices or []
        for w in wanted if isinstance(wanted, list) else [wanted]:
            if not any(_same(w, c) for c in choices):
                raise ValueError(f"{where}: {w!r} is not one of the knob's choices")


def _reason(e: Exception) -> str:
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        msg = str(first["msg"]).removeprefix("Value error, ")
        return f"'{loc}': {msg}" if loc else msg
    if isinstance(e, KeyError):
        return f"unknown placeholder {{{e.args[0]}}} (known: {', '.join(PLACEHOLDERS)})"
    return str(e)


def _preset_config(table: Mapping[str, Any], placeholders: Mapping[str, str]) -> SpeculativeConfig:
    """The preset with its ``{placeholders}`` filled; KeyError names a missing one."""
    filled: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, str):
            for name in _PLACEHOLDER_RE.findall(value):
                if name not in PLACEHOLDERS:
                    raise KeyError(name)
                value = value.replace("{" + name + "}", placeholders[name])
        filled[key] = value
    return SpeculativeConfig.model_validate(filled)


def model_placeholders(model: str | None) -> dict[str, str]:
    """What ``{draft_model}``, ``{eagle_head}`` and ``{eagle3_head}`` stand for on ``model``
    (from the simulator's profiles; a model without one leaves it out)."""
    if model is None:
        return {}
    from servegym.engines.sim.profiles import model_profiles
    from servegym.engines.sim.speculative import method_profile

    out: dict[str, str] = {}
    profile = model_profiles().get(model)
    if profile is not None and profile.draft_model:
        out["draft_model"] = profile.draft_model
    for method, key in (("eagle", "eagle_head"), ("eagle3", "eagle3_head")):
        head = method_profile(method)[0].heads.get(model)
        if head:
            out[key] = head
    return out


def search_spaces_dir() -> Path:
    return data_dir("agents") / "search_spaces"


def read_search_space(path: Path) -> SearchSpaceFile:
    """Read and validate a search-space file; every problem is one line naming it."""
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"search space not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: malformed TOML: {e}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        return SearchSpaceFile.model_validate(raw)
    except ValidationError as e:
        raise UserError(f"{path}: {_reason(e)}") from None


def load_search_space(
    engine: str = "sim",
    *,
    model: str | None = None,
    num_gpus: int | None = None,
    path: Path | None = None,
) -> SearchSpace:
    """The space for ``engine`` (``agents/search_spaces/<engine>.toml``, or ``path``), made
    concrete for ``model`` (presets it lacks a draft for are dropped) and ``num_gpus``
    (larger tensor-parallel sizes are dropped)."""
    if path is None:
        path = search_spaces_dir() / f"{engine}.toml"
        if not path.is_file():
            known = sorted(p.stem for p in search_spaces_dir().glob("*.toml"))
            raise UserError(
                f"no search space for engine '{engine}' (known: {', '.join(known) or 'none'})"
            )
    return SearchSpace(read_search_space(path), model=model, num_gpus=num_gpus)


class SearchSpace:
    """A search space made concrete for one model and GPU count."""

    def __init__(
        self,
        spec: SearchSpaceFile,
        *,
        model: str | None = None,
        num_gpus: int | None = None,
        placeholders: Mapping[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self.placeholders = (
            dict(placeholders) if placeholders is not None else model_placeholders(model)
        )
        self.presets: dict[str, SpeculativeConfig] = {}
        for name, table in spec.speculative_presets.items():
            try:
                self.presets[name] = _preset_config(table, self.placeholders)
            except KeyError:
                continue  # the model has no draft of this kind: the engine would refuse it
        self.knobs: dict[str, KnobSpec] = {}
        for name, knob in spec.knobs.items():
            choices = knob.choices
            if name == SPECULATIVE_KNOB and choices is not None:
                choices = [c for c in choices if c == SPECULATIVE_OFF or c in self.presets]
            if name == TP_KNOB and choices is not None and num_gpus is not None:
                choices = [
                    c
                    for c in choices
                    if isinstance(c, int) and not isinstance(c, bool) and c <= num_gpus
                ]
            if choices is not None and not choices:
                continue  # nothing left to choose: the knob keeps the baseline value
            self.knobs[name] = knob.model_copy(update={"choices": choices})

    @property
    def names(self) -> list[str]:
        return list(self.knobs)

    def _active(self, knob: KnobSpec, params: Mapping[str, Scalar]) -> bool:
        return all(_matches(params.get(k), v) for k, v in knob.when.items())

    def sample(self, rng: np.random.Generator) -> Params:
        """One draw, uniformly per knob (log-uniformly where ``log``); conditional knobs only
        when their condition holds. Forbidden combinations are not filtered here."""
        params: Params = {}
        for name, knob in self.knobs.items():
            if not self._active(knob, params):
                continue
            params[name] = _draw(knob, rng)
        return params

    def suggest(self, trial: optuna.Trial) -> Params:
        """Ask an Optuna trial for every active knob (define-by-run)."""
        params: Params = {}
        for name, knob in self.knobs.items():
            if not self._active(knob, params):
                continue
            value: Scalar
            if knob.kind == "categorical":
                assert knob.choices is not None
                chosen = trial.suggest_categorical(name, knob.choices)
                assert chosen is not None
                value = chosen
            elif knob.kind == "int":
                assert knob.low is not None and knob.high is not None
                value = trial.suggest_int(
                    name,
                    int(knob.low),
                    int(knob.high),
                    log=knob.log,
                    step=int(knob.step) if knob.step else 1,
                )
            else:
                assert knob.low is not None and knob.high is not None
                value = trial.suggest_float(name, knob.low, knob.high, log=knob.log, step=knob.step)
            params[name] = value
        return params

    def forbidden_by(self, params: Mapping[str, Scalar]) -> ForbiddenClause | None:
        """The first forbidden clause ``params`` match, if any."""
        for clause in self.spec.forbidden:
            if clause.matches(params):
                return clause
        return None

    def to_config(self, params: Mapping[str, Scalar], base: ServingConfig) -> ServingConfig:
        """``params`` laid over ``base``; raises :class:`IllegalConfig` when a forbidden
        clause matches or the ServingConfig refuses the combination."""
        clause = self.forbidden_by(params)
        if clause is not None:
            raise IllegalConfig(
                f"forbidden: {clause.description or clause.relation or clause.when}"
            )
        data = base.model_dump()
        for name, value in params.items():
            if name == SPECULATIVE_KNOB:
                preset = None if value == SPECULATIVE_OFF else self.presets.get(str(value))
                if value != SPECULATIVE_OFF and preset is None:
                    raise IllegalConfig(f"speculative preset '{value}' is not available")
                data[name] = None if preset is None else preset.model_dump()
            elif name.startswith(PIPELINE_PREFIX):
                table = dict(data.get("pipeline") or {})
                table[name.removeprefix(PIPELINE_PREFIX)] = value
                data["pipeline"] = table
            else:
                data[name] = value
        try:
            return ServingConfig.model_validate(data)
        except ValidationError as e:
            raise IllegalConfig(_reason(e)) from None

    def sample_config(
        self, rng: np.random.Generator, base: ServingConfig, max_tries: int = 1000
    ) -> tuple[Params, ServingConfig]:
        """A legal draw and its config (redrawing illegal ones, at most ``max_tries``)."""
        for _ in range(max_tries):
            params = self.sample(rng)
            try:
                return params, self.to_config(params, base)
            except IllegalConfig:
                continue
        raise UserError(
            f"search space '{self.spec.engine}': no legal config in {max_tries} draws; "
            "check its [[forbidden]] clauses"
        )


def _draw(knob: KnobSpec, rng: np.random.Generator) -> Scalar:
    if knob.kind == "categorical":
        assert knob.choices is not None
        return knob.choices[int(rng.integers(len(knob.choices)))]
    assert knob.low is not None and knob.high is not None
    low, high = knob.low, knob.high
    if knob.kind == "int":
        if knob.log:
            # Uniform in log space over [low - 0.5, high + 0.5), as Optuna's log ints.
            lo = math.log(low - 0.5 if low > 0.5 else low)
            x = math.exp(rng.uniform(lo, math.log(high + 0.5)))
            value = min(max(round(x), int(low)), int(high))
        else:
            step = int(knob.step or 1)
            n = (int(high) - int(low)) // step
            value = int(low) + step * int(rng.integers(n + 1))
        return int(value)
    if knob.log:
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))
    if knob.step:
        n = math.floor((high - low) / knob.step + 1e-9)
        return float(round(low + knob.step * int(rng.integers(n + 1)), 10))
    return float(rng.uniform(low, high))
