"""Two-level pricing: per-rank aggregates of a mesh, then knob arithmetic vectorized over settings.

Everything that depends only on the *mesh* (tp, pp, cp, ep, etp, dp, order), the micro-batch and
the stage partition is summed once per pipeline rank into a `StageTable` of numpy arrays:
parameters, saved activations per recompute mode, compute and recompute seconds, per-layer
communication. The *knobs* that leave all of that unchanged (ZeRO stage, sharding group, recompute
mode, optimizer offload, schedule) are then priced for many settings at once (`price_knobs`),
with the formulas of `cost_models.memory` (ZeRO states), `cost_models.activations`,
`cost_models.pipeline` and `cost_models.comm`. `cost_models.estimate.estimate` prices a single
layout through the same path (one setting), so the planner and `autopar evaluate` agree exactly.
"""

from __future__ import annotations

import operator
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from cluster_specs.spec import ClusterSpec
from cost_models import finetune, stacks
from cost_models.activations import (
    EAGER_FP32_FROZEN_NORM_BYTES,
    EAGER_FP32_NORM_BYTES,
    ActivationContext,
    layer_activation_bytes,
    logits_bytes,
    mamba_backward_transient_bytes,
    retained_logits_bytes,
)
from cost_models.calibration import Calibration
from cost_models.compute import (
    LayerTime,
    ShardGeometry,
    layer_gemms,
    layer_time,
    lm_head_times,
    mtp_projection_times,
    trained_mtp_layers,
)
from cost_models.finetune import FineTune, frozen_weight_bytes
from cost_models.flops import flash_backward_factor
from cost_models.fsdp_units import Phase, edge_units, single_stage_phases
from cost_models.interning import KeptMemo
from cost_models.layout import DEFAULT_RECOMPUTE_MODULES, Layout
from cost_models.memory import HOST_GRAD_BYTES, nvme_pinned_bytes
from cost_models.mesh_comm import comm_store, embedding_gradient_times, mesh_channels, mesh_comm
from cost_models.pipeline import (
    FORWARDS_FIRST_SCHEDULES,
    WEIGHT_PASS_SCHEDULES,
    dualpipev_loss_meets_first_chunk,
    split_backward_peaks,
)
from cost_models.stage_data import RECOMPUTE_MODES, KnobArrays, KnobPrices, Setting, StageTable
from cost_models.stages import StagePartition
from model_specs.params import ParamCounts, count_params
from model_specs.spec import ModelSpec, TrainingSpec, param_bytes_of

FSDP_ACCUMULATED_GRAD_BYTES = 4
"""Bytes per element of a gradient FSDP2 accumulates over micro-batches without reducing: float32,
its reduce dtype (`FSDPParam.to_accumulated_grad_if_needed`), whatever the compute dtype."""

LayerKind = tuple[bool, bool, str]
"""(is MoE, uses a sliding window, mixer): the mixer is `ModelSpec.layer_mixer` ("transformer", or
a hybrid layer's "mamba", "attention", "mlp", "moe"). The first entry stays the MoE flag."""


@lru_cache(maxsize=256)
def layer_kinds(model: ModelSpec) -> tuple[LayerKind, ...]:
    """The `LayerKind` of every layer, in order: layers differ only in these, so each kind is priced
    once and pipeline cuts weigh every layer by its own kind's cost (a Mamba, attention or MLP layer
    of a hybrid model costs what it costs)."""
    return tuple(
        (model.is_moe_layer(i), model.uses_sliding_window(i), model.layer_mixer(i)) for i in range(model.num_layers)
    )


@lru_cache(maxsize=256)
def layer_kind_counts(model: ModelSpec) -> dict[LayerKind, int]:
    counts: dict[LayerKind, int] = {}
    for key in layer_kinds(model):
        counts[key] = counts.get(key, 0) + 1
    return counts


@lru_cache(maxsize=4096)
def layer_times(
    model: ModelSpec, cluster: ClusterSpec, precision: str, act_bytes: int, g: ShardGeometry, cal: Calibration,
    ft: FineTune | None = None,
) -> dict[LayerKind, LayerTime]:
    """Seconds per layer kind for one shard geometry (cached: many layouts share a geometry)."""
    kinds: dict[LayerKind, LayerTime] = {}
    for i, key in enumerate(layer_kinds(model)):
        if key not in kinds:
            kinds[key] = layer_time(model, i, g, cluster.gpu, precision, act_bytes, cal, ft)
    return kinds


@lru_cache(maxsize=4096)
def _layer_acts(model: ModelSpec, actx: ActivationContext) -> dict[LayerKind, tuple[float, float, float]]:
    """Saved bytes per layer kind and micro-batch under each of `RECOMPUTE_MODES`."""
    out: dict[LayerKind, tuple[float, ...]] = {}
    for i, key in enumerate(layer_kinds(model)):
        if key not in out:
            out[key] = tuple(layer_activation_bytes(model, i, actx, mode) for mode in RECOMPUTE_MODES)  # type: ignore[assignment]
    return out


@lru_cache(maxsize=4096)
def _layer_saved_bytes(model: ModelSpec, actx: ActivationContext) -> np.ndarray:
    """(modes, layers) saved bytes per micro-batch of every layer under each of `RECOMPUTE_MODES`
    (read-only): `_layer_arrays`' `a0`..`a3` rows, the same floats, without pricing the layers' times
    (`activation_floor` reads only these)."""
    acts = _layer_acts(model, actx)
    firsts, of_layer = layer_classes(model)
    kinds = layer_kinds(model)
    per_class = np.array([[acts[kinds[i]][mode] for i in firsts] for mode in range(len(RECOMPUTE_MODES))], dtype=float)
    out = per_class[:, of_layer]
    out.flags.writeable = False
    return out


@lru_cache(maxsize=256)
def layer_classes(model: ModelSpec) -> tuple[tuple[int, ...], np.ndarray]:
    """Layers that are priced alike: the first layer of each distinct (kind, parameter counts)
    class in model order, and every layer's class index (read-only)."""
    pc = count_params(model)
    classes: dict[tuple, int] = {}
    firsts: list[int] = []
    index = []
    for i, key in enumerate(layer_kinds(model)):
        cls = (key, pc.layers[i])
        if cls not in classes:
            classes[cls] = len(firsts)
            firsts.append(i)
        index.append(classes[cls])
    of_layer = np.array(index, dtype=np.int64)
    of_layer.flags.writeable = False
    return tuple(firsts), of_layer


@lru_cache(maxsize=4096)
def _layer_arrays(
    model: ModelSpec, cluster: ClusterSpec, precision: str, g: ShardGeometry, actx: ActivationContext, cal: Calibration,
    ft: FineTune | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per-layer quantities for one shard geometry: priced once per layer class (`layer_classes`),
    as arrays over the classes and spread over the model's layers (read-only). Weights: `dense`,
    `expert` (elements on the rank), `dense_w`, `expert_w` (stored bytes), `dense_t`, `expert_t`
    (trainable elements: all of them, or the adapters of a frozen base), `deq` (bytes a layer's
    backward adds transiently: the largest dequantized 16-bit copy under QLoRA, a Mamba-2 layer's
    recomputed scan, `activations.mamba_backward_transient_bytes`)."""
    kinds = layer_times(model, cluster, precision, actx.act_bytes, g, cal, ft)
    pb = param_bytes_of(precision)
    acts_by_kind = _layer_acts(model, actx)
    pc = count_params(model)
    tp, ep, etp = g.tp, g.ep, g.etp
    all_kinds = layer_kinds(model)
    firsts, of_layer = layer_classes(model)
    scan_transient = mamba_backward_transient_bytes(model, actx)
    # floats here (one shard geometry); the cost functions are typed for arrays too (`Scalars`)
    names = ("dense", "expert", "a0", "a1", "a2", "a3", "fwd", "fb", "sel", "osac", "attn_f", "moe",
             "dense_w", "expert_w", "dense_t", "expert_t", "deq", "pend", "refwd")
    out: dict[str, list[Any]] = {k: [] for k in names}
    for i in firsts:
        key = all_kinds[i]
        lp = pc.layers[i]
        lt = kinds[key]
        a = acts_by_kind[key]
        out["dense"].append((lp.attention + lp.dense_mlp + lp.shared_experts + lp.mamba) / tp + lp.norms + lp.router)
        out["expert"].append(lp.routed_experts / (ep * etp))
        out["a0"].append(a[0])
        out["a1"].append(a[1])
        out["a2"].append(a[2])
        out["a3"].append(a[3])
        out["fwd"].append(lt.forward)
        out["refwd"].append(lt.full_recompute)  # what full recompute re-runs (`compute.checkpoint_early_stop`)
        out["fb"].append(lt.forward + lt.backward)
        out["sel"].append(lt.selective_recompute_of(actx.recompute_modules))
        out["osac"].append(lt.op_sac_recompute)
        out["attn_f"].append(lt.attention_fwd)  # the attention kernel's forward seconds
        out["moe"].append(float(key[0]))
        dense, expert = out["dense"][-1], out["expert"][-1]
        transient = scan_transient if model.is_mamba_layer(i) else 0.0
        # the gradient of every weight GEMM's output waits for the weight pass (frozen weights have none)
        outputs = sum(float(gm.m * gm.n * gm.count) for gm in layer_gemms(model, i, g))
        out["pend"].append(actx.act_bytes * outputs if ft is None else 0.0)
        if ft is None:
            out["dense_w"].append(pb * dense)
            out["expert_w"].append(pb * expert)
            out["dense_t"].append(dense)
            out["expert_t"].append(expert)
            out["deq"].append(transient)
        else:
            st = finetune.layer_state(model, i, float(tp), float(ep), float(etp), ft)
            out["dense_w"].append(frozen_weight_bytes(dense, st.dense_linear, ft) + pb * st.dense_adapters)
            out["expert_w"].append(frozen_weight_bytes(expert, st.expert_linear, ft) + pb * st.expert_adapters)
            out["dense_t"].append(st.dense_adapters)
            out["expert_t"].append(st.expert_adapters)
            out["deq"].append(transient + (ft.compute_bytes * st.largest_linear if ft.quantized else 0.0))
    per_class = {k: np.array(v, dtype=float) for k, v in out.items()}
    per_layer = {k: v[of_layer] for k, v in per_class.items()}
    for d in (per_class, per_layer):
        for a in d.values():
            a.flags.writeable = False
    return per_layer, per_class


GEOMETRY_FIELDS = (
    "micro_batch", "tp", "cp", "sp", "ep", "etp", "framework", "stack", "elementwise_kernels", "cp_attention",
    "attention_kernel", "fsdp_flat_params", "norm_kernel", "recompute_modules",
)
"""The `Layout` fields that `ShardGeometry.of`, `activation_context` and `FineTune.of` read of a
mesh (the resolved accessors they call, `sp_`, `etp_`, `attention_kernel_`, `recompute_modules_`,
read these and nothing else of it): what `_geometry` keys a job's `_Geometry` on
(tests/cost_models/test_stage_table_memos.py checks that they read no other field)."""

_geometry_fields = operator.attrgetter(*GEOMETRY_FIELDS)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


class _Geometry:
    """What every table of one job (model, training, cluster, calibration) at one shard geometry
    and activation context shares, whatever its pipeline partition and rank order: the geometry
    (`ShardGeometry.of`), the activation context, the fine-tuning state (`FineTune.of`), the
    per-layer and per-class arrays (`_layer_arrays`), and what `_rank_sums` and `build_table` make
    of them alone: the quantities `_rank_sums` adds up per rank and the rows whose per-rank maxima
    it takes, when full recompute re-runs every layer (no `recompute_layers`), their sums over runs
    of one class (`class_runs`), and the per-class fields of a `StageTable`. All arrays read-only."""

    __slots__ = (
        "g", "actx", "ft", "pc", "per_layer", "per_class", "of_layer", "firsts", "every_layer", "every_peak",
        "class_backward", "class_weight_bytes", "class_trainable", "logits", "_runs",
    )

    def __init__(self, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, cal: Calibration, mesh: Layout) -> None:
        self.g = ShardGeometry.of(mesh, mesh.micro_batch, training.seq_len)
        self.actx = activation_context(training, mesh, model)
        self.ft = FineTune.of(training, mesh.stack)
        self.pc = count_params(model)
        self.logits: dict[tuple[str, bool], float] = {}  # `logits_bytes` per loss kernel and logits upcast
        self.per_layer, self.per_class = _layer_arrays(model, cluster, training.precision, self.g, self.actx, cal, self.ft)
        self.firsts, self.of_layer = layer_classes(model)
        self._runs: tuple[np.ndarray, np.ndarray] | None = None
        every = np.ones(len(self.of_layer), dtype=bool)
        self.every_layer = _readonly(_rank_quantities(self.per_layer, every))
        self.every_peak = _readonly(_peak_rows(self.per_layer, every))
        pc = self.per_class
        self.class_backward = _readonly(pc["fb"] - pc["fwd"])
        self.class_weight_bytes = _readonly(np.array([pc["dense_w"], pc["expert_w"]]))
        self.class_trainable = _readonly(np.array([pc["dense_t"], pc["expert_t"]]))

    def class_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """(quantities, classes, layers + 1): what `_rank_sums` adds up over 0, 1, 2 ... layers of one
        class, as its bincount adds them (from 0, one layer after the other: the cumulative sums of
        the class's column of `every_layer`, repeated), and (5, classes + 1) the class's rows of
        `every_peak`, at least 0, then a column of zeros (a rank without layers: `_uniform_ranks`'
        peak column -1). Every layer of a class has that class's column, so these are a rank's sums
        and maxima when its layers are of one class (`_uniform_ranks`). Computed on first use (20 x 8
        bytes per layer and class)."""
        if self._runs is None:
            firsts = list(self.firsts)
            columns = self.every_layer[:, firsts]  # (quantities, classes)
            layers = self.every_layer.shape[1]
            runs = np.zeros(columns.shape + (layers + 1,))
            runs[:, :, 1:] = np.cumsum(np.repeat(columns[:, :, None], layers, axis=2), axis=2)
            peaks = np.zeros((len(self.every_peak), len(firsts) + 1))
            peaks[:, :-1] = np.maximum(self.every_peak[:, firsts], 0.0)
            self._runs = (_readonly(runs), _readonly(peaks))
        return self._runs


GEOMETRY_ENTRIES = 4096
"""`_GEOMETRIES` starts over beyond this many entries (as many shard geometries as the lru_caches
of `_layer_arrays`, `layer_times` and `_layer_acts` keep)."""
_GEOMETRIES: KeptMemo[_Geometry] = KeptMemo(GEOMETRY_ENTRIES)


def _geometry(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, cal: Calibration, mesh: Layout) -> _Geometry:
    """The `_Geometry` of `mesh` (resolved) in a job, memoized on the job objects (by identity,
    `KeptMemo`) and the mesh's `GEOMETRY_FIELDS` (by value): everything `ShardGeometry.of`,
    `activation_context`, `FineTune.of` and `_layer_arrays` read."""
    key = (id(model), id(training), id(cluster), id(cal), _geometry_fields(mesh))
    geo = _GEOMETRIES.get(key)
    if geo is None:
        geo = _GEOMETRIES.put(key, (model, training, cluster, cal), _Geometry(model, training, cluster, cal, mesh))
    return geo


def _rank_quantities(arr: dict[str, np.ndarray], recomputed: np.ndarray) -> np.ndarray:
    """(quantities, layers) what `_rank_sums` adds up per rank, one row per quantity (its
    `_RANK_QUANTITIES` rows, in the order it unpacks them), from per-layer arrays (`_layer_arrays`)
    and whether full recompute re-runs each layer."""
    a0, fwd, moe = arr["a0"], arr["fwd"], arr["moe"]
    q = np.empty((_RANK_QUANTITIES, len(a0)))
    q[0], q[1], q[2], q[3], q[5] = arr["dense"], arr["expert"], a0, arr["a1"], arr["a3"]
    q[6], q[7], q[9] = 0.0, arr["sel"], arr["osac"]
    q[10], q[11], q[14], q[15] = 1.0, moe, arr["fb"], fwd
    _set_recompute_rows(q, recomputed, a0, arr["a2"], arr["refwd"], moe)
    q[16], q[17], q[18], q[19] = arr["dense_w"], arr["expert_w"], arr["dense_t"], arr["expert_t"]
    return q


def _peak_rows(arr: dict[str, np.ndarray], recomputed: np.ndarray) -> np.ndarray:
    """(5, layers) the per-layer rows whose per-rank maxima `_rank_sums` takes: a layer's elements,
    its weights (stored bytes, trainable elements), its backward transient (`deq`) and its
    recompute working set (its activations when full recompute re-runs it)."""
    return np.array([
        arr["dense"] + arr["expert"], arr["dense_w"] + arr["expert_w"], arr["dense_t"] + arr["expert_t"], arr["deq"],
        np.where(recomputed, arr["a0"], 0.0),
    ])


def _rank_sums(geo: _Geometry, partition: StagePartition, limit: int | None, mtp: int) -> tuple[np.ndarray, ...]:
    """Per-rank sums over the layers each pipeline rank holds, of one shard geometry's per-layer
    arrays (`geo`; new arrays, the caller's, but the class counts, which may be the partition's
    read-only ones). `limit`: layers per rank that full recompute re-runs, the first ones in the
    rank's order (None = all: the geometry's own quantities, `_Geometry.every_layer`); `mtp`: the
    multi-token-prediction blocks on the head rank (`_priced_mtp`). The partition's chunks cover
    layers 0..n-1 in model order (a probe partition may cover fewer than all)."""
    # Sums run over each rank's layers in model order: one `np.bincount` over all quantities at
    # once, which adds in input order, or where each rank holds one layer class the same additions
    # read from that class's runs.
    pp = partition.pp
    index = _partition_index(partition)
    owner, mine = index.owner, index.mine
    n = len(owner)
    n_classes = len(geo.firsts)
    uniform = _uniform_ranks(partition, geo.of_layer, n_classes) if limit is None else None
    if uniform is not None:
        # every rank's layers are of one class: its sums and maxima are that class's over as many
        # layers (`_Geometry.class_runs`: the same additions in the same order, so the same floats)
        rank_class, layers, peak_column, class_counts = uniform
        runs, class_peaks = geo.class_runs()
        quantities = geo.every_layer[:, :n]
        sums = runs[:, rank_class, layers]
        maxima = class_peaks[:, peak_column]
    else:
        if limit is None:
            quantities, rows = geo.every_layer[:, :n], geo.every_peak[:, :n]
        else:  # position of each layer within its rank: chunks of a rank come in model order
            arr = {k: v[:n] for k, v in geo.per_layer.items()}
            recomputed = np.cumsum(mine, axis=1)[owner, np.arange(n)] - 1 < limit
            quantities, rows = _rank_quantities(arr, recomputed), _peak_rows(arr, recomputed)
        k = _RANK_QUANTITIES
        sums = np.bincount(index.bins, weights=quantities.ravel(), minlength=k * pp).reshape(k, pp).astype(float, copy=False)
        # each rank's largest layer (elements), the weights (bytes, elements) of its largest layer, its
        # largest dequantized copy (QLoRA) and its largest recompute working set: the maxima of the
        # rows over each rank's run of layers (none: 0)
        maxima = np.zeros((len(rows), pp))
        if len(index.held):
            grouped = rows if index.by_rank is None else rows[:, index.by_rank]
            maxima[:, index.held] = np.maximum(np.maximum.reduceat(grouped, index.starts, axis=1), 0.0)
        class_counts = np.bincount(owner * n_classes + geo.of_layer[:n], minlength=pp * n_classes).reshape(pp, n_classes).astype(float)
    if mtp:
        arr = {k: v[:n] for k, v in geo.per_layer.items()}
        sums = sums + _mtp_sums(arr, quantities[:, n - 1], pp, partition.head_rank, int(mine[partition.head_rank].sum()), mtp, limit)
        class_counts = class_counts.copy()  # the uniform ranks' counts are the partition's, shared
        class_counts[partition.head_rank, geo.of_layer[n - 1]] += mtp
    # the rows of `sums` in the order `_rank_quantities` stacks them (6: zeros, the recompute seconds
    # of no recompute), each field's rows together: views of the new `sums`, none sharing a row
    return (
        sums[0], sums[1], maxima[0], sums[2:6], maxima[4], sums[10], sums[11], sums[12], sums[13], sums[14],
        sums[15], sums[6:10], class_counts, sums[16:18], sums[18:20], maxima[1:4],
    )


_RANK_QUANTITIES = 20
"""Per-layer quantities `_rank_sums` adds up per rank (rows of its one bincount)."""

_UNIFORM: KeptMemo[tuple[np.ndarray, ...]] = KeptMemo(1 << 12)


def _uniform_ranks(partition: StagePartition, of_layer: np.ndarray, n_classes: int) -> tuple[np.ndarray, ...] | None:
    """When every rank of `partition` holds layers of one class only (`of_layer`: each layer's class,
    `layer_classes`, of `n_classes`), each rank's class and its layers, (pp,) int arrays (a rank
    without layers: class 0, 0 layers), its column of `_Geometry.class_runs`' peaks (its class, or
    -1 without layers) and its layers of each class, (pp, classes) floats; else None. Read-only,
    memoized on the partition and the model's class array (by identity, `KeptMemo`)."""
    key = (partition, id(of_layer))
    hit = _UNIFORM.get(key)
    if hit is None:
        owner = _partition_index(partition).owner
        classes = of_layer[: len(owner)]
        pp = partition.pp
        lowest, highest = np.full(pp, len(of_layer)), np.full(pp, -1)
        np.minimum.at(lowest, owner, classes)
        np.maximum.at(highest, owner, classes)
        layers = np.bincount(owner, minlength=pp)
        held = layers > 0
        if np.all(lowest[held] == highest[held]):
            rank_class = np.where(held, highest, 0)
            counts = np.zeros((pp, n_classes))
            counts[np.arange(pp), rank_class] = layers
            hit = tuple(_readonly(a) for a in (rank_class, layers, np.where(held, rank_class, -1), counts))
        else:
            hit = ()
        _UNIFORM.put(key, of_layer, hit)
    return hit or None


def _set_recompute_rows(
    q: np.ndarray, recomputed: np.ndarray | bool, a0: object, a2: object, fwd: object, moe: object
) -> None:
    """Fill the rows of `_rank_sums`' quantities that depend on whether full recompute re-runs a
    layer (columns of `q`: layers, or one MTP block): the activations it keeps (4: `a2` when
    re-run, else `a0`), the recompute forward seconds (8), the re-run count (12) and its MoE count (13)."""
    q[4] = np.where(recomputed, a2, a0)
    q[8] = np.where(recomputed, fwd, 0.0)
    q[12] = recomputed
    q[13] = np.where(recomputed, moe, 0.0)


def activation_floor(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, mesh: Layout, partition: StagePartition,
    schedule: str, vpp: int, cal: Calibration,
) -> np.ndarray | None:
    """(modes,) bytes that no knob setting of `mesh` (resolved) on `partition` can stay under, per
    recompute mode, without building its table: the busiest rank's saved activations of the
    micro-batches it holds in flight (`_split_peaks`), summed over its layers in the order
    `_rank_sums` adds them, plus the CUDA context; `price_memory` adds only non-negative terms to
    them (the multi-token-prediction blocks, weights, states, logits, buffers, the allocator's
    fragmentation). NaN for full recompute (its kept inputs depend on `recompute_layers`). None
    where `price_memory` may take activations away (activation offload, torch's pipelining
    schedules, DualPipeV), so no floor is claimed there."""
    if mesh.framework != "megatron" or mesh.activation_offload_layers or mesh.offload_activations or schedule == "dualpipev":
        return None
    cal = stacks.stack_calibration(cal, mesh.stack)
    saved = _saved_per_rank(model, training, mesh, partition)
    in_flight = _in_flight(schedule, partition.pp, vpp, mesh.grad_accum_, mesh.framework, mesh.moe_a2a_overlap)
    floor = np.full(len(RECOMPUTE_MODES), np.nan)
    floor[_FLOOR_MODES] = (in_flight * saved).max(axis=1) + cal.cuda_context_bytes
    return floor


FLOOR_FIELDS = (
    "micro_batch", "tp", "cp", "sp", "etp", "framework", "stack", "norm_kernel", "cp_attention", "recompute_modules",
    "grad_accum", "moe_a2a_overlap", "activation_offload_layers", "offload_activations",
)
"""The `Layout` fields `activation_floor` reads of a mesh (`ACTIVATION_FIELDS`, the micro-batch count,
combined 1F1B, activation offload; through `sp_`, `etp_`, `grad_accum_` and `recompute_modules_`
too): meshes equal in these have one floor on one partition, schedule and virtual-stage count
(the search shares it; tests/cost_models/test_stage_table_memos.py checks that it reads no other
field)."""

_FLOOR_MODES = np.array([RECOMPUTE_MODES.index(m) for m in ("none", "selective", "op_sac")])
"""The recompute modes `activation_floor` bounds (indices into `RECOMPUTE_MODES`: all but full)."""

ACTIVATION_FIELDS = (
    "micro_batch", "tp", "cp", "sp", "etp", "framework", "stack", "norm_kernel", "cp_attention", "recompute_modules",
)
"""The `Layout` fields `activation_context` reads of a mesh (through `sp_`, `etp_` and
`recompute_modules_` too): what `_saved_per_rank` keys the saved bytes on
(tests/cost_models/test_stage_table_memos.py checks that it reads no other field)."""

_activation_fields = operator.attrgetter(*ACTIVATION_FIELDS)

SAVED_ENTRIES = 4096
"""`_SAVED` starts over beyond this many activation contexts (as many as `_layer_saved_bytes` keeps)."""
_SAVED: KeptMemo[tuple[np.ndarray, dict[StagePartition, np.ndarray]]] = KeptMemo(SAVED_ENTRIES)


def _saved_per_rank(model: ModelSpec, training: TrainingSpec, mesh: Layout, partition: StagePartition) -> np.ndarray:
    """(3, pp) saved bytes per micro-batch of each rank's layers under the `_FLOOR_MODES`
    (`_layer_saved_bytes`), each summed over the rank's layers in model order, as `_rank_sums` adds
    them (one `np.bincount`, which adds in input order; read-only). Memoized on the model and the
    training (by identity, `KeptMemo`), the mesh's `ACTIVATION_FIELDS` and the partition: the floors
    of meshes that differ in their data- and expert-parallel degrees or their schedule share it."""
    key = (id(model), id(training), _activation_fields(mesh))
    hit = _SAVED.get(key)
    if hit is None:
        per_layer = _layer_saved_bytes(model, activation_context(training, mesh, model))
        hit = _SAVED.put(key, (model, training), (per_layer, {}))
    per_layer, by_partition = hit
    per_rank = by_partition.get(partition)
    if per_rank is None:
        owner = _partition_index(partition)[0]
        n, pp, k = len(owner), partition.pp, len(_FLOOR_MODES)
        bins = (owner[None, :] + pp * np.arange(k)[:, None]).ravel()
        per_rank = np.bincount(bins, weights=per_layer[_FLOOR_MODES, :n].ravel(), minlength=k * pp).reshape(k, pp)
        per_rank.flags.writeable = False
        by_partition[partition] = per_rank
    return per_rank


@lru_cache(maxsize=4096)
def _in_flight(schedule: str, pp: int, vpp: int, grad_accum: int, framework: str, paired: bool) -> np.ndarray:
    """(pp,) micro-batches each rank holds in flight: the largest of its `_split_peaks` activation
    counts (read-only)."""
    out = _split_peaks(schedule, pp, vpp, grad_accum, framework, paired)[0].max(axis=0)
    out.flags.writeable = False
    return out


def _priced_mtp(model: ModelSpec, partition: StagePartition, ft: FineTune | None) -> int:
    """MTP modules priced on this partition's head rank: the trained ones
    (`compute.trained_mtp_layers`) when the partition holds the whole model (a probe partition of
    fewer layers has no head)."""
    return trained_mtp_layers(model, ft is not None) if partition.num_layers == model.num_layers else 0


def _mtp_sums(
    arr: dict[str, np.ndarray], last: np.ndarray, pp: int, head_rank: int, held: int, mtp: int, limit: int | None,
) -> np.ndarray:
    """(quantities, pp) the multi-token-prediction blocks add to `_rank_sums`: `mtp` transformer
    blocks of the last layer's kind (DeepSeek-V3 report Sec. 2.2: each MTP module is one
    transformer block; Megatron-Core builds it from the decoder's layer spec) on the rank that holds
    the LM head (Megatron-Core places them in the last pipeline stage, beside the output layer they
    share), after the rank's `held` layers: full recompute with a `limit` re-runs them only within
    it. `last`: the last layer's column of `_rank_sums`' quantities."""
    out = np.zeros((len(last), pp))
    i = len(arr["fwd"]) - 1
    for depth in range(mtp):
        column = last.copy()
        recomputed = limit is None or held + depth < limit
        _set_recompute_rows(column, recomputed, arr["a0"][i], arr["a2"][i], arr["refwd"][i], arr["moe"][i])
        out[:, head_rank] += column
    return out


class PartitionIndex(NamedTuple):
    """Of a partition (`_partition_index`), read-only arrays: each layer's pipeline rank (`owner`),
    the (pp, layers) mask of the layers each rank holds (`mine`), the bincount bins of `_rank_sums`'
    quantities (`bins`, row-major), the layers grouped by rank in model order (`by_rank`: None when
    the ranks hold their layers in model order already, one chunk each), the ranks that hold any
    (`held`) and where each of those starts in that grouping (`starts`)."""

    owner: np.ndarray
    mine: np.ndarray
    bins: np.ndarray
    by_rank: np.ndarray | None
    held: np.ndarray
    starts: np.ndarray


@lru_cache(maxsize=1024)
def _partition_index(partition: StagePartition) -> PartitionIndex:
    """The `PartitionIndex` of a partition."""
    pp = partition.pp
    owner = np.repeat(np.array(partition.chunk_ranks, dtype=np.int64), partition.chunk_layers)
    mine = owner[None, :] == np.arange(pp)[:, None]
    bins = (owner[None, :] + pp * np.arange(_RANK_QUANTITIES)[:, None]).ravel()
    by_rank: np.ndarray | None = np.argsort(owner, kind="stable")
    if np.array_equal(by_rank, np.arange(len(owner))):
        by_rank = None
    layers = np.bincount(owner, minlength=pp)
    held = np.flatnonzero(layers)
    starts = (np.cumsum(layers) - layers)[held]
    for a in (owner, mine, bins, by_rank, held, starts):
        if a is not None:
            a.flags.writeable = False
    return PartitionIndex(owner, mine, bins, by_rank, held, starts)


def activation_context(training: TrainingSpec, mesh: Layout, model: ModelSpec | None = None) -> ActivationContext:
    fp8_inputs = training.precision == "fp8" and mesh.framework == "megatron"
    eager_rms = mesh.norm_kernel == "eager_fp32" and (model is None or model.norm == "rmsnorm")
    stack = getattr(mesh, "stack", None)
    frozen: dict[str, Any] = {}
    if training.frozen_base:
        # what an adapted base keeps for backward (`activations.adapter_saved_bytes`, `cost_models.stacks`)
        width, copies = stacks.adapter_input_bytes(training, stack)
        frozen = dict(adapted=training.lora_modules, adapter_input_bytes=width, adapter_copies=copies,
                      adapter_rank=training.lora_rank_, dora=training.dora)
    if stack is not None and stacks.defaults(stack).expands_kv:
        frozen["expand_kv"] = True
    return ActivationContext(
        training.seq_len // mesh.cp, mesh.micro_batch, mesh.tp, mesh.sp_, mesh.etp_, training.activation_bytes,
        mesh.framework, gemm_input_bytes=1 if fp8_inputs else training.activation_bytes,
        norm_bytes=(EAGER_FP32_FROZEN_NORM_BYTES if training.frozen_base else EAGER_FP32_NORM_BYTES)
        if eager_rms else training.activation_bytes,
        cp=mesh.cp, cp_attention=getattr(mesh, "cp_attention", "ring") if mesh.cp > 1 else "ring",
        recompute_modules=getattr(mesh, "recompute_modules_", DEFAULT_RECOMPUTE_MODULES),
        **frozen,
    )


DEEPSPEED_MAX_LIVE_PARAMETERS = 1e9
"""DeepSpeed ZeRO-3 `stage3_max_live_parameters` default: parameters gathered at once."""
DEEPSPEED_REDUCE_BUCKET = 5e8
"""DeepSpeed ZeRO `reduce_bucket_size` default (elements)."""


TABLE_FIELDS = (
    "pp", "dp", "recompute_layers", "cross_entropy", "tp_comm_overlap", "offload_activations", "activation_offload_layers",
)
"""The `Layout` fields besides `GEOMETRY_FIELDS` that `_order_free` reads of a mesh (through
`dp_`, `cross_entropy_`, `tp_comm_overlap_`, `communicator_groups` too): with the geometry, the
partition and the GPU count, what its memo is keyed on (tests/cost_models/test_stage_table_memos.py)."""

_table_fields = operator.attrgetter(*TABLE_FIELDS)

TABLE_PARTS_ENTRIES = 1 << 13
"""`_TABLE_PARTS` starts over beyond this many entries (a few KiB each: some 30 arrays of pp or
classes entries)."""
_TABLE_PARTS: KeptMemo[dict[str, Any]] = KeptMemo(TABLE_PARTS_ENTRIES)


def build_table(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    mesh: Layout,
    partition: StagePartition,
    cal: Calibration,
) -> StageTable:
    """`mesh` must be resolved (`Layout.resolved`). Every field but the communication comes from
    `_order_free`, memoized on the mesh's `_Geometry` (so on the job's objects by identity), the
    partition, the GPU count and the mesh's `TABLE_FIELDS`: rank orders, and later searches of the
    same job, share it (read-only arrays); the communication reads the rank order (`_placed_comm`)."""
    cal = stacks.stack_calibration(cal, mesh.stack)  # a fine-tuning stack's host cost per kernel
    geo = _geometry(model, training, cluster, cal, mesh)
    # per-job memo (`comm_store`): the head reads only the token count and TP degree of the
    # geometry (the logits' bytes, the activation context and the loss kernel: `_Geometry.logits`)
    store: dict[tuple, Any] = comm_store(model, training, cluster, cal, gpus)
    key = (id(geo), partition, gpus, _table_fields(mesh))
    parts = _TABLE_PARTS.get(key)
    if parts is None:
        parts = _TABLE_PARTS.put(key, geo, _order_free(model, training, cluster, gpus, mesh, partition, cal, geo, store))
    placed = _placed_comm(model, training, cluster, gpus, mesh, cal, parts["class_attention_f"], parts["class_counts"], store)
    return StageTable(model, training, cluster, gpus, mesh, partition, **parts, **placed)


def _order_free(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: int, mesh: Layout, partition: StagePartition,
    cal: Calibration, geo: _Geometry, store: dict[tuple, Any],
) -> dict[str, Any]:
    """The `StageTable` fields of `mesh` (resolved) on `partition` that read no rank order (all but
    `_placed_comm`'s), by name; `geo`: the mesh's `_Geometry`, `store`: the job's `comm_store`,
    `cal`: the stack's calibration. Read-only arrays."""
    pp, tp = mesh.pp, mesh.tp
    ab = training.activation_bytes
    g, actx, ft, pc = geo.g, geo.actx, geo.ft, geo.pc
    mtp = _priced_mtp(model, partition, ft)
    (dense, expert, largest, acts, working, layers, moe, re_layers, re_moe, compute, forward, reco, counts,
     weight_bytes, trainable, peaks) = _rank_sums(geo, partition, mesh.recompute_layers, mtp)
    head_rank = partition.head_rank  # pp - 1, or rank 0 under a V-shape schedule
    outside, outside_bytes = _outside_layers(model, training, pc, tp, pp, head_rank, store)
    dense += outside
    weight_bytes[0] += outside_bytes
    trained_outside = ft is None or training.trainable_embeddings  # PEFT's modules_to_save
    if trained_outside:
        trainable[0] += outside
    head_key = ("lm_head", g.tokens, g.tp, g.framework)  # the stack prices its kernels (`Calibration.stack`)
    head = store.get(head_key)
    if head is None:
        # LM head stays bf16 under FP8; frozen under LoRA / QLoRA
        head = store[head_key] = lm_head_times(model, g, cluster.gpu, "bf16", ab, cal, not trained_outside)
    head_fwd, head_bwd = head
    compute[head_rank] += head_fwd + head_bwd
    forward[head_rank] += head_fwd
    # the embedding's dense gradient, every micro-batch's backward on its rank
    table = model.vocab_size / tp * model.hidden_size  # elements of one token-embedding table shard
    embedding_tables = np.zeros(pp)
    emb_elsewhere, emb_with_head, emb_mtp_copies = embedding_gradient_times(
        model, tp, cluster, mesh.framework, training, cal, store
    )
    if trained_outside:
        compute[0] += emb_with_head if head_rank == 0 else emb_elsewhere
        embedding_tables[0] += table
    gemm_weights = _gemm_weight_elements(model, training, mesh, partition, head_rank)
    if mtp:
        # each multi-token-prediction module: its input projection and norms (weights on the head
        # rank), its block (`_mtp_sums`), and one more pass through the shared output head and loss
        mtp_key = ("mtp", g.tokens, g.tp, g.framework)
        proj = store.get(mtp_key)
        if proj is None:
            proj = store[mtp_key] = mtp_projection_times(model, g, cluster.gpu, training.precision, ab, cal)
        extra = mtp * (2 * model.hidden_size * model.hidden_size / tp + 3 * pc.final_norm)
        if head_rank != 0 and not model.tie_embeddings:
            # the modules embed the next tokens: away from the first stage the head's rank keeps
            # its own copy of the table, tied to the first stage's (Megatron-Core GPTModel: "we
            # need to maintain a copy of embedding layer in the mtp process stage"); with tied
            # embeddings its copy of the head is that table already. Each module's lookup gives
            # that copy a dense gradient of the whole table, as the first stage's
            extra += pc.embedding / tp
            compute[head_rank] += emb_mtp_copies
            embedding_tables[head_rank] += table
        dense[head_rank] += extra
        weight_bytes[0, head_rank] += training.param_bytes * extra
        if ft is None:
            trainable[0, head_rank] += extra
        compute[head_rank] += mtp * (head_fwd + head_bwd + proj[0] + proj[1])
        forward[head_rank] += mtp * (head_fwd + proj[0])

    per_class = geo.per_class
    upcast = mesh.stack is not None and stacks.defaults(mesh.stack).upcasts_logits
    logits_key = (mesh.cross_entropy_, upcast)
    logits = geo.logits.get(logits_key)
    if logits is None:
        logits = geo.logits[logits_key] = logits_bytes(model, actx, mesh.cross_entropy_, upcast)
    if mtp:
        logits = logits * (1 + mtp)  # each MTP module's loss holds its own logits until the backward
    # Megatron's first n layers of a stage, or a stack's every layer (`Layout.offload_activations`)
    offloaded_acts, offloaded_layers = _offloaded(
        acts, layers, int(layers.max()) if mesh.offload_activations else mesh.activation_offload_layers
    )
    pending = _pending_wgrad(counts @ per_class["pend"], model, actx, head_rank, ft is None)
    # read-only, as the geometry's arrays the parts name too (`_Geometry`), so tables share them
    for a in (dense, expert, largest, acts, working, layers, moe, re_layers, re_moe, compute, forward, reco, counts,
              weight_bytes, trainable, peaks, offloaded_acts, offloaded_layers, pending, embedding_tables, gemm_weights):
        a.setflags(write=False)
    if isinstance(logits, np.ndarray):
        logits.flags.writeable = False
    return dict(
        dense_params=dense, expert_params=expert, largest_layer=largest, acts=acts, working=working, layers=layers,
        moe_layers=moe, recomputed_layers=re_layers, recomputed_moe=re_moe, compute=compute, forward=forward,
        recompute=reco, class_counts=counts, class_forward=per_class["fwd"], class_backward=geo.class_backward,
        logits=logits, tp_overlap=mesh.tp_comm_overlap_, tp_backward_traffic=tp_backward_traffic(mesh.framework, mesh.sp_),
        nccl_groups=mesh.communicator_groups, weight_bytes=weight_bytes, trainable=trainable,
        class_weight_bytes=geo.class_weight_bytes, class_trainable=geo.class_trainable,
        largest_weight_bytes=peaks[0], largest_trainable=peaks[1], dequant_bytes=peaks[2],
        offloaded_acts=offloaded_acts, offloaded_layers=offloaded_layers,
        pending_wgrad=pending, embedding_grad_elements=embedding_tables, gemm_weight_elements=gemm_weights,
        class_attention_f=per_class["attn_f"],
    )


def _outside_layers(
    model: ModelSpec, training: TrainingSpec, pc: ParamCounts, tp: int, pp: int, head_rank: int, store: dict[tuple, Any],
) -> tuple[np.ndarray, np.ndarray]:
    """(pp,) elements of the weights outside the layers on each rank (the embedding on the first,
    the final norm and LM head on `head_rank`; compute dtype, frozen under LoRA / QLoRA) and their
    stored bytes; memoized in the job's `comm_store` (read-only)."""
    key = ("outside", tp, pp, head_rank)
    hit = store.get(key)
    if hit is None:
        outside = np.zeros(pp)
        outside[0] += pc.embedding / tp
        outside[head_rank] += pc.final_norm
        if pc.lm_head:
            outside[head_rank] += pc.lm_head / tp
        elif pp > 1:  # tied embeddings: the last chunk keeps its own copy of the head (its own module, even in a V)
            outside[head_rank] += model.vocab_size * model.hidden_size / tp
        hit = store[key] = (_readonly(outside), _readonly(training.param_bytes * outside))
    return hit


def _gemm_weight_elements(model: ModelSpec, training: TrainingSpec, mesh: Layout, partition: StagePartition,
                          head_rank: int) -> np.ndarray:
    """(pp,) trained GEMM weight elements of each rank that autocast casts under a stack training
    float32 weights (`stacks.autocast_weights`; `StageTable.gemm_weight_elements`): the linears of
    the rank's layers and, on the head rank, the LM head (with tied embeddings the head's GEMM reads
    the table, whose cast is cached like any trained weight's); zeros otherwise."""
    out = np.zeros(partition.pp)
    if not stacks.autocast_weights(training, stacks.weights_owner(mesh.framework, mesh.stack, mesh.dp_, mesh.cp)):
        return out
    for rank in range(partition.pp):
        out[rank] = sum(float(finetune.linear_elements(model, i, mesh.tp, mesh.ep, mesh.etp_))
                        for i in partition.rank_layers(rank))
    out[head_rank] += head_gemm_elements(model, mesh.tp)
    return out


def head_gemm_elements(model: ModelSpec, tp: int) -> float:
    """Elements of the LM head's GEMM weight on one TP rank (vocabulary x hidden / tp): the part of
    `StageTable.gemm_weight_elements` that sits outside the layers (not re-run by a recompute)."""
    return model.vocab_size * model.hidden_size / tp


PLACED_FIELDS = (
    "tp", "cp", "ep", "etp", "dp", "pp", "sp", "order", "moe_parallel_folding", "micro_batch", "cp_attention",
    "moe_token_dispatcher", "framework", "stack", "elementwise_kernels", "attention_kernel", "fsdp_flat_params",
)
"""The `Layout` fields that `_placed_comm` reads of a mesh (through `etp_`, `dp_`, `sp_`,
`mesh_comm.mesh_strides` and, for the expert-TP rows, `ShardGeometry.of` too): with the layer
classes' attention and counts where context parallelism exchanges, what its memo in the job's
`comm_store` is keyed on (tests/cost_models/test_stage_table_memos.py)."""

_placed_fields = operator.attrgetter(*PLACED_FIELDS)


def _placed_comm(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: int, mesh: Layout, cal: Calibration,
    attention_f: np.ndarray, counts: np.ndarray, store: dict[tuple, Any],
) -> dict[str, Any]:
    """The `StageTable` fields that read where the mesh's groups sit on the topology (its rank
    order): seconds of the per-layer TP, EP and expert-TP collectives and of a pipeline send, the
    boundary bytes, the CP exchange per rank (`cp_exposure`) and each group's channel. `attention_f`
    (K,): one layer's attention forward of each layer class; `counts` (pp, K): layers of each class
    per rank; `store`: the job's `comm_store`. Nothing else of a table reads the order. Memoized in
    the store on the mesh's `PLACED_FIELDS` and, under context parallelism, the two arrays (by
    identity: the entry holds them); the dict returned is shared, not to be changed."""
    key = ("placed", _placed_fields(mesh), id(attention_f), id(counts)) if mesh.cp > 1 else ("placed", _placed_fields(mesh))
    hit = store.get(key)
    if hit is None:
        placed = _price_placed(model, training, cluster, gpus, mesh, cal, attention_f, counts, store)
        hit = store[key] = (placed, attention_f, counts)
    return hit[0]  # type: ignore[no-any-return]


def _price_placed(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: int, mesh: Layout, cal: Calibration,
    attention_f: np.ndarray, counts: np.ndarray, store: dict[tuple, Any],
) -> dict[str, Any]:
    """`_placed_comm` without its memo."""
    tp_per_layer, cp_step, ep_per_moe, p2p, boundary, etp_per_moe = mesh_comm(
        model, training, cluster, gpus, mesh, cal, store=store
    )[0]
    if mesh.cp > 1:
        cp_exposed, cp_busy = _cp_exposure_memo(
            cp_step, mesh.cp, attention_f, flash_backward_factor(model), counts, mesh.cp_attention == "allgather_mask"
        )
    else:
        cp_exposed = cp_busy = _no_cp_exchange(counts.shape[0])
    channels_key = (
        "channels", mesh.tp, mesh.cp, mesh.ep, mesh.etp_, mesh.dp_, mesh.pp, mesh.order, mesh.moe_parallel_folding
    )
    channels = store.get(channels_key)
    if channels is None:
        channels = store[channels_key] = mesh_channels(cluster, gpus, mesh)
    return dict(tp_per_layer=tp_per_layer, cp_exposed=cp_exposed, cp_busy=cp_busy, ep_per_moe_layer=ep_per_moe,
                etp_per_moe_layer=etp_per_moe, p2p=p2p, boundary_bytes=boundary, channels=channels)


_DEGREES = operator.attrgetter(
    "tp", "pp", "cp", "dp_", "ep", "etp_", "micro_batch", "moe_parallel_folding", "framework", "stack"
)
"""What `reorder` requires of the new mesh to be the table's own."""


def reorder(t: StageTable, mesh: Layout, cal: Calibration) -> StageTable:
    """Table `t` for `mesh` (resolved), which differs from `t.mesh` in its rank order at most (and in
    knobs a table ignores): the order places the groups on the topology, so only the communication
    fields (`_placed_comm`) are priced again; every other field (parameters, activations, compute,
    the layer classes) reads the degrees, the micro-batch and the partition alone and is shared
    (read-only arrays). Equal, field for field, to `build_table` of `mesh` on `t.partition`
    (tests/planner/test_search_bounds.py)."""
    if _DEGREES(t.mesh) != _DEGREES(mesh):
        raise ValueError("reorder: the mesh differs from the table's in more than its rank order")
    cal = stacks.stack_calibration(cal, mesh.stack)  # as `build_table` prices it
    placed = _placed_comm(
        t.model, t.training, t.cluster, t.gpus, mesh, cal, t.class_attention_f, t.class_counts,
        comm_store(t.model, t.training, t.cluster, cal, t.gpus),
    )
    return t.sharing(mesh=mesh, **placed)


def _pending_wgrad(layers: np.ndarray, model: ModelSpec, actx: ActivationContext, head_rank: int, trained: bool) -> np.ndarray:
    """(pp,) bytes per micro-batch a split backward keeps pending: the layers' weight-GEMM output
    gradients (`layers`), and on the head rank the LM head's, the logits' gradient (tokens x
    vocab / tp in the activation dtype; `bench.fake_world_memory`, Llama-3-8B TP4 PP4: the head
    rank's error went from -7.8% to -1.1% under ZB1P, -6.6% to -2.7% under ZB1P with vpp 2 and
    -2.0% to -0.9% under ZB-V, where rank 0 holds the head)."""
    if not trained:  # a frozen head has no weight pass
        return layers
    out = layers.copy()
    out[head_rank] += actx.tokens * model.vocab_size / actx.tp * actx.act_bytes
    return out


def _offloaded(acts: np.ndarray, layers: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(saved bytes per micro-batch and mode, layers) of the `n` offloaded layers of each rank, at
    the rank's mean layer (Megatron offloads the first n layers of the stage)."""
    off = np.minimum(float(n), layers)
    if not n:  # none offloaded (layer counts are never negative): the same zeros, two operations fewer
        return acts * 0.0, off
    return acts * np.divide(off, np.maximum(layers, 1.0))[None, :], off


def tp_backward_traffic(framework: str, sp: bool) -> float:
    """Backward TP/SP traffic over the forward's: Megatron's sequence-parallel linear layers
    all-gather their input again in the backward for the weight gradient (Megatron-Core
    `tensor_parallel.layers.LinearWithGradAccumulationAndAsyncCommunication`), 2x; PyTorch's
    DTensor TP saves the gathered input (`cost_models.activations`), 1x."""
    return 2.0 if framework == "megatron" and sp else 1.0


_CP_EXPOSURES: KeptMemo[tuple[np.ndarray, np.ndarray]] = KeptMemo(1 << 12)


def _cp_exposure_memo(
    cp_step: float, cp: int, attention_f: np.ndarray, backward_factor: float, counts: np.ndarray, allgather: bool
) -> tuple[np.ndarray, np.ndarray]:
    """`cp_exposure`, memoized on its arguments' values (the arrays by their dtype, shape and bytes; the
    results are read-only): a search's tables repeat few of them (the Qwen3-235B-A22B plan_speed
    job: 191 distinct of 10,257 with cp > 1)."""
    if cp <= 1:
        zeros = _no_cp_exchange(counts.shape[0])
        return zeros, zeros
    key = (cp_step, cp, attention_f.dtype.str, attention_f.shape, attention_f.tobytes(), backward_factor,
           counts.dtype.str, counts.shape, counts.tobytes(), allgather)
    hit = _CP_EXPOSURES.get(key)
    if hit is None:
        hit = cp_exposure(cp_step, cp, attention_f, backward_factor, counts, allgather)
        for a in hit:
            a.flags.writeable = False
        _CP_EXPOSURES.put(key, None, hit)
    return hit


@lru_cache(maxsize=256)
def _no_cp_exchange(pp: int) -> np.ndarray:
    """(2, pp) zeros, read-only: `cp_exposure` without context parallelism (both of its arrays)."""
    return _readonly(np.zeros((2, pp)))


def cp_exposure(
    cp_step: float, cp: int, attention_f: np.ndarray, backward_factor: float, counts: np.ndarray, allgather: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Context-parallel exchange per micro-batch and pipeline rank ((2, pp) arrays, forward and
    backward): seconds not hidden, and seconds on the CP group's channel. `cp_step`: one ring
    step's K/V block send (or, under all-gather attention, one layer's K/V all-gather);
    `attention_f` (K,): one layer's attention kernel forward of each layer class on this rank;
    `counts` (pp, K): layers of each class per rank.

    Ring attention (`cost_models.step_time`): each of the cp - 1 steps sends the next block while
    this one's attention runs; the forward sends K, V, the backward K, V and dK, dV (twice the
    bytes) behind the attention backward (`backward_factor` x forward). All-gather attention
    gathers K/V before attending and reduce-scatters dK/dV after: nothing hidden."""
    pp = counts.shape[0]
    if cp <= 1:
        zeros = np.zeros((2, pp))
        return zeros, zeros
    if allgather:
        per_layer = np.full((2, len(attention_f)), cp_step)
        busy = per_layer
    else:
        steps = cp - 1
        per_layer = np.stack(
            [
                steps * np.maximum(0.0, cp_step - attention_f / cp),
                steps * np.maximum(0.0, 2 * cp_step - backward_factor * attention_f / cp),
            ]
        )
        busy = np.stack([np.full(len(attention_f), steps * cp_step), np.full(len(attention_f), 2 * steps * cp_step)])
    return per_layer @ counts.T, busy @ counts.T


# ------------------------------------------------------------------------------------------------
# knob arithmetic


@lru_cache(maxsize=4096)
def _split_peaks(
    schedule: str, pp: int, vpp: int, grad_accum: int, framework: str, paired: bool
) -> tuple[np.ndarray, np.ndarray]:
    """`pipeline.split_backward_peaks` of every rank as (C, pp) arrays of activation and pending
    micro-batches (ranks with fewer candidates repeat their last; read-only). The largest
    activation count of a rank is its in-flight micro-batches (`in_flight_micro_batches`)."""
    cands = [split_backward_peaks(schedule, pp, vpp, grad_accum, r, framework, paired) for r in range(pp)]
    c = max(len(x) for x in cands)
    a = np.array([[x[min(i, len(x) - 1)][0] for x in cands] for i in range(c)])
    g = np.array([[x[min(i, len(x) - 1)][1] for x in cands] for i in range(c)])
    for arr in (a, g):
        arr.flags.writeable = False
    return a, g


def _shards(t: StageTable, shard: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense sharding group (dp_shard x cp) and expert sharding group per setting."""
    m = t.mesh
    dense = shard * m.cp
    expert = np.maximum(1, (shard * m.cp * m.tp) // (m.ep * m.etp_))
    return dense.astype(float), expert.astype(float)


_STATE_BYTES: KeptMemo[tuple] = KeptMemo(1 << 12)  # entries hold (settings, pp) arrays: keep the memo small


def _state_bytes_cached(t: StageTable, knobs: KnobArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """`_state_bytes`, memoized on everything it reads: the knobs, model and training objects (by
    identity, `KeptMemo`), the framework, whether the step
    accumulates and pipelines, the sharding degrees and the per-rank parameter counts. Tables of
    one mesh at other micro-batches share them. The arrays are read-only."""
    m = t.mesh
    objs = (knobs, t.model, t.training)
    key = (
        id(knobs), id(t.model), id(t.training), m.framework, m.grad_accum_ > 1, m.pp > 1,
        m.stack, stacks.weights_owner(m.framework, m.stack, m.dp_, m.cp), m.optimizer_state, m.optimizer_in_backward,
        m.tp, m.cp, m.ep, m.etp_, t.dense_params.tobytes(), t.expert_params.tobytes(),
        t.weight_bytes.tobytes(), t.trainable.tobytes(), t.gemm_weight_elements.tobytes(),
    )
    hit = _STATE_BYTES.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    out = _state_bytes(t, knobs)
    for a in out[:5]:
        a.flags.writeable = False
    return _STATE_BYTES.put(key, objs, out)


def _state_bytes(t: StageTable, knobs: KnobArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Bytes per setting and rank of parameters, gradients, GPU optimizer states, offloaded state in
    host memory and on NVMe ((settings, pp) arrays), and the FSDP embedding-gradient transient (bytes)."""
    tr, m = t.training, t.mesh
    zero, shard, offload = knobs.zero[:, None], knobs.shard[:, None], knobs.offload[:, None]
    ds, es = _shards(t, shard)
    # stored weights in bytes (a frozen base at its storage dtype, adapters), trainable elements
    WD, WE = t.weight_bytes[0][None, :], t.weight_bytes[1][None, :]
    D, E = t.trainable[0][None, :], t.trainable[1][None, :]
    # bytes per trained element under the stack (`stacks.trainable_bytes`; the runtime's single-replica
    # layouts keep float32 weights: `stacks.UNWRAPPED`): the tables store trained weights at the compute
    # dtype; float32 ones add the difference
    owner = stacks.weights_owner(m.framework, m.stack, m.dp_, m.cp)
    unwrapped = (zero == 0) | (owner == stacks.UNWRAPPED)  # no sharding wrapper: ZeRO-0, or no FSDP mesh
    tb = stacks.trainable_bytes(tr, owner, m.optimizer_state)
    WD = WD + (tb.weight - tr.param_bytes) * D if owner is not None else WD
    WE = WE + (tb.weight - tr.param_bytes) * E if owner is not None else WE
    params = np.where(zero >= 3, WD / ds, WD) + np.where(zero >= 3, WE / es, WE)
    if m.framework == "fsdp" and owner is None:
        # ZeRO-0 under FSDP2 is `replicate` (runtime.parallelize): its mixed-precision policy casts the
        # float32 trained weights to a compute-dtype copy of every block that lives beside them for the
        # whole step (measured on the fake-world trace of Llama-3-8B over 8 ranks: 0.41 GiB more per
        # layer than ZeRO-3 holds, one bf16 copy). A frozen base is stored in the compute dtype
        # already and is not cast: only the trained elements are (measured on one H200: the runtime's
        # LoRA of a 16-layer Llama-3-8B peaks at 26.0 GiB allocated, 25.96 priced so, 34.4 with the
        # frozen base copied again)
        copies = tr.param_bytes * (D + E)
        params = params + np.where(zero == 0, copies, 0.0)
    elif tb.copy:
        # a stack's float32 weights under autocast: the cached compute-dtype cast of every GEMM
        # weight, from its first use in the forward to its backward (`stacks.autocast_weights`; the
        # embedding and the norms are read in float32); under FSDP its mixed precision gathers bf16
        # parameters and autocast casts nothing
        params = params + np.where(unwrapped, tb.copy * t.gemm_weight_elements[None, :], 0.0)
    # PyTorch FSDP has no ZeRO-1 of its own: with one micro-batch per step it reduces each layer's
    # unsharded gradient right after that layer's backward, as ZeRO-2 does; with several it keeps
    # the unsharded gradients until the last one (runtime.parallelize)
    grads_sharded_from = 1 if (m.framework == "fsdp" and m.grad_accum_ == 1) else 2
    grad_bytes = tr.grad_bytes if owner is None else tb.gradient
    if m.framework == "fsdp" and m.grad_accum_ > 1 and owner is None:
        # FSDP2 accumulating without reduction keeps each unsharded gradient in its reduce dtype
        # (float32: `FSDPParam.to_accumulated_grad_if_needed`), not the bf16 compute dtype. The
        # runtime accumulates so under ZeRO-0/1, and torch.distributed.pipelining does under every
        # ZeRO stage (`backward_maybe_with_nosync` turns gradient sync off for every micro-batch;
        # the reduction runs once after the schedule). Measured: Llama-3-8B TP4 x PP4 x DP8, ZeRO-1,
        # 8 micro-batches, last stage with 2 vs 4 layers: 0.768 GiB per layer traced, 0.663
        # priced with bf16 gradients (+0.102 = one more bf16 copy of a layer's TP shard).
        if m.pp > 1:
            grads_sharded_from = 4  # never sharded during the step
        grad_bytes = max(tr.grad_bytes, FSDP_ACCUMULATED_GRAD_BYTES)
    grads = np.where(
        zero >= grads_sharded_from,
        (tr.grad_bytes if owner is None else tb.gradient) * (D / ds + E / es),
        grad_bytes * (D + E),
    )
    if m.optimizer_in_backward:
        # torchtune's optimizer_in_bwd: each parameter is stepped and its gradient freed in its
        # post-accumulate-grad hook, so the gradients alive are about one layer's (or the embedding's)
        table = count_params(t.model).embedding / m.tp if (not tr.frozen_base or tr.trainable_embeddings) else 0.0
        grads = np.minimum(grads, tb.gradient * np.maximum(t.largest_trainable, table)[None, :])
    if m.framework == "fsdp" and m.tp > 1 and m.grad_accum_ > 1:
        # DTensor's backward of the row-wise (vocabulary-sharded) token embedding all-gathers the
        # output gradient and returns a Replicate gradient of the whole vocabulary on every TP rank;
        # FSDP2 accumulates it as is (float32), so the first stage keeps V x h, not V x h / tp
        # (measured: (128256, 4096) float32 accumulated gradient, 1.96 GiB, on stage 0 of Llama-3-8B
        # TP4 x PP4; a fake 4-rank TP mesh gives a Replicate (1024, 64) gradient for a 1024-row table).
        emb = 0 if tr.frozen_base else count_params(t.model).embedding
        grads[:, 0] += np.where(zero[:, 0] >= grads_sharded_from, 0.0, grad_bytes * emb * (1 - 1 / m.tp))
        # Each micro-batch's embedding backward creates that full-vocabulary gradient in bf16 before
        # FSDP adds it to the float32 one, after the micro-batch's activations are freed: a
        # transient of V x h x 2 bytes on top of the other in-flight micro-batches (measured:
        # (128256, 4096) float32 + bfloat16 live together at stage 0's peak, Llama-3-8B TP2 x PP2
        # with 2 layers per stage).
        embedding_transient = float(tr.param_bytes * emb) if emb else 0.0
    else:
        embedding_transient = 0.0
    local = np.where(zero >= 1, D / ds, D) + np.where(zero >= 1, E / es, E)  # trainable elements of the rank
    opt_all = tb.optimizer * local
    # bitsandbytes' paged states live in unified memory: off PyTorch's allocator, paged to the host
    opt = np.where(offload | tb.paged, 0.0, opt_all)
    # offloaded: the optimizer states and the float32 gradient partition the host optimizer reads
    off = np.where(offload, opt_all + HOST_GRAD_BYTES * local, np.where(tb.paged, opt_all, 0.0))
    # ZeRO-3 parameter offload: the weight shard leaves the GPU too (the gathered layers stay in the
    # layer-phase buffers)
    offload_params = knobs.offload_params[:, None]
    off = off + np.where(offload_params, params, 0.0)
    params = np.where(offload_params, 0.0, params)
    # ZeRO++ hpZ: a secondary 16-bit weight shard over the hpZ group, kept from forward to backward
    hpz = knobs.hpz[:, None]
    params = params + np.where(hpz > 1, (WD + WE) / hpz, 0.0)
    # ZeRO-Infinity's NVMe tier: the offloaded states on NVMe, pinned staging buffers in host memory
    nvme = knobs.offload_nvme[:, None]
    pinned = nvme_pinned_bytes(local, offload, offload_params, tr.param_bytes)
    host = np.where(nvme, pinned, off)
    on_nvme = np.where(nvme, off, 0.0)
    return params, grads, opt, host, on_nvme, embedding_transient


_PHASE_Z3 = np.array([False, False, True, True])[:, None]
_PHASE_FULL = np.array([False, True, False, True])[:, None]
"""Rows of the (ZeRO-3, full recompute) flag pairs, indexed by `KnobArrays.phase`."""


def price_memory(
    t: StageTable, settings: list[Setting], schedule: str, vpp: int, cal: Calibration, knobs: KnobArrays | None = None
) -> KnobPrices:
    """Bytes per rank for every setting (ZeRO: Rajbhandari et al. 2020; see cost_models.memory).
    `knobs`: `KnobArrays.of(settings)` when the caller has it already (a planner's grid)."""
    tr, m = t.training, t.mesh
    pp = m.pp
    cached = knobs is not None and len(knobs.zero) == len(settings)  # a planner's grid: memoize
    if knobs is None or not cached:
        knobs = KnobArrays.of(settings)
    zero, mode = knobs.zero[:, None], knobs.mode
    if cached:
        params, grads, opt, host, nvme, embedding_transient = _state_bytes_cached(t, knobs)
    else:
        params, grads, opt, host, nvme, embedding_transient = _state_bytes(t, knobs)
    if m.framework == "fsdp" and pp > 1 and vpp > 1 and schedule in WEIGHT_PASS_SCHEDULES and m.grad_accum_ > 1:
        # torch.distributed.pipelining's weight pass writes each weight's gradient in the compute
        # dtype; FSDP2 folds it into the float32 accumulated gradient only in that layer's next
        # backward hook, so with two chunks per rank one chunk's compute-dtype weight gradients are
        # alive while the other chunk's input pass runs (measured: ZB-V, Llama-3-8B TP4 x PP4, rank 1's
        # peak in chunk 6's input pass holds chunk 1's 4 layers of bf16 weight gradients, 0.41 GiB,
        # left by its weight pass; one chunk per rank leaves one layer's)
        grads = grads + tr.param_bytes * (t.largest_trainable * t.layers / vpp)[None, :]
    # the rank's largest candidate peak of saved activations and (under a split backward) pending
    # weight-output gradients, (C, modes, pp) -> per recompute mode, then per setting
    a_units, g_units = _split_peaks(schedule, pp, vpp, m.grad_accum_, m.framework, m.moe_a2a_overlap)
    peaks = a_units[:, None, :] * t.acts[None, :, :] + (g_units * t.pending_wgrad[None, :])[:, None, :]
    acts = np.maximum.reduce(peaks, axis=0)[mode]
    if m.activation_offload_layers or m.offload_activations:
        # offloaded layers stay on the GPU only as the two layers being copied out / prefetched back
        # (Megatron's --cpu-offloading; a stack's, torchtune's OffloadActivations, every layer)
        staging = 2 * np.divide(t.offloaded_acts, np.maximum(t.offloaded_layers, 1.0)[None, :])
        inflight = a_units.max(axis=0)  # micro-batches in flight per rank
        on_host = (t.offloaded_acts * inflight[None, :])[mode]
        acts = acts - on_host + np.minimum(staging, t.offloaded_acts * inflight[None, :])[mode]
    logits = np.zeros((len(settings), pp))
    logits[:, t.partition.head_rank] = t.logits
    if m.framework == "fsdp" and pp > 1 and schedule in FORWARDS_FIRST_SCHEDULES and m.grad_accum_ > 1:
        # torch.distributed.pipelining's GPipe runs every forward, then every backward. Gradients
        # do not exist before the first backward (zero_grad sets them to None; FSDP2 allocates the
        # accumulated ones lazily) and that backward frees its micro-batch's activations while
        # creating them: the peak is (m-1) micro-batches plus the larger of one micro-batch and
        # the gradients, not m plus the gradients. The last stage computes each micro-batch's loss
        # in the forward and keeps it (bf16 logits + float32 log-softmax) until its backward.
        # Measured: Llama-3-8B TP8 x PP2 x DP16, 4 micro-batches: stage 0 22.0 GiB traced against
        # 25.2 priced with gradients on top of 4 micro-batches; stage 1 25.6 against 24.7.
        one = t.acts[mode]  # (J, pp): one micro-batch
        acts = acts - np.minimum(one, grads)
        actx = activation_context(tr, m, t.model)
        logits[:, t.partition.head_rank] += (m.grad_accum_ - 1) * retained_logits_bytes(t.model, actx, m.cross_entropy_)
    if schedule == "dualpipev" and pp > 1 and not dualpipev_loss_meets_first_chunk(pp, m.grad_accum_):
        # torch's DualPipeV at its minimum 2p micro-batches (`pipeline.dualpipev_loss_meets_first_chunk`):
        # the only loss backward that meets 2p + 1 chunks on the head rank (rank 0, which holds the
        # model's first and last chunks) runs before the first chunk's first backward, so its
        # gradients (FSDP2 creates them lazily; at least the embedding's) do not exist yet; later
        # 2p + 1 chunks meet only the retained logits (bf16 logits + float32 log-softmax), and the
        # loss transient otherwise meets 2p chunks. The head rank's peak is the largest of the three,
        # so the priced "2p + 1 chunks + loss transient + every gradient" is too high by the least of
        # the first chunk's gradients, one chunk and the transient's excess over the retained logits.
        # Measured (Llama-3-8B TP4 x PP4, 8 micro-batches, rank 0, 2 steps): 21.7 GiB traced, 22.9
        # priced before (+5.5%).
        head = t.partition.head_rank
        actx = activation_context(tr, m, t.model)
        retained = retained_logits_bytes(t.model, actx, m.cross_entropy_)
        emb = 0 if tr.frozen_base else count_params(t.model).embedding
        first_chunk_grads = max(tr.grad_bytes, FSDP_ACCUMULATED_GRAD_BYTES) * emb
        one_chunk = t.acts[mode][:, head] / vpp  # the rank's layers come in vpp (= 2) chunks
        relief = np.minimum(np.minimum(first_chunk_grads, one_chunk), max(t.logits - retained, 0.0))
        logits[:, head] -= relief
    if m.framework == "deepspeed":  # gathers bounded by max_live_parameters, gradients by the bucket
        # stored bytes per gathered element of the largest layer (the compute dtype's, less under QLoRA)
        bytes_per_element = np.divide(t.largest_weight_bytes, np.maximum(t.largest_layer, 1.0))
        gathered = bytes_per_element * np.minimum(2 * t.largest_layer, DEEPSPEED_MAX_LIVE_PARAMETERS)
        reducing = np.minimum(t.largest_trainable, DEEPSPEED_REDUCE_BUCKET)
        z3_buffers = gathered + tr.grad_bytes * reducing
    else:  # FSDP: the current and the prefetched layer, and one layer's unsharded gradient
        z3_buffers = 2 * t.largest_weight_bytes + tr.grad_bytes * t.largest_trainable
    # Two transient peaks that do not coincide: a layer's backward (ZeRO-3 gathered parameters and
    # unsharded gradient, and under full recompute that layer's activations re-created) and the
    # loss on the last stage (logits and their float32 gradients, freed before the LM head's
    # backward gathers its weight). The rank holds the larger; `comm_buffers` reports what the
    # layer phase adds beyond the logits, so the breakdown still sums to the total.
    # per (ZeRO-3, full recompute) pair of flags (`KnobArrays.phase`), then per setting
    # (the runtime's single-replica layouts gather nothing at any ZeRO stage: `stacks.UNWRAPPED`)
    owner = stacks.weights_owner(m.framework, m.stack, m.dp_, m.cp)
    no_fsdp = owner == stacks.UNWRAPPED
    phase = knobs.phase % 2 if no_fsdp else knobs.phase
    # QLoRA: each quantized linear is dequantized to a 16-bit copy before its GEMM (forward and
    # backward); added per pair of flags before each setting takes its pair's row (the same sums)
    layer_phase = (
        np.where(_PHASE_Z3, z3_buffers[None, :], 0.0) + np.where(_PHASE_FULL, t.working[None, :], 0.0)
        + t.dequant_bytes[None, :]
    )[phase]
    buffers = np.maximum(0.0, layer_phase - logits)
    if embedding_transient:
        # it replaces the micro-batch's transient peak (its activations, loss and layer buffers)
        transient = t.acts[mode][:, 0] + logits[:, 0] + buffers[:, 0]
        buffers[:, 0] += np.maximum(0.0, embedding_transient - transient)
    if m.framework == "fsdp" and pp == 1 and m.stack is None and not m.fsdp_root_holds_ends:
        # torchtitan's FSDP2 units (and the runtime's): the embedding and the norm + head are units
        # of their own, so each vocabulary table is unsharded only while its unit works; the peak is
        # the largest of the step's phases (`fsdp_units.single_stage_phases`, measured there). The
        # runtime's loop keeps the micro-batch's logits (compute dtype) through the backward, and
        # the head's backward takes their gradient in the same dtype.
        actx = activation_context(tr, m, t.model)
        retained = float(actx.tokens * t.model.vocab_size / m.tp * tr.param_bytes)
        first_layer = t.acts[mode] / np.maximum(t.layers, 1.0)[None, :]
        phases = single_stage_phases(
            edge_units(t.model, tr, m.tp), zero3=(zero >= 3) & (not no_fsdp), param_bytes=tr.param_bytes,
            accumulating=m.grad_accum_ > 1, shard=_shards(t, knobs.shard[:, None])[0], acts=acts, grads=grads,
            logits=logits, layer_phase=layer_phase, first_layer_acts=first_layer,
            retained_logits=retained, logit_gradient=retained, layer_weight=t.largest_weight_bytes,
        )
        if embedding_transient:  # the full-vocabulary gradient of a TP embedding (above)
            phases.append(Phase(grads + embedding_transient, grads, 0.0 * acts, 0.0 * acts))
        peaks = np.stack([ph.total for ph in phases])
        winner, peak = np.argmax(peaks, axis=0), peaks.max(axis=0)
        # breakdown of the winning phase (it sums to the total)
        grads = np.choose(winner, [ph.grads for ph in phases])
        acts = np.choose(winner, [ph.acts for ph in phases])
        logits = np.choose(winner, [ph.logits for ph in phases])
        buffers = peak - grads - acts - logits
    elif m.framework == "fsdp" and pp == 1 and m.grad_accum_ == 1:
        # A stack's FSDP, or one whose root group holds both ends (`Layout.fsdp_root_holds_ends`;
        # accelerate's transformer-based wrap policy wraps the decoder layers only), under PyTorch's own step
        # (zero_grad(set_to_none=True), one micro-batch, no pipeline): no gradient exists before the
        # backward, so the loss phase holds none; the backward frees each layer's saved tensors as
        # it creates that layer's (sharded) gradients, so the layer phase peaks either at its start
        # (all activations, no gradient) or at its end (all gradients, the first layer's
        # activations). Under ZeRO-3 the FSDP2 root group (embedding, final norm, LM
        # head) is gathered for the LM head's backward and stays gathered, with the head's bf16
        # gradient waiting for the root's reduce-scatter, until the embedding's backward ends.
        # Measured: Mixtral-8x7B EP8 over 64 ranks, ZeRO-3, full recompute: 2 layers 4.18 GiB traced
        # (peak in layer 0's backward: 2 x 0.244 GiB gathered root + 0.244 head gradient, 31 of 32
        # layers' float32 sharded gradients live at 32 layers) against 3.47 priced with every layer
        # input and no root; Llama-3-8B FSDP 64, full recompute: 17.54 traced, 17.88 priced with
        # the gradients under the loss.
        pc = count_params(t.model)
        head_gradient = 0 if tr.frozen_base else (pc.lm_head or pc.embedding)
        root = (pc.embedding + pc.final_norm + pc.lm_head + head_gradient) / m.tp * tr.param_bytes
        root_phase = np.where(zero >= 3, root, 0.0)
        first_layer_acts = t.acts[mode] / np.maximum(t.layers, 1.0)[None, :]
        early = acts + layer_phase + root_phase
        late = grads + first_layer_acts + layer_phase + root_phase
        loss = acts + logits
        winner = np.argmax(np.stack([loss, early, late]), axis=0)
        peak = np.max(np.stack([loss, early, late]), axis=0)
        # breakdown of the winning phase (it sums to the total)
        grads = np.where(winner == 2, grads, 0.0)
        acts = np.where(winner == 2, first_layer_acts, acts)
        logits = np.where(winner == 0, logits, 0.0)
        buffers = peak - grads - acts - logits
    if pp > 1:
        if m.framework == "fsdp":
            # torch.distributed.pipelining allocates, at stage set-up, one receive buffer per
            # micro-batch and model chunk: activations from the previous stage (not on the first)
            # and gradients from the next (not on the last), kept for the whole step (measured:
            # Llama-3-8B TP4 x PP4, 8 micro-batches: 8 + 8 (1, 2048, 4096) bf16 buffers on
            # stages 1-2, 8 on stages 0 and 3). The sends reuse the stage outputs.
            ranks = np.arange(pp)
            chunks = 2 * vpp - (ranks == 0) - (ranks == t.partition.head_rank)
            buffers = buffers + (chunks * m.grad_accum_ * t.boundary_bytes)[None, :]
        else:
            buffers = buffers + 2 * t.boundary_bytes
    buffers = buffers + t.nccl_groups * cal.nccl_buffer_bytes_per_group
    allocated = params + grads + opt + acts + logits + buffers
    reserve = cal.cuda_context_bytes + stacks.fragmentation(cal, m.framework, owner, m.dp_) * allocated
    if m.activation_offload_layers or m.offload_activations:
        host = host + on_host
    return KnobPrices(params, grads, opt, acts, logits, buffers, reserve, host, allocated, nvme, knobs=knobs)
