"""Floating-point work of a training step, per layer and per model.

Conventions (state them whenever a FLOP figure is printed):
- A multiply-add is 2 FLOPs. A GEMM of (m x k) @ (k x n) is 2*m*n*k FLOPs forward; its backward is
  twice that (input and weight gradients).
- Matmul parameters exclude norms, biases, embedding lookups and position tables (no GEMM touches
  them); the LM head and the MoE router are GEMMs and count. Routed experts count `top_k` times.
- Attention scores: forward is QK^T (2*s*s_kv*heads*d_qk) plus AV (2*s*s_kv*heads*d_v) per sequence.
  * "full" convention: s_kv = s for every query, causal mask ignored. This is how Megatron-LM, NeMo,
    llm-foundry and PyTorch's FlopCounterMode count, so published MFU uses it.
  * "causal" convention: each query attends to the keys before it (s*(s+1)/2 pairs, or the sliding
    window); what a flash-attention kernel with a causal mask actually executes.
- Model FLOPs = forward + backward = 3 x forward (backward of attention counted as 2 x forward, the
  Megatron convention). With a frozen base (LoRA, QLoRA: `TrainingSpec.frozen_base`) the weight
  GEMMs compute input gradients only: 2 x their forward, plus the adapters' 6 x r x (in + out) per
  token and adapted module (`cost_models.finetune`); attention is unchanged. MFU of a LoRA run is
  measured against that work, not against 6N. Hardware FLOPs add what recompute executes again, and count the flash-
  attention backward as PyTorch's `sdpa_backward_flop_count` does (`flash_backward_factor`: 2.5 x
  forward when d_qk == d_v; it recomputes QK^T).
- Mamba-2 layers (hybrid models, `ModelSpec.hybrid_pattern`): in_proj and out_proj are GEMMs
  (`mamba_matmul_params`); the chunked SSD scan (Dao & Gu 2024, "Transformers are SSMs", Sec. 6 and
  Listing 1) is counted like attention scores, by its matmuls (`ssd_scan_flops_forward`): per chunk
  of Q tokens, C B^T per group (2 Q^2 N x G), the masked diagonal block times X per head
  (2 Q^2 P x H), the chunk's final state B^T X (2 Q N P x H) and the previous state's output C h
  (2 Q N P x H); the sequence is padded to whole chunks. The inter-chunk state recurrence, the
  depthwise causal conv1d, softplus / exp / gating and the gated RMSNorm are elementwise (memory-
  bound, `cost_models.compute`), outside the FLOP count like every activation. Backward = 2 x
  forward (each matmul's input and weight gradients), as for attention under the model-FLOPs
  convention; the "full" and "causal" conventions count the same (each chunk computes its whole
  Q x Q block). Hardware FLOPs count the scan 4 x forward: its backward recomputes the forward
  (mamba_ssm's `mamba_split_conv1d_scan_combined` keeps only its input and recomputes the chunk
  states and C B^T; `runtime.model.Mamba2Mixer` checkpoints the same region). Megatron-LM's `num_floating_point_operations` counts the scan as 7 d_inner N per
  token instead (a per-token constant without the chunk terms); for Nemotron-H-56B both are
  under 3% of a Mamba layer's GEMMs.
Source: Narayanan et al. 2021 (Eq. 3), Korthikanti et al. 2022 (Sec. 5), PaLM appendix B.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from model_specs.params import count_params
from model_specs.spec import ModelSpec

AttentionConvention = Literal["full", "causal"]

def flash_backward_factor(model: ModelSpec) -> float:
    """Hardware FLOPs of a flash-attention backward relative to its forward.

    `torch.utils.flop_counter.sdpa_backward_flop_count` counts 2*pairs*H*(3*d_qk + 2*d_v) (it
    recomputes QK^T and computes dQ, dK, dV, dP) against a forward of 2*pairs*H*(d_qk + d_v): 2.5
    when d_qk == d_v, 2.6 for DeepSeek's MLA (d_qk 192, d_v 128)."""
    return (3 * model.qk_head_dim + 2 * model.v_dim) / (model.qk_head_dim + model.v_dim)


def attention_matmul_params(model: ModelSpec) -> int:
    """Weight elements of the attention projections that are GEMMs (no biases, norms, sinks)."""
    h, nh = model.hidden_size, model.num_heads
    if model.attention == "mla":
        assert model.kv_lora_rank and model.qk_rope_head_dim and model.v_head_dim and model.qk_nope_head_dim
        qk = model.qk_head_dim
        q = h * model.q_lora_rank + model.q_lora_rank * nh * qk if model.q_lora_rank else h * nh * qk
        kv = h * (model.kv_lora_rank + model.qk_rope_head_dim)
        kv += model.kv_lora_rank * nh * (model.qk_nope_head_dim + model.v_head_dim)
        return q + kv + nh * model.v_head_dim * h
    d = model.qk_head_dim
    return h * nh * d + 2 * h * model.kv_heads * d + nh * d * h


def mlp_matmul_params(model: ModelSpec, width: int) -> int:
    return (3 if model.gated_mlp else 2) * model.hidden_size * width


def mamba_matmul_params(model: ModelSpec) -> int:
    """Weight elements of a Mamba-2 mixer's GEMMs: in_proj h x (2 d_inner + 2 G N + H) and out_proj
    d_inner x h (conv1d, dt_bias, A_log, D and the norm are not GEMMs)."""
    return model.hidden_size * (model.mamba_in_proj_width + model.mamba_inner)


def ssd_scan_flops_forward(model: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of the chunked SSD scan of one Mamba-2 layer for one sequence (module doc):
    ceil(s / Q) chunks of Q tokens, each 2 Q^2 (G N + H P) + 4 Q H N P."""
    q = model.mamba_chunk_size
    heads, p, n, g = model.mamba_num_heads, model.mamba_head_dim, model.mamba_state_size, model.mamba_groups
    assert heads and p and n
    chunks = -(-seq_len // q)
    return float(chunks * (2.0 * q * q * (g * n + heads * p) + 4.0 * q * heads * n * p))


@dataclass(frozen=True)
class LayerMatmuls:
    """GEMM weight elements one token touches in one layer, split by parallel treatment."""

    attention: int
    dense_mlp: int
    router: int
    shared_experts: int
    routed_active: int  # top_k experts
    mamba: int = 0  # a Mamba-2 mixer's in_proj and out_proj (hybrid `M` layers)

    @property
    def total(self) -> int:
        return self.attention + self.dense_mlp + self.router + self.shared_experts + self.routed_active + self.mamba


def layer_matmuls(model: ModelSpec, index: int) -> LayerMatmuls:
    mixer = model.layer_mixer(index)
    if mixer == "mamba":
        return LayerMatmuls(0, 0, 0, 0, 0, mamba_matmul_params(model))
    if mixer == "attention":
        return LayerMatmuls(attention_matmul_params(model), 0, 0, 0, 0)
    attn = attention_matmul_params(model) if mixer == "transformer" else 0
    if not model.is_moe_layer(index):
        return LayerMatmuls(attn, mlp_matmul_params(model, model.ffn_hidden_size), 0, 0, 0)
    assert model.moe_ffn_hidden_size
    shared = model.num_shared_experts * mlp_matmul_params(model, model.shared_expert_width)
    if model.shared_expert_gate:
        shared += model.hidden_size
    return LayerMatmuls(
        attention=attn,
        dense_mlp=0,
        router=model.hidden_size * model.num_experts,
        shared_experts=shared,
        routed_active=model.moe_top_k * mlp_matmul_params(model, model.moe_ffn_hidden_size),
    )


def attention_pairs(model: ModelSpec, index: int, seq_len: int, convention: AttentionConvention) -> float:
    """(query, key) pairs scored per sequence in layer `index`."""
    if convention == "full":
        return float(seq_len * seq_len)
    if model.uses_sliding_window(index):
        w = model.sliding_window
        assert w is not None
        if model.window_kind == "chunked":  # causal inside each chunk of w tokens (Llama 4)
            full, rest = divmod(seq_len, w)
            return float(full * w * (w + 1) / 2 + rest * (rest + 1) / 2)
        if w < seq_len:
            # queries past the first w each see w keys; the first w see 1..w
            return float(w * (w + 1) / 2 + (seq_len - w) * w)
    return seq_len * (seq_len + 1) / 2


def attention_score_flops_forward(model: ModelSpec, index: int, seq_len: int, convention: AttentionConvention) -> float:
    """Forward FLOPs of QK^T and AV for one sequence in layer `index` (0 without attention)."""
    if not model.has_attention(index):
        return 0.0
    pairs = attention_pairs(model, index, seq_len, convention)
    return 2.0 * pairs * model.num_heads * (model.qk_head_dim + model.v_dim)


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one optimizer step over the whole model and global batch (all ranks together)."""

    model_flops: float  # full-attention convention, 3 x forward: the MFU numerator
    model_flops_causal: float  # same with causal attention pairs
    hardware_flops: float  # causal attention, flash backward, + recompute
    matmul_flops: float  # GEMM part of model_flops (6 * active matmul params * tokens)
    attention_flops: float  # score part of model_flops (full convention)
    scan_flops: float = 0.0  # SSD-scan part of model_flops (Mamba-2 layers, 3 x forward)


def forward_flops_per_sequence(model: ModelSpec, seq_len: int, convention: AttentionConvention = "full") -> float:
    """Forward FLOPs for one sequence: GEMMs (layers + LM head) and attention scores."""
    total = 2.0 * seq_len * model.vocab_size * model.hidden_size  # LM head
    for i in range(model.num_layers):
        total += 2.0 * seq_len * layer_matmuls(model, i).total
        total += attention_score_flops_forward(model, i, seq_len, convention)
        if model.is_mamba_layer(i):
            total += ssd_scan_flops_forward(model, seq_len)
    return total


@lru_cache(maxsize=4096)
def step_flops(
    model: ModelSpec,
    seq_len: int,
    sequences: int,
    recompute: Literal["none", "selective", "full", "op_sac"] = "none",
    recomputed_layer_fraction: float = 1.0,
    frozen_base: bool = False,
    adapter_params_per_token: float = 0.0,
) -> StepFlops:
    """FLOPs of a step over `sequences` sequences of `seq_len` tokens (cached: specs are frozen).

    `recomputed_layer_fraction` is the share of layers that full recompute re-runs (1.0 = all).
    `frozen_base`: no weight-gradient GEMMs; `adapter_params_per_token`: adapter elements a token
    passes through (forward 2 FLOPs each, backward 4), counted in every total.
    """
    tokens = float(seq_len * sequences)
    matmul_fwd = 2.0 * tokens * model.vocab_size * model.hidden_size
    attn_full_fwd = attn_causal_fwd = scan_fwd = 0.0
    layer_matmul_fwd = 0.0
    for i in range(model.num_layers):
        layer_matmul_fwd += 2.0 * tokens * layer_matmuls(model, i).total
        attn_full_fwd += sequences * attention_score_flops_forward(model, i, seq_len, "full")
        attn_causal_fwd += sequences * attention_score_flops_forward(model, i, seq_len, "causal")
        if model.is_mamba_layer(i):
            scan_fwd += sequences * ssd_scan_flops_forward(model, seq_len)
    matmul_fwd += layer_matmul_fwd
    passes = 2.0 if frozen_base else 3.0  # forward + input gradient (+ weight gradient)
    adapters = 6.0 * tokens * adapter_params_per_token
    # the SSD scan's matmuls take gradients for their inputs (x, B, C, dt): 3 x forward in every count
    model_flops = passes * matmul_fwd + 3.0 * attn_full_fwd + 3.0 * scan_fwd + adapters
    model_causal = passes * matmul_fwd + 3.0 * attn_causal_fwd + 3.0 * scan_fwd + adapters
    # hardware: the scan's backward re-runs its forward (mamba_ssm's fused kernels recompute the
    # chunk states and C B^T; the runtime checkpoints the mixer core): 4 x forward
    hardware = passes * matmul_fwd + (1.0 + flash_backward_factor(model)) * attn_causal_fwd + 4.0 * scan_fwd + adapters
    if recompute == "full":
        hardware += recomputed_layer_fraction * (layer_matmul_fwd + attn_causal_fwd + scan_fwd)
    elif recompute == "selective":
        hardware += attn_causal_fwd
    elif recompute == "op_sac":  # every second matmul of each block (cost_models.op_sac)
        from cost_models.op_sac import block_matmuls

        hardware += sum(
            2.0 * tokens * sum(m.macs_per_token for m in block_matmuls(model, i)[1::2]) for i in range(model.num_layers)
        )
    return StepFlops(
        model_flops, model_causal, hardware, passes * matmul_fwd + adapters, 3.0 * attn_full_fwd, 3.0 * scan_fwd
    )


def six_n_t(model: ModelSpec, tokens: int) -> float:
    """The 6*N*T rule of thumb with N = active parameters excluding the embedding table."""
    pc = count_params(model)
    return 6.0 * (pc.active - pc.embedding) * tokens

