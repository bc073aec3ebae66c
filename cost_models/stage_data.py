"""The per-rank tables and knob settings both pricing levels read.

`cost_models.stage_table` builds a `StageTable` once per mesh, micro-batch and partition and prices
many knob settings (`Setting`, as arrays: `KnobArrays`) against it; `cost_models.step_time`
composes a step from the same table and knobs. Both read these definitions from here, so the step
composition never reaches back into the module that calls it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from cluster_specs.spec import ClusterSpec
from cost_models.interning import KeptMemo
from cost_models.layout import Layout
from cost_models.stages import StagePartition
from model_specs.spec import ModelSpec, TrainingSpec

RECOMPUTE_MODES = ("none", "selective", "full", "op_sac")


class Sharding(NamedTuple):
    """What the data-parallel traffic of a setting depends on: the ZeRO stage, the sharding group
    (ranks), and the ZeRO++ knobs (hpZ group, int8 weight gathers, int4 gradient reduce-scatters)."""

    zero: int
    shard: int
    hpz: int = 1
    qwz: bool = False
    qgz: bool = False


@dataclass(frozen=True)
class Setting:
    """One knob setting (the planner passes many; `estimate` passes one)."""

    zero_stage: int
    dp_shard: int
    recompute: str
    offload_optimizer: bool
    offload_params: bool = False
    offload_nvme: bool = False  # offloaded states on NVMe (ZeRO-Infinity), not in host memory
    hpz: int = 1  # ZeRO++ hpZ secondary group (ranks); 1 = off
    quantized_weights: bool = False  # ZeRO++ qwZ
    quantized_gradients: bool = False  # ZeRO++ qgZ

    @property
    def sharding(self) -> Sharding:
        return Sharding(self.zero_stage, self.dp_shard, self.hpz, self.quantized_weights, self.quantized_gradients)


@dataclass
class StageTable:
    """Per-pipeline-rank aggregates for one mesh, micro-batch and partition (arrays of length pp)."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    gpus: int
    mesh: Layout  # resolved; its knobs (zero, recompute...) are ignored here; its schedule sets the bubble rule
    partition: StagePartition
    dense_params: np.ndarray
    expert_params: np.ndarray
    largest_layer: np.ndarray
    acts: np.ndarray  # (4, pp): saved bytes per micro-batch, all layers, per RECOMPUTE_MODES
    working: np.ndarray  # one layer's full activations (recompute working set)
    layers: np.ndarray  # layer count
    moe_layers: np.ndarray
    recomputed_layers: np.ndarray  # layers re-run under full recompute (all, or recompute_layers)
    recomputed_moe: np.ndarray
    compute: np.ndarray  # forward + backward seconds per micro-batch (LM head on the last rank)
    forward: np.ndarray  # the forward part of `compute`
    recompute: np.ndarray  # (4, pp): extra seconds per micro-batch per RECOMPUTE_MODES
    class_counts: np.ndarray  # (pp, K): layers of each layer class (`layer_classes`) per rank
    class_forward: np.ndarray  # (K,) forward compute seconds of one layer of each class, one micro-batch
    class_backward: np.ndarray  # (K,) backward compute seconds of one layer
    logits: float  # bytes on the last rank
    tp_per_layer: float  # seconds of one layer's forward TP/SP collectives
    tp_overlap: bool  # TP comm overlap on (`Layout.tp_comm_overlap`)
    tp_backward_traffic: float  # backward TP traffic / forward's (2: Megatron re-gathers SP inputs)
    cp_exposed: np.ndarray  # (2, pp): forward, backward seconds of CP exchange not hidden, per micro-batch
    cp_busy: np.ndarray  # (2, pp): forward, backward seconds of CP traffic on its channel
    ep_per_moe_layer: float  # one MoE layer's forward dispatch + combine (the backward the same)
    etp_per_moe_layer: float  # the expert-TP all-gather + reduce-scatter part of `ep_per_moe_layer`
    p2p: float  # one boundary send, one direction
    boundary_bytes: float
    nccl_groups: int
    channels: tuple[int, int, int, int, int]  # channel of the TP, CP, EP, pipeline, expert-TP groups (`comm.INTRA` / `INTER`)
    weight_bytes: np.ndarray  # (2, pp) stored bytes of the dense and expert weights (frozen base + adapters)
    trainable: np.ndarray  # (2, pp) trainable elements, dense and expert: gradients and optimizer states
    class_weight_bytes: np.ndarray  # (2, K) stored bytes of one layer of each class, dense and expert
    class_trainable: np.ndarray  # (2, K) trainable elements of one layer of each class
    largest_weight_bytes: np.ndarray  # (pp,) stored bytes of the rank's largest layer
    largest_trainable: np.ndarray  # (pp,) trainable elements of the rank's largest layer
    dequant_bytes: np.ndarray  # (pp,) a layer backward's transient: QLoRA's dequantized copy, a Mamba scan's recompute
    offloaded_acts: np.ndarray = field(default_factory=lambda: np.zeros((4, 1)))
    """(4, pp): saved bytes per micro-batch of the layers whose activations go to the host
    (`Layout.activation_offload_layers`, the first ones of each rank), per RECOMPUTE_MODES."""
    offloaded_layers: np.ndarray = field(default_factory=lambda: np.zeros(1))  # (pp,) layers offloaded per rank
    pending_wgrad: np.ndarray = field(default_factory=lambda: np.zeros(1))
    """(pp,): bytes per micro-batch of the gradients of the rank's weight-GEMM outputs, which a split
    backward (zero_bubble, zbv) keeps between a chunk's input- and weight-gradient passes
    (`pipeline.split_backward_peaks`)."""
    embedding_grad_elements: np.ndarray = field(default_factory=lambda: np.zeros(1))
    """(pp,): elements of the token-embedding tables whose dense gradient `compute` already holds
    (`compute.embedding_gradient_time`: the first rank's table, and the head rank's copy for the MTP
    modules), which `step_time`'s per-element gradient copies leave to it."""
    gemm_weight_elements: np.ndarray = field(default_factory=lambda: np.zeros(1))
    """(pp,): trained elements of the rank's GEMM weights (its layers' linears and the LM head) that
    autocast casts to the compute dtype when a stack trains float32 weights under autocast
    (`stacks.autocast_weights`); zeros otherwise."""
    class_attention_f: np.ndarray = field(default_factory=lambda: np.zeros(1))
    """(K,) seconds of one layer's attention kernel forward of each layer class, one micro-batch
    (what `stage_table.cp_exposure` hides the ring's exchange behind)."""
    dp_key_memo: tuple | None = field(default=None, init=False, repr=False, compare=False)
    """`step_time._dp_table_key`'s memo, filled by it (None until then): the calibration, mesh and
    arrays it last read of this table, their bytes and the key. Not part of the table's value; a
    copy (`stage_table.reorder`, the search's combined-1F1B twin) carries it along."""

    def sharing(self, **fields: Any) -> StageTable:
        """A table with `fields` replaced and every other field this one's object (the arrays are
        read-only, so shared): `copy.copy` and an update of its fields, without the copy protocol
        (the search derives some 8,000 tables of other rank orders, `stage_table.reorder`).
        `fields` must name fields of the table; their values are not checked."""
        table = object.__new__(StageTable)
        table.__dict__.update(self.__dict__)
        table.__dict__.update(fields)
        return table


@dataclass(frozen=True)
class KnobArrays:
    """The knobs of many settings as arrays over settings (axis 0 of `KnobPrices`), and each
    setting's index (`sharding`) into the distinct (ZeRO stage, sharding group) pairs of the
    settings it was made from (`shardings`), which is all the data-parallel traffic reads."""

    zero: np.ndarray  # ZeRO stage
    shard: np.ndarray  # sharding group, ranks
    mode: np.ndarray  # index into RECOMPUTE_MODES
    offload: np.ndarray  # optimizer offload (bool)
    offload_params: np.ndarray  # ZeRO-3 parameter offload (bool)
    sharding: np.ndarray  # index into `shardings`
    shardings: tuple[Sharding, ...]  # distinct shardings, first-seen order
    phase: np.ndarray  # 2 x (ZeRO-3) + (full recompute): which layer-phase buffers the setting holds
    offload_nvme: np.ndarray  # offloaded states on NVMe (bool)
    hpz: np.ndarray  # ZeRO++ hpZ secondary group, ranks (1 = off)

    @classmethod
    def of(cls, settings: list[Setting]) -> KnobArrays:
        """The knobs of `settings`. Equal lists of settings share one object, process-wide (its
        arrays are read-only), so memos keyed on its identity (`step_time._BoundParts`) hold from
        one search to the next."""
        key = tuple(settings)
        hit = _KNOB_ARRAYS.get(key)
        if hit is not None:
            return hit
        distinct: dict[Sharding, int] = {}
        index = [distinct.setdefault(s.sharding, len(distinct)) for s in settings]
        zero = np.array([s.zero_stage for s in settings], dtype=np.int64)
        mode = np.array([RECOMPUTE_MODES.index(s.recompute) for s in settings], dtype=np.int64)
        knobs = cls(
            zero,
            np.array([s.dp_shard for s in settings]),
            mode,
            np.array([s.offload_optimizer for s in settings]),
            np.array([s.offload_params for s in settings]),
            np.array(index, dtype=np.int64),
            tuple(distinct),
            2 * (zero >= 3) + (mode >= 2),  # full and op_sac re-create a layer in the backward
            np.array([s.offload_nvme for s in settings]),
            np.array([s.hpz for s in settings], dtype=np.int64),
        )
        for value in vars(knobs).values():
            if isinstance(value, np.ndarray):
                value.flags.writeable = False
        return _KNOB_ARRAYS.put(key, None, knobs)


_KNOB_ARRAYS: KeptMemo[KnobArrays] = KeptMemo(1 << 12)
"""`KnobArrays.of`'s memo, by the settings' values; it starts over at 4,096 grids."""


@dataclass
class KnobPrices:
    """Per setting (axis 0) and, where named, per pipeline rank (axis 1)."""

    parameters: np.ndarray  # (J, pp) bytes
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    logits: np.ndarray
    comm_buffers: np.ndarray
    reserve: np.ndarray
    host_optimizer: np.ndarray
    allocated: np.ndarray  # (J, pp) bytes: everything but `reserve`, as `price_memory` summed it
    nvme: np.ndarray  # (J, pp) bytes of offloaded state on the node's NVMe (ZeRO-Infinity)
    stage_time: np.ndarray | None = None  # (J, pp) seconds per micro-batch
    parts: dict[str, np.ndarray] | None = None  # (J,) seconds per step on the critical path
    step_s: np.ndarray | None = None  # (J,)
    knobs: KnobArrays | None = None  # the settings priced, as arrays

    @property
    def total(self) -> np.ndarray:
        return self.allocated + self.reserve

    @property
    def peak(self) -> np.ndarray:
        """(J,) bytes on the worst rank."""
        return np.maximum.reduce(self.total, axis=1)
