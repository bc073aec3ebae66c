"""Per-rank memory of a layout: model states (ZeRO), activations, logits, buffers, reserve.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, Sec. 3 and Fig. 1): with Psi
parameters on a rank and K optimizer bytes per parameter, mixed-precision Adam keeps
2 Psi (bf16 weights) + 2 Psi (bf16 gradients) + K Psi (K = 12: fp32 master, m, v).
ZeRO-1 divides the K Psi by the sharding group N_d, ZeRO-2 also the gradients, ZeRO-3 also the
weights. Under hybrid sharding the group is `dp_shard` (x cp: context-parallel ranks hold identical
weights, so Megatron and torchtitan shard over dp x cp). Expert weights are sharded over the
expert-data-parallel group instead.

Activations come from `cost_models.activations`; the number of micro-batches whose activations a
pipeline rank holds at its peak comes from `cost_models.pipeline`; `cost_models.stage_table` applies
these formulas to every rank and many knob settings at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.context import PricingContext
from model_specs.params import count_params
from model_specs.spec import TrainingSpec


def model_state_bytes(params: float, zero_stage: int, shard: int, training: TrainingSpec, offload: bool = False) -> dict[str, float]:
    """ZeRO model-state bytes on one rank for `params` parameters sharded over `shard` ranks.

    Returns weights, gradients and optimizer bytes on the GPU. With `offload` the optimizer states
    live in host memory (ZeRO-Offload) and count 0 here."""
    weights = training.param_bytes * params / (shard if zero_stage >= 3 else 1)
    grads = training.grad_bytes * params / (shard if zero_stage >= 2 else 1)
    opt = training.optimizer_bytes * params / (shard if zero_stage >= 1 else 1)
    return {"parameters": weights, "gradients": grads, "optimizer": 0.0 if offload else opt}


@dataclass(frozen=True)
class RankParams:
    """Parameters held by one pipeline rank before data-parallel sharding (elements)."""

    dense: float  # sharded by TP where the op is TP-sharded; replicated over dp x cp
    expert: float  # routed experts, sharded by ep x etp; replicated over the expert-DP group
    largest_layer: float  # biggest single layer on this rank (dense + expert), for FSDP gathers

    @property
    def total(self) -> float:
        return self.dense + self.expert


def rank_params(ctx: PricingContext, rank: int) -> RankParams:
    lay, model = ctx.layout, ctx.model
    pc = count_params(model)
    tp, ep, etp = lay.tp, lay.ep, lay.etp_
    dense = expert = largest = 0.0
    for i in ctx.partition.rank_layers(rank):
        lp = pc.layers[i]
        d = (lp.attention + lp.dense_mlp + lp.shared_experts) / tp + lp.norms + lp.router
        e = lp.routed_experts / (ep * etp)
        dense += d
        expert += e
        largest = max(largest, d + e)
    if rank == 0:
        dense += pc.embedding / tp
    if rank == lay.pp - 1:
        dense += pc.final_norm
        # The LM head; with tied embeddings and pp > 1 the last stage keeps its own copy.
        if pc.lm_head:
            dense += pc.lm_head / tp
        elif lay.pp > 1:
            dense += model.vocab_size * model.hidden_size / tp
    return RankParams(dense, expert, largest)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the worst rank of one pipeline stage."""

    stage: int
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    comm_buffers: float
    reserve: float
    host_optimizer: float  # offloaded optimizer states, in host memory (not in `total`)

    @property
    def total(self) -> float:
        return (
            self.parameters + self.gradients + self.optimizer + self.activations + self.logits + self.comm_buffers + self.reserve
        )

    def as_dict(self) -> dict[str, int]:
        return {
            "parameters_bytes": int(self.parameters),
            "gradients_bytes": int(self.gradients),
            "optimizer_bytes": int(self.optimizer),
            "activations_bytes": int(self.activations),
            "logits_bytes": int(self.logits),
            "comm_buffers_bytes": int(self.comm_buffers),
            "reserve_bytes": int(self.reserve),
            "host_optimizer_bytes": int(self.host_optimizer),
            "total_bytes": int(self.total),
        }
