"""Hardware and model profiles of the simulator (data files under ``profiles/``).

A profile is pure data with its sources; the simulator's cost model reads it. Profiles have
short ids used everywhere (task files, commands): ``h100-sxm``, ``llama-3.1-8b`` ...
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servegym.engines.config import SpecMethod
from servegym.errors import UserError

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"

T = TypeVar("T", bound=BaseModel)

WeightFormat = Literal["bf16", "fp8", "int8", "int4"]
InterconnectKind = Literal["nvlink", "pcie", "infinity-fabric"]
WorkloadFamily = Literal["synthetic", "chat", "agentic", "trace"]


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PeakCompute(_Data):
    """Dense peak tensor throughput, TFLOP/s (TOPS for integer), without sparsity."""

    bf16: float = Field(gt=0)
    fp8: float | None = Field(default=None, gt=0, description="None: no FP8 tensor cores")
    int8: float = Field(gt=0)
    int4: float | None = Field(default=None, gt=0)


class HardwareProfile(_Data):
    """One GPU model, as the roofline and the scheduler see it."""

    id: str
    name: str
    memory_gib: float = Field(gt=0, description="HBM per GPU, GiB")
    hbm_bandwidth_tbs: float = Field(gt=0, description="peak HBM bandwidth, TB/s")
    peak_tflops: PeakCompute
    mem_efficiency: float = Field(
        gt=0, le=1, description="achievable fraction of peak bandwidth for weight/KV streaming"
    )
    compute_efficiency: float = Field(
        gt=0, le=1, description="achievable fraction of peak FLOP/s for large GEMMs"
    )
    eager_overhead_ms: float = Field(
        ge=0, description="extra per-step kernel-launch overhead in eager mode (no CUDA graphs)"
    )
    interconnect_gbs: float = Field(
        gt=0, description="per-GPU all-reduce bus bandwidth, GB/s (NVLink or PCIe)"
    )
    interconnect_kind: InterconnectKind = Field(
        default="nvlink",
        description="what links the GPUs of one server: NVLink-class or only PCIe",
    )
    allreduce_latency_us: float = Field(ge=0, description="latency of one small all-reduce")
    weight_load_gbs: float = Field(gt=0, description="checkpoint load rate into HBM, GB/s")
    cuda_graph_capture_s: float = Field(ge=0)
    compile_s: float = Field(ge=0, description="torch.compile warm-up at start-up")
    activation_reserve_gib: float = Field(
        ge=0, description="memory kept for activations and workspace, GiB"
    )
    price_per_hour: float = Field(ge=0, description="on-demand USD per GPU-hour")
    price_source: str
    sources: list[str] = Field(default_factory=list)


class EngineProfile(_Data):
    """What a serving engine pays beyond the GPU kernels (``profiles/engines/<id>.toml``).

    The kernels' speed is the hardware profile's (bandwidth and compute efficiency); an
    engine scales them (``gemm_scale``, ``attention_scale``: its kernels and fusion) and adds
    host-side costs: the engine core's per-step work (``step_overhead_ms``), per-sequence
    work that grows with the batch (``per_seq_overhead_us``: the engine core's scheduling,
    sampling and output of each running request), the synchronisation of tensor-parallel
    workers once per step (``tp_step_overhead_ms``), and the API server every request passes
    through before it reaches the scheduler, one at a time (``api_request_ms`` plus
    ``api_per_token_us`` per prompt token: HTTP, chat template, tokenisation), and the
    latency of the serving path that holds no server (``api_latency_ms``: hand-offs between
    the client, the API server and the engine process, streaming the first token back),
    added once to every request. ``api_chunk_us`` is the API server's work per streamed
    chunk (output processing, detokenising and sending one request's tokens of one step):
    it runs on the same server as the intake, in the order the work arrives, and a token
    reaches the client only when its chunk has been sent, so many open streams make each
    one slower and every new request waits behind the chunks before it.
    ``api_holds_burst`` is how a server that preprocesses on its event loop takes a burst
    (vLLM's chat endpoint, which renders the chat template there): requests that arrive
    while it is busy reach the scheduler together, when it has finished all of them,
    instead of one by one. Every number is fitted to published
    measurements by ``benchmarks/sim_calibration.py --fit``.
    """

    id: str
    name: str
    step_overhead_ms: float = Field(ge=0, description="host time per engine step, ms")
    per_seq_overhead_us: float = Field(
        ge=0, description="host time per scheduled request per step, microseconds"
    )
    tp_step_overhead_ms: float = Field(
        ge=0, description="extra time per step when tensor parallel > 1 (worker sync), ms"
    )
    api_request_ms: float = Field(
        ge=0, description="API-server time per request before scheduling (serialised), ms"
    )
    api_per_token_us: float = Field(
        ge=0, description="API-server time per prompt token (tokenisation), microseconds"
    )
    api_latency_ms: float = Field(
        default=0.0,
        ge=0,
        description="latency every request pays outside the serialised API server, ms",
    )
    api_chunk_us: float = Field(
        default=0.0,
        ge=0,
        description="API-server time per streamed output chunk (one request's tokens of one "
        "step), serialised with the requests it takes in, microseconds",
    )
    api_holds_burst: bool = Field(
        default=False,
        description="requests taken in while the API server is busy enter the scheduler "
        "together when it is done (preprocessing on the server's event loop)",
    )
    gemm_scale: float = Field(
        gt=0, le=3, description="multiplies the hardware's compute efficiency for GEMMs"
    )
    attention_scale: float = Field(
        gt=0, le=3, description="multiplies the hardware's compute efficiency for attention"
    )
    fitted_on: list[str] = Field(
        default_factory=list, description="calibration sources the numbers were fitted to"
    )
    notes: str = ""


class ModelProfile(_Data):
    """One transformer's architecture, as far as serving cost depends on it."""

    id: str
    hf_name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    num_parameters: float = Field(gt=0, description="total parameters")
    max_position_embeddings: int = Field(gt=0)
    tie_word_embeddings: bool = False
    draft_model: str | None = Field(
        default=None, description="id of the default draft model for speculative decoding"
    )
    sources: list[str] = Field(default_factory=list)

    def kv_bytes_per_token(self, bytes_per_element: float) -> float:
        """KV-cache bytes one token occupies across all layers (K and V)."""
        return 2.0 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_element

    def architecture_parameters(self) -> float:
        """Parameters implied by the architecture numbers (dense GQA decoder, gated MLP).

        Per layer: Q and O projections (hidden x heads*head_dim each), K and V projections
        (hidden x kv_heads*head_dim each), a gated MLP (3 x hidden x intermediate) and two
        norms; plus the input embedding, the LM head unless tied, and the final norm. Biases
        and per-head norms (Qwen3's q/k norm) are a few thousand parameters and left out.
        """
        h = self.hidden_size
        attn = 2 * h * self.num_attention_heads * self.head_dim
        attn += 2 * h * self.num_kv_heads * self.head_dim
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return float(self.num_layers * per_layer + embed + h)


class QuantizationProfile(_Data):
    """What a weight format costs and changes (``profiles/quantization.toml``)."""

    format: WeightFormat
    bytes_per_param: float = Field(gt=0)
    accuracy_ratio: float = Field(
        gt=0, le=1, description="modelled task accuracy relative to bf16 (1.0 = no loss)"
    )
    dequant_overhead: float = Field(
        ge=0, description="extra fraction of GEMM time for dequantization at large batch"
    )
    applies_to: Literal["weights", "kv_cache"] = Field(
        default="weights", description="what the format stores: model weights or the KV cache"
    )
    compute_dtype: WeightFormat | None = Field(
        default=None,
        description="which peak_tflops entry the GEMMs run at when compute-bound; None: the "
        "format itself (W8A8). Weight-only formats (W4A16) compute in bf16",
    )
    aliases: list[str] = Field(
        default_factory=list,
        description="ServingConfig.quantization values that map to this format (awq, gptq ...)",
    )
    sources: list[str] = Field(default_factory=list)


def _load_dir(kind: str) -> dict[str, Path]:
    folder = PROFILES_DIR / kind
    return {p.stem: p for p in sorted(folder.glob("*.toml"))}


def _read(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: malformed TOML: {e}") from None


def _validate(cls: type[T], path: Path) -> T:
    try:
        return cls.model_validate(_read(path))
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise UserError(f"{path}: field '{loc}': {err['msg']}") from None


@cache
def hardware_profiles() -> dict[str, HardwareProfile]:
    return {k: _validate(HardwareProfile, p) for k, p in _load_dir("hardware").items()}


@cache
def model_profiles() -> dict[str, ModelProfile]:
    return {k: _validate(ModelProfile, p) for k, p in _load_dir("models").items()}


@cache
def engine_profiles() -> dict[str, EngineProfile]:
    return {k: _validate(EngineProfile, p) for k, p in _load_dir("engines").items()}


def get_engine(engine_id: str, flag: str = "engine") -> EngineProfile:
    profiles = engine_profiles()
    if engine_id not in profiles:
        raise UserError(
            f"{flag}: unknown simulated engine '{engine_id}' (known: {', '.join(profiles)})"
        )
    return profiles[engine_id]


@cache
def quantization_profiles() -> dict[str, QuantizationProfile]:
    raw = _read(PROFILES_DIR / "quantization.toml")
    out: dict[str, QuantizationProfile] = {}
    for name, table in raw.items():
        try:
            out[name] = QuantizationProfile.model_validate(table)
        except ValidationError as e:
            raise UserError(f"{PROFILES_DIR / 'quantization.toml'}: [{name}]: {e}") from None
    return out


def get_hardware(hw_id: str, flag: str = "--hardware") -> HardwareProfile:
    profiles = hardware_profiles()
    if hw_id not in profiles:
        raise UserError(f"{flag}: unknown hardware '{hw_id}' (known: {', '.join(profiles)})")
    return profiles[hw_id]


def get_model(model_id: str, flag: str = "--model") -> ModelProfile:
    profiles = model_profiles()
    if model_id not in profiles:
        raise UserError(f"{flag}: unknown model '{model_id}' (known: {', '.join(profiles)})")
    return profiles[model_id]


class SpeculativeProfile(_Data):
    """One speculative-decoding method (``profiles/speculative.toml``).

    Acceptance follows the usual i.i.d. model: a proposed token at position ``i`` (1-based)
    is accepted with probability ``acceptance_rate[family] * position_decay ** (i - 1)`` given
    that all before it were; the first rejection ends the run. With a constant rate ``a`` and
    ``k`` proposed tokens the expected tokens per verification step is
    ``(1 - a ** (k + 1)) / (1 - a)``.
    """

    method: SpecMethod
    acceptance_rate: dict[WorkloadFamily, float] = Field(
        description="per-token conditional acceptance probability by workload family"
    )
    match_rate: dict[WorkloadFamily, float] = Field(
        default_factory=dict,
        description="fraction of steps on which the proposer has a proposal at all (ngram "
        "finds no match on fresh text); missing families: 1.0",
    )
    position_decay: float = Field(
        default=1.0, gt=0, le=1, description="acceptance multiplier per further position"
    )
    draft_param_fraction: float | None = Field(
        default=None,
        ge=0,
        description="weights a draft step reads, as a fraction of the target's parameters "
        "(EAGLE head, MTP module); None: the draft model's own profile (draft_model) or no "
        "GPU work (ngram)",
    )
    draft_step_overhead_ms: float = Field(
        ge=0, description="fixed time per draft step (launch, CPU), on top of its weight reads"
    )
    autoregressive: bool = Field(
        default=True,
        description="True: one draft step per proposed token (draft model, EAGLE, MTP); "
        "False: one lookup proposes all k tokens (ngram)",
    )
    default_num_speculative_tokens: int = Field(ge=1)
    heads: dict[str, str] = Field(
        default_factory=dict,
        description="model id -> published draft head (eagle, eagle3); a model missing here "
        "has no head and the method must fail at launch",
    )
    requires_native_support: bool = Field(
        default=False, description="the target itself must ship the module (MTP)"
    )
    judgment: list[str] = Field(
        default_factory=list, description="which numbers are judgment rather than measured"
    )
    sources: list[str] = Field(default_factory=list)

    def rate(self, family: WorkloadFamily) -> float:
        return self.acceptance_rate.get(family, self.acceptance_rate.get("chat", 0.0))

    def expected_tokens_per_step(self, family: WorkloadFamily, k: int) -> float:
        """Expected tokens emitted per verification step (accepted drafts + the bonus token)."""
        p = self.match_rate.get(family, 1.0)
        a = self.rate(family)
        run, prob = 0.0, 1.0
        for i in range(k):
            prob *= a * self.position_decay**i
            run += prob
        return 1.0 + p * run


@cache
def speculative_profiles() -> dict[str, SpeculativeProfile]:
    path = PROFILES_DIR / "speculative.toml"
    raw = _read(path)
    out: dict[str, SpeculativeProfile] = {}
    for name, table in raw.items():
        try:
            out[name] = SpeculativeProfile.model_validate(table)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise UserError(f"{path}: [{name}] field '{loc}': {err['msg']}") from None
    return out
