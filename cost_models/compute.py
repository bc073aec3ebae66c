"""Compute time of one micro-batch on one rank: GEMMs, attention and memory-bound kernels.

Each GEMM (m x k) @ (k x n) takes 2*m*n*k FLOPs at `peak x efficiency(m, n, k)`, where efficiency
is `calibration.gemm_efficiency x prod_d d / (d + gemm_half_dim)` (large GEMMs approach the fitted
ceiling; thin ones pay for tile and wave quantization), bounded below by the roofline time
`bytes / (hbm_bandwidth x hbm_efficiency)`. Backward runs two GEMMs of the same dimensions
(input and weight gradients): 2x forward time.

Attention runs at `attention_efficiency x bf16 peak` on causal FLOPs (FlashAttention skips masked
blocks); its backward costs `cost_models.flops.flash_backward_factor` x forward (2.5 for d_qk == d_v).

Norms, activations, residual adds and rotary embeddings are memory-bound: their time is the bytes
they read and write over HBM bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cluster_specs.spec import GPUSpec
from cost_models.calibration import Calibration
from cost_models.flops import attention_pairs, flash_backward_factor
from cost_models.mesh import MeshLike
from model_specs.spec import ModelSpec

Scalars = float | np.ndarray
"""A number, or an array of them (one per shard geometry priced together)."""


@dataclass(frozen=True)
class Gemm:
    """Dimensions (elements) of one GEMM; arrays when many shard geometries are priced at once."""

    m: Scalars
    n: Scalars
    k: Scalars
    count: Scalars = 1.0  # identical GEMMs (e.g. experts on this rank)

    @property
    def flops(self) -> Scalars:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class ShardGeometry:
    """How one micro-batch of one layer is split on a rank."""

    tokens: float | np.ndarray  # tokens on this rank: micro_batch x seq_len / cp
    seq_len: int  # full sequence length
    cp: int | np.ndarray
    tp: int | np.ndarray
    sp: bool | np.ndarray
    ep: int | np.ndarray
    etp: int | np.ndarray
    # Arrays (broadcasting against each other) price many geometries at once: every time below is
    # then an array of the same shape, each entry exactly what the scalar geometry gives.

    @classmethod
    def of(cls, mesh: MeshLike, micro_batch: int | np.ndarray, seq_len: int) -> ShardGeometry:
        """The geometry of a layout (or the planner's mesh) at `micro_batch` sequences of `seq_len`
        (an integer array of micro-batch sizes gives an array of token counts)."""
        return cls(micro_batch * seq_len / mesh.cp, seq_len, mesh.cp, mesh.tp, mesh.sp_, mesh.ep, mesh.etp_)


def layer_gemms(model: ModelSpec, index: int, g: ShardGeometry) -> list[Gemm]:
    """GEMMs of layer `index` on one rank for one micro-batch (forward)."""
    h, t, tp = model.hidden_size, g.tokens, g.tp
    nh = model.num_heads
    out: list[Gemm] = []
    if model.attention == "mla":
        assert model.kv_lora_rank and model.qk_rope_head_dim and model.qk_nope_head_dim and model.v_head_dim
        if model.q_lora_rank:
            out += [Gemm(t, model.q_lora_rank, h), Gemm(t, nh * model.qk_head_dim / tp, model.q_lora_rank)]
        else:
            out.append(Gemm(t, nh * model.qk_head_dim / tp, h))
        out.append(Gemm(t, model.kv_lora_rank + model.qk_rope_head_dim, h))
        out.append(Gemm(t, nh * (model.qk_nope_head_dim + model.v_head_dim) / tp, model.kv_lora_rank))
        out.append(Gemm(t, h, nh * model.v_head_dim / tp))
    else:
        d = model.qk_head_dim
        kv_cols = 2 * _larger(model.kv_heads / tp, 1.0) * d
        out.append(Gemm(t, nh * d / tp + kv_cols, h))
        out.append(Gemm(t, h, nh * d / tp))
    gate = 2 if model.gated_mlp else 1
    if not model.is_moe_layer(index):
        f = model.ffn_hidden_size / tp
        return out + [Gemm(t, gate * f, h), Gemm(t, h, f)]
    assert model.moe_ffn_hidden_size
    out.append(Gemm(t, model.num_experts, h))  # router, replicated over TP
    if model.num_shared_experts:
        fs = model.num_shared_experts * (model.shared_expert_ffn_hidden_size or model.moe_ffn_hidden_size) / tp
        out += [Gemm(t, gate * fs, h), Gemm(t, h, fs)]
    # Routed tokens: each rank dispatches its tokens (sequence-sharded under SP) top_k times; with
    # balanced routing each of its E/ep local experts receives routed / (E/ep) of the ep group's.
    t_route = t / _where(g.sp, tp, 1) * model.moe_top_k * _where(g.sp, g.etp, 1)
    local_experts = model.num_experts / g.ep
    per_expert = t_route / local_experts
    fe = model.moe_ffn_hidden_size / g.etp
    out += [Gemm(per_expert, gate * fe, h, local_experts), Gemm(per_expert, h, fe, local_experts)]
    return out


def gemm_time(gemm: Gemm, peak: float, gpu: GPUSpec, act_bytes: int, efficiency: float, cal: Calibration) -> Scalars:
    """Seconds for one forward GEMM group (elementwise when the GEMM's dimensions are arrays)."""
    shape: Scalars = 1.0
    for d in (gemm.m, gemm.n, gemm.k):
        shape *= d / (d + cal.gemm_half_dim)
    compute = gemm.flops / (peak * efficiency * shape)
    traffic = act_bytes * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n) * gemm.count
    memory = traffic / (gpu.memory_bandwidth_bytes_per_s * cal.hbm_efficiency)
    return _larger(compute, memory)


def _larger(a: float | np.ndarray, b: float | np.ndarray) -> float | np.ndarray:
    """max(a, b) of two floats, elementwise for arrays (the builtin keeps the scalar path fast)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return max(a, b)


def _where(cond: bool | np.ndarray, a: float | np.ndarray, b: float | np.ndarray) -> float | np.ndarray:
    """`a if cond else b`, elementwise when `cond` is an array."""
    if isinstance(cond, np.ndarray):
        return np.where(cond, a, b)
    return a if cond else b


def elementwise_bytes(model: ModelSpec, index: int, g: ShardGeometry, act_bytes: int) -> Scalars:
    """HBM bytes moved by the memory-bound ops of one layer, forward (backward ~ 2x).

    Per token: two norms (read + write h each), two residual adds (read 2h, write h), rotary on q
    and k (read + write), the MLP activation (gated: read 2f, write f; else read f, write f). Norms
    and residuals are sequence-sharded under SP; the rest is head- or column-sharded under TP."""
    h, tp = model.hidden_size, g.tp
    rep = _where(g.sp, tp, 1)
    per_token = (2 * 2 * h + 2 * 3 * h) / rep
    per_token += 2 * (model.num_heads + max(model.kv_heads, 1)) * model.qk_head_dim / tp
    return per_token * g.tokens * act_bytes + activation_function_bytes(model, index, g, act_bytes)


def activation_function_bytes(model: ModelSpec, index: int, g: ShardGeometry, act_bytes: int) -> Scalars:
    """HBM bytes of the MLP activation function, forward: gated reads 2f and writes f per token,
    non-gated reads f and writes f (the part of `elementwise_bytes` selective recompute re-runs)."""
    if model.is_moe_layer(index):
        assert model.moe_ffn_hidden_size
        f = model.moe_top_k * model.moe_ffn_hidden_size / g.etp
    else:
        f = model.ffn_hidden_size / g.tp
    return (3 if model.gated_mlp else 2) * f * g.tokens * act_bytes


@dataclass(frozen=True)
class LayerTime:
    """Seconds for one layer, one micro-batch, one rank."""

    gemm_fwd: Scalars
    attention_fwd: Scalars
    elementwise_fwd: Scalars
    attention_bwd_factor: float  # flash backward / forward FLOPs (`flops.flash_backward_factor`)
    activation_fwd: Scalars  # the MLP activation function's share of elementwise_fwd

    @property
    def attention(self) -> Scalars:
        """Attention kernel forward + backward: the window ring attention hides its exchange in."""
        return (1.0 + self.attention_bwd_factor) * self.attention_fwd

    @property
    def selective_recompute(self) -> Scalars:
        """What selective recompute re-runs: the attention core and the MLP activation function."""
        return self.attention_fwd + self.activation_fwd

    @property
    def forward(self) -> Scalars:
        return self.gemm_fwd + self.attention_fwd + self.elementwise_fwd

    @property
    def backward(self) -> Scalars:
        return 2.0 * self.gemm_fwd + self.attention_bwd_factor * self.attention_fwd + 2.0 * self.elementwise_fwd


def layer_time(model: ModelSpec, index: int, g: ShardGeometry, gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration) -> LayerTime:
    peak = gpu.peak(precision)
    eff = cal.fp8_gemm_efficiency if precision == "fp8" and "fp8" in gpu.peak_flops_per_s else cal.gemm_efficiency
    gemm = sum(gemm_time(x, peak, gpu, act_bytes, eff, cal) for x in layer_gemms(model, index, g))
    # Attention: this rank computes its heads (nh / tp) for its share of query positions (1 / cp,
    # load-balanced causal chunks) against the keys before them.
    pairs = attention_pairs(model, index, g.seq_len, "causal") / g.cp
    seqs = g.tokens / (g.seq_len / g.cp)
    attn_flops = 2.0 * pairs * seqs * model.num_heads / g.tp * (model.qk_head_dim + model.v_dim)
    attn = attn_flops / (gpu.peak("bf16") * cal.attention_efficiency)
    bandwidth = gpu.memory_bandwidth_bytes_per_s * cal.hbm_efficiency
    elem = elementwise_bytes(model, index, g, act_bytes) / bandwidth
    act = activation_function_bytes(model, index, g, act_bytes) / bandwidth
    return LayerTime(gemm, attn, elem, flash_backward_factor(model), act)


def lm_head_times(
    model: ModelSpec, g: ShardGeometry, gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration
) -> tuple[Scalars, Scalars]:
    """(forward, backward) seconds of the LM head GEMM and the cross-entropy (memory-bound:
    forward reads the logits and writes float32 probabilities, backward reads them and writes
    the logits' gradient)."""
    peak = gpu.peak(precision)
    eff = cal.fp8_gemm_efficiency if precision == "fp8" and "fp8" in gpu.peak_flops_per_s else cal.gemm_efficiency
    gemm = gemm_time(Gemm(g.tokens, model.vocab_size / g.tp, model.hidden_size), peak, gpu, act_bytes, eff, cal)
    per_pass = g.tokens * model.vocab_size / g.tp * (act_bytes + 4) / (gpu.memory_bandwidth_bytes_per_s * cal.hbm_efficiency)
    return gemm + per_pass, 2.0 * gemm + per_pass


def lm_head_time(model: ModelSpec, g: ShardGeometry, gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration) -> Scalars:
    """Forward + backward seconds of the LM head and the cross-entropy."""
    return sum(lm_head_times(model, g, gpu, precision, act_bytes, cal))
