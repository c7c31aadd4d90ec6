"""The gates a submission must pass before its improvement counts.

- **launch**: the submission must start (a simulated :class:`LaunchError`, on real tracks a
  server that never becomes ready). Failing it: outcome ``launch_failed``.
- **accuracy**: the submission's accuracy relative to the baseline's must be at least the
  task's ``accuracy.min_ratio``. On the sim track accuracy is the engine's modelled
  ``accuracy_ratio`` (weight and KV-cache quantization), so the gate compares
  ``submission.accuracy_ratio / baseline.accuracy_ratio``. Failing it: ``accuracy_failed``.
- **integrity**: the submission must be a valid :class:`ServingConfig` for an allowed engine
  (re-validated by the harness: a config built with ``model_construct`` or mutated after
  validation does not pass), and every measured scoring request must have completed with
  its forced output length, as recounted by the harness (requests the baseline fails too,
  such as prompts beyond the model's context, are excused). Failing it:
  ``integrity_flagged``.
  (The full catalogue of reward hacks is a later issue.)

Each gate is a :class:`GateResult`; ``passed`` is ``None`` when the gate was not reached
(e.g. accuracy after a failed launch).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servegym.engines.config import ServingConfig
from servegym.engines.launcher import ExternalServer, LauncherSubmission
from servegym.scoring.objectives import IntegrityCounts

GATE_NAMES: tuple[str, ...] = ("launch", "accuracy", "integrity")


class GateResult(BaseModel):
    """One gate's verdict."""

    model_config = ConfigDict(extra="forbid")

    passed: bool | None = Field(description="None: not reached")
    detail: str = ""
    value: float | None = None
    threshold: float | None = None
    findings: list[str] = Field(default_factory=list)


def not_reached(why: str) -> GateResult:
    return GateResult(passed=None, detail=why)


def opening_gates(submission: Any, engines: Sequence[str]) -> dict[str, GateResult]:
    """The gates before anything runs: all unreached without a submission; else the
    config's integrity checked, and launch and accuracy waiting on it."""
    if submission is None:
        none = not_reached("no submission")
        return {"launch": none, "accuracy": none, "integrity": none}
    return {
        "launch": not_reached("integrity check failed first"),
        "accuracy": not_reached("the submission did not launch"),
        "integrity": check_config(submission, engines),
    }


def check_config(config: Any, engines: Sequence[str]) -> GateResult:
    """Integrity, part one: the submission is a valid ServingConfig for the task's engines,
    or a workspace with its launcher script."""
    findings: list[str] = []
    if isinstance(config, ExternalServer):
        return GateResult(passed=True, detail=f"a running server at {config.base_url}")
    if isinstance(config, LauncherSubmission):
        script = Path(config.path) / config.script
        if not script.is_file():
            findings.append(f"the submitted workspace has no {config.script}")
        elif not engines:
            findings.append("the task allows no engine")
        if findings:
            return GateResult(passed=False, detail=findings[0], findings=findings)
        return GateResult(
            passed=True,
            detail=f"{config.script} in a workspace of {config.files} files ({config.digest[:12]})",
        )
    if not isinstance(config, ServingConfig):
        findings.append(f"the submission is a {type(config).__name__}, not a ServingConfig")
    else:
        try:
            ServingConfig.model_validate(config.model_dump())
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(x) for x in first["loc"]) or "config"
            findings.append(f"invalid config: {loc}: {first['msg']}")
        except Exception as e:  # a value model_dump cannot even serialise
            findings.append(f"invalid config: {type(e).__name__}: {e}")
    if not engines:
        findings.append("the task allows no engine")
    if findings:
        return GateResult(passed=False, detail=findings[0], findings=findings)
    return GateResult(passed=True, detail=f"valid ServingConfig for {', '.join(engines)}")


def check_launch(error: str | None) -> GateResult:
    if error is None:
        return GateResult(passed=True, detail="started")
    first = error.strip().splitlines()[0] if error.strip() else "failed to start"
    return GateResult(passed=False, detail=first, findings=[error])


def check_accuracy(
    submission_accuracy: float, baseline_accuracy: float, min_ratio: float
) -> GateResult:
    """The submission's accuracy over the baseline's must be at least ``min_ratio``.

    A baseline with no accuracy at all (0) cannot be fallen short of: the gate passes."""
    if baseline_accuracy <= 0:
        return GateResult(
            passed=True,
            detail="the baseline's accuracy is 0: nothing to fall short of",
            value=None,
            threshold=min_ratio,
        )
    rel = submission_accuracy / baseline_accuracy
    ok = rel >= min_ratio - 1e-12
    verb = ">=" if ok else "<"
    return GateResult(
        passed=ok,
        detail=f"accuracy {rel:.4f} of the baseline's {verb} the minimum {min_ratio:.4f}",
        value=rel,
        threshold=min_ratio,
    )


def check_outputs(counts: IntegrityCounts, baseline: IntegrityCounts | None = None) -> GateResult:
    """Integrity, part two: every measured scoring request completed with its forced length.

    Requests the baseline itself cannot serve (a prompt longer than the model's context is
    refused by any config that keeps the default ``max_model_len``) are the task's, not the
    submission's: with ``baseline`` given, the submission is flagged only when a larger
    share of its requests failed than of the baseline's. Any length mismatch is flagged.
    A cpu-track pipeline counts questions answered end to end instead (``counts.unit``).
    """
    findings: list[str] = []
    unit = counts.unit  # "requests", or a pipeline's "questions"
    if counts.requests == 0:
        findings.append(f"no scoring {unit[:-1]} was measured")
    base_share = 0.0
    if baseline is not None and baseline.requests:
        base_share = baseline.failed / baseline.requests
    share = counts.failed / counts.requests if counts.requests else 0.0
    if counts.failed and share > base_share + 1e-12:
        also = (
            f" (the baseline failed {baseline.failed} of {baseline.requests})"
            if baseline is not None and baseline.failed
            else ""
        )
        findings.append(
            f"{counts.failed} of {counts.requests} scoring {unit} did not complete{also}"
        )
    if counts.length_mismatches:
        findings.append(
            f"{counts.length_mismatches} completed requests returned a different number of "
            "output tokens than forced (harness recount)"
        )
    if findings:
        return GateResult(passed=False, detail=findings[0], findings=findings)
    done = counts.requests - counts.failed
    note = f" ({counts.failed} refused, as the baseline's)" if counts.failed else ""
    what = "answered" if unit == "questions" else "completed with their forced output length"
    return GateResult(passed=True, detail=f"{done} {unit} {what}{note}")


def merge(config_gate: GateResult, output_gate: GateResult | None) -> GateResult:
    """The integrity gate: the config check and (when reached) the output check."""
    if config_gate.passed is False:
        return config_gate
    if output_gate is None:
        return config_gate
    if output_gate.passed is False:
        return output_gate
    return GateResult(
        passed=output_gate.passed,
        detail=f"{config_gate.detail}; {output_gate.detail}",
        findings=[*config_gate.findings, *output_gate.findings],
    )
