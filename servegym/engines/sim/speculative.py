"""Speculative decoding: how many tokens a decode step yields, and what proposing costs.

Each decode step a running request proposes ``k = num_speculative_tokens`` draft tokens; the
target model verifies them (and the current token: ``k + 1`` query tokens per request) in
the same step, accepts a prefix of them and adds one token of its own. With per-position
acceptance ``a_i = rate x decay^(i-1)`` (``profiles/speculative.toml``, by method and workload
family) the expected tokens per step is ``E = 1 + m x sum_i prod_{j<=i} a_j``, where ``m`` is
the share of steps with any proposal (n-gram lookup finds none on fresh text); with a constant
rate that is the usual ``(1 - a^(k+1)) / (1 - a)`` (Leviathan et al., 2023). The target
verifies ``1 + m k`` tokens per request on average.

**Expectations, not draws.** The simulator does not draw acceptances per request: every
decoding request yields the expected count in a deterministic pattern shared by all requests
in a step (step ``s`` yields ``floor((s+1) E) - floor(s E)`` tokens, so chunk sizes alternate
between ``floor(E)`` and ``ceil(E)`` with mean ``E``). Decode steps of a batch stay alike,
which event skipping needs, and runs stay reproducible without a second random stream; the
price is that inter-token gaps under speculation vary less than on a real engine.

**Cost.** Autoregressive proposers (draft model, EAGLE heads, MTP) run ``k`` draft steps per
decode step over the decoding requests; each reads the draft's weights (the draft model's
own profile, or ``draft_param_fraction`` of the target's parameters for a head) and pays
``draft_step_overhead_ms``. n-gram lookup is one CPU step. A draft model keeps its own KV
cache (capacity is shared) and prefills every prompt too. Verification makes each request
cost ``1 + k`` target tokens, so steps become compute-bound at a much smaller batch:
speculation helps at low concurrency and hurts at high.

When ``profiles/speculative.toml`` is absent, :data:`BUILTIN` stands in (same layout,
documented constants).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from servegym.engines.config import SpeculativeConfig
from servegym.engines.sim.profiles import (
    PROFILES_DIR,
    ModelProfile,
    SpeculativeProfile,
    WorkloadFamily,
    speculative_profiles,
)

SPECULATIVE_TOML = PROFILES_DIR / "speculative.toml"
FAMILIES: tuple[str, ...] = ("synthetic", "chat", "agentic", "trace")


def _builtin(method: str, rates: dict[str, float], **kw: object) -> SpeculativeProfile:
    return SpeculativeProfile.model_validate(
        {"method": method, "acceptance_rate": rates, "default_num_speculative_tokens": 4, **kw}
    )


BUILTIN: dict[str, SpeculativeProfile] = {
    "ngram": _builtin(
        "ngram",
        {"synthetic": 0.3, "chat": 0.45, "agentic": 0.84, "trace": 0.3},
        match_rate={"synthetic": 0.02, "chat": 0.3, "agentic": 0.45, "trace": 0.02},
        draft_step_overhead_ms=0.05,
        autoregressive=False,
    ),
    "draft_model": _builtin(
        "draft_model",
        {"synthetic": 0.33, "chat": 0.7, "agentic": 0.75, "trace": 0.33},
        position_decay=0.97,
        draft_step_overhead_ms=0.6,
    ),
    "eagle": _builtin(
        "eagle",
        {"synthetic": 0.32, "chat": 0.68, "agentic": 0.82, "trace": 0.32},
        position_decay=0.85,
        draft_param_fraction=0.09,
        draft_step_overhead_ms=0.9,
    ),
    "eagle3": _builtin(
        "eagle3",
        {"synthetic": 0.37, "chat": 0.78, "agentic": 0.78, "trace": 0.37},
        position_decay=0.96,
        draft_param_fraction=0.05,
        draft_step_overhead_ms=0.9,
    ),
    "mtp": _builtin(
        "mtp",
        {"synthetic": 0.6, "chat": 0.85, "agentic": 0.85, "trace": 0.6},
        position_decay=0.9,
        draft_param_fraction=0.03,
        draft_step_overhead_ms=0.5,
        requires_native_support=True,
    ),
}
"""Fallback acceptance data (the values ``profiles/speculative.toml`` shipped with, without
EAGLE heads: with no data file an EAGLE method accepts any head name)."""


def method_profile(method: str) -> tuple[SpeculativeProfile, str]:
    """The data of one method and where it came from."""
    if SPECULATIVE_TOML.is_file():
        profiles = speculative_profiles()
        if method in profiles:
            return profiles[method], "profiles/speculative.toml"
    return BUILTIN[method], "built-in constants (servegym/engines/sim/speculative.py)"


@dataclass(frozen=True, slots=True)
class SpecPlan:
    """Speculative decoding as the scheduler and the cost model use it."""

    method: str
    k: int
    rate: float
    """Per-token acceptance rate (first position) on this workload family."""
    match_rate: float
    tokens_per_step: float
    """E: expected tokens a decode step yields per request (>= 1)."""
    verify_tokens: float
    """Expected target-model query tokens per decoding request per step (1 + m k)."""
    budget_tokens: int
    """Tokens of the step budget one decoding request takes."""
    lookahead: int
    """Extra KV slots reserved per decoding request for the proposals (k)."""
    draft_steps: int
    """Draft forward passes per decode step (k, or 1 for a non-autoregressive lookup)."""
    draft: ModelProfile | None
    """The draft model (draft_model method)."""
    head_params: float
    """Parameters one EAGLE / MTP draft step reads (0 for other methods)."""
    step_overhead_ms: float
    source: str


def family_of(kind: str) -> WorkloadFamily:
    return cast(WorkloadFamily, kind if kind in FAMILIES else "chat")


def plan(
    spec: SpeculativeConfig,
    model: ModelProfile,
    draft: ModelProfile | None,
    family: str,
) -> SpecPlan:
    """Turn a speculative config into the numbers the simulator runs on."""
    prof, source = method_profile(spec.method)
    fam = family_of(family)
    k = spec.num_speculative_tokens
    e = prof.expected_tokens_per_step(fam, k)
    match = prof.match_rate.get(fam, 1.0)
    verify = 1.0 + match * k
    gpu_draft = spec.method != "ngram"
    return SpecPlan(
        method=spec.method,
        k=k,
        rate=prof.rate(fam),
        match_rate=match,
        tokens_per_step=e,
        verify_tokens=verify,
        budget_tokens=max(1, round(verify)) if not gpu_draft else 1 + k,
        lookahead=k,
        draft_steps=k if prof.autoregressive else 1,
        draft=draft if spec.method == "draft_model" else None,
        head_params=(prof.draft_param_fraction or 0.0) * model.num_parameters
        if spec.method in ("eagle", "eagle3", "mtp")
        else 0.0,
        step_overhead_ms=prof.draft_step_overhead_ms,
        source=source,
    )
