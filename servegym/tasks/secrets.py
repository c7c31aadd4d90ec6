"""Seeds the harness derives: the hidden scoring seed, and the public per-run noise seeds.

The scoring workload's seed is never in a task file and never shown to an agent: it is
HMAC-SHA256 of the task id and the trial seed under a secret only the harness holds, so an
agent that knows the task, the dev seed and its own trial seed still cannot rebuild the
scoring workload. The trial writes the seed into ``trial.json`` once the evaluation is over.

The secret comes from ``$SERVEGYM_SECRET``; without it, :data:`DEFAULT_SECRET` is used. That
constant is public (it is in this file), so it is **for local runs only; leaderboards set
their own** ``SERVEGYM_SECRET`` (and keep it out of every sandbox).

:func:`stable_seed` derives the seeds that need no secret (the noise of each dev experiment,
the bootstrap's generator) from their parts with SHA-256: stable across runs, machines and
Python versions, unlike ``hash()``.
"""

from __future__ import annotations

import hashlib
import hmac
import os

SECRET_ENV = "SERVEGYM_SECRET"
DEFAULT_SECRET = "servegym-local-runs-only-v1"
"""For local runs only; leaderboards set their own ``SERVEGYM_SECRET``."""

_SEED_MASK = (1 << 63) - 1


def harness_secret() -> bytes:
    """The secret scoring seeds are derived with (``$SERVEGYM_SECRET`` or the default)."""
    return (os.environ.get(SECRET_ENV) or DEFAULT_SECRET).encode("utf-8")


def using_default_secret() -> bool:
    """True when no ``$SERVEGYM_SECRET`` is set (a local run)."""
    return not os.environ.get(SECRET_ENV)


def _to_seed(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big") & _SEED_MASK


def stable_seed(*parts: object) -> int:
    """A non-negative 63-bit seed from ``parts`` (their ``str``, joined), no secret involved."""
    text = "\x1f".join(str(p) for p in parts)
    return _to_seed(hashlib.sha256(text.encode("utf-8")).digest())


def scoring_seed(task_id: str, trial_seed: int, *, avoid: int | None = None) -> int:
    """The hidden seed of the scoring workload for one trial.

    HMAC-SHA256(secret, ``"scoring" | task_id | trial_seed``), first 8 bytes, 63 bits.
    ``avoid`` (the task's dev seed) is never returned: on the (astronomically unlikely)
    collision the next counter value is taken, so scoring never reuses the dev workload.
    """
    secret = harness_secret()
    counter = 0
    while True:
        msg = f"scoring\x1f{task_id}\x1f{trial_seed}\x1f{counter}".encode()
        seed = _to_seed(hmac.new(secret, msg, hashlib.sha256).digest())
        if seed != avoid:
            return seed
        counter += 1
