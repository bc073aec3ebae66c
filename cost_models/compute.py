"""Compute time of one micro-batch on one rank: GEMMs, attention and memory-bound kernels.

Kernel rates are looked up in the GPU's kernel atlas (`cost_models.kernels`): measured points,
interpolated between them and extrapolated outside them by the tile / wave model, or, for a GPU
without measurements, its datasheet (each lookup has a provenance: measured, interpolated,
extrapolated, datasheet).

GEMMs. A GEMM (m x k) @ (k x n) is 2*m*n*k FLOPs; `count` > 1 identical GEMMs (the experts of a
rank) run as one grouped kernel sharing its waves. Its time is the atlas's (`kernels.atlas.
GemmTable.seconds`). The backward runs two GEMMs of their own shapes, each looked up by its shape:
the input gradient dX (m x k) = dY (m x n) @ W^T (n x k), a GEMM (m, k, n), and the weight gradient
dW (k x n) = X^T (k x m) @ dY (m x n), a GEMM (k, n, m) (`backward_gemms`).

Attention runs the stack's kernel (`Layout.attention_kernel`): FlashAttention-2 (PyTorch SDPA's
flash backend, flash-attn 2), a fused kernel written for the GPU's own tensor cores
(Transformer Engine's cuDNN attention, FlashAttention-3 / -4: the first of them the GPU's atlas
measured), or FlashAttention in Triton (llm-foundry's `attn_impl: triton`: FlashAttention-2's rate
x `kernels.attention.TRITON_FLASH_SPEED`, a published ratio, not a measurement), at the atlas's
rate for its pass (forward; backward, `flash_backward_factor` x the forward's FLOPs), head
dimension and length: one causal call over the sequence, or under ring context parallelism calls
over blocks of the 2 x cp load-balanced chunks (no mask).

Norms, activations, residual adds, rotary embeddings and the MoE router, permute and unpermute are
memory-bound: their time is the bytes they read and write over the bandwidth streaming kernels
sustain (`hbm_bandwidth`: the atlas's measured share of the datasheet HBM bandwidth).

The stack. Every kernel time is multiplied by the stack's `Calibration.stack(...).compute` (gaps
between kernels, small kernels no model prices), and each kernel launch of a layer adds the
stack's exposed share of a call's fixed latency (`Stack.latency_exposed` x the atlas's measured
call latency, `launch_seconds`).

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
from typing import Any

import numpy as np

from cluster_specs.spec import GPUSpec
from cost_models import finetune, op_sac
from cost_models.calibration import Calibration, stack_key
from cost_models.finetune import FineTune
from cost_models.flops import attention_pairs, flash_backward_factor, ssd_scan_flops_forward
from cost_models.interning import KeptMemo
from cost_models.kernels import record as rec
from cost_models.kernels.atlas import atlas_for
from cost_models.kernels.attention import TRITON_FLASH_SPEED
from cost_models.kernels.gemm import EXTRAPOLATED
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
    flash2: bool = False  # FlashAttention-2's curves price the attention, not a fused kernel's (`Layout.attention_kernel`)
    attention_speed: float = 1.0  # the kernel's rate over those curves' (`TRITON_FLASH_SPEED` for "triton_flash")
    framework: str = "megatron"  # the stack (`calibration.stack_key`): its `Calibration.stack` constants
    checkpoint_early_stop: bool = False  # full recompute by PyTorch's non-reentrant checkpoint (`LayerTime.early_stop_fwd`)
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
            **stack_kernels(getattr(mesh, "framework", "megatron"), getattr(mesh, "attention_kernel_", None),  # type: ignore[arg-type]
                            bool(getattr(mesh, "fsdp_flat_params", False))),
            checkpoint_early_stop=checkpoint_early_stop(getattr(mesh, "framework", "megatron"),
                                                        bool(getattr(mesh, "fsdp_flat_params", False)),
                                                        getattr(mesh, "stack", None)),
        )


def checkpoint_early_stop(framework: str, fsdp_flat_params: bool = False, stack: str | None = None) -> bool:
    """Whether a stack's full recompute stops before each block's last GEMM. PyTorch's non-reentrant
    `torch.utils.checkpoint` (what `checkpoint_wrapper` applies by default: torchtitan, torchtune and
    this runtime, `runtime/recompute.py`) stops re-running a block's forward once every tensor the
    first forward saved is back (`set_checkpoint_early_stop`, on by default); the MLP's down
    projection saves its input before it runs and nothing after it saves anything (the residual add),
    so it is never recomputed: measured with torch 2.13 on CPU, a checkpointed Llama block's backward
    runs 11 matmuls where the plain one runs 8 (the 4 linears' input and weight gradients) and full
    recomputation would run 12. Megatron's recompute, DeepSpeed's and FSDP1's of llm-foundry
    (`fsdp_flat_params`) and HF's `gradient_checkpointing` are taken to re-run the whole block."""
    return framework == "fsdp" and not fsdp_flat_params and stack in (None, "torchtune")


def stack_kernels(framework: str, attention_kernel: str | None = None, fsdp_flat_params: bool = False
                  ) -> dict[str, bool | float | str]:
    """The `ShardGeometry` fields a software stack sets, for a layout (`ShardGeometry.of`) and for the
    search's vectorized geometries alike: `torch_ring`, whether its context parallelism is torch's
    `context_parallel` ring (fsdp: the runtime, torchtitan) rather than Transformer Engine's
    (Megatron-Core: `ring_merge_times`), `flash2`, whether FlashAttention-2's curves price the
    attention (`attention_kernel`, or the framework's default: `Layout.attention_kernel_`; also for
    FlashAttention in Triton, at `attention_speed` = `TRITON_FLASH_SPEED` of their rate), and the
    stack whose `Calibration.stack` constants price its kernels (`calibration.stack_key`)."""
    kernel = attention_kernel or default_attention_kernel(framework)
    return {"torch_ring": framework == "fsdp", "flash2": kernel in ("flash2", "triton_flash"),
            "attention_speed": TRITON_FLASH_SPEED if kernel == "triton_flash" else 1.0,
            "framework": stack_key(framework, fsdp_flat_params)}


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


FUSED_ATTENTION = ("cudnn", "fa3", "fa4")
"""Atlas kernels that stand for `Layout.attention_kernel` "fused", in order of preference:
Transformer Engine's cuDNN attention (Megatron-Core's default), FlashAttention-3 (Hopper),
FlashAttention-4 (Blackwell); the first the GPU's atlas (or its nearest measured GPU) has."""
FLASH2_ATTENTION = ("flash2",)


def compute_stretch(cal: Calibration, framework: str) -> float:
    """Multiplier of every kernel time of `framework`'s stack (`Stack.compute`)."""
    return cal.stack(framework).compute


def hbm_bandwidth(gpu: GPUSpec, cal: Calibration, framework: str = "megatron") -> float:
    """Bytes/s the memory-bound kernels sustain on `framework`'s stack: the atlas's streaming
    bandwidth of the GPU (`KernelAtlas.memory_bandwidth`) x `Calibration.hbm_efficiency`, over the
    stack's compute stretch (every HBM-bound cost divides its bytes by this)."""
    return atlas_for(gpu).memory_bandwidth() * cal.hbm_efficiency / compute_stretch(cal, framework)


GEMM_ENTRIES = 1 << 14
"""`_GEMM_SECONDS` starts over beyond this many entries (a float each)."""
_GEMM_SECONDS: KeptMemo[Scalars] = KeptMemo(GEMM_ENTRIES)


def gemm_time(gemm: Gemm, gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration,
              framework: str = "megatron") -> Scalars:
    """Seconds of one GEMM group in a step (elementwise when its dimensions are arrays): the
    atlas's GPU time (`GemmTable.seconds`) over `Calibration.gemm_efficiency` (or the FP8 one),
    times the stack's compute stretch (and, for FP8 GEMMs, its `Stack.fp8_compute`). The call's
    fixed latency is added per kernel launch of a layer (`launch_seconds`), not here.

    A scalar shape's seconds are memoized on the GPU and the calibration (by identity, `KeptMemo`)
    and the other arguments' values (a search's layer
    classes repeat most shapes: Qwen3-235B-A22B on 256 H100, 589 distinct of 6,789), unless a
    recorder is open (`kernels.record`: it receives every lookup, as without the memo)."""
    m, n, k, count = gemm.m, gemm.n, gemm.k, gemm.count
    key = None
    if not rec.ACTIVE and not any(isinstance(v, np.ndarray) for v in (m, n, k, count)):
        key = (id(gpu), id(cal), precision, act_bytes, framework, m, n, k, count)
        hit = _GEMM_SECONDS.get(key)
        if hit is not None:
            return hit
    fp8 = fp8_gemms(precision, gpu)
    table = atlas_for(gpu).gemm_table("fp8" if fp8 else "bf16")
    seconds = table.seconds(m, n, k, count, act_bytes) * gemm_scale(fp8, cal, framework)
    if key is not None:
        _GEMM_SECONDS.put(key, (gpu, cal), seconds)
    return seconds


def gemm_scale(fp8: bool, cal: Calibration, framework: str) -> float:
    """A stack's multiplier of the atlas's GEMM times (`gemm_time`)."""
    stack = cal.stack(framework)
    return stack.compute * stack.fp8_compute / cal.fp8_gemm_efficiency if fp8 else stack.compute / cal.gemm_efficiency


def backward_gemms(gemm: Gemm) -> tuple[Gemm, Gemm]:
    """(input gradient, weight gradient) GEMMs of a forward GEMM (m, n, k) (module doc): dX is a
    GEMM (m, k, n), dW a GEMM (k, n, m), `count` of each."""
    return Gemm(gemm.m, gemm.k, gemm.n, gemm.count), Gemm(gemm.k, gemm.n, gemm.m, gemm.count)


def gemm_passes(gemms: list[Gemm], gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration,
                framework: str = "megatron") -> tuple[Scalars, Scalars, Scalars]:
    """(forward, input gradient, weight gradient) seconds of a list of forward GEMMs, each GEMM of
    each pass looked up by its own shape; array geometries are priced in one batched lookup."""
    if not gemms:
        return 0.0, 0.0, 0.0
    shapes = [g for x in gemms for g in (x, *backward_gemms(x))]
    if not any(isinstance(v, np.ndarray) for x in gemms for v in (x.m, x.n, x.k, x.count)):
        times = [gemm_time(x, gpu, precision, act_bytes, cal, framework) for x in shapes]
        return sum(times[0::3]), sum(times[1::3]), sum(times[2::3])
    common = np.broadcast_shapes(*(np.shape(v) for x in shapes for v in (x.m, x.n, x.k, x.count)))
    stack = [np.stack([np.broadcast_to(np.asarray(getattr(x, f), dtype=float), common) for x in shapes])
             for f in ("m", "n", "k", "count")]
    batched = np.asarray(gemm_time(Gemm(*stack), gpu, precision, act_bytes, cal, framework))
    return batched[0::3].sum(axis=0), batched[1::3].sum(axis=0), batched[2::3].sum(axis=0)


_BATCHES: list[tuple[tuple, tuple, tuple[np.ndarray, np.ndarray]]] = []
"""The last few batched lookups (`layer_gemm_batch`): the planner prices a layer's GEMMs and then
their provenance on the same geometry (`kernel_provenance`); an entry keeps its inputs alive, so
their ids stay theirs."""


def layer_gemm_batch(model: ModelSpec, index: int, g: ShardGeometry, gpu: GPUSpec, precision: str, act_bytes: int,
                     cal: Calibration) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, provenance) of every pass of layer `index`'s GEMMs (forward, input gradient,
    weight gradient of each, stacked on a first axis) over an array geometry, in one lookup
    (memoized on the inputs' identity: `_BATCHES`)."""
    key = (id(model), index, id(g), id(gpu), precision, act_bytes, id(cal))
    for k, _, out in _BATCHES:
        if k == key:
            return out
    shapes = [x for y in layer_gemms(model, index, g) for x in (y, *backward_gemms(y))]
    common = np.broadcast_shapes(*(np.shape(v) for x in shapes for v in (x.m, x.n, x.k, x.count)))
    m, n, k_, count = (np.stack([np.broadcast_to(np.asarray(getattr(x, f), dtype=float), common) for x in shapes])
                       for f in ("m", "n", "k", "count"))
    fp8 = fp8_gemms(precision, gpu)
    seconds, codes = atlas_for(gpu).gemm_table("fp8" if fp8 else "bf16").lookup(m, n, k_, count, act_bytes)
    times = seconds * gemm_scale(fp8, cal, g.framework)
    _BATCHES.append((key, (model, g, gpu, cal), (times, codes)))
    del _BATCHES[:-4]
    return times, codes


def launch_seconds(gpu: GPUSpec, cal: Calibration, framework: str = "megatron") -> float:
    """GPU seconds one kernel launch adds in a step: the stack's exposed share (`Stack.
    latency_exposed`) of the atlas's isolated-call latency (`ShapeParams.latency_s`)."""
    return cal.stack(framework).latency_exposed * atlas_for(gpu).gemm_table("bf16").params.latency_s


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
    backward `SSM_BACKWARD_FACTOR` x) run at the atlas's FlashAttention-2 forward rate over the
    sequence (modelling choice: mamba_ssm's Triton scan kernels are tiled tensor-core matmuls over
    chunks written with warp-level MMA, like FlashAttention-2, in bf16 / fp32 whatever the GEMM
    precision); the chunk states it passes between its kernels (`SSD_STATE_BYTES_FORWARD` /
    `_BACKWARD` per element) move over HBM at `hbm_bandwidth`: ceil(s / Q) chunks per sequence,
    H P N elements each, heads split over TP (hybrid models run no context parallelism:
    `layout.hybrid_violations`)."""
    if not model.is_mamba_layer(index):
        return 0.0, 0.0
    seqs = g.tokens / (g.seq_len / g.cp)
    flash, _ = atlas_for(gpu).attention_rate(FLASH2_ATTENTION, float(g.seq_len), 128, True, "fwd")
    rate = float(flash) * cal.flash2_attention_efficiency / compute_stretch(cal, g.framework)
    matmuls = ssd_scan_flops_forward(model, g.seq_len) * seqs / g.tp / rate
    chunks = -(-g.seq_len // model.mamba_chunk_size)
    state_elements = seqs * chunks * model.mamba_num_heads * model.mamba_head_dim * model.mamba_state_size / g.tp
    states = state_elements / hbm_bandwidth(gpu, cal, g.framework)
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
    attention_bwd_factor: Scalars  # attention backward / forward seconds (FLOPs x the passes' rates)
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
    gemm_dgrad: Scalars | None = None  # the input-gradient GEMMs, each by its shape (None: as gemm_fwd)
    gemm_wgrad: Scalars | None = None  # the weight-gradient GEMMs, each by its shape (None: as gemm_fwd)
    launch_fwd: Scalars = 0.0  # the forward's kernel launches' exposed latency (`launch_seconds` x kernels)
    early_stop_fwd: Scalars = 0.0  # the block's last GEMM forward, which full recompute skips (`checkpoint_early_stop`)

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
            + self.ssm_fwd + self.quant_fwd + self.ring_fwd + self.launch_fwd,
            self.host_fwd,
        )

    @property
    def full_recompute(self) -> Scalars:
        """What full recompute re-runs: the forward, less the block's last GEMM where the stack's
        checkpoint stops before it (`checkpoint_early_stop`)."""
        return _larger(
            self.gemm_fwd - self.early_stop_fwd + self.attention_fwd + self.elementwise_fwd + self.adapter_fwd
            + self.dequant_fwd + self.ssm_fwd + self.quant_fwd + self.ring_fwd + self.launch_fwd,
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
        GEMM per forward GEMM (`gemm_dgrad`, each by its own shape), the attention backward (with
        ring context parallelism's gradient accumulation) and the elementwise backward; with
        adapters, their backward and, under QLoRA, the weights dequantized again for the
        input-gradient GEMMs; the launches of its kernels."""
        dgrad = self.gemm_fwd if self.gemm_dgrad is None else self.gemm_dgrad
        return (
            dgrad + self.attention_bwd_factor * self.attention_fwd + 2.0 * self.elementwise_fwd
            + self.adapter_bwd + self.dequant_fwd + self.ssm_bwd + self.quant_bwd + self.ring_bwd + self.launch_fwd
        )

    @property
    def backward_weight(self) -> Scalars:
        """The backward's weight-gradient GEMMs ("W", each by its own shape, `gemm_wgrad`), which
        zero-bubble schedules defer, and their launches: none for a frozen base (`weight_grad_share` 0)."""
        wgrad = self.gemm_fwd if self.gemm_wgrad is None else self.gemm_wgrad
        return self.weight_grad_share * (wgrad + self.launch_fwd)


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
    bandwidth = hbm_bandwidth(gpu, cal, g.framework)
    fwd = np.where(ring, out_elements * b.out_first, 0.0) + steps * (out_elements * b.out_fwd + kv_elements * b.kv_fwd)
    bwd = np.where(ring, (out_elements + kv_elements) * b.grad_last, 0.0) + steps * (
        out_elements * b.dq_bwd + kv_elements * b.dkv_bwd
    )
    fwd, bwd = fwd / bandwidth, bwd / bandwidth
    if fwd.ndim == 0:
        return float(fwd), float(bwd)
    return fwd, bwd


def attention_times(model: ModelSpec, index: int, g: ShardGeometry, gpu: GPUSpec, cal: Calibration
                    ) -> tuple[Scalars, Scalars]:
    """(forward, backward) seconds of one layer's attention kernel on one rank: this rank's heads
    (nh / tp) for its share of query positions (1 / cp, load-balanced causal chunks) against the
    keys before them (causal FLOPs: the kernels skip masked tiles), at the atlas's rate of the
    stack's kernel (`attention_rate`, x `ShardGeometry.attention_speed`) for one causal call over
    the sequence, or under context parallelism for calls over blocks of the 2 x cp chunks (no
    mask); the backward's FLOPs are `flash_backward_factor` x the forward's. (0, 0) in a layer
    without attention (hybrid models)."""
    if not model.has_attention(index):
        return 0.0, 0.0
    pairs = attention_pairs(model, index, g.seq_len, "causal") / g.cp
    seqs = g.tokens / (g.seq_len / g.cp)
    attn_flops = 2.0 * pairs * seqs * model.num_heads / g.tp * (model.qk_head_dim + model.v_dim)
    d = int(model.qk_head_dim)
    chunk = g.seq_len / (2.0 * g.cp)
    cp = np.asarray(g.cp)
    fwd_rate: Scalars
    bwd_rate: Scalars
    if cp.ndim or np.asarray(g.flash2).ndim:
        cp_b = np.broadcast_to(cp, np.broadcast_shapes(cp.shape, np.shape(g.flash2)))
        rates: list[Scalars] = []
        for p in ("fwd", "bwd"):
            whole = attention_rate(gpu, cal, g.flash2, float(g.seq_len), d, True, p, g.framework)
            block = attention_rate(gpu, cal, g.flash2, np.maximum(chunk, 1.0), d, False, p, g.framework)
            rates.append(np.where(cp_b > 1, block, whole))
        fwd_rate, bwd_rate = rates
    elif g.cp > 1:
        fwd_rate = attention_rate(gpu, cal, g.flash2, float(chunk), d, False, "fwd", g.framework)
        bwd_rate = attention_rate(gpu, cal, g.flash2, float(chunk), d, False, "bwd", g.framework)
    else:
        fwd_rate = attention_rate(gpu, cal, g.flash2, float(g.seq_len), d, True, "fwd", g.framework)
        bwd_rate = attention_rate(gpu, cal, g.flash2, float(g.seq_len), d, True, "bwd", g.framework)
    fwd = attn_flops / (fwd_rate * g.attention_speed)
    return fwd, flash_backward_factor(model) * attn_flops / (bwd_rate * g.attention_speed)


def attention_time(model: ModelSpec, index: int, g: ShardGeometry, gpu: GPUSpec, cal: Calibration) -> Scalars:
    """Forward seconds of one layer's attention kernel on one rank (`attention_times`)."""
    return attention_times(model, index, g, gpu, cal)[0]


def attention_rate(gpu: GPUSpec, cal: Calibration, flash2: bool | np.ndarray, seq: Scalars, head_dim: int,
                   causal: bool, pass_: str = "fwd", framework: str = "megatron") -> Scalars:
    """FLOP/s of the stack's attention kernel (`Layout.attention_kernel`: FlashAttention-2 or the
    fused kernel, `FUSED_ATTENTION`) for one pass at `seq` queries (= keys) of `head_dim`: the
    atlas's rate (`KernelAtlas.attention_rate`) x `Calibration.attention_efficiency` (or the
    FlashAttention-2 one), over the stack's compute stretch. Elementwise over array `flash2`."""
    atlas = atlas_for(gpu)
    stretch = compute_stretch(cal, framework)

    def rate(flash: bool) -> Scalars:
        kernels, eff = (FLASH2_ATTENTION, cal.flash2_attention_efficiency) if flash else (FUSED_ATTENTION, cal.attention_efficiency)
        r, _ = atlas.attention_rate(kernels, seq, head_dim, causal, pass_)
        r = r * eff / stretch
        return float(r) if np.ndim(r) == 0 else r

    if isinstance(flash2, np.ndarray):
        return np.where(flash2, rate(True), rate(False))
    return rate(bool(flash2))


def fp8_gemms(precision: str, gpu: GPUSpec) -> bool:
    """Whether GEMMs run in FP8: FP8 training on a GPU with FP8 tensor cores (elsewhere they run in
    16 bits, `GPUSpec.peak`'s fallback), at `fp8_gemm_efficiency` and with the experts' quantize
    kernels (`fp8_expert_quantize_bytes`)."""
    return precision == "fp8" and "fp8" in gpu.peak_flops_per_s


def layer_time(
    model: ModelSpec, index: int, g: ShardGeometry, gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration,
    ft: FineTune | None = None,
) -> LayerTime:
    """Seconds of layer `index` on one rank for one micro-batch. `ft`: a frozen base with LoRA /
    QLoRA adapters (`cost_models.finetune`): no weight-gradient GEMMs, adapter kernels, and under
    QLoRA the weights dequantized before each use."""
    fp8 = fp8_gemms(precision, gpu)
    fw = g.framework
    gemms = layer_gemms(model, index, g)
    if gemms and any(isinstance(v, np.ndarray) for x in gemms for v in (x.m, x.n, x.k, x.count)):
        batched, _ = layer_gemm_batch(model, index, g, gpu, precision, act_bytes, cal)
        gemm, dgrad, wgrad = batched[0::3].sum(axis=0), batched[1::3].sum(axis=0), batched[2::3].sum(axis=0)
    else:
        gemm, dgrad, wgrad = gemm_passes(gemms, gpu, precision, act_bytes, cal, fw)
    attn, attn_bwd = attention_times(model, index, g, gpu, cal)
    attn_bwd_factor = attn_bwd / attn if np.any(np.asarray(attn) > 0) else flash_backward_factor(model)
    if isinstance(attn_bwd_factor, np.ndarray):
        attn_bwd_factor = np.where(np.asarray(attn) > 0, attn_bwd_factor, flash_backward_factor(model))
    bandwidth = hbm_bandwidth(gpu, cal, fw)
    elem = elementwise_bytes(model, index, g, act_bytes) / bandwidth
    act = activation_kernel_bytes(model, index, g, act_bytes) / bandwidth
    kernels = layer_kernels(model, index, g)
    host = kernels * cal.kernel_launch_s
    launch = kernels * launch_seconds(gpu, cal, fw)
    share = op_sac.recomputed_macs_share(model, index) * _dense_gemm_share(model, index, gemms)
    # the input norms: read + write h each (two per layer, one in a hybrid layer)
    norms = model.tp_blocks_per_layer * 2 * model.hidden_size / _where(g.sp, g.tp, 1) * g.tokens * act_bytes / bandwidth
    ssm, ssm_bwd = ssd_times(model, index, g, gpu, cal)
    ring_fwd, ring_bwd = ring_merge_times(model, index, g, gpu, cal)
    quant: tuple[Scalars, Scalars] = (0.0, 0.0)
    if fp8:
        quant_fwd_bytes, quant_bwd_bytes = fp8_expert_quantize_bytes(model, index, g)
        quant = (quant_fwd_bytes / bandwidth, quant_bwd_bytes / bandwidth)
    # PyTorch's early-stopping checkpoint skips a dense block's last GEMM, its MLP's down projection
    # (`checkpoint_early_stop`; `layer_gemms` lists it last): not with adapters, whose own GEMMs run after it
    dense_last = (g.checkpoint_early_stop and ft is None and bool(gemms) and not model.is_moe_layer(index)
                  and model.layer_mixer(index) in ("transformer", "mlp"))
    early_stop: Scalars = gemm_time(gemms[-1], gpu, precision, act_bytes, cal, fw) if dense_last else 0.0
    mla_up: Scalars = 0.0
    if model.attention == "mla":
        ups = (gemms[1], gemms[3]) if model.q_lora_rank else (gemms[2],)  # q_b and kv_b (see layer_gemms)
        mla_up = sum(gemm_time(x, gpu, precision, act_bytes, cal, fw) for x in ups)
    if ft is None:
        return LayerTime(
            gemm, attn, elem, attn_bwd_factor, act, host, share, norms, mla_up, ssm_fwd=ssm, ssm_bwd=ssm_bwd,
            quant_fwd=quant[0], quant_bwd=quant[1], ring_fwd=ring_fwd, ring_bwd=ring_bwd, gemm_dgrad=dgrad,
            gemm_wgrad=wgrad, launch_fwd=launch, early_stop_fwd=early_stop,
        )
    adapters, adapters_bwd = finetune.adapter_seconds(model, index, g.tokens, g.tp, g.ep, g.etp, act_bytes, bandwidth, ft)
    dequant: Scalars = 0.0
    if ft.quantized:
        state = finetune.layer_state(model, index, g.tp, g.ep, g.etp, ft)
        dequant = (state.dense_linear + state.expert_linear) * (ft.base_bytes + ft.compute_bytes) / bandwidth
    extra = finetune.adapter_kernels(model, index, ft)
    host = host + extra * cal.kernel_launch_s
    launch = launch + extra * launch_seconds(gpu, cal, fw)
    return LayerTime(
        gemm, attn, elem, attn_bwd_factor, act, host, share, norms, mla_up, 0.0, adapters, adapters_bwd,
        dequant, ssm, ssm_bwd, quant[0], quant[1], ring_fwd, ring_bwd, dgrad, wgrad, launch,
    )


def _dense_gemm_share(model: ModelSpec, index: int, gemms: list[Gemm]) -> float:
    """Share of a layer's GEMM FLOPs outside the routed experts (1 in a dense layer), of its GEMMs
    (`layer_gemms`; over a batch of geometries, their mean): op-level SAC's matmul rule applies to
    that part only (`cost_models.op_sac`)."""
    flops = [_mean_flops(x) for x in gemms]
    total = sum(flops)
    if not model.is_moe_layer(index) or not total:
        return 1.0
    n_attn = 5 if model.attention == "mla" and model.q_lora_rank else (4 if model.attention == "mla" else 2)
    if not model.has_attention(index):
        n_attn = 0
    shared = 2 if model.num_shared_experts else 0
    dense = sum(flops[:n_attn]) + sum(flops[n_attn + 1 : n_attn + 1 + shared])
    return dense / total


def _mean_flops(x: Gemm) -> float:
    """m x n x k x count of one GEMM (multiply-adds), as a float; over a batch of geometries (array
    fields) their mean."""
    v = x.m * x.n * x.k * x.count
    return float(np.mean(v)) if isinstance(v, np.ndarray) else float(v)


def lm_head_times(
    model: ModelSpec, g: ShardGeometry, gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration,
    frozen: bool = False,
) -> tuple[Scalars, Scalars]:
    """(forward, backward) seconds of the LM head GEMM and the cross-entropy (memory-bound:
    forward reads the logits and writes float32 probabilities, backward reads them and writes
    the logits' gradient). The backward's GEMMs are looked up by their own shapes (`backward_gemms`);
    a `frozen` head (LoRA, QLoRA) computes only its input gradient."""
    fwd, dgrad, wgrad = gemm_passes([Gemm(g.tokens, model.vocab_size / g.tp, model.hidden_size)], gpu, precision,
                                    act_bytes, cal, g.framework)
    per_pass = g.tokens * model.vocab_size / g.tp * (act_bytes + 4) / hbm_bandwidth(gpu, cal, g.framework)
    return fwd + per_pass, dgrad + (0.0 if frozen else wgrad) + per_pass


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
    return elements * per_element / hbm_bandwidth(gpu, cal, framework)


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
    column-parallel over TP) in the layers' GEMM precision, its backward's GEMMs by their shapes. Its
    transformer block is priced as a layer (`stage_table._mtp_sums`) and its output head as the LM
    head (`lm_head_times`)."""
    fwd, dgrad, wgrad = gemm_passes([Gemm(g.tokens, model.hidden_size / g.tp, 2 * model.hidden_size)], gpu, precision,
                                    act_bytes, cal, g.framework)
    return fwd, dgrad + wgrad


def lm_head_time(
    model: ModelSpec, g: ShardGeometry, gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration, frozen: bool = False
) -> Scalars:
    """Forward + backward seconds of the LM head and the cross-entropy."""
    return sum(lm_head_times(model, g, gpu, precision, act_bytes, cal, frozen))


def kernel_provenance(
    model: ModelSpec, index: int, g: ShardGeometry, gpu: GPUSpec, precision: str, act_bytes: int, cal: Calibration,
) -> np.ndarray:
    """Seconds of layer `index`'s GEMMs (forward, input and weight gradients) and attention kernel
    (forward, backward) on one rank, split by the provenance of their atlas rates
    (`kernels.gemm.PROVENANCE`: measured, interpolated, extrapolated, datasheet): an array of shape
    (4, *geometry). What the plan reports as measured / interpolated / extrapolated, and, weighted
    by the atlas's `Uncertainty`, the margin the planner ranks by (`kernel_margin`)."""
    atlas = atlas_for(gpu)
    gemms = layer_gemms(model, index, g)
    parts: list[tuple[Any, Any]] = []
    if gemms and any(isinstance(v, np.ndarray) for x in gemms for v in (x.m, x.n, x.k, x.count)):
        times, codes = layer_gemm_batch(model, index, g, gpu, precision, act_bytes, cal)
        parts += list(zip(times, codes, strict=True))
    else:
        table = atlas.gemm_table("fp8" if fp8_gemms(precision, gpu) else "bf16")
        for x in (y for z in gemms for y in (z, *backward_gemms(z))):
            parts.append((gemm_time(x, gpu, precision, act_bytes, cal, g.framework), table.provenance(x.m, x.n, x.k)))
    if model.has_attention(index):
        fwd, bwd = attention_times(model, index, g, gpu, cal)
        kernels = FLASH2_ATTENTION if np.all(g.flash2) else FUSED_ATTENTION  # one stack per search
        d = int(model.qk_head_dim)
        seq = np.where(np.asarray(g.cp) > 1, g.seq_len / (2.0 * np.asarray(g.cp)), float(g.seq_len))
        for p, t in (("fwd", fwd), ("bwd", bwd)):
            causal_code = atlas.attention_rate(kernels, float(g.seq_len), d, True, p)[1]
            block_code = atlas.attention_rate(kernels, np.maximum(seq, 1.0), d, False, p)[1]
            code = np.where(np.asarray(g.cp) > 1, block_code, causal_code)
            if g.attention_speed != 1.0:  # a kernel priced from another's measured rate
                code = np.maximum(code, EXTRAPOLATED)
            parts.append((t, code))
    shape = np.broadcast_shapes(*(np.shape(t) for t, _ in parts), *(np.shape(c) for _, c in parts))
    if shape == ():
        split = [0.0] * 4
        for t, code in parts:
            split[int(code)] += float(t)
        return np.array(split)
    out = np.zeros((4, *shape))
    for t, code in parts:
        t_b = np.broadcast_to(np.asarray(t, dtype=float), shape)
        c_b = np.broadcast_to(np.asarray(code, dtype=int), shape)
        for k in range(4):
            out[k] += np.where(c_b == k, t_b, 0.0)
    return out


def kernel_margin(split: np.ndarray) -> Scalars:
    """Relative slow-end margin of kernel time split by provenance (`kernel_provenance`): the
    time-weighted atlas uncertainty of its rates (`kernels.atlas.Uncertainty`)."""
    from cost_models.kernels.atlas import uncertainty

    u = np.asarray(uncertainty().by_provenance).reshape((4,) + (1,) * (split.ndim - 1))
    total = split.sum(axis=0)
    out = np.where(total > 0, (split * u).sum(axis=0) / np.where(total > 0, total, 1.0), 0.0)
    return float(out) if out.ndim == 0 else out
