"""Reference decoder-only transformer built from a `ModelSpec`, in plain PyTorch (no parallelism).

This is the model every parallel layout of `runtime` starts from (TP/SP, FSDP, PP, CP and EP are
applied to it later, torchtitan style), and the model whose FLOPs and memory the ground-truth tests
measure. It follows torchtitan's module structure and HuggingFace's numerics for each family:

- `Transformer`: token embedding (`tok_embeddings`), learned position table (`pos_embeddings`, only
  when `spec.position_embedding == "learned"`), `layers` (an `nn.ModuleDict` keyed by the layer
  index as a string, so pipeline stages can delete the layers they do not own), final norm
  (`norm`) and LM head (`output`). Any of `tok_embeddings`, `pos_embeddings`, `norm`, `output` may
  be set to `None` by a pipeline stage; `forward` then passes hidden states through.
- `TransformerBlock`: pre-norm, sequential (`h = x + attn(n1(x)); out = h + mlp(n2(h))`) or
  parallel residual (`out = x + attn(n1(x)) + mlp(n2(x))`, GPT-NeoX: two norms, both read `x`).
- `Attention`: MHA / GQA / MQA with optional q/k/v bias, output bias, per-head RMSNorm on q and k
  (Qwen3, applied before RoPE), attention sinks (GPT-OSS) and sliding windows (Mistral, GPT-OSS).
- `MLAttention`: DeepSeek-V2/V3 multi-head latent attention (q and kv low-rank factors with
  RMSNorm on the latents, nope/rope split, one rope key shared by all heads).
- `FeedForward`: gated (`swiglu`, `geglu`: w2(act(w1 x) * w3 x)) or two-matrix (`gelu`, `relu`,
  `relu2`, `silu`: w2(act(w1 x))).
- `MoE`: router, `GroupedExperts` (routed experts stored as 3-D tensors, expert index first, so
  expert parallelism shards dim 0), shared experts and an optional shared-expert sigmoid gate.
- Hybrid models (`spec.hybrid_pattern`, Nemotron-H): every layer is a `HybridBlock`, one RMSNorm and
  one mixer: `Mamba2Mixer` (chunked SSD scan in plain PyTorch, `ssd_chunked_scan`), `Attention`,
  `FeedForward` or `MoE`. The runtime runs them without tensor, context or expert parallelism
  (`runtime.spec` refuses those layouts).

Shapes: B = batch, S = sequence, h = hidden, H = query heads, K = kv heads, d = head width,
E = routed experts, k = top-k, T = B*S tokens.

Positional encoding
- `rope`: rotate-half RoPE (HuggingFace Llama convention), full head width for standard attention,
  `qk_rope_head_dim` for MLA. Base `rope_theta` = `spec.rope_theta` if the spec has one, else
  10000. No RoPE scaling (YaRN, Llama-3 NTK), which change no shape, except when a checkpoint's
  config.json asks for linear or llama3 scaling (`RotaryEmbedding`, `runtime.checkpoint`).
- `learned`: GPT-2 style table of `max_position_embeddings` rows added to the token embedding.
- `alibi`: implemented exactly (BLOOM slopes, additive bias -slope*(i-j)) as a float attention mask.

Attention kernels
- Default path: `F.scaled_dot_product_attention(is_causal=True)` with `enable_gqa` for GQA/MQA;
  with a sliding window (`i - j < window`, the HuggingFace convention) or ALiBi an explicit mask
  is passed instead of `is_causal`.
- Attention sinks (GPT-OSS) are supported: one learned logit per head appended as an extra
  softmax column (then dropped), computed with an explicit ("eager") softmax path, as HF's
  `GptOssAttention` eager implementation does. Its matmuls count the same FLOPs as SDPA.

Mixture of experts (documented choices)
- Scores: `softmax` over all experts, top-k, renormalised to sum to 1 (equal to Mixtral's softmax
  over the top-k logits, and to Qwen3-MoE with `norm_topk_prob`). When
  `spec.router_score_correction_bias` is set (DeepSeek-V3): `sigmoid` scores, top-k chosen on
  `scores + expert_bias` (aux-loss-free balancing bias, not trained by the optimizer), weights are
  the unbiased scores of the chosen experts renormalised to sum to 1. Group-limited routing and
  `routed_scaling_factor` are not in `ModelSpec` and are not modelled; there is no auxiliary loss.
- Dispatch: the T*k (token, expert) pairs are sorted by expert; each expert's FFN runs only on its
  own tokens, so the routed GEMM FLOPs are exactly `k * T * (expert FFN)`. Per-expert token counts
  must be Python ints (they size the GEMMs). With real tensors they come from `bincount`; with
  fake or meta tensors (FLOP and memory counting under `FakeTensorMode`, where top-k is data
  dependent) a balanced assignment of the same T*k pairs is used (counts differ by at most one
  between experts). FLOPs depend only on the sum, so the count is exact either way.

Parameters: `sum(p.numel() for p in model.parameters())` equals `model_specs.params.count_params(
spec).total` (tested). DeepSeek's `expert_bias` is therefore an `nn.Parameter` with
`requires_grad=False` (HF keeps it as a buffer; `count_params` counts it). Multi-token-prediction
modules (`mtp_layers`) are not built, as `count_params` does not count them.

Hooks for the parallel runtime: `Attention.core` / `MLAttention.core` (the causal attention kernel,
default `attention_core`; context parallelism swaps in one that gathers K/V), and `run_region`
on attention (core + head merge, consumed by `wo`) and `FeedForward` (activation, consumed by
`w2`): selective activation recompute swaps the runner. Defaults compute exactly as before.

Not supported (raise `NotSupportedError`): MLA combined with `qk_norm`, `qkv_bias` or
`attention_sinks` (no family has them and `count_params` does not count them for MLA).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from model_specs.spec import ModelSpec
from runtime.errors import NotSupportedError
from runtime.weights import SeededInit

__all__ = [
    "Attention",
    "FeedForward",
    "GroupedExperts",
    "HybridBlock",
    "Mamba2Mixer",
    "MLAttention",
    "MoE",
    "NotSupportedError",
    "Transformer",
    "TransformerBlock",
    "build_model",
    "num_params",
]

DEFAULT_ROPE_THETA = 10000.0
DEFAULT_NORM_EPS = 1e-5
"""Epsilon of every norm (`ModelSpec` carries none; PyTorch's `nn.LayerNorm` default)."""
INIT_STD = 0.02


# ---- small helpers ------------------------------------------------------------------------------


def _norm(spec: ModelSpec, width: int) -> nn.Module:
    """RMSNorm (scale only) or LayerNorm (scale and shift) over `width`, as `spec.norm` says."""
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(width, eps=DEFAULT_NORM_EPS)
    return nn.LayerNorm(width, eps=DEFAULT_NORM_EPS)


def init_norm(init: SeededInit, norm: nn.Module | None) -> None:
    """Unit scale (and zero shift for LayerNorm) of a norm, or nothing for None."""
    if norm is None:
        return
    weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
    if weight is not None:
        init.ones_(weight)
    if bias is not None:
        init.zeros_(bias)


def _rms(width: int) -> nn.RMSNorm:
    """RMSNorm regardless of `spec.norm` (qk-norm, MLA latent norms: scale only in every family)."""
    return nn.RMSNorm(width, eps=DEFAULT_NORM_EPS)


def _is_symbolic(t: torch.Tensor) -> bool:
    """True for fake (FakeTensorMode) or meta tensors, whose values cannot be read."""
    if t.device.type == "meta":
        return True
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x: (B, S, heads, d); cos, sin: (S, d) (fp32). Returns x's dtype."""
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    return (x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for RoPE of width `dim` at the given positions.

    Computed on the fly with elementwise ops (no matmul, so FLOP counters see none, and no buffer
    to re-materialise after meta-device construction). Source: Su et al. 2021; HF `LlamaRotaryEmbedding`.
    `scaling` (HF's `rope_scaling` dict; a checkpoint's, `runtime.checkpoint`): `linear` divides the
    frequencies by `factor`; `llama3` (Llama 3.1) divides those whose wavelength exceeds
    original_max_position_embeddings / low_freq_factor by `factor`, keeps those under
    original / high_freq_factor and blends in between (HF `_compute_llama3_parameters`).
    """

    def __init__(self, dim: int, theta: float = DEFAULT_ROPE_THETA, scaling: dict | None = None) -> None:
        super().__init__()
        if dim % 2:
            raise NotSupportedError(f"RoPE needs an even width, got {dim}")
        self.dim = dim
        self.theta = theta
        kind = (scaling or {}).get("rope_type", "default")
        if kind not in ("default", "linear", "llama3"):
            raise NotSupportedError(f"RoPE scaling {kind!r} is not implemented (default, linear, llama3)")
        self.scaling = scaling if kind != "default" else None

    def _scaled(self, inv_freq: torch.Tensor) -> torch.Tensor:
        sc = self.scaling
        if sc is None:
            return inv_freq
        factor = float(sc["factor"])
        if sc["rope_type"] == "linear":
            return inv_freq / factor
        low, high = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
        old = float(sc["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, blended, scaled)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: (S,) integer. Returns cos, sin: (S, dim) fp32."""
        idx = torch.arange(0, self.dim, 2, device=positions.device, dtype=torch.float32)
        inv_freq = self._scaled(1.0 / (self.theta ** (idx / self.dim)))
        freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi head slopes (Press et al. 2022; BLOOM's `build_alibi_tensor` for non powers of two)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest != num_heads:
        extra_base = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra_base ** (2 * i + 1) for i in range(num_heads - closest)]
    return torch.tensor(slopes, dtype=torch.float32)


def attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    window: int | None = None,
    chunked: bool = False,
    alibi: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention. q: (B, H, S, dq); k: (B, K, S, dq); v: (B, K, S, dv); H % K == 0.

    `window`: each query i sees keys j with i - window < j <= i, or with `chunked` (Llama 4) keys
    j <= i in the same chunk (i // window == j // window). `alibi`: (H,) slopes. `sinks`:
    (H,) learned logits appended to each row's softmax. Returns (B, H, S, dv) in q's dtype.
    """
    s = q.shape[-2]
    gqa = q.shape[1] != k.shape[1]
    if window is not None and window >= s:
        window = None
    if sinks is None and alibi is None and window is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)

    i = torch.arange(s, device=q.device)
    dist = i[:, None] - i[None, :]  # query - key
    allowed = dist >= 0
    if window is not None:
        allowed = allowed & ((i[:, None] // window == i[None, :] // window) if chunked else (dist < window))
    if alibi is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=gqa)

    bias = torch.zeros(allowed.shape, dtype=torch.float32, device=q.device).masked_fill(
        ~allowed, float("-inf")
    )
    if alibi is not None:
        bias = bias[None] - alibi.to(q.device, torch.float32)[:, None, None] * dist.clamp(min=0)[None]
    if sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias.to(q.dtype), scale=scale, enable_gqa=gqa
        )

    # Eager path with sinks (HF GptOssAttention eager_attention_forward).
    if gqa:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale + bias
    sink_col = sinks.float().reshape(1, -1, 1, 1).expand(scores.shape[0], -1, s, 1)
    probs = torch.cat([scores, sink_col], dim=-1).softmax(dim=-1)[..., :-1].to(v.dtype)
    return torch.matmul(probs, v)


def run_region(fn: Callable[..., torch.Tensor], inputs: tuple, consumer: nn.Module) -> torch.Tensor:
    """`consumer(fn(*inputs))`: the default runner of a recompute region.

    Attention runs its core (scores, softmax, weighted sum and the head merge) and MLPs their
    activation function as such a region, the output projection (wo, w2) being the consumer.
    `runtime.parallelize` swaps the runner per module (`module.run_region`) for selective
    activation recompute, which keeps only the region's inputs for backward.
    """
    return consumer(fn(*inputs))


# ---- attention ----------------------------------------------------------------------------------


class Attention(nn.Module):
    """Multi-head / grouped-query / multi-query attention.

    Weights: wq (H*d, h), wk (K*d, h), wv (K*d, h), wo (h, H*d); biases as `spec.qkv_bias` and
    `spec.attn_out_bias`; q_norm/k_norm (d,) when `spec.qk_norm`; sinks (H,) when
    `spec.attention_sinks`. Input/output (B, S, h).
    """

    def __init__(self, spec: ModelSpec, layer_id: int) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.qk_head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = spec.num_heads, spec.kv_heads, d
        self.wq = nn.Linear(h, self.n_heads * d, bias=spec.qkv_bias)
        self.wk = nn.Linear(h, self.n_kv_heads * d, bias=spec.qkv_bias)
        self.wv = nn.Linear(h, self.n_kv_heads * d, bias=spec.qkv_bias)
        self.wo = nn.Linear(self.n_heads * d, h, bias=spec.attn_out_bias)
        # q/k norms per head (Qwen3, Gemma 3) or over the whole projection (OLMo-2)
        whole = spec.qk_norm_scope == "projection"
        self.qk_norm_whole = whole
        self.q_norm = _rms(self.n_heads * d if whole else d) if spec.qk_norm else None
        self.k_norm = _rms(self.n_kv_heads * d if whole else d) if spec.qk_norm else None
        self.sinks = nn.Parameter(torch.zeros(self.n_heads)) if spec.attention_sinks else None
        self.window = spec.sliding_window if spec.uses_sliding_window(layer_id) else None
        self.chunked = spec.window_kind == "chunked"
        self.use_rope = spec.position_embedding == "rope"
        self.total_heads, self.head_start = self.n_heads, 0  # tensor parallel keeps heads [start, start + n)
        if spec.position_embedding == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(self.n_heads), persistent=False)
        else:
            self.alibi_slopes = None
        # Swappable by runtime.parallelize: the attention kernel (context parallel replaces it) and
        # the runner of the core + output projection (selective recompute replaces it).
        self.core = attention_core
        self.run_region = run_region

    def init_weights(self, init: SeededInit, std: float, out_std: float) -> None:
        for lin in (self.wq, self.wk, self.wv):
            init.normal_(lin.weight, std)
        init.normal_(self.wo.weight, out_std)
        for lin in (self.wq, self.wk, self.wv, self.wo):
            if lin.bias is not None:
                init.zeros_(lin.bias)
        init_norm(init, self.q_norm)
        init_norm(init, self.k_norm)
        if self.sinks is not None:
            init.zeros_(self.sinks)
        _init_alibi(self)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, s, _ = x.shape
        q, k = self.wq(x), self.wk(x)
        if self.qk_norm_whole and self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, s, -1, self.head_dim)
        k = k.view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if not self.qk_norm_whole and self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope and rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        return self.run_region(self.attend, (q, k, v), self.wo)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention core: q (B, S, H, d), k/v (B, S, K, d) -> merged heads (B, S, H*d)."""
        b, s = q.shape[:2]
        out = self.core(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            window=self.window,
            chunked=self.chunked,
            alibi=self.alibi_slopes,
            sinks=self.sinks,
        )
        return out.transpose(1, 2).reshape(b, s, -1)


def _init_alibi(attn: nn.Module) -> None:
    """Refill the (non-persistent) ALiBi slope buffer of the heads `attn` holds."""
    slopes = attn.alibi_slopes
    if slopes is None or _is_symbolic(slopes):
        return
    full = alibi_slopes(attn.total_heads)[attn.head_start : attn.head_start + slopes.shape[0]]
    with torch.no_grad():
        slopes.copy_(full)


class MLAttention(nn.Module):
    """DeepSeek-V2/V3 multi-head latent attention (DeepSeek-V2 paper Sec. 2.1; HF `DeepseekV3Attention`).

    q: wq_a (q_lora, h) -> q_norm (q_lora) -> wq_b (H*(nope+rope), q_lora), or wq (H*(nope+rope), h)
    without q LoRA. kv: wkv_a (kv_lora + rope, h) gives the latent c_kv and one rope key shared by
    all heads; kv_norm (kv_lora); wkv_b (H*(nope+v), kv_lora) expands the latent into per-head nope
    keys and values. wo (h, H*v). Queries and keys are [nope | rope] (width nope+rope); values v.
    Softmax scale (nope+rope)^-0.5 (no YaRN mscale). Input/output (B, S, h).
    """

    def __init__(self, spec: ModelSpec, layer_id: int) -> None:
        super().__init__()
        for flag in ("qk_norm", "qkv_bias", "attention_sinks"):
            if getattr(spec, flag):
                raise NotSupportedError(f"MLA with {flag}=True is not supported by the reference model")
        assert spec.kv_lora_rank and spec.qk_rope_head_dim and spec.qk_nope_head_dim and spec.v_head_dim
        h, nh = spec.hidden_size, spec.num_heads
        self.n_heads = nh
        self.q_lora_rank, self.kv_lora_rank = spec.q_lora_rank, spec.kv_lora_rank
        self.nope, self.rope_dim, self.v_dim = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
        self.qk_dim = self.nope + self.rope_dim
        if self.q_lora_rank:
            self.wq_a: nn.Linear | None = nn.Linear(h, self.q_lora_rank, bias=False)
            self.q_norm: nn.RMSNorm | None = _rms(self.q_lora_rank)
            self.wq: nn.Linear = nn.Linear(self.q_lora_rank, nh * self.qk_dim, bias=False)  # wq_b
        else:
            self.wq_a = self.q_norm = None
            self.wq = nn.Linear(h, nh * self.qk_dim, bias=False)
        self.wkv_a = nn.Linear(h, self.kv_lora_rank + self.rope_dim, bias=False)
        self.kv_norm = _rms(self.kv_lora_rank)
        self.wkv_b = nn.Linear(self.kv_lora_rank, nh * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(nh * self.v_dim, h, bias=spec.attn_out_bias)
        self.window = spec.sliding_window if spec.uses_sliding_window(layer_id) else None
        self.total_heads, self.head_start = nh, 0
        if spec.position_embedding == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(nh), persistent=False)
        else:
            self.alibi_slopes = None
        self.use_rope = spec.position_embedding == "rope"
        self.core = attention_core  # swappable, as in Attention
        self.run_region = run_region

    def init_weights(self, init: SeededInit, std: float, out_std: float) -> None:
        for lin in (self.wq_a, self.wq, self.wkv_a, self.wkv_b):
            if lin is not None:
                init.normal_(lin.weight, std)
        init.normal_(self.wo.weight, out_std)
        if self.wo.bias is not None:
            init.zeros_(self.wo.bias)
        init_norm(init, self.q_norm)
        init_norm(init, self.kv_norm)
        _init_alibi(self)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, s, _ = x.shape
        if self.wq_a is not None and self.q_norm is not None:
            q = self.wq(self.q_norm(self.wq_a(x)))
        else:
            q = self.wq(x)
        q = q.view(b, s, -1, self.qk_dim)
        q_nope, q_pe = q.split([self.nope, self.rope_dim], dim=-1)
        c_kv, k_pe = self.wkv_a(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        k_pe = k_pe.unsqueeze(2)  # (B, S, 1, rope): one rope key for all heads
        kv = self.wkv_b(self.kv_norm(c_kv)).view(b, s, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        if self.use_rope and rope is not None:
            q_pe, k_pe = apply_rotary(q_pe, *rope), apply_rotary(k_pe, *rope)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        return self.run_region(self.attend, (q, k, v), self.wo)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention core: q/k (B, S, H, nope+rope), v (B, S, H, v) -> merged heads (B, S, H*v)."""
        b, s = q.shape[:2]
        out = self.core(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), window=self.window, alibi=self.alibi_slopes
        )
        return out.transpose(1, 2).reshape(b, s, -1)


# ---- MLP and MoE --------------------------------------------------------------------------------


def _activation(kind: str, x: torch.Tensor) -> torch.Tensor:
    if kind in ("swiglu", "silu"):
        return F.silu(x)
    if kind in ("geglu", "gelu"):
        return F.gelu(x, approximate="tanh")  # GPT-2 "gelu_new", Gemma "gelu_pytorch_tanh"
    if kind == "relu":
        return F.relu(x)
    if kind == "relu2":
        return F.relu(x).square()
    raise NotSupportedError(f"unknown MLP kind {kind!r}")


class FeedForward(nn.Module):
    """Dense MLP of `width` neurons. Gated: w2(act(w1 x) * w3 x) with w1, w3 (width, h), w2 (h, width);
    two-matrix: w2(act(w1 x)). Biases on all matrices when `spec.mlp_bias`. Input/output (..., h)."""

    def __init__(self, spec: ModelSpec, width: int) -> None:
        super().__init__()
        h = spec.hidden_size
        self.kind = spec.mlp
        self.w1 = nn.Linear(h, width, bias=spec.mlp_bias)
        self.w2 = nn.Linear(width, h, bias=spec.mlp_bias)
        self.w3 = nn.Linear(h, width, bias=spec.mlp_bias) if spec.gated_mlp else None
        self.run_region = run_region  # swappable: selective recompute of the activation

    def init_weights(self, init: SeededInit, std: float, out_std: float) -> None:
        init.normal_(self.w1.weight, std)
        init.normal_(self.w2.weight, out_std)
        if self.w3 is not None:
            init.normal_(self.w3.weight, std)
        for lin in (self.w1, self.w2, self.w3):
            if lin is not None and lin.bias is not None:
                init.zeros_(lin.bias)

    def activation(self, g: torch.Tensor, u: torch.Tensor | None) -> torch.Tensor:
        """act(g) * u (gated) or act(g): the input of w2."""
        a = _activation(self.kind, g)
        return a if u is None else a * u

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.w1(x)
        u = self.w3(x) if self.w3 is not None else None
        return self.run_region(self.activation, (g, u), self.w2)


class GroupedExperts(nn.Module):
    """E routed experts stored as 3-D tensors, expert index first (torchtitan `GroupedExperts`).

    w1, w3: (E, width, h); w2: (E, h, width) (nn.Linear's (out, in) layout per expert); biases
    b1, b3: (E, width), b2: (E, h) when `spec.mlp_bias`. w3/b3 only for gated MLPs.
    """

    def __init__(self, spec: ModelSpec, num_experts: int, width: int) -> None:
        super().__init__()
        h = spec.hidden_size
        self.kind = spec.mlp
        self.num_experts = num_experts
        gated = spec.gated_mlp
        # zeros until `init_weights` (`build_model` initialises every module after construction)
        self.w1 = nn.Parameter(torch.zeros(num_experts, width, h))
        self.w2 = nn.Parameter(torch.zeros(num_experts, h, width))
        self.w3 = nn.Parameter(torch.zeros(num_experts, width, h)) if gated else None
        if spec.mlp_bias:
            self.b1 = nn.Parameter(torch.zeros(num_experts, width))
            self.b2 = nn.Parameter(torch.zeros(num_experts, h))
            self.b3 = nn.Parameter(torch.zeros(num_experts, width)) if gated else None
        else:
            self.b1 = self.b2 = self.b3 = None

    def init_weights(self, init: SeededInit, std: float, out_std: float) -> None:
        init.normal_(self.w1, std)
        init.normal_(self.w2, out_std)
        if self.w3 is not None:
            init.normal_(self.w3, std)
        for b in (self.b1, self.b2, self.b3):
            if b is not None:
                init.zeros_(b)

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x: (N, h) tokens sorted by expert; counts: tokens per expert (sum N). Returns (N, h).

        Each expert runs its GEMMs on its own rows only (one `mm` per matrix per expert)."""
        outs = []
        w1, w2 = self.w1.unbind(0), self.w2.unbind(0)
        w3 = self.w3.unbind(0) if self.w3 is not None else None
        b1 = self.b1.unbind(0) if self.b1 is not None else None
        b2 = self.b2.unbind(0) if self.b2 is not None else None
        b3 = self.b3.unbind(0) if self.b3 is not None else None
        for e, xe in enumerate(torch.split(x, counts, dim=0)):
            a = F.linear(xe, w1[e], b1[e] if b1 is not None else None)
            a = _activation(self.kind, a)
            if w3 is not None:
                a = a * F.linear(xe, w3[e], b3[e] if b3 is not None else None)
            outs.append(F.linear(a, w2[e], b2[e] if b2 is not None else None))
        return torch.cat(outs, dim=0)


class MoE(nn.Module):
    """Mixture-of-experts MLP: router (h -> E, `spec.router_bias`), top-k gating (see module doc),
    `GroupedExperts`, shared experts (a list of `num_shared_experts` FeedForwards) and the optional
    shared-expert sigmoid gate (h -> 1, Qwen2-MoE). Input/output (B, S, h)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        assert spec.moe_ffn_hidden_size
        h = spec.hidden_size
        self.num_experts, self.top_k = spec.num_experts, spec.moe_top_k
        self.router = nn.Linear(h, self.num_experts, bias=spec.router_bias)
        self.use_sigmoid = spec.router_score_correction_bias
        self.expert_bias = (
            nn.Parameter(torch.zeros(self.num_experts), requires_grad=False)
            if spec.router_score_correction_bias
            else None
        )
        self.experts = GroupedExperts(spec, self.num_experts, spec.moe_ffn_hidden_size)
        self.shared_experts = (
            nn.ModuleList(FeedForward(spec, spec.shared_expert_width) for _ in range(spec.num_shared_experts))
            if spec.num_shared_experts
            else None
        )
        self.shared_gate = (
            nn.Linear(h, 1, bias=False) if spec.shared_expert_gate and self.shared_experts else None
        )

    def init_weights(self, init: SeededInit, std: float, out_std: float) -> None:
        init.normal_(self.router.weight, std)
        if self.router.bias is not None:
            init.zeros_(self.router.bias)
        if self.expert_bias is not None:
            init.zeros_(self.expert_bias)
        self.experts.init_weights(init, std, out_std)
        for ff in self.shared_experts or ():
            ff.init_weights(init, std, out_std)
        if self.shared_gate is not None:
            init.normal_(self.shared_gate.weight, std)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (T, h). Returns top-k expert indices (T, k) int64 and weights (T, k) fp32 (rows sum to 1)."""
        logits = self.router(x).float()
        if self.use_sigmoid:
            scores = logits.sigmoid()
            assert self.expert_bias is not None
            idx = torch.topk(scores + self.expert_bias.float(), self.top_k, dim=-1).indices
            w = scores.gather(-1, idx)
        else:
            w, idx = torch.topk(logits.softmax(dim=-1), self.top_k, dim=-1)
        return idx, w / w.sum(dim=-1, keepdim=True)

    def tokens_per_expert(self, flat_idx: torch.Tensor) -> list[int]:
        """Tokens routed to each expert (Python ints). Balanced when `flat_idx` is fake or meta."""
        if _is_symbolic(flat_idx):
            base, extra = divmod(flat_idx.numel(), self.num_experts)
            return [base + 1] * extra + [base] * (self.num_experts - extra)
        return torch.bincount(flat_idx, minlength=self.num_experts).tolist()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (T, h)
        idx, w = self.route(flat)
        flat_idx = idx.reshape(-1)  # (T*k,)
        order = torch.argsort(flat_idx, stable=True)
        token_of = order // self.top_k  # source token of each sorted (token, expert) pair
        counts = self.tokens_per_expert(flat_idx)
        routed = self.experts(flat[token_of], counts)  # (T*k, h)
        routed = routed * w.reshape(-1)[order].unsqueeze(-1).to(routed.dtype)
        out = torch.zeros_like(flat).index_add(0, token_of, routed)
        return self.add_shared(flat, out).view(shape)

    def add_shared(self, flat: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Add the shared experts' output (gated by a sigmoid when the spec has a shared gate)."""
        if self.shared_experts is None:
            return out
        shared = sum(ff(flat) for ff in self.shared_experts)
        if self.shared_gate is not None:
            shared = torch.sigmoid(self.shared_gate(flat)) * shared
        return out + shared


# ---- Mamba-2 (hybrid models) --------------------------------------------------------------------


def causal_depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Causal depthwise conv1d over the sequence: x (B, S, C), weight (C, 1, K), bias (C,) ->
    (B, S, C), out[t] = bias + sum_k w[k] x[t - K + 1 + k] (zeros before the start). Written as K
    shifted multiply-adds (elementwise, as the causal_conv1d kernel is memory-bound) rather than
    `nn.Conv1d`, whose padded output the FLOP counter would count."""
    k = weight.shape[-1]
    s = x.shape[1]
    xp = F.pad(x, (0, 0, k - 1, 0))
    w = weight[:, 0, :].to(x.dtype)
    out = xp[:, 0:s] * w[:, 0]
    for j in range(1, k):
        out = out + xp[:, j : j + s] * w[:, j]
    return out if bias is None else out + bias.to(x.dtype)


def ssd_chunked_scan(
    x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, chunk: int
) -> torch.Tensor:
    """The SSD scan of Mamba-2 by chunks (Dao & Gu 2024, Sec. 6, Listing 1 `ssd_minimal_discrete`;
    transformers `NemotronHMamba2Mixer.torch_forward`). x (B, S, H, P), dt (B, S, H) (after
    softplus), a (H,) (A = -exp(A_log)), b / c (B, S, G, N). Returns y (B, S, H, P) without the D
    skip. The sequence is zero-padded to whole chunks of `chunk` tokens. Matmuls (what FLOP
    counters see, `cost_models.flops.ssd_scan_flops_forward`): per chunk C B^T per group, the
    masked diagonal block times X per head, each chunk's final state B^T X and the output of the
    previous chunks' state C h; the state recurrence between chunks is elementwise (a sequential
    scan, as mamba_ssm's `_state_passing_fwd`)."""
    bsz, s, heads, p = x.shape
    groups, n = b.shape[2], b.shape[3]
    pad = (-s) % chunk
    if pad:
        x, b, c = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, b, c))
        dt = F.pad(dt, (0, 0, 0, pad))
    nc = (s + pad) // chunk
    rep = heads // groups
    dtype = x.dtype
    xdt = (x * dt[..., None].to(dtype)).view(bsz, nc, chunk, heads, p).transpose(2, 3)  # (B, c, H, Q, P)
    acs = (dt.float() * a.float()).view(bsz, nc, chunk, heads).transpose(2, 3).cumsum(-1)  # (B, c, H, Q)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    decay = torch.exp((acs[..., :, None] - acs[..., None, :]).masked_fill(~causal, float("-inf")))  # (B, c, H, Q, Q)
    bc = b.view(bsz, nc, chunk, groups, n).transpose(2, 3)  # (B, c, G, Q, N)
    cc = c.view(bsz, nc, chunk, groups, n).transpose(2, 3)
    cb = torch.matmul(cc, bc.transpose(-1, -2))  # (B, c, G, Q, Q): C B^T per group
    scores = cb.repeat_interleave(rep, dim=2) * decay.to(dtype)
    y = torch.matmul(scores, xdt)  # diagonal blocks (B, c, H, Q, P)
    to_end = torch.exp(acs[..., -1:] - acs).to(dtype)  # decay from each position to its chunk's end
    bh = bc.repeat_interleave(rep, dim=2) * to_end[..., None]  # (B, c, H, Q, N)
    states = torch.matmul(bh.transpose(-1, -2), xdt)  # (B, c, H, N, P): each chunk's final state
    chunk_decay = torch.exp(acs[..., -1]).to(dtype)  # (B, c, H)
    h = torch.zeros_like(states[:, 0])
    entering = []
    for k in range(nc):  # state entering chunk k (elementwise recurrence)
        entering.append(h)
        h = h * chunk_decay[:, k, :, None, None] + states[:, k]
    prev = torch.stack(entering, dim=1)  # (B, c, H, N, P)
    ch = cc.repeat_interleave(rep, dim=2) * torch.exp(acs).to(dtype)[..., None]  # (B, c, H, Q, N)
    y = y + torch.matmul(ch, prev)  # contribution of the previous chunks
    return y.transpose(2, 3).reshape(bsz, nc * chunk, heads, p)[:, :s]


def _inverse_softplus_of_log_uniform_dt(u: torch.Tensor) -> torch.Tensor:
    """softplus^-1(dt) for dt = exp(u (ln 0.1 - ln 1e-3) + ln 1e-3) clamped at 1e-4, u uniform on [0, 1)
    (HF `NemotronHPreTrainedModel._init_weights`)."""
    dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
    return dt + torch.log(-torch.expm1(-dt))


class Mamba2Mixer(nn.Module):
    """Mamba-2 mixer (Dao & Gu 2024, Sec. 7; transformers `NemotronHMamba2Mixer`; Megatron-Core
    `megatron/core/ssm/mamba_mixer.py`). in_proj (h -> z, x B C, dt: 2 d_inner + 2 G N + H);
    depthwise causal conv1d over x B C (`conv1d.weight` (conv_dim, 1, K), bias) and SiLU; dt =
    softplus(dt + dt_bias); A = -exp(A_log); the chunked SSD scan (`ssd_chunked_scan`) plus the D
    skip; a gated RMSNorm per group (`norm_weight`, y * silu(z) normalized over d_inner / G,
    norm_before_gate=False as Nemotron-H); out_proj (d_inner -> h). Parameters as
    `model_specs.params.mamba_params`.

    Memory: everything between in_proj and out_proj (conv, scan, gate, norm) runs as one
    checkpointed region (`torch.utils.checkpoint`): it keeps its input, in_proj's output, and is
    recomputed in the backward, as mamba_ssm's fused `mamba_split_conv1d_scan_combined` keeps
    zxbcdt and recomputes its intermediates; so FLOP counters see the scan's forward twice
    (`cost_models.flops`: hardware FLOPs). Input/output (B, S, h)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        assert spec.mamba_num_heads and spec.mamba_head_dim and spec.mamba_state_size
        h = spec.hidden_size
        self.heads, self.head_dim = spec.mamba_num_heads, spec.mamba_head_dim
        self.groups, self.state = spec.mamba_groups, spec.mamba_state_size
        self.inner, self.conv_dim, self.chunk = spec.mamba_inner, spec.mamba_conv_dim, spec.mamba_chunk_size
        self.eps = DEFAULT_NORM_EPS
        self.in_proj = nn.Linear(h, spec.mamba_in_proj_width, bias=spec.mamba_proj_bias)
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, spec.mamba_conv_kernel, groups=self.conv_dim, bias=spec.mamba_conv_bias
        )
        self.dt_bias = nn.Parameter(torch.ones(self.heads))
        self.A_log = nn.Parameter(torch.zeros(self.heads))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm_weight = nn.Parameter(torch.ones(self.inner))
        self.out_proj = nn.Linear(self.inner, h, bias=spec.mamba_proj_bias)

    def init_weights(self, init: SeededInit, std: float, out_std: float) -> None:
        init.normal_(self.in_proj.weight, std)
        init.normal_(self.out_proj.weight, out_std)
        for lin in (self.in_proj, self.out_proj):
            if lin.bias is not None:
                init.zeros_(lin.bias)
        init.normal_(self.conv1d.weight, std)
        if self.conv1d.bias is not None:
            init.zeros_(self.conv1d.bias)
        init.values_(self.A_log, torch.log(torch.arange(1, self.heads + 1, dtype=torch.float32)))  # S4D-real (HF)
        init.ones_(self.D)
        init.ones_(self.norm_weight)
        # dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1] (HF `_init_weights`): a uniform
        # draw, then an elementwise map (layout-free)
        init.uniform_(self.dt_bias, 0.0, 1.0)
        init.transform_(self.dt_bias, _inverse_softplus_of_log_uniform_dt)

    def core(self, zxbcdt: torch.Tensor) -> torch.Tensor:
        """conv, scan, D skip, gate and norm: zxbcdt (B, S, proj) -> normed output (B, S, d_inner)."""
        bsz, s, _ = zxbcdt.shape
        z, xbc, dt = zxbcdt.split([self.inner, self.conv_dim, self.heads], dim=-1)
        xbc = F.silu(causal_depthwise_conv(xbc, self.conv1d.weight, self.conv1d.bias))
        x, b, c = xbc.split([self.inner, self.groups * self.state, self.groups * self.state], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias.float())
        x4 = x.reshape(bsz, s, self.heads, self.head_dim)
        y = ssd_chunked_scan(
            x4, dt, -torch.exp(self.A_log.float()), b.reshape(bsz, s, self.groups, self.state),
            c.reshape(bsz, s, self.groups, self.state), self.chunk,
        )
        y = (y + x4 * self.D.to(x.dtype)[:, None]).reshape(bsz, s, self.inner)
        g = (y.float() * F.silu(z.float())).view(bsz, s, self.groups, -1)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.norm_weight.to(x.dtype) * g.view(bsz, s, self.inner).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        zxbcdt = self.in_proj(x)
        if torch.is_grad_enabled() and zxbcdt.requires_grad:
            y = checkpoint(self.core, zxbcdt, use_reentrant=False, preserve_rng_state=False)
        else:
            y = self.core(zxbcdt)
        return self.out_proj(y)


class HybridBlock(nn.Module):
    """One layer of a hybrid model (`ModelSpec.hybrid_pattern`): `x + mixer(norm(x))` with a single
    RMSNorm and a single mixer, `Mamba2Mixer` (M), `Attention` (*), `FeedForward` (-) or `MoE`
    (E), as transformers' `NemotronHBlock` and Megatron-Core's hybrid stack build it.
    `self.kind` names the mixer. Input/output (B, S, h)."""

    def __init__(self, spec: ModelSpec, layer_id: int) -> None:
        super().__init__()
        self.kind = spec.layer_mixer(layer_id)
        self.norm = _norm(spec, spec.hidden_size)
        if self.kind == "mamba":
            self.mixer: nn.Module = Mamba2Mixer(spec)
        elif self.kind == "attention":
            self.mixer = Attention(spec, layer_id)
        elif self.kind == "moe":
            self.mixer = MoE(spec)
        else:
            self.mixer = FeedForward(spec, spec.ffn_hidden_size)

    def init_weights(self, init: SeededInit, std: float, out_std: float) -> None:
        init_norm(init, self.norm)
        self.mixer.init_weights(init, std, out_std)  # type: ignore[operator]

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if self.kind == "attention":
            return x + self.mixer(self.norm(x), rope)
        return x + self.mixer(self.norm(x))


# ---- blocks and model ---------------------------------------------------------------------------


class TransformerBlock(nn.Module):
    """Pre-norm block: attention_norm -> attention, ffn_norm -> feed_forward (dense) or moe.
    `spec.norm_placement` "post" (OLMo-2) applies the same two norms to the branch outputs instead;
    "sandwich" (Gemma 2/3) adds post_attention_norm and post_ffn_norm on the branch outputs.

    `self.mlp` is the FeedForward or MoE of this layer (`self.moe` is True on MoE layers).
    Input/output (B, S, h)."""

    def __init__(self, spec: ModelSpec, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.parallel_residual = spec.parallel_residual
        self.attention_norm = _norm(spec, spec.hidden_size)
        self.attention: nn.Module = (
            MLAttention(spec, layer_id) if spec.attention == "mla" else Attention(spec, layer_id)
        )
        self.ffn_norm = _norm(spec, spec.hidden_size)
        self.placement = spec.norm_placement
        sandwich = spec.norm_placement == "sandwich"
        self.post_attention_norm = _norm(spec, spec.hidden_size) if sandwich else None
        self.post_ffn_norm = _norm(spec, spec.hidden_size) if sandwich else None
        self.moe = spec.is_moe_layer(layer_id)
        self.mlp: nn.Module = MoE(spec) if self.moe else FeedForward(spec, spec.ffn_hidden_size)

    def init_weights(self, init: SeededInit, std: float, out_std: float) -> None:
        for norm in (self.attention_norm, self.ffn_norm, self.post_attention_norm, self.post_ffn_norm):
            init_norm(init, norm)
        self.attention.init_weights(init, std, out_std)  # type: ignore[operator]
        self.mlp.init_weights(init, std, out_std)  # type: ignore[operator]

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if self.parallel_residual:
            return x + self.attention(self.attention_norm(x), rope) + self.mlp(self.ffn_norm(x))
        if self.placement == "post":  # OLMo-2: the norms sit on the branch outputs
            h = x + self.attention_norm(self.attention(x, rope))
            return h + self.ffn_norm(self.mlp(h))
        if self.post_attention_norm is not None and self.post_ffn_norm is not None:  # Gemma 2/3 sandwich
            h = x + self.post_attention_norm(self.attention(self.attention_norm(x), rope))
            return h + self.post_ffn_norm(self.mlp(self.ffn_norm(h)))
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.mlp(self.ffn_norm(h))


class Transformer(nn.Module):
    """Decoder-only transformer of a `ModelSpec`.

    tok_embeddings (V, h); pos_embeddings (max_position_embeddings, h) for learned positions;
    layers: ModuleDict {"0": block, ...}; norm (h); output: Linear(h, V, bias=False), its weight the
    embedding table when `spec.tie_embeddings`. forward: tokens (B, S) int64 -> logits (B, S, V);
    a pipeline stage may set tok_embeddings / pos_embeddings / norm / output to None, and then
    takes / returns hidden states (B, S, h).
    """

    def __init__(self, spec: ModelSpec, *, rope_theta: float | None = None, rope_scaling: dict | None = None) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab_size, h)
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(spec.max_position_embeddings, h) if spec.position_embedding == "learned" else None
        )
        if spec.position_embedding == "rope":
            theta = rope_theta or float(getattr(spec, "rope_theta", None) or DEFAULT_ROPE_THETA)
            rope_dim = spec.qk_rope_head_dim if spec.attention == "mla" else spec.qk_head_dim
            assert rope_dim
            self.rope: RotaryEmbedding | None = RotaryEmbedding(rope_dim, theta, rope_scaling)
        else:
            self.rope = None
        block = HybridBlock if spec.is_hybrid else TransformerBlock
        self.layers = nn.ModuleDict({str(i): block(spec, i) for i in range(spec.num_layers)})
        self.norm: nn.Module | None = _norm(spec, h)
        self.output: nn.Linear | None = nn.Linear(h, spec.vocab_size, bias=False)
        if spec.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_weights(self, init: SeededInit | None = None, std: float = INIT_STD) -> None:
        """Normal(0, std) weights (GPT-2 / Megatron), output projections (wo, w2) scaled by
        1/sqrt(2 * num_layers), zero biases and sinks, unit norm scales. Values are drawn by
        `init` (`runtime.weights.SeededInit`: from a seed and each parameter's global name, so the
        shard of a sharded or cut model gets the slice of what the whole model gets; default seed
        0 and this module's names). Works on pipeline chunks and sharded (DTensor) parameters
        alike; blocks wrapped for activation checkpointing are unwrapped."""
        init = init or SeededInit.of(self)
        out_std = std / math.sqrt(2 * self.spec.num_layers)
        if self.tok_embeddings is not None:
            init.normal_(self.tok_embeddings.weight, std)
        if self.pos_embeddings is not None:
            init.normal_(self.pos_embeddings.weight, std)
        for layer in self.layers.values():
            block = getattr(layer, "_checkpoint_wrapped_module", layer)
            block.init_weights(init, std, out_std)  # type: ignore[operator]
        init_norm(init, self.norm)
        tied = self.tok_embeddings is not None and self.output is not None and self.output.weight is self.tok_embeddings.weight
        if self.output is not None and not tied:
            init.normal_(self.output.weight, std)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """tokens: (B, S) int64 (or hidden states (B, S, h) on a stage without embeddings);
        positions: (S,) absolute positions (default arange(S); context parallel passes its chunk's).
        Returns logits (B, S, V), or hidden states when `output` is None."""
        s = tokens.shape[1]
        if positions is None:
            positions = torch.arange(s, device=tokens.device)
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        if self.pos_embeddings is not None:
            h = h + self.pos_embeddings(positions)[None]
        rope = self.rope(positions) if self.rope is not None else None
        for layer in self.layers.values():
            h = layer(h, rope)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (fp32) of logits(tokens) against targets (B, S)."""
        logits = self(tokens)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def num_params(model: nn.Module) -> int:
    """Distinct parameter elements (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def build_model(
    spec: ModelSpec,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    rope_theta: float | None = None,
    norm_eps: float = DEFAULT_NORM_EPS,
    rope_scaling: dict | None = None,
    seed: int = 0,
) -> Transformer:
    """Build and initialise the reference `Transformer` of `spec` on `device` in `dtype`, its
    values drawn from `seed` and each parameter's name (`Transformer.init_weights`).

    `dtype` is applied through the default dtype during construction (it also works inside
    `FakeTensorMode`, where `module.to(dtype)` fails). device="meta" gives a shape-only model:
    nothing is allocated or drawn (the runtime shards it, then materialises its shards:
    `runtime.parallelize`). `rope_theta`, `rope_scaling` and `norm_eps` override the spec's RoPE
    base, add a RoPE scaling (`RotaryEmbedding`) and set the norms' epsilon: a checkpoint's
    config.json gives them (`runtime.checkpoint`); without one the model has no RoPE scaling.
    """
    old = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Transformer(spec, rope_theta=rope_theta, rope_scaling=rope_scaling)
    finally:
        torch.set_default_dtype(old)
    if norm_eps != DEFAULT_NORM_EPS:
        set_norm_eps(model, norm_eps)
    if not _is_symbolic(next(model.parameters())):
        model.init_weights(SeededInit.of(model, seed))
    return model


def set_norm_eps(model: nn.Module, eps: float) -> None:
    """Set the epsilon of every RMSNorm / LayerNorm of `model` (HF configs carry theirs:
    `rms_norm_eps`, `layer_norm_epsilon`, ...), the Mamba mixers' gated norms included."""
    for m in model.modules():
        if isinstance(m, nn.RMSNorm | nn.LayerNorm | Mamba2Mixer):
            m.eps = eps
