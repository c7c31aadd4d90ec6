"""The pinned-environment check on a fake /proc: which processes of a server's tree are
judged, and how a renamed process's overwritten environment is told apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from servegym.sandbox import egress, pinned_env
from servegym.sandbox.egress import descendants
from servegym.sandbox.pinned_env import unpinned

PINNED = {"ONEDNN_MAX_CPU_ISA": "AVX2"}


def fake_proc(root: Path, procs: dict[int, tuple[int, str, dict[str, str]]]) -> None:
    """``pid -> (ppid, comm, environ)`` as /proc shows them."""
    for pid, (ppid, comm, env) in procs.items():
        d = root / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0\n")
        (d / "comm").write_text(comm + "\n")
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


def test_unpinned_judges_values_everywhere_and_absence_where_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(egress, "PROC", tmp_path)
    monkeypatch.setattr(pinned_env, "PROC", tmp_path)
    honest = {"PATH": "/usr/bin", **PINNED}
    fake_proc(
        tmp_path,
        {
            10: (1, "bwrap", honest),
            11: (10, "vllm", honest),
            12: (11, "VLLM::Worker", {"OMP_NUM_THREADS": "2"}),  # renamed: environ overwritten
            13: (11, "python3", {"PATH": "/usr/bin"}),  # started without it
            14: (11, "python3", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}),  # another value
            99: (1, "elsewhere", {"PATH": "/usr/bin"}),  # not in the tree
        },
    )
    found = unpinned(descendants(10), PINNED)
    found.sort(key=lambda u: u.pid)
    assert [(u.pid, u.value) for u in found] == [(13, None), (14, "AVX512_CORE_AMX")]
    assert found[0].text() == (
        "python3 (pid 13) runs with unset; the task pins ONEDNN_MAX_CPU_ISA=AVX2"
    )
    assert unpinned(descendants(11), {}) == []
