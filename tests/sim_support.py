"""Shared helpers of the simulator tests: profiles and workloads built by hand or loaded.

The shipped profile data (``servegym/engines/sim/profiles/``) is used when present; until
then (and for tests that pin exact arithmetic) the hand-built profiles below stand in. Their
figures are the public spec-sheet numbers of the parts they are named after.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servegym.engines.config import ServingConfig
from servegym.engines.sim.engine import SimRun, simulate
from servegym.engines.sim.launch import LaunchedEngine, launch
from servegym.engines.sim.profiles import (
    EngineProfile,
    HardwareProfile,
    ModelProfile,
    PeakCompute,
    get_engine,
    hardware_profiles,
    model_profiles,
)
from servegym.loadgen.records import RunResult
from servegym.scoring.metrics import Metrics, compute_metrics
from servegym.workloads.generate import materialise
from servegym.workloads.model import Session, Turn, Workload
from servegym.workloads.registry import load_spec
from servegym.workloads.spec import ArrivalSpec, WorkloadSpec

H100 = HardwareProfile(
    id="h100-sxm",
    name="NVIDIA H100 SXM 80GB",
    memory_gib=79.2,
    hbm_bandwidth_tbs=3.35,
    peak_tflops=PeakCompute(bf16=989.0, fp8=1979.0, int8=1979.0),
    mem_efficiency=0.8,
    compute_efficiency=0.6,
    eager_overhead_ms=3.0,
    interconnect_gbs=360.0,
    allreduce_latency_us=6.0,
    weight_load_gbs=2.5,
    cuda_graph_capture_s=10.0,
    compile_s=25.0,
    activation_reserve_gib=1.5,
    price_per_hour=2.99,
    price_source="hand-built test profile",
)
A100 = HardwareProfile(
    id="a100-80gb",
    name="NVIDIA A100 SXM 80GB",
    memory_gib=79.2,
    hbm_bandwidth_tbs=2.039,
    peak_tflops=PeakCompute(bf16=312.0, int8=624.0),
    mem_efficiency=0.8,
    compute_efficiency=0.6,
    eager_overhead_ms=3.5,
    interconnect_gbs=240.0,
    allreduce_latency_us=8.0,
    weight_load_gbs=2.5,
    cuda_graph_capture_s=12.0,
    compile_s=30.0,
    activation_reserve_gib=1.5,
    price_per_hour=1.79,
    price_source="hand-built test profile",
)
L40S = HardwareProfile(
    id="l40s",
    name="NVIDIA L40S 48GB",
    memory_gib=44.4,
    hbm_bandwidth_tbs=0.864,
    peak_tflops=PeakCompute(bf16=362.0, fp8=733.0, int8=733.0),
    mem_efficiency=0.8,
    compute_efficiency=0.6,
    eager_overhead_ms=3.5,
    interconnect_gbs=25.0,
    allreduce_latency_us=20.0,
    weight_load_gbs=2.0,
    cuda_graph_capture_s=12.0,
    compile_s=30.0,
    activation_reserve_gib=1.2,
    price_per_hour=1.0,
    price_source="hand-built test profile",
)
LLAMA_8B = ModelProfile(
    id="llama-3.1-8b",
    hf_name="meta-llama/Llama-3.1-8B-Instruct",
    num_layers=32,
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=128256,
    num_parameters=8.03e9,
    max_position_embeddings=131072,
    draft_model="llama-3.2-1b",
)
LLAMA_70B = ModelProfile(
    id="llama-3.1-70b",
    hf_name="meta-llama/Llama-3.1-70B-Instruct",
    num_layers=80,
    hidden_size=8192,
    intermediate_size=28672,
    num_attention_heads=64,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=128256,
    num_parameters=70.6e9,
    max_position_embeddings=131072,
    draft_model="llama-3.2-1b",
)
LLAMA_1B = ModelProfile(
    id="llama-3.2-1b",
    hf_name="meta-llama/Llama-3.2-1B-Instruct",
    num_layers=16,
    hidden_size=2048,
    intermediate_size=8192,
    num_attention_heads=32,
    num_kv_heads=8,
    head_dim=64,
    vocab_size=128256,
    num_parameters=1.24e9,
    max_position_embeddings=131072,
    tie_word_embeddings=True,
)
MODELS = {m.id: m for m in (LLAMA_8B, LLAMA_70B, LLAMA_1B)}
HARDWARE = {h.id: h for h in (H100, A100, L40S)}


def _shipped_hardware() -> dict[str, HardwareProfile]:
    try:
        return hardware_profiles()
    except Exception:
        return {}


def _shipped_models() -> dict[str, ModelProfile]:
    try:
        return model_profiles()
    except Exception:
        return {}


def hardware(hw_id: str) -> HardwareProfile:
    """The shipped profile when the data exists, else the hand-built one."""
    return _shipped_hardware().get(hw_id) or HARDWARE[hw_id]


def model(model_id: str) -> ModelProfile:
    return _shipped_models().get(model_id) or MODELS[model_id]


def all_models() -> dict[str, ModelProfile]:
    return {**MODELS, **_shipped_models()}


def no_api_engine() -> EngineProfile:
    """The shipped vLLM engine profile without its API server, so requests reach the
    scheduler the moment they arrive (for tests of the scheduler's own order)."""
    return get_engine("vllm").model_copy(
        update={
            "api_request_ms": 0.0,
            "api_per_token_us": 0.0,
            "api_latency_ms": 0.0,
            "api_chunk_us": 0.0,
        }
    )


def engine(
    model_id: str = "llama-3.1-8b",
    hw_id: str = "h100-sxm",
    family: str = "synthetic",
    *,
    engine_profile: EngineProfile | str = "vllm",
    **knobs: object,
) -> LaunchedEngine:
    """Launch on (shipped or hand-built) profiles with ServingConfig knobs."""
    return launch(
        model(model_id),
        hardware(hw_id),
        ServingConfig(**knobs),  # type: ignore[arg-type]
        workload_family=family,
        models=all_models(),
        engine=engine_profile,
    )


def workload(name: str, *overrides: str, requests: int | None = None, seed: int = 0) -> Workload:
    spec, base = load_spec(name, overrides, requests=requests)
    return materialise(spec, seed, base_dir=base)


def simple_workload(
    prompts: Sequence[int],
    outputs: Sequence[int],
    *,
    arrivals: Sequence[float] | None = None,
    concurrency: int | None = None,
    seed: int = 0,
    shared_prefix: int = 0,
    vocab: tuple[int, int] = (1000, 30000),
) -> Workload:
    """Single-turn requests with given lengths (random token ids), optional shared prefix."""
    if concurrency is not None:
        arrival = ArrivalSpec(kind="concurrency", concurrency=concurrency)
    elif arrivals is not None:
        arrival = ArrivalSpec(kind="poisson", rate=1.0)
    else:
        arrival = ArrivalSpec(kind="offline")
    spec = WorkloadSpec(name="test", num_requests=len(prompts), arrival=arrival)
    rng = np.random.default_rng(seed)
    prefixes = []
    if shared_prefix:
        prefixes = [rng.integers(*vocab, size=shared_prefix, dtype=np.int32)]
    sessions = []
    for i, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        own = max(p - shared_prefix, 0)
        t = None if concurrency is not None else (arrivals[i] if arrivals is not None else 0.0)
        sessions.append(
            Session(
                id=i,
                tokens=rng.integers(*vocab, size=own, dtype=np.int32),
                turns=[Turn(prompt_len=max(p, shared_prefix), output_len=o, arrival_s=t)],
                prefix_id=0 if shared_prefix else None,
            )
        )
    return Workload(spec=spec, seed=seed, sessions=sessions, prefixes=prefixes)


def run(eng: LaunchedEngine, wl: Workload, **kw: object) -> SimRun:
    return simulate(eng, wl, **kw)  # type: ignore[arg-type]


def metrics(eng: LaunchedEngine, wl: Workload, sim: SimRun | None = None, **kw: object) -> Metrics:
    """Simulate (unless given) and compute the load generator's metrics on the records."""
    sim = sim if sim is not None else simulate(eng, wl, **kw)  # type: ignore[arg-type]
    result = RunResult(
        target=eng.name,
        model=eng.model.id,
        workload=wl.spec.name,
        workload_hash="-",
        seed=wl.seed,
        started_at="-",
        duration_s=sim.duration_s,
        records=sim.records,
    )
    return compute_metrics(result)
