"""Seeded measurement noise: real GPUs vary a few percent from run to run and step to step.

Two multiplicative factors scale every engine step's duration:

- a per-run factor drawn once, ~ N(1, ``run_sigma``) (clock, thermal and placement
  differences between runs; 2% by default), clipped to +-4 sigma;
- a per-step jitter ~ N(1, ``step_sigma``) (1% by default), also clipped.

The jitter of a step depends only on the step's global index (a table of
:data:`JITTER_TABLE` draws, indexed modulo its length), never on how the simulator grouped
steps, so event skipping and step-by-step simulation give the same times. Start-up time
gets the run factor too. The same seed gives identical noise; ``enabled=False`` gives
factors of exactly 1.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

JITTER_TABLE = 1 << 16
"""Distinct per-step jitter draws; step ``s`` uses draw ``s % JITTER_TABLE``."""

DEFAULT_RUN_SIGMA = 0.02
DEFAULT_STEP_SIGMA = 0.01
_CLIP_SIGMAS = 4.0
_SEED_TAG = 0x5E6A_0015E  # separates the noise stream from any other use of the seed


class Noise:
    """The noise of one simulated run."""

    def __init__(
        self,
        seed: int,
        *,
        enabled: bool = True,
        run_sigma: float = DEFAULT_RUN_SIGMA,
        step_sigma: float = DEFAULT_STEP_SIGMA,
    ) -> None:
        self.enabled = enabled
        self.seed = seed
        if not enabled:
            self.run_factor = 1.0
            self._jitter: FloatArray | None = None
            return
        rng = np.random.default_rng([_SEED_TAG, seed & 0xFFFF_FFFF_FFFF_FFFF])
        lo, hi = 1.0 - _CLIP_SIGMAS * run_sigma, 1.0 + _CLIP_SIGMAS * run_sigma
        self.run_factor = float(np.clip(rng.normal(1.0, run_sigma), lo, hi))
        jitter = rng.normal(1.0, step_sigma, size=JITTER_TABLE)
        np.clip(
            jitter, 1.0 - _CLIP_SIGMAS * step_sigma, 1.0 + _CLIP_SIGMAS * step_sigma, out=jitter
        )
        # Fold the run factor in once, so applying noise to k steps is one multiply.
        self._jitter = jitter * self.run_factor

    def apply(self, times: FloatArray, first_step: int) -> FloatArray:
        """Scale the durations of steps ``first_step .. first_step + len(times) - 1`` in place."""
        if self._jitter is None:
            return times
        n = len(times)
        start = first_step % JITTER_TABLE
        if start + n <= JITTER_TABLE:
            times *= self._jitter[start : start + n]
        else:
            idx = (np.arange(first_step, first_step + n) % JITTER_TABLE).astype(np.intp)
            times *= self._jitter[idx]
        return times

    def factor(self, step: int) -> float:
        """The combined factor of one step (run factor times its jitter)."""
        if self._jitter is None:
            return 1.0
        return float(self._jitter[step % JITTER_TABLE])
