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

from model_specs.spec import TrainingSpec


def model_state_bytes(params: float, zero_stage: int, shard: int, training: TrainingSpec, offload: bool = False) -> dict[str, float]:
    """ZeRO model-state bytes on one rank for `params` parameters sharded over `shard` ranks.

    Returns weights, gradients and optimizer bytes on the GPU. With `offload` the optimizer states
    live in host memory (ZeRO-Offload) and count 0 here."""
    weights = training.param_bytes * params / (shard if zero_stage >= 3 else 1)
    grads = training.grad_bytes * params / (shard if zero_stage >= 2 else 1)
    opt = training.optimizer_bytes * params / (shard if zero_stage >= 1 else 1)
    return {"parameters": weights, "gradients": grads, "optimizer": 0.0 if offload else opt}


def host_bytes_per_node(worst_rank_host_bytes: float, ranks_per_node: int) -> float:
    """Host RAM one node needs for offloaded state (bytes): each GPU's process keeps its offloaded
    optimizer shard (ZeRO-Offload: fp32 master weights, m and v, 12 bytes per parameter of its
    shard) and any offloaded activations in host memory, so a node holds `ranks_per_node` of them.
    The worst rank's bytes times the ranks of a node bound it, exactly when a node's ranks share a
    pipeline stage (the tp-cp-ep-dp-pp order puts pp outermost). Not counted: the framework's own
    process memory and a model-loading peak without meta-device init."""
    return worst_rank_host_bytes * ranks_per_node


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
    host_optimizer: float  # offloaded optimizer states and activations, in host memory (not in `total`)

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
