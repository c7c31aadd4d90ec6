"""Named, independent random streams derived from one seed.

Every random part of a workload (input lengths, output lengths, arrivals, token ids, ...)
draws from its own stream, keyed by a name. Drawing more or fewer values from one stream
never shifts another, so changing, say, the warm-up count leaves the measured requests'
lengths, tokens and arrival times as they were.
"""

from __future__ import annotations

import zlib

import numpy as np

from servegym.errors import UserError

MAX_SEED = 2**63 - 1
"""The largest seed: a workload's content hash stores its seed as a signed 64-bit integer."""


def check_seed(seed: int) -> int:
    """Return ``seed`` if it is a usable seed (an integer from 0 to 2^63 - 1), else raise."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise UserError(f"seed must be a non-negative integer, got {seed!r}")
    if seed > MAX_SEED:
        raise UserError(f"seed must be at most 2^63 - 1 ({MAX_SEED}), got {seed}")
    return int(seed)


def stream(seed: int, name: str) -> np.random.Generator:
    """The generator of the stream ``name`` under ``seed``.

    The stream is a child of ``SeedSequence(seed)`` whose spawn key is the CRC-32 of the
    name: stable across runs, machines and Python versions (unlike ``hash``), and
    independent of which other streams exist.
    """
    key = zlib.crc32(name.encode("utf-8"))
    seq = np.random.SeedSequence(entropy=check_seed(seed), spawn_key=(key,))
    return np.random.Generator(np.random.PCG64(seq))
