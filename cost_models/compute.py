"""Compute time of one micro-batch on one rank: GEMMs, attention and memory-bound kernels.

GEMMs. A GEMM (m x k) @ (k x n) is 2*m*n*k FLOPs. cuBLAS / CUTLASS run it as output tiles of
tm x tn, each tile on one SM, in waves of `sm_count` tiles (NVIDIA, "Matrix Multiplication
Background User's Guide": tile and wave quantization). So a GEMM reaches
    `gemm_efficiency` (the fitted ceiling of a large, square GEMM)
  x tile rate      of the tile shape chosen (smaller tiles reuse less data: `TILES`)
  x utilization    useful output area / (waves x sm_count x tm x tn): partial tiles on the edges and
                   a last wave that leaves SMs idle (tile and wave quantization)
  x k efficiency   k / (k + `gemm_k_overhead`): each tile's prologue and epilogue cost about as
                   much as that many more elements of k
of the peak, and the library picks the fastest of the tile shapes in `TILES` and split-K factors in
`SPLITS` (split-K fills idle SMs on thin GEMMs, at the price of an fp32 reduction of s partial
outputs). A GEMM is never faster than its operands' HBM traffic (roofline). Grouped expert GEMMs
(`count` > 1) share the waves. Backward runs two GEMMs of the forward's shape (input and weight
gradients): 2x forward time. On devices without SMs (`GPUSpec.sm_count` None: the CPU runtime)
only the k efficiency applies.

Attention runs at `attention_rate` on causal FLOPs (FlashAttention skips masked blocks): a fused
kernel written for the GPU's tensor cores (Transformer Engine's cuDNN attention) at
`attention_efficiency x bf16 peak`, FlashAttention-2 (PyTorch SDPA's flash backend, flash-attn 2) at
`flash2_attention_efficiency`, and on Hopper and Blackwell, whose peak needs warpgroup MMA that its
mma.sync kernels do not issue, at `flash2_warpgroup_share` of that; times the share of its 128 x 128
tiles that holds scored pairs (`attention_tile_efficiency`:
short sequences and context-parallel blocks waste part of each tile); its backward costs
`cost_models.flops.flash_backward_factor` x forward (2.5 for d_qk == d_v).

Norms, activations, residual adds, rotary embeddings and the MoE router, permute and unpermute are
memory-bound: their time is the bytes they read and write over HBM bandwidth.

Ring context parallelism merges each step's partial attention output into the running one and, in
the backward, adds each step's dQ and dK / dV into the running gradients: memory-bound kernels on
the compute stream, once and at each of the cp - 1 later steps of every layer (`ring_merge_times`:
Transformer Engine's in the input dtype, torch's in fp32), whose share grows as a rank's block gets
shorter (the attention falls with the square of the block, the merges only linearly).

Host overhead. Every kernel is launched from the host; when a layer's kernels are short (tiny
micro-batches, small models, thin TP shards) the GPU waits for the launches. A layer's forward takes
at least `kernels x kernel_launch_s` (`layer_kernels`), its backward twice that.

MoE load imbalance. The slowest expert-parallel rank sets the pace. With balanced routing the
tokens a rank receives are a sum of independent draws (multinomial over the ep ranks), whose
maximum over ep ranks exceeds the mean by about sqrt(2 ln ep) standard deviations (the expected
maximum of ep near-Gaussian counts): `moe_imbalance`. Routed expert GEMMs are priced at that load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cluster_specs.spec import GPUSpec
from cost_models import finetune, op_sac
from cost_models.calibration import Calibration
from cost_models.finetune import FineTune
from cost_models.flops import attention_pairs, flash_backward_factor, ssd_scan_flops_forward
from cost_models.layout import default_attention_kernel
from cost_models.mesh import MeshLike, Scalars
from model_specs.spec import ModelSpec


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
    eager: bool = False  # one kernel per PyTorch op for the memory-bound ops (`Layout.elementwise_kernels`)
    cp_ring: bool = True  # context parallelism passes K/V blocks around a ring (`Layout.cp_attention` "ring")
    torch_ring: bool = False  # ... torch's context_parallel runs that ring (framework fsdp), not Transformer Engine
    flash2: bool = False  # FlashAttention-2 runs the attention, not a fused kernel (`Layout.attention_kernel`)
    # Arrays (broadcasting against each other) price many geometries at once: every time below is
    # then an array of the same shape, each entry exactly what the scalar geometry gives.

    @classmethod
    def of(cls, mesh: MeshLike, micro_batch: int | np.ndarray, seq_len: int) -> ShardGeometry:
        """The geometry of a layout (or the planner's mesh) at `micro_batch` sequences of `seq_len`
        (an integer array of micro-batch sizes gives an array of token counts)."""
        eager = getattr(mesh, "elementwise_kernels", "fused") == "eager"
        ring = getattr(mesh, "cp_attention", "ring") == "ring"
        return cls(
            micro_batch * seq_len / mesh.cp, seq_len, mesh.cp, mesh.tp, mesh.sp_, mesh.ep, mesh.etp_, eager, ring,
            **stack_kernels(getattr(mesh, "framework", "megatron"), getattr(mesh, "attention_kernel_", None)),
        )


def stack_kernels(framework: str, attention_kernel: str | None = None) -> dict[str, bool]:
    """The `ShardGeometry` flags a software stack sets, for a layout (`ShardGeometry.of`) and for the
    search's vectorized geometries alike: `torch_ring`, whether its context parallelism is torch's
    `context_parallel` ring (fsdp: the runtime, torchtitan) rather than Transformer Engine's
    (Megatron-Core: `ring_merge_times`), and `flash2`, whether FlashAttention-2 attends
    (`attention_kernel`, or the framework's default: `Layout.attention_kernel_`)."""
    kernel = attention_kernel or default_attention_kernel(framework)
    return {"torch_ring": framework == "fsdp", "flash2": kernel == "flash2"}


def layer_gemms(model: ModelSpec, index: int, g: ShardGeometry) -> list[Gemm]:
    """GEMMs of layer `index` on one rank for one micro-batch (forward). A Mamba-2 layer: in_proj
    (column-parallel) and out_proj (row-parallel), split over TP by heads (Megatron-Core
    `MambaMixer`)."""
    h, t, tp = model.hidden_size, g.tokens, g.tp
    nh = model.num_heads
    out: list[Gemm] = []
    if model.is_mamba_layer(index):
        return [Gemm(t, model.mamba_in_proj_width / tp, h), Gemm(t, h, model.mamba_inner / tp)]
    if model.has_attention(index):
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
    if not model.has_ffn(index):
        return out
    if not model.is_moe_layer(index):
        f = model.ffn_hidden_size / tp
        return out + [Gemm(t, gate * f, h), Gemm(t, h, f)]
    assert model.moe_ffn_hidden_size
    out.append(Gemm(t, model.num_experts, h))  # router, replicated over TP
    if model.num_shared_experts:
        fs = model.shared_experts_width / tp
        out += [Gemm(t, gate * fs, h), Gemm(t, h, fs)]
    # Routed tokens: each rank dispatches its tokens (sequence-sharded under SP) top_k times; with
    # balanced routing each of its E/ep local experts receives routed / (E/ep) of the ep group's.
    t_route = routed_rows(model, g)
    local_experts = model.num_experts / g.ep
    per_expert = t_route * moe_imbalance(t_route, g.ep) / local_experts
    fe = model.moe_ffn_hidden_size / g.etp
    out += [Gemm(per_expert, gate * fe, h, local_experts), Gemm(per_expert, h, fe, local_experts)]
    return out


def routed_rows(model: ModelSpec, g: ShardGeometry) -> Scalars:
    """Token rows a rank's local experts process in one micro-batch, forward, under balanced
    routing (a rank receives as many routed copies as it sends): its tokens (sequence-sharded under
    SP) times top_k, times the expert-TP degree under SP, whose all-gather hands every expert-TP
    rank the rows of the whole expert-TP group (Megatron-Core `MoEAlltoAllTokenDispatcher.
    dispatch_postprocess`: `gather_from_sequence_parallel_region` over the expert-TP group)."""
    return g.tokens / _where(g.sp, g.tp, 1) * model.moe_top_k * _where(g.sp, g.etp, 1)


def moe_imbalance(routed_per_rank: Scalars, ep: int | np.ndarray) -> Scalars:
    """Load of the busiest expert-parallel rank over the mean (module doc): 1 + sqrt(2 ln ep) x the
    relative standard deviation of a rank's share of the group's routed tokens under balanced
    routing, sqrt((1 - 1/ep) / routed_per_rank). 1 for ep = 1 (one rank holds every expert)."""
    if isinstance(ep, np.ndarray) or isinstance(routed_per_rank, np.ndarray):
        ep_f = np.asarray(ep, dtype=float)
        spread = np.sqrt(2.0 * np.log(np.maximum(ep_f, 1.0)) * (1.0 - 1.0 / ep_f) / np.maximum(routed_per_rank, 1.0))
        return 1.0 + spread
    if ep <= 1:
        return 1.0
    return 1.0 + math.sqrt(2.0 * math.log(ep) * (1.0 - 1.0 / ep) / max(routed_per_rank, 1.0))


TILE_K = 64
"""Elements of k one mainloop iteration consumes (CUTLASS / cuBLAS Hopper and Ampere BF16 kernels)."""


def _tile_rate(tm: int, tn: int, ref: tuple[int, int] = (128, 256)) -> float:
    """Throughput of a tm x tn tile relative to the large 128 x 256 tile: a tile loads (tm + tn)
    elements per k step and does tm * tn multiply-adds on them, so its data reuse is
    tm*tn / (tm + tn). Modelling choice (not fitted): the rate scales as the square root of that
    reuse, which keeps 128 x 128 tiles within ~13% of the large tile (they run near peak on
    Hopper) and halves nothing smaller than 64 x 64."""
    reuse = tm * tn / (tm + tn)
    ref_reuse = ref[0] * ref[1] / (ref[0] + ref[1])
    return min(1.0, (reuse / ref_reuse) ** 0.5)


TILES: tuple[tuple[int, int, float], ...] = tuple(
    (tm, tn, _tile_rate(tm, tn)) for tm, tn in ((128, 256), (256, 128), (128, 128), (64, 128), (128, 64), (64, 64))
)
"""CTA tile shapes (rows of the output x columns) a GEMM library chooses from, with their rates."""

SPLITS = (1, 2, 4, 8, 16)
"""Split-K factors tried for thin GEMMs (k cut into s slices, partial outputs reduced in fp32)."""


def hbm_bandwidth(gpu: GPUSpec, cal: Calibration) -> float:
    """Bytes/s the memory-bound kernels sustain: the GPU's HBM bandwidth x the fitted
    `Calibration.hbm_efficiency` (every HBM-bound cost divides its bytes by this)."""
    return gpu.memory_bandwidth_bytes_per_s * cal.hbm_efficiency


def gemm_time(gemm: Gemm, peak: float, gpu: GPUSpec, act_bytes: int, efficiency: float, cal: Calibration) -> Scalars:
    """Seconds for one forward GEMM group (elementwise when the GEMM's dimensions are arrays): the
    fastest tile shape and split-K factor (module doc), never faster than its HBM traffic."""
    m, n, k, count = gemm.m, gemm.n, gemm.k, gemm.count
    flops = gemm.flops
    bandwidth = hbm_bandwidth(gpu, cal)
    traffic = act_bytes * (m * k + k * n + m * n) * count
    memory = traffic / bandwidth
    k0 = cal.gemm_k_overhead
    rate = peak * efficiency
    if gpu.sm_count is None:
        return _larger(flops / (rate * k / (k + k0)), memory)
    sms = gpu.sm_count
    array = any(isinstance(x, np.ndarray) for x in (m, n, k, count))
    ceil = np.ceil if array else math.ceil
    best: Scalars = math.inf
    area = m * n * count
    for tm, tn, tile_rate in TILES:
        tiles = ceil(m / tm) * ceil(n / tn) * count
        utilization_tiles = area / (tiles * tm * tn)  # partial tiles on the edges
        for split in SPLITS:
            kk = k / split
            waves = ceil(tiles * split / sms)
            busy = tiles * split / (waves * sms)  # share of SM slots the waves fill
            t = flops / (rate * tile_rate * utilization_tiles * busy * kk / (kk + k0))
            if split > 1:
                # s fp32 partial outputs written, read back and reduced into the output
                t = t + area * 4 * (split + 1) / bandwidth
                if array:
                    t = np.where(kk >= 2 * TILE_K, t, np.inf)
                elif kk < 2 * TILE_K:
                    continue
            best = np.minimum(best, t) if array else min(best, t)  # type: ignore[call-overload]
    return _larger(best, memory)


def attention_tile_efficiency(q_len: Scalars, k_len: Scalars, causal: bool) -> Scalars:
    """Share of the 128 x 128 (query, key) tiles a flash-attention kernel runs that holds scored
    pairs, for one call over q_len queries and k_len keys (causal: the square's lower triangle,
    diagonal included; FlashAttention-2/3 skip fully masked tiles and compute diagonal ones whole)."""
    block = 128.0
    array = isinstance(q_len, np.ndarray) or isinstance(k_len, np.ndarray)
    ceil = np.ceil if array else math.ceil
    tq, tk = ceil(q_len / block), ceil(k_len / block)
    if causal:
        pairs = q_len * (q_len + 1) / 2
        tiles = tq * (tq + 1) / 2
    else:
        pairs = q_len * k_len
        tiles = tq * tk
    return pairs / (tiles * block * block)


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


FP32_BYTES = 4


def eager_norm_bytes(act_bytes: int) -> int:
    """HBM bytes per element of one eager RMSNorm, forward (torchtitan's `RMSNorm`, HF
    `LlamaRMSNorm`: `(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight`), one
    kernel per op: the upcast (read a, write 4), pow (read 4, write 4), mean (read 4), the multiply
    by rsqrt (read 4, write 4), the downcast (read 4, write a) and the weight (read a, write a). A
    fused kernel reads a and writes a."""
    a, f = act_bytes, FP32_BYTES
    return (a + f) + 2 * f + f + 2 * f + (f + a) + 2 * a


def eager_rotary_bytes(act_bytes: int) -> int:
    """HBM bytes per query / key element of eager rotary embeddings, forward (torchtitan's
    `apply_rotary_emb`: upcast, complex multiply by the frequencies, downcast; HF's
    `q * cos + rotate_half(q) * sin` moves about as much): (a + 4) + (4 + 4) + (4 + a). Fused: 2a."""
    a, f = act_bytes, FP32_BYTES
    return (a + f) + 2 * f + (f + a)


def elementwise_bytes(model: ModelSpec, index: int, g: ShardGeometry, act_bytes: int) -> Scalars:
    """HBM bytes moved by the memory-bound ops of one layer, forward (backward ~ 2x).

    Fused kernels (`Layout.elementwise_kernels = "fused"`: Megatron's, or torch.compile), per token:
    two norms (read + write h each), two residual adds (read 2h, write h), rotary on the q and k
    heads a rank holds (read + write; K/V heads are replicated when TP exceeds their count), the
    MLP activation (`activation_kernel_bytes`). Norms and residuals are sequence-sharded under SP;
    the rest is head- or column-sharded under TP. A hybrid layer has one norm and one residual; a
    Mamba-2 layer adds its conv, scan and gated-norm traffic (`mamba_kernel_widths`); a MoE layer
    its router and permutation traffic (`moe_kernel_bytes`).

    Eager (`"eager"`: torchtitan without torch.compile, HF Transformers), every PyTorch op is its
    own kernel: an RMSNorm moves `eager_norm_bytes` per element and RoPE `eager_rotary_bytes`; the
    attention output is transposed back to (tokens, heads x dim) by a copy (read + write); with
    grouped-query attention K and V are repeated to every query head (`repeat_kv`: read kv heads,
    write query heads); a gated MLP's activation is two kernels (`activation_kernel_bytes`). The
    residual adds are one kernel either way; a LayerNorm is one kernel in eager PyTorch
    (`F.layer_norm`); Mamba and MoE kernels are custom kernels in every framework."""
    h, tp, a = model.hidden_size, g.tp, act_bytes
    rep = _where(g.sp, tp, 1)
    eager_rms = g.eager and model.norm == "rmsnorm"
    norm = eager_norm_bytes(a) if eager_rms else 2 * a
    per_token = model.tp_blocks_per_layer * (norm * h + 3 * a * h) / rep
    if model.has_attention(index):
        d = model.qk_head_dim
        q, kv = model.num_heads / tp, _larger(model.kv_heads / tp, 1.0)
        eager_rope = g.eager and model.position_embedding == "rope"
        per_token += (eager_rotary_bytes(a) if eager_rope else 2 * a) * (q + kv) * d
        if g.eager:
            per_token += 2 * a * q * model.v_dim  # the output copy back to (tokens, heads x dim)
            if model.kv_heads and model.kv_heads < model.num_heads:
                per_token += 2 * a * (kv * d + q * d)  # repeat_kv: read kv heads, write query heads
    if model.is_mamba_layer(index):
        per_token += mamba_kernel_widths(model) / tp * a
    total = per_token * g.tokens + activation_kernel_bytes(model, index, g, a)
    if model.is_moe_layer(index):
        total = total + moe_kernel_bytes(model, g, a)
    return total


def activation_kernel_bytes(model: ModelSpec, index: int, g: ShardGeometry, act_bytes: int) -> Scalars:
    """HBM bytes of the MLP activation as it runs (what selective recompute re-runs): fused as
    `activation_function_bytes`; eager, a dense gated MLP's silu (read f, write f) and product
    (read 2f, write f) are two kernels, 5f for the fused kernel's 3f."""
    fused = activation_function_bytes(model, index, g, act_bytes)
    if g.eager and model.has_ffn(index) and not model.is_moe_layer(index) and model.gated_mlp:
        return fused * 5 / 3
    return fused


EAGER_EXTRA_KERNELS_PER_NORM = 6
"""Kernels an eager RMSNorm launches beyond the fused one (upcast, pow, mean, add + rsqrt,
multiply, downcast, weight: 7; `eager_norm_bytes`)."""
EAGER_EXTRA_KERNELS_ROTARY = 4
"""Beyond the fused rotary kernel: q and k each upcast, multiply and downcast (6 for 2)."""


def mamba_kernel_widths(model: ModelSpec) -> float:
    """Elements per token (before TP) the memory-bound kernels of a Mamba-2 mixer move, forward
    (modelling choice, from the kernels' inputs and outputs): the conv reads x B C of the in_proj
    output and writes them (2 conv_dim); the chunked scan reads x B C and dt and writes y
    (conv_dim + H + d_inner); the gate and the grouped RMSNorm read y and z and write their output
    (3 d_inner). The scan's matmuls and chunk states are priced apart (`ssd_times`)."""
    return 3.0 * model.mamba_conv_dim + (model.mamba_num_heads or 0) + 4.0 * model.mamba_inner


def moe_kernel_bytes(model: ModelSpec, g: ShardGeometry, act_bytes: int) -> Scalars:
    """HBM bytes of an MoE layer's memory-bound kernels, forward, per rank (Megatron-Core's
    token dispatcher, `moe_utils.permute` / `unpermute`): the router's float32 logits, softmax and
    top-k over the experts; permute reads each local token and writes its top_k copies; unpermute
    reads the top_k expert outputs and the probabilities and writes one weighted sum per token.
    With more than one local expert, the rows received from the other ranks arrive grouped by
    source rank and are sorted by local expert before the grouped GEMM and back after it
    (`sort_chunks_by_idxs`, "permutation 2"; torchtitan's EP permutes its received tokens the
    same way): each sort reads and writes every received row (`routed_rows`)."""
    tokens = g.tokens / _where(g.sp, g.tp, 1)  # tokens this rank routes (sequence-sharded under SP)
    router = tokens * model.num_experts * 4 * 3  # logits written, read by softmax/top-k, probs written
    copies = tokens * model.moe_top_k * model.hidden_size * act_bytes
    permute = tokens * model.hidden_size * act_bytes + copies
    unpermute = copies + tokens * model.moe_top_k * 4 + tokens * model.hidden_size * act_bytes
    local_experts = model.num_experts / g.ep
    sort = _where(local_experts > 1, 2 * 2 * routed_rows(model, g) * model.hidden_size * act_bytes, 0.0)
    return router + permute + unpermute + sort


def activation_function_bytes(model: ModelSpec, index: int, g: ShardGeometry, act_bytes: int) -> Scalars:
    """HBM bytes of the MLP activation function, forward: gated reads 2f and writes f per token,
    non-gated reads f and writes f (the part of `elementwise_bytes` selective recompute re-runs).
    An MoE layer's routed experts apply it to the rows they process (`routed_rows`), its shared
    experts to every token. None in a hybrid model's attention or Mamba layers."""
    if not model.has_ffn(index):
        return 0.0
    width = 3 if model.gated_mlp else 2
    if model.is_moe_layer(index):
        assert model.moe_ffn_hidden_size
        routed = width * model.moe_ffn_hidden_size / g.etp * routed_rows(model, g)
        return (routed + width * model.shared_experts_width / g.tp * g.tokens) * act_bytes
    return width * model.ffn_hidden_size / g.tp * g.tokens * act_bytes


FP8_QUANTIZE_BYTES_PER_ELEMENT = 4
"""HBM bytes per element of a separate FP8 quantize kernel that writes both layouts: read the
16-bit input (2), write the row-wise FP8 copy (1) and the column-wise (transposed) one the
weight-gradient GEMM needs (1). Transformer Engine's `GroupedLinear` (Megatron-Core's TEGroupedMLP)
quantizes every expert's input with `tex.fused_multi_quantize` before the forward grouped GEMM and
every grad output the same way in the backward (transformer_engine/pytorch/module/grouped_linear.py),
where a dense layer's LayerNormLinear / LayerNormMLP fuse most of their casts into the norm and
activation kernels (the fitted FP8 GEMM efficiency, from dense rows, absorbs those)."""


FP8_PADDING_BYTES_PER_ELEMENT = 2 * (2 + 2)
"""HBM bytes per element of an h-wide routed row that an FP8 MoE layer copies per pass to align every
local expert's rows to a multiple of 16: two copies, each reading and writing 16 bits. Megatron-Core's
TEGroupedMLP pads its input with Transformer Engine's `Fp8Padding` and unpads its output with
`Fp8Unpadding` (transformer_engine/pytorch/module/fp8_padding.py, `fused_multi_row_padding`; the
backward runs the inverse copies). TE skips the copy only when every expert's row count is already
aligned, which routed counts almost never are. Megatron-Core's `moe_router_padding_for_fp8`
(added June 2025, off by default: "can remove the explicit padding in the GroupedMLP layer")
pads the routing map instead; not priced."""


def fp8_expert_quantize_bytes(model: ModelSpec, index: int, g: ShardGeometry) -> tuple[Scalars, Scalars]:
    """(forward, backward) HBM bytes of the FP8 quantize kernels of an MoE layer's routed-expert
    grouped GEMMs on one rank (`FP8_QUANTIZE_BYTES_PER_ELEMENT` per element): forward, the rows
    entering FC1 (h) and FC2 (f / etp); backward, the grad outputs of FC2 (h) and FC1 (f / etp, 2f
    gated); plus, each pass, the padding copies that align the experts' rows for the FP8 GEMMs
    (`FP8_PADDING_BYTES_PER_ELEMENT` per element of h-wide rows). (0, 0) outside MoE layers;
    `layer_time` adds it where `fp8_gemms`."""
    if not model.is_moe_layer(index):
        return 0.0, 0.0
    assert model.moe_ffn_hidden_size
    rows, h, f = routed_rows(model, g), model.hidden_size, model.moe_ffn_hidden_size / g.etp
    fc1_out = (2 if model.gated_mlp else 1) * f
    padding = FP8_PADDING_BYTES_PER_ELEMENT * rows * h
    return (
        FP8_QUANTIZE_BYTES_PER_ELEMENT * rows * (h + f) + padding,
        FP8_QUANTIZE_BYTES_PER_ELEMENT * rows * (h + fc1_out) + padding,
    )


SSM_BACKWARD_FACTOR = 3.0
"""Backward of the chunked SSD scan's matmuls over their forward: the input gradients (2x) and the
forward they recompute (1x; `cost_models.flops`, hardware FLOPs)."""

SSD_STATE_BYTES_FORWARD = 12
SSD_STATE_BYTES_BACKWARD = 34
"""HBM bytes per element of the chunk states (one H x P x N state per chunk of Q tokens) that
mamba_ssm's chunked scan moves between its kernels (`ops/triton/ssd_combined.py`,
`_mamba_chunk_scan_combined_fwd` / `_bwd`; Megatron-Core's `MambaMixer` trains through it).
Forward: `_chunk_state_fwd(states_in_fp32=True)` writes them in float32 (4), `_state_passing_fwd`
reads them and writes them in the activation dtype (4 + 2), `_chunk_scan_fwd` reads them (2): 12.
Backward: the states are recomputed (`_chunk_state_fwd` writes 4; `_state_passing_fwd` with its
default float32 output reads 4, writes 4), `_chunk_scan_bwd_dstates` writes dstates in float32 (4),
`_state_passing_bwd` reads states and dstates (4 + 4) and writes both in the activation dtype
(2 + 2), and `_chunk_scan_chunk_state_bwd_dx`, `_chunk_state_bwd_db` and `_chunk_scan_bwd_dC` read
one of them each (2 + 2 + 2): 34. Counted for 16-bit activations; the C @ B^T products
(`_bmm_chunk_fwd`, G Q values per token) are small beside the states (H P N / Q per token) and
left out."""


def ssd_times(model: ModelSpec, index: int, g: ShardGeometry, gpu: GPUSpec, cal: Calibration) -> tuple[Scalars, Scalars]:
    """(forward, backward) seconds of one Mamba-2 layer's chunked SSD scan on one rank ((0, 0)
    elsewhere). Its matmul FLOPs (`flops.ssd_scan_flops_forward`, heads and groups split over TP;
    backward `SSM_BACKWARD_FACTOR` x) run at `attention_efficiency` of the bf16 peak (modelling
    choice: mamba_ssm's Triton scan kernels are tiled tensor-core matmuls over chunks, like a
    flash-attention kernel, in bf16 / fp32 whatever the GEMM precision); the chunk states it passes
    between its kernels (`SSD_STATE_BYTES_FORWARD` / `_BACKWARD` per element) move over HBM at
    `hbm_efficiency` of its bandwidth: ceil(s / Q) chunks per sequence, H P N elements each, heads
    split over TP (hybrid models run no context parallelism: `layout.hybrid_violations`)."""
    if not model.is_mamba_layer(index):
        return 0.0, 0.0
    seqs = g.tokens / (g.seq_len / g.cp)
    matmuls = ssd_scan_flops_forward(model, g.seq_len) * seqs / g.tp / (gpu.compute_peak("bf16") * cal.attention_efficiency)
    chunks = -(-g.seq_len // model.mamba_chunk_size)
    state_elements = seqs * chunks * model.mamba_num_heads * model.mamba_head_dim * model.mamba_state_size / g.tp
    states = state_elements / hbm_bandwidth(gpu, cal)
    return (
        matmuls + SSD_STATE_BYTES_FORWARD * states,
        SSM_BACKWARD_FACTOR * matmuls + SSD_STATE_BYTES_BACKWARD * states,
    )


@dataclass(frozen=True)
class LayerTime:
    """Seconds for one layer, one micro-batch, one rank."""

    gemm_fwd: Scalars
    attention_fwd: Scalars
    elementwise_fwd: Scalars
    attention_bwd_factor: float  # flash backward / forward FLOPs (`flops.flash_backward_factor`)
    activation_fwd: Scalars  # the MLP activation function's share of elementwise_fwd
    host_fwd: Scalars = 0.0  # the host's kernel launches of the forward (`layer_kernels` x kernel_launch_s)
    op_sac_gemm_share: float = 0.0  # share of gemm_fwd op-level SAC re-runs (`op_sac.recomputed_macs_share`)
    norm_fwd: Scalars = 0.0  # the two input norms' share of elementwise_fwd
    mla_up_fwd: Scalars = 0.0  # MLA's query and key/value up-projection GEMMs (part of gemm_fwd)
    weight_grad_share: float = 1.0  # share of gemm_fwd whose weights get gradients (0: frozen base, LoRA)
    adapter_fwd: Scalars = 0.0  # LoRA adapters' forward (`cost_models.finetune`, memory-bound)
    adapter_bwd: Scalars = 0.0  # and their backward
    dequant_fwd: Scalars = 0.0  # QLoRA: dequantizing the layer's base weights once (per forward / backward)
    ssm_fwd: Scalars = 0.0  # a Mamba-2 layer's chunked SSD scan forward (`ssd_times`)
    ssm_bwd: Scalars = 0.0  # and its backward
    quant_fwd: Scalars = 0.0  # FP8: quantizing and padding the routed experts' GEMM inputs (`fp8_expert_quantize_bytes`)
    quant_bwd: Scalars = 0.0  # and their grad outputs
    ring_fwd: Scalars = 0.0  # ring context parallelism: merging each step's partial output (`ring_merge_times`)
    ring_bwd: Scalars = 0.0  # and accumulating each step's dQ and dK / dV

    @property
    def attention(self) -> Scalars:
        """Attention kernel forward + backward: the window ring attention hides its exchange in."""
        return (1.0 + self.attention_bwd_factor) * self.attention_fwd

    @property
    def selective_recompute(self) -> Scalars:
        """What selective recompute re-runs by default: the attention core and the MLP activation."""
        return self.selective_recompute_of(("core_attn", "act"))

    def selective_recompute_of(self, modules: tuple[str, ...]) -> Scalars:
        """Forward seconds selective recompute of `modules` re-runs (`cost_models.activations`)."""
        out: Scalars = 0.0
        if "core_attn" in modules:
            out = out + self.attention_fwd + self.ring_fwd
        if "act" in modules:
            out = out + self.activation_fwd
        if "layernorm" in modules:
            out = out + self.norm_fwd
        if "mla_up_proj" in modules:
            out = out + self.mla_up_fwd
        return out

    @property
    def op_sac_recompute(self) -> Scalars:
        """What torchtitan's op-level SAC re-runs (`cost_models.op_sac`): every second matmul of the
        block and all elementwise kernels (norms, rotary, activation), not the attention kernel."""
        return self.op_sac_gemm_share * self.gemm_fwd + self.elementwise_fwd

    @property
    def forward(self) -> Scalars:
        """GPU time of the forward, or the host's launches when they take longer."""
        return _larger(
            self.gemm_fwd + self.attention_fwd + self.elementwise_fwd + self.adapter_fwd + self.dequant_fwd
            + self.ssm_fwd + self.quant_fwd + self.ring_fwd,
            self.host_fwd,
        )

    @property
    def backward(self) -> Scalars:
        """Input gradients and weight gradients (`backward_input` + `backward_weight`), or the
        host's launches (twice the forward's kernels) when they take longer."""
        return _larger(self.backward_input + self.backward_weight, 2.0 * self.host_fwd)

    @property
    def backward_input(self) -> Scalars:
        """The backward's input-gradient part ("B" of zero-bubble schedules, Qi et al. 2024): one
        GEMM per forward GEMM, the attention backward (with ring context parallelism's gradient
        accumulation) and the elementwise backward; with adapters, their backward and, under QLoRA,
        the weights dequantized again for the input-gradient GEMMs."""
        return (
            self.gemm_fwd + self.attention_bwd_factor * self.attention_fwd + 2.0 * self.elementwise_fwd
            + self.adapter_bwd + self.dequant_fwd + self.ssm_bwd + self.quant_bwd + self.ring_bwd
        )

    @property
    def backward_weight(self) -> Scalars:
        """The backward's weight-gradient GEMMs ("W"), which zero-bubble schedules defer: none for a
        frozen base (`weight_grad_share` 0)."""
        return self.weight_grad_share * self.gemm_fwd


def layer_kernels(model: ModelSpec, index: int, g: ShardGeometry) -> Scalars:
    """Kernels one layer's forward launches on one rank (its backward launches about twice as many).

    Dense layer: 2 norms, QKV GEMM, rotary, attention, output GEMM, 2 residual adds, 2 MLP GEMMs and
    the activation (11), plus the 4 sequence-parallel all-gathers / reduce-scatters under TP. MLA
    adds its 2 down-projections, 2 latent norms and the split of the rope part (5). An MoE block
    adds the router GEMM, softmax/top-k, the load-balancing loss, permute and unpermute (5), the
    2 all-to-alls under expert parallelism, and 3 per shared expert MLP; its expert MLPs are
    grouped GEMMs (one kernel each). Ring context parallelism launches an attention kernel, a
    send/receive and an output correction per extra ring step (3 x (cp - 1)).
    Hybrid layers (one block): norm and residual (2) plus the mixer's kernels: attention 4 (QKV,
    rotary, attention, output), MLP 3, MoE 1 (its first GEMM, above which the MoE kernels count as
    usual), Mamba-2 10 (in_proj, conv, the five chunked-scan kernels of mamba_ssm, gate + norm,
    out_proj), with 2 sequence-parallel collectives under TP. Eager elementwise kernels add their
    op-by-op launches (`_eager_extra_kernels`)."""
    if model.is_hybrid:
        mixer = model.layer_mixer(index)
        k: Scalars = 2.0 + {"attention": 4.0, "mlp": 3.0, "moe": 1.0, "mamba": 10.0}[mixer] + _where(g.tp > 1, 2.0, 0.0)
        if mixer == "moe":
            k = k + 5.0 + 3.0 * model.num_shared_experts + _where(g.ep > 1, 2.0, 0.0)
        return k + 3.0 * (g.cp - 1) + (_eager_extra_kernels(model, index) if g.eager else 0.0)
    n: Scalars = 11.0 + _where(g.tp > 1, 4.0, 0.0)
    if g.eager:
        n = n + _eager_extra_kernels(model, index)
    if model.attention == "mla":
        n = n + 5.0
    if model.is_moe_layer(index):
        n = n + 5.0 + 3.0 * model.num_shared_experts
        n = n + _where(g.ep > 1, 2.0, 0.0)
    return n + 3.0 * (g.cp - 1)


def _eager_extra_kernels(model: ModelSpec, index: int) -> float:
    """Kernels an eager layer launches beyond the fused count (`elementwise_bytes`): the
    norms' and rotary's ops, the attention output copy, `repeat_kv`'s two copies, the gated
    activation's second kernel."""
    n = float(EAGER_EXTRA_KERNELS_PER_NORM * model.tp_blocks_per_layer if model.norm == "rmsnorm" else 0)
    if model.has_attention(index):
        n += EAGER_EXTRA_KERNELS_ROTARY if model.position_embedding == "rope" else 0
        n += 1  # the attention output copy
        n += 2 if model.kv_heads and model.kv_heads < model.num_heads else 0  # repeat_kv of K and V
    if model.has_ffn(index) and not model.is_moe_layer(index) and model.gated_mlp:
        n += 1
    return n


@dataclass(frozen=True)
class RingMergeBytes:
    """HBM bytes ring context parallelism moves outside the attention kernel, per element of the
    tensors it touches (load-balanced causal rings: the last rank of the ring merges its whole
    query block at every step, and sets the pace)."""

    out_first: float  # per element of the rank's attention output, forward, once: the first step's output
    out_fwd: float  # ... at each later step: merging that step's partial output
    kv_fwd: float  # per element of the K and V block, forward, each later step: packing it for the next rank
    dq_bwd: float  # per element of the query gradient, backward, each later step: adding its dQ
    dkv_bwd: float  # per element of dK and dV, backward, each later step: adding them and packing for the next rank
    grad_last: float  # per element of dQ, dK and dV, backward, once: casting the accumulators back


RING_MERGE_TE = RingMergeBytes(out_first=6.0, out_fwd=6.0, kv_fwd=0.0, dq_bwd=6.0, dkv_bwd=6.0, grad_last=0.0)
"""Transformer Engine's ring (`AttnFuncWithCPAndKVP2P`, K/V received into preallocated buffers):
after the ring, every step's 16-bit partial output is rescaled into the output in the input dtype
(`flash_attn_fwd_out_correction`: `out.add_(out_per_step * exp(lse_step - lse))`, read 2 + 2,
write 2; only the log-sum-exp corrections run on the side streams); the backward adds each step's
dQ and dK / dV into the running gradients in the input dtype (`dq.add_(dq_)`, `dkv.add_(dkv_)`)."""
RING_MERGE_TORCH_EAGER = RingMergeBytes(out_first=12.0, out_fwd=38.0, kv_fwd=4.0, dq_bwd=10.0, dkv_bwd=25.0, grad_last=6.0)
"""torch's ring (`torch.distributed.tensor.experimental._attention`, `_SDPAMerger` with
`convert_to_f32`), op by op on the compute stream: the first output upcast and the merged one cast
back (read 2, write 4; read 4, write 2); each later step's partial upcast (2 + 4), `out - block_out`
(read 4 + 4, write 4), `sigmoid(block_lse - lse) * (...)` (read 4, write 4), `out - (...)` (read
4 + 4, write 4): 38, and `torch.cat` of K and V for the next rank (read 2, write 2). Backward, in
fp32 accumulators: `grad_query += grad_query_` (read 4 + 2, write 4); the received dK / dV updated
by `_partial_update` (a copy of the whole, read and write 4, and the add on its half, 10 / 2) and
concatenated for the next rank (read and write 4): 25; the accumulators cast back at the end."""
RING_MERGE_TORCH_FUSED = RingMergeBytes(out_first=12.0, out_fwd=10.0, kv_fwd=4.0, dq_bwd=10.0, dkv_bwd=18.0, grad_last=6.0)
"""The same ring under torch.compile (`elementwise_kernels` fused), each merge one kernel: read the
16-bit partial, read and write the fp32 output (2 + 4 + 4); the K/V copy for the next rank as
eager; backward, `grad_query += grad_query_` (10) and the dK / dV add (read 4 + 2, write 4) with
its copy for the next rank (read and write 4): 18."""


def ring_merge_times(model: ModelSpec, index: int, g: ShardGeometry, gpu: GPUSpec, cal: Calibration) -> tuple[Scalars, Scalars]:
    """Seconds per layer and micro-batch of ring context parallelism's merges on one rank (forward,
    backward), HBM-bound on the compute stream: `RING_MERGE_TE` (Megatron-Core),
    `RING_MERGE_TORCH_EAGER` or `RING_MERGE_TORCH_FUSED` (torch's context_parallel, op by op or
    compiled) bytes, at each of the cp - 1 steps after the first and once, over this rank's
    attention output (tokens x heads / tp x v_dim) and K / V block (tokens x K/V heads / tp x
    (qk_dim + v_dim); GQA keeps its K/V heads). Zero without context parallelism, under all-gather
    attention (one kernel over the gathered K/V, no merges) and in a layer without attention."""
    if not model.has_attention(index):
        return 0.0, 0.0
    cp = np.asarray(g.cp, dtype=float)
    ring = (cp > 1) & g.cp_ring
    steps = np.where(ring, cp - 1.0, 0.0)
    heads = model.num_heads / g.tp
    kv_heads = heads if model.attention == "mla" else _larger(model.kv_heads / g.tp, 1.0)
    out_elements = g.tokens * heads * model.v_dim
    kv_elements = g.tokens * kv_heads * (model.qk_head_dim + model.v_dim)
    b = (RING_MERGE_TORCH_EAGER if g.eager else RING_MERGE_TORCH_FUSED) if g.torch_ring else RING_MERGE_TE
    bandwidth = hbm_bandwidth(gpu, cal)
    fwd = np.where(ring, out_elements * b.out_first, 0.0) + steps * (out_elements * b.out_fwd + kv_elements * b.kv_fwd)
    bwd = np.where(ring, (out_elements + kv_elements) * b.grad_last, 0.0) + steps * (
        out_elements * b.dq_bwd + kv_elements * b.dkv_bwd
    )
    fwd, bwd = fwd / bandwidth, bwd / bandwidth
    if fwd.ndim == 0:
        return float(fwd), float(bwd)
    return fwd, bwd


def attention_time(model: ModelSpec, index: int, g: ShardGeometry, gpu: GPUSpec, cal: Calibration) -> Scalars:
    """Seconds of one layer's attention kernel forward on one rank: this rank's heads (nh / tp) for
    its share of query positions (1 / cp, load-balanced causal chunks) against the keys before them,
    at `attention_efficiency` of the bf16 peak times the tile efficiency of the kernel calls (one
    causal call over the sequence, or under ring context parallelism calls over blocks of the
    2 x cp load-balanced chunks). 0 in a layer without attention (hybrid models)."""
    if not model.has_attention(index):
        return 0.0
    pairs = attention_pairs(model, index, g.seq_len, "causal") / g.cp
    seqs = g.tokens / (g.seq_len / g.cp)
    attn_flops = 2.0 * pairs * seqs * model.num_heads / g.tp * (model.qk_head_dim + model.v_dim)
    chunk = g.seq_len / (2.0 * g.cp)
    if isinstance(g.cp, np.ndarray):
        tiles = np.where(
            g.cp > 1,
            attention_tile_efficiency(chunk, chunk, causal=False),
            attention_tile_efficiency(float(g.seq_len), float(g.seq_len), causal=True),
        )
    elif g.cp > 1:
        tiles = attention_tile_efficiency(chunk, chunk, causal=False)
    else:
        tiles = attention_tile_efficiency(float(g.seq_len), float(g.seq_len), causal=True)
    return attn_flops / (attention_rate(gpu, cal, g.flash2) * tiles)


def attention_rate(gpu: GPUSpec, cal: Calibration, flash2: bool | np.ndarray = False) -> Scalars:
    """FLOP/s an attention kernel sustains on large tiles (`Layout.attention_kernel`): a fused kernel
    written for the GPU's own tensor cores at `attention_efficiency` of the bf16 kernel peak;
    FlashAttention-2 at `flash2_attention_efficiency`, times `flash2_warpgroup_share` on a GPU whose
    peak needs warpgroup MMA (`GPUSpec.warpgroup_mma`), which its mma.sync kernels do not issue."""
    peak = gpu.compute_peak("bf16")
    flash2_share = cal.flash2_warpgroup_share if gpu.warpgroup_mma else 1.0
    flash2_rate = peak * cal.flash2_attention_efficiency * flash2_share
    fused_rate = peak * cal.attention_efficiency
    if isinstance(flash2, np.ndarray):
        return np.where(flash2, flash2_rate, fused_rate)
    return flash2_rate if flash2 else fused_rate


def fp8_gemms(precision: str, gpu: GPUSpec) -> bool:
    """Whether GEMMs run in FP8: FP8 training on a GPU with FP8 tensor cores (elsewhere they run in
    16 bits, `GPUSpec.peak`'s fallback), at `fp8_gemm_efficiency` and with the experts' quantize
    kernels (`fp8_expert_quantize_bytes`)."""
    return precision == "fp8" and "fp8" in gpu.peak_flops_per_s


def gemm_rate(precision: str, gpu: GPUSpec, cal: Calibration) -> tuple[float, float]:
    """(peak FLOP/s, calibrated share of it) the GEMMs of `precision` run at on `gpu`:
    `fp8_gemm_efficiency` where `fp8_gemms`, else `gemm_efficiency`."""
    eff = cal.fp8_gemm_efficiency if fp8_gemms(precision, gpu) else cal.gemm_efficiency
    return gpu.compute_peak(precision), eff


def layer_time(
    model: ModelSpec, index: int, g: ShardGeometry, gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration,
    ft: FineTune | None = None,
) -> LayerTime:
    """Seconds of layer `index` on one rank for one micro-batch. `ft`: a frozen base with LoRA /
    QLoRA adapters (`cost_models.finetune`): no weight-gradient GEMMs, adapter kernels, and under
    QLoRA the weights dequantized before each use."""
    (peak, eff), fp8 = gemm_rate(precision, gpu, cal), fp8_gemms(precision, gpu)
    gemm = sum(gemm_time(x, peak, gpu, act_bytes, eff, cal) for x in layer_gemms(model, index, g))
    attn = attention_time(model, index, g, gpu, cal)
    bandwidth = hbm_bandwidth(gpu, cal)
    elem = elementwise_bytes(model, index, g, act_bytes) / bandwidth
    act = activation_kernel_bytes(model, index, g, act_bytes) / bandwidth
    host = layer_kernels(model, index, g) * cal.kernel_launch_s
    share = op_sac.recomputed_macs_share(model, index) * _dense_gemm_share(model, index, g)
    # the input norms: read + write h each (two per layer, one in a hybrid layer)
    norms = model.tp_blocks_per_layer * 2 * model.hidden_size / _where(g.sp, g.tp, 1) * g.tokens * act_bytes / bandwidth
    ssm, ssm_bwd = ssd_times(model, index, g, gpu, cal)
    ring_fwd, ring_bwd = ring_merge_times(model, index, g, gpu, cal)
    quant: tuple[Scalars, Scalars] = (0.0, 0.0)
    if fp8:
        quant_fwd_bytes, quant_bwd_bytes = fp8_expert_quantize_bytes(model, index, g)
        quant = (quant_fwd_bytes / bandwidth, quant_bwd_bytes / bandwidth)
    mla_up: Scalars = 0.0
    if model.attention == "mla":
        gemms = layer_gemms(model, index, g)
        ups = (gemms[1], gemms[3]) if model.q_lora_rank else (gemms[2],)  # q_b and kv_b (see layer_gemms)
        mla_up = sum(gemm_time(x, peak, gpu, act_bytes, eff, cal) for x in ups)
    if ft is None:
        return LayerTime(
            gemm, attn, elem, flash_backward_factor(model), act, host, share, norms, mla_up, ssm_fwd=ssm, ssm_bwd=ssm_bwd,
            quant_fwd=quant[0], quant_bwd=quant[1], ring_fwd=ring_fwd, ring_bwd=ring_bwd,
        )
    adapters, adapters_bwd = finetune.adapter_seconds(model, index, g.tokens, g.tp, g.ep, g.etp, act_bytes, bandwidth, ft)
    dequant: Scalars = 0.0
    if ft.quantized:
        state = finetune.layer_state(model, index, g.tp, g.ep, g.etp, ft)
        dequant = (state.dense_linear + state.expert_linear) * (ft.base_bytes + ft.compute_bytes) / bandwidth
    host = host + finetune.adapter_kernels(model, index, ft) * cal.kernel_launch_s
    return LayerTime(
        gemm, attn, elem, flash_backward_factor(model), act, host, share, norms, mla_up, 0.0, adapters, adapters_bwd,
        dequant, ssm, ssm_bwd, quant[0], quant[1], ring_fwd, ring_bwd,
    )


def _dense_gemm_share(model: ModelSpec, index: int, g: ShardGeometry) -> float:
    """Share of a layer's GEMM FLOPs outside the routed experts (1 in a dense layer): op-level SAC's
    matmul rule applies to that part only (`cost_models.op_sac`)."""
    gemms = layer_gemms(model, index, g)
    flops = [float(np.mean(x.m * x.n * x.k * x.count)) for x in gemms]
    total = sum(flops)
    if not model.is_moe_layer(index) or not total:
        return 1.0
    n_attn = 5 if model.attention == "mla" and model.q_lora_rank else (4 if model.attention == "mla" else 2)
    if not model.has_attention(index):
        n_attn = 0
    shared = 2 if model.num_shared_experts else 0
    dense = sum(flops[:n_attn]) + sum(flops[n_attn + 1 : n_attn + 1 + shared])
    return dense / total


def lm_head_times(
    model: ModelSpec, g: ShardGeometry, gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration,
    frozen: bool = False,
) -> tuple[Scalars, Scalars]:
    """(forward, backward) seconds of the LM head GEMM and the cross-entropy (memory-bound:
    forward reads the logits and writes float32 probabilities, backward reads them and writes
    the logits' gradient). A `frozen` head (LoRA, QLoRA) computes only its input gradient."""
    peak, eff = gemm_rate(precision, gpu, cal)
    gemm = gemm_time(Gemm(g.tokens, model.vocab_size / g.tp, model.hidden_size), peak, gpu, act_bytes, eff, cal)
    per_pass = g.tokens * model.vocab_size / g.tp * (act_bytes + 4) / hbm_bandwidth(gpu, cal)
    return gemm + per_pass, (1.0 if frozen else 2.0) * gemm + per_pass


TIED_SAME_STAGE_EXTRA_PASSES = 4
"""Passes over the table, in the weight's dtype, that tied embeddings add when the LM head sits on the
embedding's rank (Megatron-Core `LanguageModule.setup_embeddings_and_output_layer` sets
`zero_out_wgrad`, so the head's fused weight-gradient GEMM returns `torch.zeros` of the table, one
write, and autograd adds it to the embedding's gradient: two reads and a write)."""


def embedding_gradient_time(
    model: ModelSpec, tp: int, gpu: GPUSpec, framework: str, param_bytes: int, grad_bytes: int,
    head_on_same_rank: bool, cal: Calibration,
) -> float:
    """Seconds per micro-batch of materializing the token embedding's gradient on its rank, HBM-bound.

    PyTorch's embedding backward (`embedding_dense_backward`) returns a dense gradient of the whole
    (vocabulary-sharded) table, allocated with zeros in the weight's dtype and written only on the
    rows of the micro-batch's tokens: `param_bytes` written per element of the vocab / tp x hidden
    shard, however few tokens there are. Megatron-Core's DDP then adds it to the gradient buffer in
    a backward hook (`DistributedDataParallel._make_backward_post_hook`: `param.main_grad.add_(
    param.grad.data)`; the layers' weight GEMMs accumulate into `main_grad` in their epilogue, the
    embedding has no such path): read both, write the buffer, `param_bytes + 2 x grad_bytes` more.
    With tied embeddings and the head on the same rank, `TIED_SAME_STAGE_EXTRA_PASSES` x
    `param_bytes` more. FSDP reads that gradient again in its reduce-scatter copy-in (`step_time`)."""
    elements = model.vocab_size / tp * model.hidden_size
    per_element = float(param_bytes)
    if framework == "megatron":
        per_element += param_bytes + 2 * grad_bytes
        if model.tie_embeddings and head_on_same_rank:
            per_element += TIED_SAME_STAGE_EXTRA_PASSES * param_bytes
    return elements * per_element / hbm_bandwidth(gpu, cal)


def trained_mtp_layers(model: ModelSpec, frozen_base: bool) -> int:
    """Multi-token-prediction modules a run trains and pays for: the model's (`ModelSpec.mtp_layers`)
    in full training; none on a frozen base (LoRA / QLoRA: Transformers and PEFT run the decoder
    and its head only)."""
    return 0 if frozen_base else model.mtp_layers


def mtp_projection_times(
    model: ModelSpec, g: ShardGeometry, gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration,
) -> tuple[Scalars, Scalars]:
    """(forward, backward) seconds of one multi-token-prediction module's input projection on one
    rank: the normed hidden state and the normed embedding of the next token, concatenated (2h),
    projected to h (DeepSeek-V3 report Sec. 2.2, M_k; Megatron-Core `MultiTokenPredictionLayer.eh_proj`,
    column-parallel over TP) in the layers' GEMM precision. Its transformer block is priced as a
    layer (`stage_table._mtp_sums`) and its output head as the LM head (`lm_head_times`)."""
    peak, eff = gemm_rate(precision, gpu, cal)
    gemm = gemm_time(Gemm(g.tokens, model.hidden_size / g.tp, 2 * model.hidden_size), peak, gpu, act_bytes, eff, cal)
    return gemm, 2.0 * gemm


def lm_head_time(
    model: ModelSpec, g: ShardGeometry, gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration, frozen: bool = False
) -> Scalars:
    """Forward + backward seconds of the LM head and the cross-entropy."""
    return sum(lm_head_times(model, g, gpu, precision, act_bytes, cal, frozen))
