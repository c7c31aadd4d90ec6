"""How long one engine step takes: a roofline per kernel class, plus fixed overheads.

A step runs every scheduled token through the model once. Its time is the sum of

- **linear layers** (QKV/O projections, MLP, LM head):
  ``max(weight bytes / BW, FLOPs / peak_fmt)`` where FLOPs = 2 x body parameters x tokens
  + 2 x vocab x hidden x sampled positions (logits are computed only where a token is
  sampled), and ``peak_fmt`` is the tensor-core rate of the weight format: W8A8 fp8 / int8
  run on fp8 / int8 tensor cores; weight-only formats (int4 AWQ/GPTQ W4A16, and fp8 on a
  GPU without fp8 tensor cores, as vLLM's Marlin kernels do on an A100) compute at the
  bf16 rate with a dequantization overhead. So int4 reads a quarter of the bytes (a big win
  while decode is memory-bound, at small batch) and computes slower than bf16 once the step
  is compute-bound (large batch, prefill);
- **attention**: ``max(KV bytes read / BW, attention FLOPs / peak_bf16)``, where each
  scheduled request reads the KV of its whole context once and does
  ``4 x layers x heads x head_dim`` FLOPs per query-key pair: a decode's cost grows
  linearly with its context, a prefill chunk's quadratically with its length (flash
  attention keeps the score matrix on chip, so only KV bytes count as memory traffic);
- **tensor-parallel communication**: two all-reduces per layer of the step's activations
  (``tokens x hidden x 2 bytes``), each ``latency + 2 (TP-1)/TP x bytes / bus bandwidth``;
- **speculative proposing**: ``draft_steps`` passes over the decoding requests, each a
  roofline of the draft's weights and FLOPs plus its KV reads and ``draft_step_overhead_ms``;
  a draft model also prefills every prompt (see :mod:`servegym.engines.sim.speculative`);
- **overheads** (the engine profile's, :class:`~servegym.engines.sim.profiles.EngineProfile`):
  ``step_overhead_ms`` (scheduling, sampling, output processing) on every step plus
  ``per_seq_overhead_us`` per scheduled request (host work that grows with the batch), plus
  ``tp_step_overhead_ms`` on every step under tensor parallel (worker synchronisation), and
  the hardware's ``eager_overhead_ms`` of kernel launches (scaled by layers / 32: the
  profiles' figure is for a 32-layer model) on steps that run without a CUDA graph: every
  step in eager mode, and otherwise steps of more than
  :data:`~servegym.engines.sim.defaults.CUDA_GRAPH_MAX_CAPTURE_SIZE` tokens (vLLM v1 captures
  piecewise graphs by token count, mixed prefill/decode batches included, up to that size).
  The overheads are added, not overlapped: at small batch the GPU idles while the host
  works; at large batch they are a small share of a long step. (The engine's API server,
  which every request passes before it is scheduled, is modelled in the scheduler.)

BW is ``hbm_bandwidth x mem_efficiency`` and every peak is scaled by
``compute_efficiency`` (times the engine's ``gemm_scale`` for the linear layers and
``attention_scale`` for attention). Weights and KV heads are split over the TP GPUs (KV heads
are replicated when TP exceeds them). Summing the kernel classes (rather than one roofline over
the whole step) reflects that they run one after another: in a mid-size decode batch the
GEMMs may be compute-bound while attention is still memory-bound.

Every function takes scalars or numpy arrays (one entry per step), so a run of k identical
decode steps is priced in one call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servegym.engines.sim.profiles import (
    EngineProfile,
    HardwareProfile,
    ModelProfile,
    QuantizationProfile,
)
from servegym.engines.sim.speculative import SpecPlan

FloatArray = npt.NDArray[np.float64]

GIB = 1024**3
REFERENCE_LAYERS = 32
"""Launch overheads in the hardware profiles are for a 32-layer model; a model with more (or
fewer) layers launches proportionally more (fewer) kernels per step."""

BUILTIN_QUANT: dict[str, QuantizationProfile] = {
    "bf16": QuantizationProfile(
        format="bf16", bytes_per_param=2.0, accuracy_ratio=1.0, dequant_overhead=0.0
    ),
    "fp8": QuantizationProfile(
        format="fp8", bytes_per_param=1.0, accuracy_ratio=0.997, dequant_overhead=0.0
    ),
    "int8": QuantizationProfile(
        format="int8", bytes_per_param=1.0, accuracy_ratio=0.985, dequant_overhead=0.05
    ),
    "int4": QuantizationProfile(
        format="int4",
        bytes_per_param=0.52,
        accuracy_ratio=0.97,
        dequant_overhead=0.15,
        compute_dtype="bf16",
    ),
}
"""Fallbacks when ``profiles/quantization.toml`` is absent (its shipped values)."""

KV_FP8_ACCURACY = 0.998
"""Fallback accuracy ratio of an fp8 KV cache (the data's ``kv_fp8`` entry when present)."""


@dataclass(frozen=True, slots=True)
class Memory:
    """Per-GPU memory figures of one engine (bytes)."""

    weight_bytes_total: float
    weight_bytes_per_gpu: float
    checkpoint_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    kv_bytes_per_token_total: float


def _peak(hw: HardwareProfile, dtype: str) -> float | None:
    value: float | None = getattr(hw.peak_tflops, dtype, None)
    return value


class CostModel:
    """Step time of one engine configuration."""

    def __init__(
        self,
        model: ModelProfile,
        hw: HardwareProfile,
        *,
        tp: int,
        quant: QuantizationProfile,
        weight_only_dequant: float,
        act_bytes: float,
        kv_elem_bytes: float,
        graph_max_tokens: int,
        eager: bool,
        spec: SpecPlan | None,
        engine: EngineProfile,
    ) -> None:
        """``weight_only_dequant``: the dequantization overhead a format pays when the GPU
        has no tensor cores for it and it runs weight-only at bf16 rate (fp8 on an A100)."""
        self.model = model
        self.hw = hw
        self.tp = tp
        self.spec = spec
        self.graph_max_tokens = graph_max_tokens
        self.eager = eager
        self.engine = engine

        h, v = model.hidden_size, model.vocab_size
        embed = float(v * h)
        lm_head = 0.0 if model.tie_word_embeddings else embed
        body = model.num_parameters - embed - lm_head
        self.body_params = body
        # Weights: the body in the weight format; embeddings and LM head stay 16-bit (32-bit
        # under dtype=float32, which also stores an unquantized body in 4 bytes). Every step
        # reads all of them (the profiles' efficiency factors are fitted that way).
        body_bytes = act_bytes if quant.format == "bf16" else quant.bytes_per_param
        wbytes = body * body_bytes + (embed + lm_head) * act_bytes
        # Checkpoint on disk: fp8 is quantized online from the bf16 checkpoint.
        ckpt = wbytes if quant.format != "fp8" else model.num_parameters * act_bytes

        bw = hw.hbm_bandwidth_tbs * 1e12 * hw.mem_efficiency
        ce = hw.compute_efficiency * engine.gemm_scale
        peak_bf16 = hw.peak_tflops.bf16 * 1e12 * ce
        peak_attn = hw.peak_tflops.bf16 * 1e12 * hw.compute_efficiency * engine.attention_scale
        if act_bytes >= 4:
            peak_attn /= 2.0
        if act_bytes >= 4:
            peak_bf16 /= 2.0  # fp32 activations: TF32 at half the 16-bit rate
        dequant = 1.0 + quant.dequant_overhead
        compute_dtype = quant.compute_dtype or quant.format
        peak_fmt = _peak(hw, compute_dtype)
        if compute_dtype == "bf16":
            peak_lin = peak_bf16
        elif peak_fmt is not None:
            peak_lin = peak_fmt * 1e12 * ce
        else:  # no tensor cores for the format: weight-only, dequantized to bf16
            peak_lin = peak_bf16
            dequant = 1.0 + max(quant.dequant_overhead, weight_only_dequant)
        self.weight_only = compute_dtype != "bf16" and peak_fmt is None

        kv_heads_gpu = max(1.0, model.num_kv_heads / tp)
        kv_tok_gpu = 2.0 * model.num_layers * kv_heads_gpu * model.head_dim * kv_elem_bytes
        kv_tok_total = model.kv_bytes_per_token(kv_elem_bytes)

        # Coefficients (per GPU, seconds).
        self.c_weights = wbytes / tp / bw
        self.a_lin = 2.0 * body / tp / peak_lin * dequant
        self.a_lm = 2.0 * v * h / tp / peak_bf16
        self.a_kv = kv_tok_gpu / bw
        self.a_attn = 4.0 * model.num_layers * (model.num_attention_heads / tp) * model.head_dim
        self.a_attn /= peak_attn
        if tp > 1:
            ring = 2.0 * (tp - 1) / tp
            per_ar_bytes = h * act_bytes * ring / (hw.interconnect_gbs * 1e9)
            self.c_comm = 2.0 * model.num_layers * hw.allreduce_latency_us * 1e-6
            self.a_comm = 2.0 * model.num_layers * per_ar_bytes
        else:
            self.c_comm = 0.0
            self.a_comm = 0.0
        layers = model.num_layers / REFERENCE_LAYERS
        self.c_step = engine.step_overhead_ms * 1e-3
        if tp > 1:
            self.c_step += engine.tp_step_overhead_ms * 1e-3
        self.c_seq = engine.per_seq_overhead_us * 1e-6
        self.c_eager = hw.eager_overhead_ms * 1e-3 * layers

        # Speculative proposer: draft_steps passes over the decoding requests per step.
        self.spec_kind = "none" if spec is None else spec.method
        self.draft_steps = 0 if spec is None else spec.draft_steps
        self.c_draft_w = 0.0  # weight read of one draft pass
        self.a_draft_lin = 0.0  # compute of one draft pass, per decoding request
        self.a_draft_kv = 0.0  # KV read of one draft pass, per context token
        self.a_draft_prefill = 0.0  # draft compute per prompt token
        self.c_pass = 0.0  # fixed cost of one draft pass
        draft_kv_total = 0.0
        draft_kv_gpu = 0.0
        draft_wbytes = 0.0
        if spec is not None:
            self.c_pass = spec.step_overhead_ms * 1e-3
            if spec.method == "draft_model" and spec.draft is not None:
                d = spec.draft
                d_embed = float(d.vocab_size * d.hidden_size)
                d_lm = 0.0 if d.tie_word_embeddings else d_embed
                d_body = d.num_parameters - d_embed - d_lm
                draft_wbytes = d_body * quant.bytes_per_param + (d_embed + d_lm) * act_bytes
                d_kvh = max(1.0, d.num_kv_heads / tp)
                self.c_draft_w = draft_wbytes / tp / bw
                self.a_draft_lin = (2.0 * d_body * dequant / peak_lin) + (
                    2.0 * d.vocab_size * d.hidden_size / peak_bf16
                )
                self.a_draft_lin /= tp
                self.a_draft_prefill = 2.0 * d_body / tp / peak_lin * dequant
                draft_kv_gpu = 2.0 * d.num_layers * d_kvh * d.head_dim * kv_elem_bytes
                draft_kv_total = d.kv_bytes_per_token(kv_elem_bytes)
                self.a_draft_kv = draft_kv_gpu / bw
            elif spec.head_params > 0:  # EAGLE / MTP head: one layer + LM head per pass
                hp = spec.head_params
                draft_wbytes = hp * act_bytes
                self.c_draft_w = draft_wbytes / tp / bw
                self.a_draft_lin = 2.0 * hp / tp / peak_bf16
                self.a_draft_prefill = 2.0 * hp / tp / peak_bf16
                draft_kv_gpu = kv_tok_gpu / model.num_layers
                draft_kv_total = kv_tok_total / model.num_layers
                self.a_draft_kv = draft_kv_gpu / bw
        self.memory = Memory(
            weight_bytes_total=wbytes + draft_wbytes,
            weight_bytes_per_gpu=(wbytes + draft_wbytes) / tp,
            checkpoint_bytes_per_gpu=(ckpt + draft_wbytes) / tp,
            kv_bytes_per_token_per_gpu=kv_tok_gpu + draft_kv_gpu,
            kv_bytes_per_token_total=kv_tok_total + draft_kv_total,
        )

    # --- step time ----------------------------------------------------------------------

    def _fixed(
        self,
        tokens: float,
        logits: float,
        big: float,
        seqs: float,
        decodes: float,
        prefill_tokens: float,
    ) -> float:
        """The parts of a step's time that do not depend on attention context."""
        lin = self.c_weights
        comp = tokens * self.a_lin + logits * self.a_lm
        if comp > lin:
            lin = comp
        t = lin + tokens * self.a_kv + self.c_step + seqs * self.c_seq + big * self.c_eager
        if self.c_comm:
            t += self.c_comm + tokens * self.a_comm
        if self.draft_steps and decodes > 0:
            dl = decodes * self.a_draft_lin
            t += self.draft_steps * ((dl if dl > self.c_draft_w else self.c_draft_w) + self.c_pass)
        if prefill_tokens:
            t += prefill_tokens * self.a_draft_prefill
        return t

    def step_time(
        self,
        tokens: float,
        logits: float,
        kv_tokens: float,
        attn_pairs: float,
        big: float,
        seqs: float,
        decodes: float = 0.0,
        decode_ctx: float = 0.0,
        prefill_tokens: float = 0.0,
    ) -> float:
        """Seconds of one step, before noise.

        ``tokens``: query tokens the target processes; ``logits``: sampled positions;
        ``kv_tokens``: KV entries attention reads (every scheduled request's context plus
        its new tokens); ``attn_pairs``: query-key pairs; ``big``: 1 when the step runs
        without a CUDA graph, else 0; ``seqs``: requests scheduled; ``decodes`` /
        ``decode_ctx``: decoding requests and their total context (draft cost);
        ``prefill_tokens``: prompt tokens (draft prefill).
        """
        t = self._fixed(tokens, logits, big, seqs, decodes, prefill_tokens)
        mem = kv_tokens * self.a_kv
        cmp = attn_pairs * self.a_attn
        t += mem if mem > cmp else cmp
        if decodes > 0 and self.a_draft_kv:
            t += self.draft_steps * self.a_draft_kv * decode_ctx
        return t

    def decode_run(
        self, n: int, verify: float, ctx0: float, grown: FloatArray, big: float
    ) -> FloatArray:
        """Seconds of each of ``len(grown)`` decode-only steps of ``n`` requests (before
        noise), each verifying ``verify`` tokens, whose contexts total ``ctx0 + n * grown[j]``
        before step ``j``: exactly :meth:`step_time` of each step, priced as one vector.

        Attention's memory and compute terms are both linear in the context, so when the
        same one dominates at both ends of the run it dominates throughout, and the step
        times are one affine function of ``grown``.
        """
        nv = n * verify
        fixed = self._fixed(nv, nv, big, float(n), float(n), 0.0)
        m0 = (ctx0 + nv) * self.a_kv
        m1 = n * self.a_kv
        c0 = (verify * ctx0 + nv * (verify + 1.0) / 2.0) * self.a_attn
        c1 = verify * n * self.a_attn
        if self.a_draft_kv:
            fixed += self.draft_steps * self.a_draft_kv * (ctx0 + n)
            d1 = self.draft_steps * self.a_draft_kv * n
        else:
            d1 = 0.0
        g0, g1 = float(grown[0]), float(grown[-1])
        mem_first = m0 + m1 * g0 >= c0 + c1 * g0
        mem_last = m0 + m1 * g1 >= c0 + c1 * g1
        if mem_first and mem_last:
            return (fixed + m0) + (m1 + d1) * grown
        if not mem_first and not mem_last:
            return (fixed + c0) + (c1 + d1) * grown
        out: FloatArray = fixed + np.maximum(m0 + m1 * grown, c0 + c1 * grown) + d1 * grown
        return out

    def batch1_decode_s(self, context: int) -> float:
        """One decode step of a single request at ``context`` tokens (no noise, no spec)."""
        return float(
            self.step_time(1.0, 1.0, float(context), float(context), self.graph_flag(1), 1.0)
        )

    def graph_flag(self, tokens: int) -> float:
        """1.0 when a step of ``tokens`` tokens runs without a CUDA graph."""
        return 1.0 if (self.eager or tokens > self.graph_max_tokens) else 0.0
