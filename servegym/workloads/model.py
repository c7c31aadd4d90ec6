"""A materialised workload: the sessions and turns of one (spec, seed).

A single-turn request is a session of one turn. A session's turns share one growing token
buffer: turn ``k``'s prompt is the session's shared prefix (if any) followed by the first
``prompt_len - len(prefix)`` tokens of the session's own buffer. No turn's full prompt is
stored on its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from servegym.workloads.spec import WorkloadSpec

TokenArray = npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session.

    ``prompt_len`` counts every prompt token (shared prefix included). ``output_len`` is the
    forced output length. ``arrival_s`` is the open-loop send offset from the start of the run
    for a session's first turn (``None`` in a closed loop, where the loop decides).
    ``think_s`` is the delay between the previous turn's last token and this turn's send
    (0 for a first turn).
    """

    prompt_len: int
    output_len: int
    arrival_s: float | None = None
    think_s: float = 0.0


@dataclass(slots=True)
class Session:
    """A sequence of turns over one growing token buffer."""

    id: int
    tokens: TokenArray
    turns: list[Turn]
    prefix_id: int | None = None


@dataclass(slots=True)
class Workload:
    """The sessions of one spec and seed, plus the shared prefixes they refer to.

    ``warmup_sessions`` is how many sessions at the start are warm-up (sent first, excluded
    from metrics).
    """

    spec: WorkloadSpec
    seed: int
    sessions: list[Session]
    prefixes: list[TokenArray] = field(default_factory=list)
    warmup_sessions: int = 0

    def prefix_of(self, session: Session) -> TokenArray:
        if session.prefix_id is None:
            return np.empty(0, dtype=np.int32)
        return self.prefixes[session.prefix_id]

    def prompt_ids(self, session: Session, turn_index: int) -> TokenArray:
        """The exact prompt token ids of one turn (a fresh array)."""
        prefix = self.prefix_of(session)
        turn = session.turns[turn_index]
        own = turn.prompt_len - len(prefix)
        if own < 0 or own > len(session.tokens):
            raise ValueError(
                f"session {session.id} turn {turn_index}: prompt_len {turn.prompt_len} "
                f"does not fit prefix {len(prefix)} + buffer {len(session.tokens)}"
            )
        return np.concatenate([prefix, session.tokens[:own]])

    def iter_turns(self) -> Iterator[tuple[Session, int, Turn]]:
        for s in self.sessions:
            for i, t in enumerate(s.turns):
                yield s, i, t

    @property
    def num_turns(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def content_hash(self) -> str:
        """SHA-256 of everything that was materialised, in a canonical byte layout.

        Two workloads with the same hash send the same requests at the same times.
        """
        h = hashlib.sha256()
        h.update(b"servegym-workload-v1\0")
        h.update(self.spec.model_dump_json().encode())
        h.update(np.int64(self.seed).tobytes())
        h.update(np.int64(self.warmup_sessions).tobytes())
        h.update(np.int64(len(self.prefixes)).tobytes())
        for p in self.prefixes:
            h.update(np.int64(len(p)).tobytes())
            h.update(np.ascontiguousarray(p, dtype="<i4").tobytes())
        h.update(np.int64(len(self.sessions)).tobytes())
        for s in self.sessions:
            h.update(np.int64(s.id).tobytes())
            h.update(np.int64(-1 if s.prefix_id is None else s.prefix_id).tobytes())
            h.update(np.int64(len(s.tokens)).tobytes())
            h.update(np.ascontiguousarray(s.tokens, dtype="<i4").tobytes())
            turns = np.array(
                [
                    (
                        t.prompt_len,
                        t.output_len,
                        float("nan") if t.arrival_s is None else t.arrival_s,
                        t.think_s,
                    )
                    for t in s.turns
                ],
                dtype=[("p", "<i8"), ("o", "<i8"), ("a", "<f8"), ("t", "<f8")],
            )
            h.update(np.int64(len(s.turns)).tobytes())
            h.update(turns.tobytes())
        return h.hexdigest()
