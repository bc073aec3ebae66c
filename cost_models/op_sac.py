"""torchtitan's op-level selective activation checkpointing ("op SAC"), priced per layer.

Policy (torchtitan `activation_checkpoint.mode = "selective"`, `selective_ac_option = "op"`, the
default of its Llama recipes, `torchtitan/models/llama3/infra/parallelize.py` `_save_list`): inside
each checkpointed transformer block, the outputs of matmuls (`aten.mm`), of the attention kernel
(SDPA flash / efficient, with its log-sum-exp) and of reduce-scatters are saved, except that every
second matmul of the block is recomputed ("save every other mm"); everything else (norms, rotary,
activation functions, elementwise products, residual adds) is recomputed in the backward. The
block's input is kept by the checkpoint itself.

The matmuls of a block, in execution order: attention projections (q, k, v, o; MLA: q_a, q_b, kv_a,
kv_b, o), then the MLP (gated: w1 gate, w3 up, w2 down; plain: fc1, fc2) or, in an MoE layer, the
router and the shared experts' matmuls. Routed experts run as grouped matmuls (`_grouped_mm`),
which are not in the save list's "every other" count: their activations are priced as without
recompute (`activations.mlp_bytes`).

Saved widths are per token, in elements; the caller multiplies by tokens and bytes per element.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from model_specs.spec import ModelSpec


@dataclass(frozen=True)
class Matmul:
    """One matmul of a block: output width per token (elements, before TP), FLOPs per token / 2
    (= in x out), and whether its output is sharded by tensor parallelism (column-parallel)."""

    name: str
    out_width: float
    macs_per_token: float
    column_parallel: bool


def block_matmuls(model: ModelSpec, index: int) -> list[Matmul]:
    """The matmuls of layer `index` in execution order (module doc)."""
    return list(_block_matmuls(model, index))


@lru_cache(maxsize=4096)
def _block_matmuls(model: ModelSpec, index: int) -> tuple[Matmul, ...]:
    """`block_matmuls`, memoized on the model (by value) and the layer: the model's derived
    widths are properties, read afresh on every call (about 0.6 ms a block), and a search prices
    the activations of every layer class at every micro-batch and shard geometry."""
    return tuple(_matmuls(model, index))


def _matmuls(model: ModelSpec, index: int) -> list[Matmul]:
    h = model.hidden_size
    nh = model.num_heads
    out: list[Matmul] = []
    if model.is_mamba_layer(index):  # Mamba-2 mixer: in_proj (column-parallel), out_proj (row-parallel)
        proj, inner = model.mamba_in_proj_width, model.mamba_inner
        return [Matmul("in_proj", proj, h * proj, True), Matmul("out_proj", h, inner * h, False)]
    if model.has_attention(index):
        if model.attention == "mla":
            assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None and model.v_head_dim
            qd = model.qk_head_dim
            if model.q_lora_rank:
                out.append(Matmul("q_a", model.q_lora_rank, h * model.q_lora_rank, False))
                out.append(Matmul("q_b", nh * qd, model.q_lora_rank * nh * qd, True))
            else:
                out.append(Matmul("q", nh * qd, h * nh * qd, True))
            kv_a = model.kv_lora_rank + model.qk_rope_head_dim
            out.append(Matmul("kv_a", kv_a, h * kv_a, False))
            kv_b = nh * ((model.qk_nope_head_dim or 0) + model.v_head_dim)
            out.append(Matmul("kv_b", kv_b, model.kv_lora_rank * kv_b, True))
            out.append(Matmul("o", h, nh * model.v_head_dim * h, False))
        else:
            d = model.qk_head_dim
            kv = model.kv_heads
            out.append(Matmul("q", nh * d, h * nh * d, True))
            out.append(Matmul("k", kv * d, h * kv * d, True))
            out.append(Matmul("v", kv * model.v_dim, h * kv * model.v_dim, True))
            out.append(Matmul("o", h, nh * model.v_dim * h, False))
    if not model.has_ffn(index):
        return out
    if model.is_moe_layer(index):
        if model.num_shared_experts:
            out += _mlp(model, model.shared_experts_width)
        return out
    return out + _mlp(model, model.ffn_hidden_size)


def _mlp(model: ModelSpec, f: float) -> list[Matmul]:
    h = model.hidden_size
    if model.gated_mlp:
        return [Matmul("w1", f, h * f, True), Matmul("w3", f, h * f, True), Matmul("w2", h, f * h, False)]
    return [Matmul("fc1", f, h * f, True), Matmul("fc2", h, f * h, False)]


def saved_matmuls(model: ModelSpec, index: int) -> list[Matmul]:
    """The matmuls whose outputs op SAC keeps: the 1st, 3rd, 5th ... of the block."""
    return block_matmuls(model, index)[0::2]


def recomputed_macs_share(model: ModelSpec, index: int) -> float:
    """Share of the block's matmul work (excluding routed experts) that the backward re-runs: the
    2nd, 4th ... matmuls. Llama-3.1-8B: (k + o + w3) / all = 36.5%."""
    mms = block_matmuls(model, index)
    total = sum(m.macs_per_token for m in mms)
    return sum(m.macs_per_token for m in mms[1::2]) / total if total else 0.0


def saved_widths(model: ModelSpec, index: int, tp: float, replicated_divisor: float) -> float:
    """Elements per token op SAC keeps for the attention and dense-MLP part of layer `index` on one
    rank: the block input, the saved matmul outputs and the attention output (module doc).
    Column-parallel outputs are split by `tp`; hidden-size tensors by `replicated_divisor` (tp
    under sequence parallelism, else 1)."""
    h = model.hidden_size
    total = h / replicated_divisor  # the checkpointed block's input
    for m in saved_matmuls(model, index):
        total += m.out_width / (tp if m.column_parallel else replicated_divisor)
    if model.has_attention(index):
        total += model.num_heads * model.v_dim / tp  # the attention kernel's output
    return total
