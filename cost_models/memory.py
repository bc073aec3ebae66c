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

import numpy as np

from model_specs.params import count_params
from model_specs.spec import ModelSpec, TrainingSpec

HOST_GRAD_BYTES = 4
"""Bytes per trainable parameter of the float32 gradient partition an offloaded optimizer reads in
host memory: DeepSpeed's ZeRO-Offload copies each rank's gradient partition into a pinned float32
buffer on the host (`stage_1_and_2` / `stage3` with `offload_optimizer`; DeepSpeed's estimator counts
it too), FSDP2's CPUOffloadPolicy keeps the sharded float32 gradients on the CPU, Megatron's hybrid
device optimizer copies float32 gradients to the host before its CPU step."""

NVME_PARAM_BUFFER_COUNT, NVME_PARAM_BUFFER_ELEMENTS = 5, 100_000_000
"""DeepSpeed `offload_param` (device nvme) defaults: `buffer_count` 5 pinned host buffers of
`buffer_size` 1e8 elements each (16-bit), through which weight shards are read from and written to NVMe."""
NVME_OPTIMIZER_BUFFER_COUNT = 4
"""DeepSpeed `offload_optimizer` (device nvme) default `buffer_count`: 4 pinned float32 buffers (Adam's
master weight, m, v, gradient) of one optimizer sub-group each."""
NVME_SUB_GROUP_ELEMENTS = 100_000_000
"""`sub_group_size` our DeepSpeed exports write with NVMe offload (DeepSpeed's default is 1e9, which
makes the optimizer's four pinned swap buffers 16 GB per process; its tutorial lowers it for NVMe)."""


def nvme_pinned_bytes(local_trainable: np.ndarray | float, optimizer: bool, params: bool, param_bytes: float) -> np.ndarray:
    """Pinned host bytes one rank keeps as NVMe staging buffers (ZeRO-Infinity through DeepSpeed's
    aio): the weight buffers of `offload_param` and the optimizer's swap buffers of one sub-group
    (the smaller of `NVME_SUB_GROUP_ELEMENTS` and the rank's trainable partition)."""
    weights = NVME_PARAM_BUFFER_COUNT * NVME_PARAM_BUFFER_ELEMENTS * param_bytes
    swap = NVME_OPTIMIZER_BUFFER_COUNT * np.minimum(NVME_SUB_GROUP_ELEMENTS, local_trainable) * 4
    return np.where(params, weights, 0.0) + np.where(optimizer, swap, 0.0)


def model_state_bytes(
    params: float, zero_stage: int, shard: int, training: TrainingSpec, offload: bool = False, offload_params: bool = False
) -> dict[str, float]:
    """ZeRO model-state bytes on one rank for `params` parameters sharded over `shard` ranks.

    Returns weights, gradients and optimizer bytes on the GPU. With `offload` the optimizer states
    live in host memory (ZeRO-Offload) and count 0 here; with `offload_params` (ZeRO-3) so does the
    weight shard (ZeRO-Infinity). `host_state_bytes` gives what the host holds instead."""
    weights = training.param_bytes * params / (shard if zero_stage >= 3 else 1)
    grads = training.grad_bytes * params / (shard if zero_stage >= 2 else 1)
    opt = training.optimizer_bytes * params / (shard if zero_stage >= 1 else 1)
    return {"parameters": 0.0 if offload_params else weights, "gradients": grads, "optimizer": 0.0 if offload else opt}


def host_state_bytes(
    params: float, zero_stage: int, shard: int, training: TrainingSpec, offload: bool = False, offload_params: bool = False
) -> float:
    """Bytes one rank keeps off the GPU (in host memory, or on NVMe under ZeRO-Infinity) of what
    `model_state_bytes` leaves off it: the optimizer states with the float32 gradient partition the
    host optimizer reads (`HOST_GRAD_BYTES`), and the weight shard."""
    on_gpu = model_state_bytes(params, zero_stage, shard, training)
    local = params / (shard if zero_stage >= 1 else 1)
    optimizer = on_gpu["optimizer"] + HOST_GRAD_BYTES * local
    return (optimizer if offload else 0.0) + (on_gpu["parameters"] if offload_params else 0.0)


def bytes_per_node(worst_rank_bytes: float, ranks_per_node: int) -> float:
    """What a node's resource shared by its ranks (host RAM, NVMe) holds of per-rank offloaded state
    (bytes): each GPU's process keeps its own offloaded optimizer shard (states and the float32
    gradient partition), weight shard, offloaded activations or NVMe staging buffers, so a node
    holds `ranks_per_node` of them. The worst rank's bytes times the ranks of a node bound it,
    exactly when a node's ranks share a pipeline stage (the tp-cp-ep-dp-pp order puts pp
    outermost). Not counted here: the framework's own process memory; the model-loading peak is
    `loading_bytes_per_node`, which comes before training and is compared on its own."""
    return worst_rank_bytes * ranks_per_node


LOADING_BYTES_PER_PARAM = 4
"""Bytes per parameter a process holds while it creates or loads the model in host memory: float32,
transformers' default dtype and DeepSpeed's memory estimators' assumption
(`estimate_zero3_model_states_mem_needs`: 4 x params x GPUs per node with zero_init=0)."""


def loading_bytes_per_node(total_params: float, largest_layer_params: float, zero_init: bool, ranks_per_node: int) -> float:
    """Host RAM a node needs while its processes build the model (bytes). Without sharded init each
    of its processes materializes the whole model (`LOADING_BYTES_PER_PARAM` x total); with it
    (deepspeed.zero.Init, meta-device init + sharded load) each holds about one layer at a time
    before sharding it away (DeepSpeed's estimator: 4 x largest layer x GPUs per node)."""
    per_rank = total_params if not zero_init else largest_layer_params
    return LOADING_BYTES_PER_PARAM * per_rank * ranks_per_node


def model_loading_bytes_per_node(
    model: ModelSpec, framework: str, zero_stage: np.ndarray | int, zero_init: bool, ranks_per_node: int
) -> np.ndarray:
    """`loading_bytes_per_node` of a model under a framework, per ZeRO stage (the shape of
    `zero_stage`). Sharded init exists under ZeRO-3 in DeepSpeed (`deepspeed.zero.Init`); with
    ZeRO-0/1/2 every DeepSpeed process loads the whole model. FSDP (meta-device init, Accelerate's
    cpu_ram_efficient_loading) and Megatron (weights created sharded on the GPU) shard at any stage."""
    pc = count_params(model)
    largest = max((layer.total for layer in pc.layers), default=0)
    stage = np.asarray(zero_stage)
    sharded = zero_init & ((framework != "deepspeed") | (stage >= 3))
    return np.where(
        sharded,
        loading_bytes_per_node(pc.total, largest, True, ranks_per_node),
        loading_bytes_per_node(pc.total, largest, False, ranks_per_node),
    )


def meta_build_host_bytes_per_rank(allocated_peak_bytes: float, staged_bytes: float, device_is_host: bool) -> float:
    """Host RAM one rank holds at its peak when the model is built on the meta device and only its
    shard is materialised (bytes; the process itself, interpreter, framework and CUDA context, is not
    counted). On a host device (the CPU runtime's ranks) everything the rank allocates lives in host
    memory: its allocated peak (`MemoryBreakdown.total` less the reserve), which the start-up's
    checkpoint staging precedes (one slice beside the parameter shard, before any gradient or
    optimizer state exists). On a GPU only what start-up stages in host memory on its way to the
    device: `staged_bytes`, the largest local tensor read from a checkpoint (one at a time), or about
    nothing for seeded weights drawn on the device. It replaces `loading_bytes_per_node`'s
    4 bytes x the whole model per rank when every rank builds the model before sharding it."""
    return allocated_peak_bytes if device_is_host else staged_bytes


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
    nvme: float = 0.0  # offloaded states this rank keeps on the node's NVMe (ZeRO-Infinity; not in `total`)

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
            "nvme_bytes": int(self.nvme),
            "total_bytes": int(self.total),
        }
