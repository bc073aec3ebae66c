"""Search: enumerate the space, reject what is invalid or does not fit, rank the rest by step time.

Whole space, priced or provably pruned (branch and bound):
1. Level 1 meshes are validated once; an invalid mesh rejects all its knob settings.
2. Each (mesh, micro-batch) pair gets a lower bound on its step time: the compute of one micro-
   batch through all layers divided over the pipeline ranks, times the micro-batches. Every knob
   only adds to it (recompute, exposed communication, bubble, optimizer), so when the bound is
   above the k-th best step time found so far, no knob setting of the pair can enter the top k and
   the pair is counted as pruned. Pairs are visited in increasing bound order. The bounds of all
   pairs are computed at once (`_pair_bounds`: layer times per shard geometry and micro-batch
   size, vectorized; communication per mesh).
3. Each pipeline option (vpp, schedule) of a visited pair is bounded again from per-layer times
   (all options of a pair at once: `_PairTimes.bounds`; `step_time.time_lower_bound` without
   building the table, with the even
   partition's slowest rank and the bubble) and pruned the same way. Both levels count the SMs the
   hidden TP and ring-attention traffic takes from the compute (`step_time.comm_sm_share`) layer
   by layer, at most each pass's compute: a lower bound of what the table's bound counts.
   When that bound is within `BOUND_MARGIN` of the k-th best step time, the table's own bound
   (`step_time.time_lower_bound`) decides instead.
4. Every other layout has its memory priced; those that fit (with the headroom) get a step time,
   unless every fitting setting of the table is bounded (`_all_bounded`): its step bounded at or
   above the k-th best step, and a layout already kept strictly faster than the bound and no larger
   (the Pareto staircase, `_RankedBlocks.dominated`). Then none can rank or be on the Pareto front,
   and they are counted as fitting (`SearchStats.dominated`) without a step. The bounds, cheapest
   first:
   - each setting's own (`step_time.setting_lower_bounds`: its recompute mode's per-rank floor,
     what its sharding adds to every micro-batch, what its step adds once (the busiest rank's
     gradient-reduction tail and optimizer step, the fixed overhead), the roofline of its ZeRO
     traffic), from the option's per-rank floors that level 3 summed (`_PairTimes.bounds`) plus the
     table's recompute seconds, before the table's phase arrays are computed;
   - then from the table's own floors: its recompute mode's bound (`step_time.mode_lower_bounds`),
     then the setting's own.
   A pipeline option and its combined-1F1B twin share one table; a combined-1F1B option (which runs
   no full recompute) whose activations alone exceed the usable memory in every other mode
   (`stage_table.activation_floor`) gets no table: its settings are counted as refused
   (`SearchStats.floored`; the floor is memoized per mesh degrees, micro-batch and option, as it
   reads no rank order). Feasible layouts are kept as arrays per table (`_RankedBlocks`); only the
   ones the Plan reports (top k, Pareto front) are named.
Work shared between tables is memoized on what it reads (all bit-for-bit the same floats):
meshes differing only in a valid rank order share their validation probe, and at one micro-batch and
pipeline option their table's order-free fields and memory prices (`_RankOrders`,
`stage_table.reorder`: only the communication is priced again); `mesh_comm` parts, what a
grid's data-parallel times read of the weights alone (`step_time._dp_grid`'s `_WeightCollectives`) and its parameter/gradient/optimizer bytes
(`stage_table._state_bytes`) are cached per degrees, stride and per-rank parameter counts, so a
mesh's tables at other micro-batches reuse them; memory rejections are counted per grid setting with numpy and logged once.
The best layouts are then re-partitioned with CP-SAT (`planner.partition`) and placed on the
topology (`planner.placement`). The whole search runs with Python's cyclic garbage collector
paused (`cyclic_gc_paused`): its garbage is freed by reference counting.
"""

from __future__ import annotations

import copy
import gc
import math
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any, NamedTuple

import numpy as np

from cluster_specs.spec import ClusterSpec
from cost_models import stacks
from cost_models.calibration import Calibration, Overlap, default_calibration
from cost_models.compute import (
    LayerTime,
    ShardGeometry,
    kernel_margin,
    kernel_provenance,
    layer_time,
    lm_head_times,
    mtp_projection_times,
    stack_kernels,
    trained_mtp_layers,
)
from cost_models.error_band import error_band
from cost_models.estimate import Estimate, memory_breakdowns, price, pricing_context
from cost_models.finetune import FineTune
from cost_models.flops import flash_backward_factor
from cost_models.interning import canonical
from cost_models.layout import DEFAULT_ORDER, Layout, validate_layout
from cost_models.memory import MemoryBreakdown, bytes_per_node, model_loading_bytes_per_node
from cost_models.mesh_comm import comm_store, embedding_gradient_times, mesh_comm
from cost_models.pipeline import FB_PAIRED_SCHEDULES, SPLIT_BACKWARD_SCHEDULES, ZERO_BUBBLE_ZERO3
from cost_models.report import estimate_dict, kernels_dict
from cost_models.stage_data import RECOMPUTE_MODES, KnobArrays, KnobPrices, Setting, StageTable
from cost_models.stage_table import (
    activation_floor,
    build_table,
    layer_kind_counts,
    layer_kinds,
    price_memory,
    reorder,
)
from cost_models.stages import StagePartition
from cost_models.step_time import (
    PhaseArrays,
    comm_sm_share,
    data_parallel_strides,
    mode_rank_floors,
    phase_arrays,
    pipelined_floor,
    price_time,
    setting_lower_bounds,
    time_lower_bound,
)
from model_specs.spec import ModelSpec, TrainingSpec
from planner.explain import explain
from planner.placement import place
from planner.plan import (
    HOST_MEMORY_REASON,
    NVME_REASON,
    Candidate,
    ClosestMiss,
    Plan,
    PlanInputs,
    Rejection,
    SearchConstraints,
    SearchStats,
)
from planner.space import (
    Mesh,
    PipeOption,
    Stack,
    meshes,
    micro_batches,
    pipeline_options,
    settings,
    table_layout,
    to_layout,
)

GIB = 2**30
Progress = Callable[[int, int], None]  # (pairs done, pairs total)

MESH_FIELDS = {"dp", "tp", "pp", "cp", "ep", "etp", "sp", "order"}


@dataclass
class RejectionLog:
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)
    example_over_bytes: dict[str, float] = field(default_factory=dict)

    def add(self, reason: str, example: str, n: int = 1) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + n
        self.examples.setdefault(reason, example)

    def add_closest(self, reason: str, over_bytes: float, example: Callable[[], str], n: int = 1) -> None:
        """Count `n` layouts refused for `reason` and keep as the example the one that misses its
        limit by the fewest bytes so far (the closest to fitting, whatever order the search visits
        in); `example` names it, called only when it is kept."""
        self.counts[reason] = self.counts.get(reason, 0) + n
        if over_bytes < self.example_over_bytes.get(reason, math.inf):
            self.example_over_bytes[reason] = over_bytes
            self.examples[reason] = example()

    def count(self, reason: str, n: int = 1) -> None:
        """Count without an example (the caller fills `examples` for new reasons)."""
        self.counts[reason] = self.counts.get(reason, 0) + n

    def as_list(self) -> list[Rejection]:
        ordered = sorted(self.counts.items(), key=lambda kv: -kv[1])
        return [Rejection(reason=r, count=n, example=self.examples.get(r, "")) for r, n in ordered]


def describe(layout: Layout) -> str:
    """Compact one-line layout description."""
    parts = [f"dp={layout.dp}", f"tp={layout.tp}", f"pp={layout.pp}"]
    if layout.vpp > 1:
        parts.append(f"vpp={layout.vpp}")
    if layout.cp > 1:
        parts.append(f"cp={layout.cp}")
    if layout.ep > 1:
        parts.append(f"ep={layout.ep}")
    parts.append(f"zero={layout.zero_stage}")
    if layout.dp_shard is not None and layout.dp is not None and layout.dp_shard < layout.dp:
        parts.append(f"dp_shard={layout.dp_shard}")
    parts += [f"mb={layout.micro_batch}", f"recompute={layout.recompute}"]
    if layout.pp > 1:
        parts.append(f"schedule={layout.schedule}")
    if layout.moe_a2a_overlap:
        parts.append("combined-1f1b")
    if layout.offload_optimizer or layout.offload_params:
        what = "+".join(x for x, on in (("optimizer", layout.offload_optimizer), ("params", layout.offload_params)) if on)
        parts.append(f"offload={what}:{layout.offload_device}")
    if layout.zero_hpz_partition_size > 1:
        parts.append(f"hpz={layout.zero_hpz_partition_size}")
    if layout.zero_quantized_weights:
        parts.append("qwz")
    if layout.zero_quantized_gradients:
        parts.append("qgz")
    if layout.pp > 1:
        parts.append(f"order={layout.order}")
    return " ".join(parts)


FULL_RECOMPUTE = RECOMPUTE_MODES.index("full")
COMBINED_FULL_RECOMPUTE = "combined 1F1B does not run with full recompute (Megatron-Core's rule)"
"""`KnobArrays.mode` of full recompute."""

GPIPE_DOMINATED = "dominated: GPipe has 1F1B's step time and more activation memory"


def max_tp_of(cluster: ClusterSpec, c: SearchConstraints) -> int:
    """The largest tensor-parallel degree the planner tries: the NVLink domain, or less if pinned."""
    return c.max_tp or cluster.domain_size


def mesh_rejection(mesh: Mesh, cluster: ClusterSpec, c: SearchConstraints, limit: int | None = None) -> str | None:
    """Planner rules on top of validity: tensor parallelism stays inside the NVLink domain.
    `limit`: `max_tp_of(cluster, c)` when the caller has it already (it checks many meshes)."""
    max_tp = max_tp_of(cluster, c) if limit is None else limit
    if mesh.tp > max_tp:
        if mesh.tp > cluster.domain_size:
            return f"tp: tp={mesh.tp} crosses the NVLink domain ({cluster.domain_size} GPUs)"
        return f"tp: tp={mesh.tp} above max_tp={max_tp}"
    return None


SORTED_DIMS = sorted(["tp", "cp", "ep", "dp", "pp"])
"""`validate_layout`'s test of a rank order: its dimensions, sorted, are these."""


def _mesh_probe(model: ModelSpec, training: TrainingSpec, gpus: int, mesh: Mesh, mb: int, c: SearchConstraints) -> str | None:
    """The first mesh-level violation of `mesh` at micro-batch `mb` (a default-knob probe layout
    through `validate_layout`), as a rejection reason; None when it is valid."""
    probe = to_layout(mesh, mb, PipeOption(1, "1f1b"), Setting(1, mesh.dp, "none", False), Stack.of(c), validate=False)
    problems = [v for v in validate_layout(model, training, gpus, probe) if v.field in MESH_FIELDS]
    if problems:
        return f"{problems[0].field}: {problems[0].message}"
    return None


class _LazyLayout(NamedTuple):
    """The parts of a layout; the pydantic Layout is only built for the few that are reported.
    (A named tuple: one is made per feasible layout, far cheaper than a frozen dataclass.)"""

    mesh: Mesh
    micro_batch: int
    option: PipeOption
    setting: Setting
    stack: Stack

    def build(self, gpus: int, training: TrainingSpec) -> Layout:
        return to_layout(self.mesh, self.micro_batch, self.option, self.setting, self.stack).resolved(gpus, training)


class _Ranked(NamedTuple):
    """A feasible layout with its step time (seconds) and peak memory (bytes on the worst rank)."""

    step_s: float
    layout: _LazyLayout
    peak_bytes: int


Block = tuple[Mesh, int, PipeOption, list[Setting], np.ndarray]
"""The layouts of one priced table that fit: (mesh, micro-batch, pipeline option, the knob grid,
the indices of the settings that fit)."""


class _RankedBlocks:
    """Every feasible layout found, kept as one block of arrays per priced table (step seconds,
    peak bytes) in generation order, and the k best step times so far (`kth_best_s` is the
    pruning threshold once `full`). Layouts are only named for what the Plan reports."""

    def __init__(self, k: int, tie_rel: float = 0.0) -> None:
        self.k = k
        self.tie_rel = tie_rel  # layouts within (1 + tie_rel) of the best are kept for the tie-break
        self.best = np.zeros(0)  # the k smallest distinct step times so far (1 ns apart), ascending
        self._threshold_s = math.inf  # `threshold_s`
        self.steps: list[np.ndarray] = []
        self.peaks: list[np.ndarray] = []
        self.blocks: list[Block] = []
        # the Pareto staircase of every layout added: steps ascending, each the least peak of all
        # layouts at or below its step (`dominated`)
        self.front_steps = np.zeros(0)
        self.front_peaks = np.zeros(0)

    @property
    def full(self) -> bool:
        return len(self.best) >= self.k

    @property
    def kth_best_s(self) -> float:
        return float(self.best[-1])

    @property
    def threshold_s(self) -> float:
        """Pruning threshold once `full`: the k-th best distinct step time, and never less than the
        tie window above the best (`choose_among_ties` needs every layout in it). Kept by `add`:
        the search reads it for every pipeline option it bounds."""
        return self._threshold_s

    def add(self, step_s: np.ndarray, peak_bytes: np.ndarray, block: Block) -> None:
        if not self.full or step_s.min() < self.best[-1]:
            # equivalent layouts (same price from another rank order or split) share one slot
            self.best = np.unique(np.round(np.concatenate([self.best, step_s]), 9))[: self.k]
            self._threshold_s = max(float(self.best[-1]), float(self.best[0]) * (1.0 + self.tie_rel))
        self.steps.append(step_s)
        self.peaks.append(peak_bytes)
        self.blocks.append(block)
        steps = np.concatenate([self.front_steps, step_s])
        peaks = np.concatenate([self.front_peaks, peak_bytes])
        order = np.lexsort((peaks, steps))
        steps, peaks = steps[order], peaks[order]
        before = np.concatenate([[np.inf], np.minimum.accumulate(peaks)[:-1]])
        keep = peaks < before
        self.front_steps, self.front_peaks = steps[keep], peaks[keep]

    def dominated(self, step_s: np.ndarray, peak_bytes: np.ndarray) -> bool:
        """Whether every layout of at least `step_s` (ranking units) and `peak_bytes` has one already
        added that is strictly faster and no larger: none of them can then be on the Pareto front
        (`_RankedView.pareto`), whatever its exact step."""
        at = np.searchsorted(self.front_steps, step_s, side="left") - 1  # the last strictly faster step
        return bool(np.logical_and.reduce((at >= 0) & (self.front_peaks[np.maximum(at, 0)] <= peak_bytes), axis=None))

    def ranked(self, stack: Stack) -> _RankedView:
        if not self.steps:
            return _RankedView(np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), [], stack)
        lengths = [len(a) for a in self.steps]
        return _RankedView(
            np.concatenate(self.steps),
            np.concatenate(self.peaks).astype(np.int64),
            np.repeat(np.arange(len(lengths)), lengths),
            self.blocks,
            stack,
        )


@dataclass
class _RankedView:
    """All feasible layouts as arrays in generation order (index = generation sequence)."""

    step_s: np.ndarray  # (L,) seconds
    peak_bytes: np.ndarray  # (L,) bytes, truncated to integers
    block_of: np.ndarray  # (L,) index into `blocks`
    blocks: list[Block]
    stack: Stack

    def _named(self, i: int) -> _Ranked:
        b = int(self.block_of[i])
        mesh, mb, option, grid, fits = self.blocks[b]
        first = int(np.searchsorted(self.block_of, b))  # blocks are contiguous, in order
        layout = _LazyLayout(mesh, mb, option, grid[int(fits[i - first])], self.stack)
        return _Ranked(float(self.step_s[i]), layout, int(self.peak_bytes[i]))

    def first(self, n: int) -> list[_Ranked]:
        """The n fastest, ties in generation order."""
        order = np.argsort(self.step_s, kind="stable")[:n]
        return [self._named(int(i)) for i in order]

    def pareto(self, limit: int = 12) -> list[_Ranked]:
        """Non-dominated layouts on (higher throughput = lower step time, more memory headroom):
        by step time, then peak, then generation order, every layout whose peak is below all
        faster ones'. More than `limit`: the ends and an even spread between them."""
        if not len(self.step_s):
            return []
        order = np.lexsort((np.arange(len(self.step_s)), self.peak_bytes, self.step_s))
        peaks = self.peak_bytes[order]
        before = np.concatenate([[np.iinfo(np.int64).max], np.minimum.accumulate(peaks)[:-1]])
        front = order[peaks < before]
        if len(front) > limit:
            idx = sorted({round(i * (len(front) - 1) / (limit - 1)) for i in range(limit)})
            front = front[idx]
        return [self._named(int(i)) for i in front]


Geometry = tuple[int, int, int, int]
"""A shard geometry: (tp, cp, ep, etp)."""


@dataclass(frozen=True)
class _ComputeTimes:
    """Seconds of one micro-batch on one rank, for every shard geometry of the search (axis 0,
    `rows`) at every micro-batch size it tries (axis 1, ascending `mbs`). Layer times depend on a
    mesh only through its shard geometry, so one vectorized pass of `cost_models.compute` (array
    degrees and token counts) prices them all."""

    rows: dict[Geometry, int]
    mbs: np.ndarray  # (M,) micro-batch sizes, sequences
    compute: np.ndarray  # (G, M) forward + backward of all layers
    kind_compute: np.ndarray  # (G, M, kinds) forward + backward of one layer of each kind
    kind_forward: np.ndarray  # (G, M, kinds) forward of one layer of each kind
    kind_attention_f: np.ndarray  # (G, M, kinds) attention kernel forward of one layer of each kind
    kind_counts: np.ndarray  # (kinds,) layers of each kind
    kind_moe: np.ndarray  # (kinds,) 1.0 for an MoE kind
    kind_of_layer: np.ndarray  # (layers,) index of each layer's kind
    head: np.ndarray  # (G, M) LM head and cross-entropy (and the MTP modules), forward + backward
    embedding_grad: np.ndarray
    """(G, 3) `mesh_comm.embedding_gradient_times`: rank 0's table with the head elsewhere, with
    the head on rank 0, and the MTP modules' copy on the head's rank when that is not rank 0."""
    margin: np.ndarray
    """(G, M) the kernels' slow-end margin of one micro-batch through all layers
    (`compute.kernel_margin`: their time-weighted atlas uncertainty), which the ranking multiplies in."""

    @classmethod
    def of(
        cls, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, geometries: list[Geometry], mbs: np.ndarray,
        cal: Calibration, framework: str, store: dict[tuple, Any], attention_kernel: str, fsdp_flat_params: bool = False,
        sequence_parallel: bool = True,
    ) -> _ComputeTimes:
        grid = np.array(geometries, dtype=np.int64).reshape(-1, 4)
        tp, cp, ep, etp = (grid[:, i : i + 1] for i in range(4))  # (G, 1) columns
        g = ShardGeometry(
            mbs[None, :] * training.seq_len / cp, training.seq_len, cp, tp, (tp > 1) & sequence_parallel, ep, etp,
            **stack_kernels(framework, attention_kernel, fsdp_flat_params),
        )
        ab = training.activation_bytes
        kinds: dict[tuple[bool, bool], LayerTime] = {}
        splits: dict[tuple[bool, bool], np.ndarray] = {}
        ft = FineTune.of(training)
        for i, key in enumerate(layer_kinds(model)):
            if key not in kinds:
                kinds[key] = layer_time(model, i, g, cluster.gpu, training.precision, ab, cal, ft)
                splits[key] = kernel_provenance(model, i, g, cluster.gpu, training.precision, ab, cal)
        counts = layer_kind_counts(model)
        split = sum(n * splits[k] for k, n in counts.items())
        compute = sum(n * (kinds[k].forward + kinds[k].backward) for k, n in counts.items())
        # as build_table prices it, with the multi-token-prediction modules beside the head
        head_fwd, head_bwd = lm_head_times(model, g, cluster.gpu, "bf16", ab, cal, ft is not None)
        head = head_fwd + head_bwd
        mtp = trained_mtp_layers(model, ft is not None)
        if mtp:
            last = kinds[layer_kinds(model)[-1]]
            proj_fwd, proj_bwd = mtp_projection_times(model, g, cluster.gpu, training.precision, ab, cal)
            head = head + mtp * (head_fwd + head_bwd + proj_fwd + proj_bwd + last.forward + last.backward)
        kind_list = list(kinds)
        shape = (len(geometries), len(mbs))
        # as build_table prices it (`mesh_comm.embedding_gradient_times`)
        embedding_grad = np.array(
            [embedding_gradient_times(model, tp_, cluster, framework, training, cal, store) for tp_, _, _, _ in geometries]
        ).reshape(-1, 3)
        return cls(
            {geometry: row for row, geometry in enumerate(geometries)},
            mbs,
            np.broadcast_to(compute, shape),
            np.stack([np.broadcast_to(kinds[k].forward + kinds[k].backward, shape) for k in kind_list], axis=-1),
            np.stack([np.broadcast_to(kinds[k].forward, shape) for k in kind_list], axis=-1),
            np.stack([np.broadcast_to(kinds[k].attention_fwd, shape) for k in kind_list], axis=-1),
            np.array([float(counts[k]) for k in kind_list]),
            np.array([float(k[0]) for k in kind_list]),
            np.array([kind_list.index(k) for k in layer_kinds(model)]),
            np.broadcast_to(head, shape),
            embedding_grad,
            np.broadcast_to(kernel_margin(split), shape),
        )


@dataclass
class _PairBounds:
    """Every valid (mesh, micro-batch) pair with its lower bound, in generation order (arrays over
    pairs), and what the level-2 bound of a pair needs again (`pair_times`)."""

    meshes: list[Mesh]
    mesh_of: np.ndarray  # index into `meshes`
    mb_of: np.ndarray  # micro-batch size, sequences
    bound_s: np.ndarray  # ranking units (seconds x `kappa`) per step no layout of the pair can beat
    kappa: np.ndarray  # 1 + the pair's kernel margin (`_ComputeTimes.margin`): the ranking's conservative factor
    compute: _ComputeTimes
    per_mb_s: np.ndarray  # seconds of one micro-batch summed over the pipeline ranks, per pair
    exposure: _Exposure
    row_of: np.ndarray  # per pair, its shard geometry's row in `compute`
    at_of: np.ndarray  # per pair, its micro-batch's column in `compute`
    kind_exposed: np.ndarray
    """(pairs, kinds) seconds exposed per layer of each kind (`_Exposure.per_kind`), without the
    allowance for a schedule that may hide the all-to-alls (each option's bound drops them itself)"""
    p2p: np.ndarray  # per pair, seconds of one pipeline send (`mesh_comm`)
    kappa_max: float = 1.0
    layer_compute: dict[tuple[int, int], tuple[np.ndarray, float, dict]] = field(default_factory=dict)
    """Memo of `pair_times`' per-layer compute per (geometry row, micro-batch column): every pair of
    one shard geometry and micro-batch shares it, and its per-rank sums over a pair's options
    (`_PairTimes.bounds`)."""
    shapes: dict[tuple, Any] = field(default_factory=dict)
    """Memo of what the per-rank sums read of a pipeline shape alone, shared by every pair
    (`_PairTimes.shapes`)."""

    def pair_times(self, pair: int) -> _PairTimes:
        """What the level-2 bounds of pair `pair` (its index in these arrays) read."""
        times = self.compute
        row, at = int(self.row_of[pair]), int(self.at_of[pair])
        parts = self.layer_compute.get((row, at))
        if parts is None:
            parts = self.layer_compute[(row, at)] = (
                times.kind_compute[row, at][times.kind_of_layer], float(times.head[row, at]), {}
            )
        layer_compute, head, option_sums = parts
        embedding_grad = tuple(times.embedding_grad[row].tolist())
        return _PairTimes(layer_compute, self.kind_exposed[pair], head, embedding_grad, float(self.p2p[pair]),  # type: ignore[arg-type]
                          self.exposure, option_sums, self.shapes)


@dataclass(frozen=True)
class _Exposure:
    """The knob-independent exposed communication of one micro-batch per layer, as
    `cost_models.step_time` charges it without recompute: TP/SP forward and backward (less the
    share TP comm overlap hides: on by default for Megatron with TP), the MoE all-to-alls, the ring
    attention steps (`stage_table.cp_exposure`) per layer kind."""

    framework: str
    overlap: Overlap
    backward_factor: float  # flash-attention backward / forward
    kind_moe: np.ndarray  # (kinds,) 1.0 for an MoE kind
    kind_of_layer: np.ndarray
    mtp_layers: int = 0  # multi-token-prediction blocks on the head rank, of the last layer's kind
    sm_share: float = 0.0  # `step_time.comm_sm_share` of the GPU: compute seconds per second of traffic beside it

    def tp_hidden(self, tp: int | np.ndarray) -> float | np.ndarray:
        """Share of TP traffic hidden: `Overlap.tp` where `Layout.tp_comm_overlap` defaults to on."""
        on = (tp > 1) & (self.framework == "megatron")
        return np.where(on, self.overlap.tp, 0.0) if isinstance(on, np.ndarray) else (self.overlap.tp if on else 0.0)

    def per_kind(self, tp, cp, comm, attention_f, kind_forward, kind_compute, ep_hideable=False):  # type: ignore[no-untyped-def]
        """Seconds exposed per layer of each kind (last axis), for one pair (scalars) or many
        (arrays with a trailing kind axis): comm = (TP per layer, CP ring step, EP per MoE layer, p2p).
        `ep_hideable` (per pair): a schedule of the pair may hide the all-to-alls (DualPipeV's F&B
        pairs, framework fsdp with pp > 1), so they count as zero in a bound. Plus, from the layer
        kinds' forward and forward + backward seconds, the SMs the hidden TP and ring-attention traffic
        takes from them (`step_time.comm_sm_share`): at least the hidden share of one pass's TP
        traffic and the ring blocks hidden behind attention beside each pass, at most that pass's
        compute (zero where the pair's schedule may pair F&B, whose compute pays the SMs otherwise)."""
        tau, x, eps = comm[0], comm[1], comm[2]
        if isinstance(cp, np.ndarray):
            steps = (cp - 1)[..., None]
            cp_ = cp[..., None]
            x_ = x[..., None]
        else:
            steps, cp_, x_ = cp - 1, cp, x
        attention_b = self.backward_factor * attention_f / cp_
        cp_exp = steps * (np.maximum(0.0, x_ - attention_f / cp_) + np.maximum(0.0, 2 * x_ - attention_b))
        hidden = self.tp_hidden(tp)
        unpaired = np.where(ep_hideable, 0.0, 1.0)  # the pair's schedules cannot pair F&B
        base = 2 * tau * (1 - hidden)
        moe = unpaired * 2 * eps * (1 - self.overlap.ep)
        beside = tau * hidden  # TP traffic hidden behind one pass
        if isinstance(base, np.ndarray):  # one row per pair: broadcast over the kinds
            base, moe, beside, unpaired = base[..., None], moe[..., None], beside[..., None], unpaired[..., None]
        out = base + moe * self.kind_moe + cp_exp
        if self.sm_share:
            # the ring's K/V (forward) and K, V, dK, dV (backward) blocks hidden behind attention
            beside_f = beside + steps * np.minimum(x_, attention_f / cp_)
            beside_b = beside + steps * np.minimum(2 * x_, attention_b)
            stolen = self.sm_share * (np.minimum(beside_f, kind_forward) + np.minimum(beside_b, kind_compute - kind_forward))
            out = out + unpaired * stolen
        return out


def _pair_bounds(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    meshes_mbs: list[tuple[Mesh, list[int]]],
    all_mbs: list[int],
    cal: Calibration,
    framework: str,
    attention_kernel: str,
    fsdp_flat_params: bool = False,
    sequence_parallel: bool = True,
) -> _PairBounds:
    """Seconds no layout of a (mesh, micro-batch) pair can beat: all micro-batches' forward and
    backward plus the communication no knob removes (TP/SP, CP ring, EP all-to-all, exposed as
    `cost_models.step_time` exposes them), spread perfectly over the pipeline ranks (the slowest
    rank is at least the average). Recompute, ZeRO traffic, bubble and optimizer only add to it.

    Communication time is affine in the micro-batch (bytes x seconds-per-byte + latency), so it is
    priced per mesh at micro-batch 1 and 2 and extrapolated exactly; the rest is vectorized over
    all pairs. `all_mbs` (ascending) holds every micro-batch size of `meshes_mbs`."""
    ov = cal.overlap(framework)
    mbs_all = np.array(all_mbs, dtype=np.int64)
    geometries = list(dict.fromkeys((mesh.tp, mesh.cp, mesh.ep, mesh.etp) for mesh, _ in meshes_mbs))
    store = comm_store(model, training, cluster, cal, gpus)
    times = _ComputeTimes.of(model, training, cluster, geometries, mbs_all, cal, framework, store, attention_kernel,
                             fsdp_flat_params, sequence_parallel)
    comm1, comm2 = [], []
    for mesh, _ in meshes_mbs:
        # alpha-beta times (no measured size ratio): exactly affine in the micro-batch, and below the
        # priced times, so the extrapolated bound stays a bound
        at1, at2 = mesh_comm(model, training, cluster, gpus, mesh, cal, (1, 2), store, sizes=False)
        comm1.append(at1[:4])
        comm2.append(at2[:4])
    c1, c2 = np.array(comm1, dtype=float).reshape(-1, 4), np.array(comm2, dtype=float).reshape(-1, 4)
    mesh_of = np.repeat(np.arange(len(meshes_mbs)), [len(mbs) for _, mbs in meshes_mbs])
    as_array: dict[int, np.ndarray] = {}  # the micro-batch lists are shared per dp: convert each once
    for _, mbs in meshes_mbs:
        if id(mbs) not in as_array:
            as_array[id(mbs)] = np.array(mbs, dtype=np.int64)
    mb = np.concatenate([as_array[id(mbs)] for _, mbs in meshes_mbs]) if meshes_mbs else np.zeros(0, dtype=np.int64)
    at = np.searchsorted(mbs_all, mb)
    assert np.array_equal(mbs_all[at], mb), "micro-batch sizes outside all_mbs"
    row = np.array([times.rows[(m.tp, m.cp, m.ep, m.etp)] for m, _ in meshes_mbs], dtype=np.int64)[mesh_of]
    compute = times.compute[row, at]
    comm = tuple(c1[mesh_of, i] + (c2[mesh_of, i] - c1[mesh_of, i]) * (mb - 1) for i in range(4))
    exposure = _Exposure(
        framework, ov, flash_backward_factor(model), times.kind_moe, times.kind_of_layer,
        trained_mtp_layers(model, training.frozen_base), comm_sm_share(cluster.gpu.sm_count),
    )
    tp = np.array([m.tp for m, _ in meshes_mbs], dtype=np.int64)[mesh_of]
    cp = np.array([m.cp for m, _ in meshes_mbs], dtype=np.int64)[mesh_of]
    pp = np.array([m.pp for m, _ in meshes_mbs], dtype=np.int64)[mesh_of]
    ep = np.array([m.ep for m, _ in meshes_mbs], dtype=np.int64)[mesh_of]
    # a schedule among the pair's options may hide the all-to-alls: DualPipeV (fsdp, pp > 1), or
    # Megatron's combined 1F1B (`space.combined_1f1b_options`; its two-micro-batch floor is not
    # checked here, which only loosens the bound)
    ep_hideable = ((pp > 1) & (framework == "fsdp")) | ((ep > 1) & (framework == "megatron") & model.is_moe)
    per_kind = exposure.per_kind(
        tp, cp, comm, times.kind_attention_f[row, at], times.kind_forward[row, at], times.kind_compute[row, at], ep_hideable
    )  # (pairs, kinds)
    per_mb = compute + per_kind @ times.kind_counts
    dp = np.array([m.dp for m, _ in meshes_mbs], dtype=np.int64)[mesh_of]
    m_count = training.global_batch // (mb * dp)
    kappa = 1.0 + times.margin[row, at]
    bound = m_count * per_mb / pp * kappa
    # what each option's bound reads (`_PairTimes`): the exposure of every pair without the allowance
    kind_exposed = exposure.per_kind(tp, cp, comm, times.kind_attention_f[row, at], times.kind_forward[row, at], times.kind_compute[row, at])
    return _PairBounds([m for m, _ in meshes_mbs], mesh_of, mb, bound, kappa, times, per_mb, exposure, row, at,
                       kind_exposed, comm[3], float(kappa.max()) if len(kappa) else 1.0)


def _visit_order(bounds: _PairBounds, order: np.ndarray, chunk: int = 4096) -> Iterator[tuple[float, int, int, int, float, float]]:
    """(bound, pair index, mesh index, micro-batch, per-micro-batch seconds, kappa) of the pairs in
    `order`, converted to Python numbers a chunk at a time: branch and bound usually stops after a
    few thousand."""
    for start in range(0, len(order), chunk):
        at = order[start : start + chunk]
        yield from zip(
            bounds.bound_s[at].tolist(), at.tolist(), bounds.mesh_of[at].tolist(), bounds.mb_of[at].tolist(),
            bounds.per_mb_s[at].tolist(), bounds.kappa[at].tolist(), strict=True,
        )


@dataclass(frozen=True)
class _PairTimes:
    """Per-micro-batch seconds of one (mesh, micro-batch) pair, as `build_table` prices them: per
    layer (arrays over the model's layers) forward + backward; per layer kind, the communication
    exposed without recompute (`_Exposure`); the LM head forward + backward; the embedding's
    gradient on rank 0 (head elsewhere, head on rank 0: `compute.embedding_gradient_time`) and that
    of the MTP modules' copy on the head's rank; one p2p send."""

    layer_compute: np.ndarray
    kind_exposed: np.ndarray  # (kinds,)
    head: float
    embedding_grad: tuple[float, float, float]
    p2p: float
    exposure: _Exposure
    option_sums: dict[tuple, np.ndarray]
    """Memo per (pp, the pair's pipeline options) of the per-rank compute stacked over the options
    (`bounds`)."""
    shapes: dict[tuple, Any]
    """Memo of what the sums read of the pipeline shape alone (not of the layer times), shared by
    every pair: per (pp, option), each layer's rank, the head's rank and the layers of each kind
    per rank (read-only); per (pp, the pair's pipeline options), those stacked over the options
    (`bounds`: the bins of one bincount over all of them, the head's ranks, the kind counts, each
    option's virtual stages and whether it pairs F&B or splits the backward)."""

    def _shape(self, pp: int, option: PipeOption) -> tuple[np.ndarray, int, np.ndarray]:
        """Each layer's pipeline rank under `option`'s partition, the head's rank and the layers of
        each kind per rank (with the MTP modules on the head's rank) (`shapes`)."""
        shape = self.shapes.get((pp, option))
        if shape is None:
            owner = _rank_of_layer(len(self.layer_compute), pp, option)
            head_rank = _partition(len(self.layer_compute), pp, option).head_rank
            kinds = len(self.kind_exposed)
            counts = np.bincount(owner * kinds + self.exposure.kind_of_layer, minlength=pp * kinds).reshape(pp, kinds)
            counts[head_rank, self.exposure.kind_of_layer[-1]] += self.exposure.mtp_layers
            counts = counts.astype(float)
            counts.flags.writeable = False
            shape = self.shapes[(pp, option)] = (owner, head_rank, counts)
        return shape

    def bounds(self, pp: int, options: list[PipeOption], grad_accum: int, ov: Overlap) -> tuple[list[float], np.ndarray]:
        """`step_time.time_lower_bound` of the pair's layout with each pipeline option of `options`
        and its partition, in seconds per step, from the per-layer times (no `StageTable` built), as
        arrays over the options (the per-option rank sums stacked once per list of options and
        shared by the pairs of one shard geometry and micro-batch: `option_sums`); and the per-rank
        seconds of one micro-batch they are made of,
        (options, pp): each rank's compute, knob-independent exposed communication without
        recompute and pipeline sends, at most the table's floor of every recompute mode
        (`step_time.mode_rank_floors`) less that mode's recompute seconds."""
        key = (pp, tuple(options))
        shapes = self.shapes.get(key)
        if shapes is None:
            each = [self._shape(pp, option) for option in options]
            heads = np.array([head_rank for _, head_rank, _ in each])
            shapes = self.shapes[key] = (
                np.concatenate([owner + i * pp for i, (owner, _, _) in enumerate(each)]),  # one bincount's bins
                np.arange(len(options)), heads, heads != 0, np.flatnonzero(heads != 0), heads[heads != 0],
                np.array([counts for _, _, counts in each]),
                np.array([float(option.vpp) for option in options]),
                np.array([option.schedule in FB_PAIRED_SCHEDULES or option.a2a_overlap for option in options]),
                np.array([option.schedule in SPLIT_BACKWARD_SCHEDULES for option in options]),
            )
        bins, rows, heads, elsewhere, rows_elsewhere, heads_elsewhere, counts, vpp, paired, free = shapes
        stacked = self.option_sums.get(key)
        if stacked is None:
            # each option's row as `build_table` adds it: its layers in model order (one bincount adds
            # in input order), then the head, rank 0's embedding gradient, the MTP copy's on the head's rank
            weights = np.concatenate([self.layer_compute] * len(options))  # `np.tile` of the 1-D layer times
            compute = np.bincount(bins, weights=weights, minlength=len(options) * pp).reshape(len(options), pp)
            compute[rows, heads] += self.head
            compute[:, 0] += np.where(elsewhere, self.embedding_grad[0], self.embedding_grad[1])
            compute[rows_elsewhere, heads_elsewhere] += self.embedding_grad[2]
            stacked = self.option_sums[key] = compute
        compute = stacked
        # row by row: F&B pairs (DualPipeV, combined 1F1B) may hide the all-to-alls (`step_time`), so
        # their exposure is bounded by zero; split-backward schedules bound their bubble by zero
        exposed = np.where(paired[:, None], 0.0, counts @ self.kind_exposed)
        pp_exposed = 2 * vpp * self.p2p * (1 - ov.pp) if pp > 1 else np.zeros(len(options))
        per = compute + exposed + pp_exposed[:, None]
        worst = np.maximum.reduce(per, axis=1)
        if pp == 1:
            return (grad_accum * worst + 0.0).tolist(), per
        bubble = np.where(free, 0.0, (np.add.reduce(per, axis=1) - worst) / vpp)
        return (grad_accum * worst + bubble).tolist(), per


def _node_refusal(
    mesh: Mesh, mb: int, option: PipeOption, setting: Setting, stack: Stack, gpus: int, training: TrainingSpec,
    need: float, limit: float, resource: str,
) -> str:
    """The example line of a layout refused for a node resource (host RAM, NVMe): what it needs and
    by how many bytes it misses, in bytes and GiB."""
    layout = to_layout(mesh, mb, option, setting, stack).resolved(gpus, training)
    return f"{describe(layout)}: needs {need / GIB:.1f} GiB of {resource}, {int(need - limit):,} bytes over the {limit / GIB:.1f} GiB usable"


@lru_cache(maxsize=1024)
def _partition(num_layers: int, pp: int, option: PipeOption) -> StagePartition:
    """The partition of a pipeline option (`StagePartition.for_layout`; frozen, so shared across
    the pairs of one pipeline shape)."""
    probe = Layout.model_construct(
        pp=pp, vpp=option.vpp, account_for_embedding_in_pipeline_split=option.embedding_slot,
        account_for_loss_in_pipeline_split=option.loss_slot, schedule=option.schedule,
    )
    return StagePartition.for_layout(num_layers, probe)


@lru_cache(maxsize=1024)
def _rank_of_layer(num_layers: int, pp: int, option: PipeOption) -> np.ndarray:
    """Pipeline rank of every layer under the pipeline option's partition (`_partition`)."""
    partition = _partition(num_layers, pp, option)
    owner = np.repeat(np.array(partition.chunk_ranks, dtype=np.int64), partition.chunk_layers)
    owner.flags.writeable = False
    return owner


def _bubble_bound(per_mb_s: float, pp: int, vpp: int, grad_accum: int, bubble_free: bool = False) -> float:
    """A lower bound of an option's `_PairTimes.bounds`, in seconds per step, from one micro-batch's seconds
    summed over the pipeline ranks (`per_mb_s`, itself at most the sum of the per-rank times that
    bound adds up). That bound is grad_accum x slowest + (sum - slowest) / vpp, which grows with
    the slowest rank, and the slowest rank is at least the average sum / pp. A bubble-filling
    schedule's (zero_bubble, zbv, dualpipev) bubble is bounded by zero."""
    average = per_mb_s / pp
    return grad_accum * average + (0.0 if bubble_free else (per_mb_s - average) / vpp)


BOUND_MARGIN = 1e-9
"""Relative margin within which an option's `_PairTimes.bounds` defers to the table's own bound: the two are the
same sum up to float rounding (tests/planner/test_search_bounds.py: within 1e-12), and only the
table's decides a layout that sits on the k-th best step time. A pair bound below the threshold by
more than the margin leaves the table's bound below it too, so that bound is not computed."""


def _all_bounded(
    ranked: _RankedBlocks, floor_s: float, kappa: float, table: StageTable, knobs: KnobArrays, fits: np.ndarray,
    peaks: np.ndarray, vpp: int, cal: Calibration, rank_floors: np.ndarray, mode_lb: np.ndarray | None,
) -> bool:
    """Whether no fitting setting (`fits`, their `peaks`) of `table` can enter the top k, the tie
    window or the Pareto front: each setting's step is bounded at or above `floor_s` (seconds: the
    ranking's threshold over the pair's `kappa`, or the reference) and a layout already kept is
    strictly faster than the bound (ranking units) and no larger. First, when given, by its
    recompute mode's bound (`mode_lb`, (modes,) seconds: `step_time.pipelined_floor` of
    `rank_floors`), then, where that leaves one, by its own bound (`step_time.setting_lower_bounds`:
    what its sharding adds to every micro-batch, what the step adds once, the roofline of its ZeRO
    traffic)."""
    if mode_lb is not None:
        lb = mode_lb[knobs.mode[fits]] * (1 - BOUND_MARGIN)
        if np.minimum.reduce(lb, axis=None) >= floor_s and ranked.dominated(lb * kappa, peaks):
            return True
    lb = setting_lower_bounds(table, knobs, vpp, cal, rank_floors)[fits] * (1 - BOUND_MARGIN)
    return bool(np.minimum.reduce(lb, axis=None) >= floor_s and ranked.dominated(lb * kappa, peaks))


def _floor_over(over_modes: np.ndarray, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of a grid's settings (their recompute `modes`), given which recompute modes' activation
    floors (`stage_table.activation_floor`), less the bound margin, are over the usable memory
    (`over_modes`): the settings other than full recompute whose mode is over, and the
    full-recompute ones."""
    full = modes == FULL_RECOMPUTE
    return ~full & over_modes[modes], full


class _RankOrders:
    """What the rank orders of one mesh's degrees share at one micro-batch and pipeline option: the
    table, whose communication alone reads the order (`stage_table.reorder` prices it again for
    another order, field for field what `build_table` gives), the memory prices, which read no
    communication (tests/planner/test_search_bounds.py checks both), and with them what those
    prices decided (`verdict`); the phase arrays of orders whose communication is placed alike
    (`phases`), and what the bounds and the timing of the settings made of an order that also places
    the data-parallel groups alike (`outcome`)."""

    def __init__(self) -> None:
        self.tables: dict[tuple, StageTable] = {}
        self.prices: dict[tuple, KnobPrices] = {}
        self._phases: dict[tuple, tuple[PhaseArrays, np.ndarray, np.ndarray]] = {}
        self._verdicts: dict[tuple, _MemoryVerdict] = {}
        self._outcomes: dict[tuple, np.ndarray | None] = {}

    def verdict(self, key: tuple) -> _MemoryVerdict | None:
        """What the memory prices under `key` decided (`_memory_verdict`), if they were priced."""
        return self._verdicts.get(key)

    def keep_verdict(self, key: tuple, verdict: _MemoryVerdict) -> None:
        self._verdicts[key] = verdict

    def table(self, key: tuple, build: Callable[[], StageTable], mesh: Layout, cal: Calibration) -> StageTable:
        """The table of `mesh` (resolved) under `key` (its degrees without the order, micro-batch and
        option without combined 1F1B): another order's reordered, or `build()`."""
        other = self.tables.get(key)
        table = self.tables[key] = build() if other is None else reorder(other, mesh, cal)
        return table

    @staticmethod
    def placed(key: tuple, table: StageTable) -> tuple:
        """What distinguishes `table`'s rank order under `key` (degrees without the order,
        micro-batch, option) for its phase arrays: its placed communication (`stage_table.reorder`:
        nothing else of the table reads the order; on a node of tp x cp x ep GPUs the orders that
        move only dp and pp place TP, CP and EP alike, and the pipeline sends on the same channel)."""
        return (
            key, table.tp_per_layer, table.ep_per_moe_layer, table.etp_per_moe_layer, table.p2p, table.channels,
            table.cp_exposed.tobytes(), table.cp_busy.tobytes(),
        )

    def phases(self, placed: tuple, table: StageTable, vpp: int, cal: Calibration) -> tuple[PhaseArrays, np.ndarray, np.ndarray]:
        """`step_time.phase_arrays` of `table` at `vpp`, its `mode_lower_bounds` and the per-rank
        floors they are made of (`mode_rank_floors`), under its `placed` key: another order's when
        that places the communication alike, else computed. Read-only."""
        hit = self._phases.get(placed)
        if hit is None:
            phases = phase_arrays(table, vpp, cal)
            floors = mode_rank_floors(table, phases)
            hit = self._phases[placed] = (phases, pipelined_floor(floors, table, vpp), floors)
        return hit

    def outcome(self, same: tuple) -> tuple[bool, np.ndarray | None]:
        """What the settings of an earlier table under `same` (its `placed` key and the strides of
        its data-parallel groups, `data_parallel_strides`: with the memory prices, all that its
        bounds and step times read) came to: (seen, None) when they were all bounded, (seen, their
        step seconds) when they were timed; (False, None) for none yet. The ranking's threshold
        only falls and its Pareto staircase only grows, so settings bounded once stay bounded."""
        if same not in self._outcomes:
            return False, None
        return True, self._outcomes[same]

    def keep_outcome(self, same: tuple, step_s: np.ndarray | None) -> None:
        self._outcomes[same] = step_s

    def memory(self, key: tuple, price: Callable[[], KnobPrices]) -> KnobPrices:
        """The memory prices under `key` (degrees without the order, micro-batch, option): another
        order's, or `price()`; shared (`step_time.price_time` fills the times into a copy)."""
        prices = self.prices.get(key)
        if prices is None:
            prices = self.prices[key] = price()
        return prices


@dataclass
class _FloorVerdict:
    """What a combined-1F1B option's activation floor decides for a knob grid (`_floor_over`): the
    settings over the usable memory, the full-recompute ones (refused by rule), whether together
    they are every setting, and whether the reasons of the refused ones have their examples in the
    log already (once so, always so: the log never drops an example)."""

    over: np.ndarray  # (settings,) bool
    full: np.ndarray  # (settings,) bool
    all_refused: bool
    full_count: int
    examples_known: bool = False
    rejections: _GridRejections | None = None  # the grid's, once counted
    pending: int = 0  # counts after the first, not yet added (`flush`)

    @classmethod
    def of(cls, floor: np.ndarray, usable: int, grid_key: tuple, modes: np.ndarray, masks: dict[tuple, tuple]) -> _FloorVerdict:
        """The verdict of an activation floor (bytes per recompute mode) on the grid `grid_key`
        (its settings' recompute `modes`): its masks depend only on which modes are over the
        `usable` bytes, and are shared through `masks` (the search's, by grid and those modes)."""
        over_modes = floor * (1 - BOUND_MARGIN) > usable
        key = (grid_key, over_modes.tobytes())
        shared = masks.get(key)
        if shared is None:
            over, full = _floor_over(over_modes, modes)
            shared = masks[key] = (over, full, bool(np.all(over | full)), int(full.sum()))
        return cls(*shared)

    def have_examples(self, rejections: _GridRejections, log: RejectionLog) -> bool:
        if not self.examples_known:
            self.examples_known = rejections.have_examples(log, self.over)
        return self.examples_known

    def count(self, rejections: _GridRejections, log: RejectionLog) -> None:
        """Count the grid's settings as refused: over the floor as memory rejections, the rest
        under the combined-1F1B full-recompute rule. The first count goes into the log at once (it
        may enter a reason there, and the log's order is its tie-break); after it the same counts
        only add up (every reason is in the log, with its example), so they wait for `flush`."""
        if self.rejections is not None:
            self.pending += 1
            return
        self.rejections = rejections
        rejections.add(log, self.over)
        if self.full_count:
            log.add(COMBINED_FULL_RECOMPUTE, "pipelined MoE meshes with combined 1F1B", self.full_count)

    def flush(self, log: RejectionLog) -> None:
        """Add the counts `count` kept back (before the grids' own `_GridRejections.flush`)."""
        if self.pending and self.rejections is not None:
            self.rejections.count_again(self.pending * self.over)
            if self.full_count:
                log.count(COMBINED_FULL_RECOMPUTE, self.pending * self.full_count)
            self.pending = 0


@dataclass
class _MemoryVerdict:
    """What one memory price of a knob grid decided (`_memory_verdict`): each setting's peak bytes,
    the settings that fit (GPU memory, host RAM, NVMe, and the schedule's rules), those over the GPU
    memory, and the counts it logged under other reasons. Another rank order of the mesh shares the
    prices (`_RankOrders.memory`), so the same verdict: `count` logs it again as pricing would (an
    example is kept only when strictly closer, so an equal one changes none)."""

    peaks: np.ndarray
    fits: np.ndarray
    over_mask: np.ndarray
    logged: list[tuple[str, int]]

    def count(self, rejections: _GridRejections, log: RejectionLog) -> None:
        for reason, n in self.logged:
            log.count(reason, n)
        rejections.count_again(self.over_mask)


def _memory_verdict(
    prices: KnobPrices, key: tuple, orders: _RankOrders, mesh: Mesh, mb: int, option: PipeOption,
    grid: list[Setting], knobs: KnobArrays, rejections: _GridRejections, log: RejectionLog,
    closest: tuple[int, Layout, MemoryBreakdown] | None, stack: Stack, gpus: int, training: TrainingSpec,
    cluster: ClusterSpec, usable: int, host_usable: int, ranks_per_node: int, loading_by_stage: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, tuple[int, Layout, MemoryBreakdown] | None]:
    """Judge a table's memory prices: log the settings refused for GPU memory (by reason, with the
    closest miss), host RAM or NVMe (`Estimate.host_bytes_per_node`, ZeRO-Infinity's drives) and the
    schedule's rules; keep the verdict under `key` in `orders` (`_MemoryVerdict`). Returns the peaks, the
    settings that fit and the closest miss so far."""
    peaks = prices.peak
    over_mask = peaks > usable
    logged: list[tuple[str, int]] = []
    # as `Estimate.host_bytes_per_node`: offloaded state, or building the model if larger
    host_node = np.maximum(bytes_per_node(np.maximum.reduce(prices.host_optimizer, axis=1), ranks_per_node), loading_by_stage[knobs.zero])
    host_over = (host_node > host_usable) & ~over_mask
    # ZeRO-Infinity: the states on NVMe must fit the node's drives
    nvme_node = bytes_per_node(np.maximum.reduce(prices.nvme, axis=1), ranks_per_node)
    nvme_over = (nvme_node > cluster.nvme_bytes) & ~over_mask & ~host_over
    for reason, mask, node_bytes, limit, resource in (
        (HOST_MEMORY_REASON, host_over, host_node, host_usable, f"host RAM per node ({ranks_per_node} ranks)"),
        (NVME_REASON, nvme_over, nvme_node, cluster.nvme_bytes, "NVMe per node"),
    ):
        if np.logical_or.reduce(mask, axis=None):
            j = int(np.flatnonzero(mask)[np.argmin(node_bytes[mask])])
            example = partial(
                _node_refusal, mesh, mb, option, grid[j], stack, gpus, training, float(node_bytes[j]), float(limit), resource
            )
            n = int(np.count_nonzero(mask))
            log.add_closest(reason, float(node_bytes[j] - limit), example, n)
            logged.append((reason, n))
    host_over = host_over | nvme_over  # refused for a node resource, not for GPU memory
    fits = (~over_mask & ~host_over).nonzero()[0]  # `np.flatnonzero` of the 1-D mask, without its wrappers
    if option.a2a_overlap:  # combined 1F1B does not run with full recompute (Megatron-Core)
        fits = fits[knobs.mode[fits] != FULL_RECOMPUTE]
    schedule = option.schedule
    if schedule in SPLIT_BACKWARD_SCHEDULES and mesh.pp > 1:
        zero3 = knobs.zero[fits] >= 3
        if zero3.any():
            n = int(zero3.sum())
            log.add(ZERO_BUBBLE_ZERO3, f"pipelined meshes with the {schedule} schedule", n)
            logged.append((ZERO_BUBBLE_ZERO3, n))
            fits = fits[~zero3]
    over_idx = over_mask.nonzero()[0]
    new_reasons = rejections.add(log, over_mask)
    if len(over_idx):
        jm = int(over_idx[np.argmin(peaks[over_idx])])
        over = int(peaks[jm] - usable)
        if closest is None or over < closest[0]:
            layout = to_layout(mesh, mb, option, grid[jm], stack).resolved(gpus, training)
            worst = max(memory_breakdowns(prices, jm), key=lambda mbd: mbd.total)
            closest = (over, layout, worst)
        for j in new_reasons:  # a reason's example comes from its first setting
            reason = rejections.reasons[j]
            if reason not in log.examples:
                layout = to_layout(mesh, mb, option, grid[j], stack).resolved(gpus, training)
                worst = max(memory_breakdowns(prices, int(j)), key=lambda mbd: mbd.total)
                log.examples[reason] = (
                    f"{describe(layout)}: needs {worst.total / GIB:.1f} GiB on stage {worst.stage}, "
                    f"{usable / GIB:.1f} GiB usable"
                )
    orders.keep_verdict(key, _MemoryVerdict(peaks, fits, over_mask, logged))
    return peaks, fits, closest


def _memory_reason(s: Setting) -> str:
    knob = f"ZeRO-{s.zero_stage}"
    if s.dp_shard and s.zero_stage > 0:
        knob += f" (shard group {s.dp_shard})"
    knob += f", {s.recompute} recompute"
    if s.offload_optimizer:
        knob += ", optimizer offload"
    return f"memory: {knob} exceeds the usable GPU memory"


@dataclass
class _GridRejections:
    """Memory rejections of one knob grid (its settings' reasons), counted per setting with numpy
    and added to the log once at the end (`flush`). A reason enters the log's counts (at 0) the
    first time any grid meets it, so the log's insertion order, its tie-break, is unchanged."""

    reasons: list[str]
    counts: np.ndarray  # (settings,) layouts rejected so far
    seen: np.ndarray  # (settings,) the setting's reason is in the log
    exampled: np.ndarray  # (settings,) the setting's reason has its example in the log (they stay)

    @classmethod
    def of(cls, reasons: list[str]) -> _GridRejections:
        n = len(reasons)
        return cls(reasons, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool))

    def have_examples(self, log: RejectionLog, over: np.ndarray) -> bool:
        """Whether the reason of every setting where `over` holds has its example in the log
        already (the log never drops an example, so a setting found so is not looked up again)."""
        for j in (over & ~self.exampled).nonzero()[0].tolist():
            if self.reasons[j] not in log.examples:
                return False
            self.exampled[j] = True
        return True

    def add(self, log: RejectionLog, over: np.ndarray) -> list[int]:
        """Count the settings where `over` (bool, per setting) holds; return those whose reason is
        new to the log (ascending), now entered with a count of 0."""
        self.counts += over
        fresh = over & ~self.seen
        if not np.logical_or.reduce(fresh, axis=None):
            return []
        self.seen |= fresh
        new = []
        for j in np.flatnonzero(fresh).tolist():
            if self.reasons[j] not in log.counts:
                log.counts[self.reasons[j]] = 0
                new.append(j)
        return new

    def count_again(self, over: np.ndarray) -> None:
        """Count the settings where `over` holds, all of which an earlier `add` has entered."""
        self.counts += over

    def flush(self, log: RejectionLog) -> None:
        for j in np.flatnonzero(self.counts).tolist():
            log.counts[self.reasons[j]] += int(self.counts[j])


def search(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    constraints: SearchConstraints | None = None,
    *,
    calibration: Calibration | None = None,
    progress: Progress | None = None,
    refine: bool = True,
    reference_step_s: float | None = None,
) -> Plan:
    """Find the fastest layouts that fit. Never raises for an impossible job: the Plan then has no
    `best`, and says why (rejections, closest miss).

    With `reference_step_s` (e.g. a published layout's predicted step time) the search also counts,
    exactly, the fitting layouts strictly faster than it (`stats.faster_than_reference`): nothing
    whose bound is below the reference is pruned."""
    with cyclic_gc_paused():
        return _search(model, training, cluster, gpus, constraints, calibration, progress, refine, reference_step_s)


_GC_PAUSE_LOCK = threading.Lock()
_gc_pauses = 0  # searches running with the cyclic collector paused
_gc_resume = False  # whether the first of them found it enabled


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Run the block with Python's cyclic garbage collector paused, and resume it after (when it was
    on before the first of overlapping blocks). A search allocates millions of short-lived tuples,
    arrays and small objects, nearly none of them in reference cycles (reference counting frees
    them): the collector's generational passes, which the allocation counts trigger, traverse the
    growing pricing memos again and again and find almost nothing (Qwen3-235B-A22B / 256 H100,
    plan_speed: about 1,200 young-generation passes per three searches collecting some 1,650
    objects, 0.4-0.6 s of the 4-5 s CPU of each search, one core). Reference cycles a search
    makes are collected once the collector runs again."""
    global _gc_pauses, _gc_resume
    with _GC_PAUSE_LOCK:
        if _gc_pauses == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _GC_PAUSE_LOCK:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_resume:
                gc.enable()


def _search(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    constraints: SearchConstraints | None,
    calibration: Calibration | None,
    progress: Progress | None,
    refine: bool,
    reference_step_s: float | None,
) -> Plan:
    """`search`, with the collector as the caller left it."""
    t0 = time.perf_counter()
    c = constraints or SearchConstraints()
    stack = Stack.of(c)
    # equal job inputs share one object each, and with it the pricing memos (cost_models.interning)
    model, training, cluster = canonical(model), canonical(training), canonical(cluster)
    cal = canonical(calibration or default_calibration())
    usable = int(cluster.gpu.memory_bytes * (1.0 - c.memory_headroom))
    host_usable = int(cluster.host_memory_bytes * (1.0 - c.memory_headroom))
    ranks_per_node = min(cluster.gpus_per_node, gpus)
    # host RAM while the model is built, per ZeRO stage 0-3 (the search's layouts use sharded init)
    loading_by_stage = model_loading_bytes_per_node(model, c.framework, np.arange(4), True, ranks_per_node)
    log = RejectionLog()
    generated = invalid = pruned = priced = feasible = bounded = floored = 0

    # --- level 1: meshes --------------------------------------------------------------------------
    valid: list[tuple[Mesh, list[int]]] = []  # meshes that pass validation, with their micro-batches
    probe_reasons: dict[tuple, str | None] = {}
    mbs_by_dp: dict[int, list[int]] = {}
    tp_limit = max_tp_of(cluster, c)
    order_valid: dict[str, bool] = {}
    for mesh in meshes(model, cluster, gpus, c):
        reason = mesh_rejection(mesh, cluster, c, tp_limit)
        if mesh.dp not in mbs_by_dp:
            mbs_by_dp[mesh.dp] = micro_batches(training, mesh.dp, c)
        mbs = mbs_by_dp[mesh.dp]
        if reason is None and not mbs:
            reason = f"micro_batch: no micro-batch divides the global batch {training.global_batch} over dp={mesh.dp}"
        if reason is None:
            # the probe's checks read the order only to see it is a permutation (its own message
            # names it only then), so meshes that differ in a valid order share the result
            valid_order = order_valid.get(mesh.order)
            if valid_order is None:
                valid_order = order_valid[mesh.order] = sorted(mesh.order.split("-")) == SORTED_DIMS
            probe_key = (mesh.tp, mesh.pp, mesh.cp, mesh.dp, mesh.ep, mesh.etp, mbs[0], valid_order)
            if probe_key not in probe_reasons or not probe_key[-1]:
                probe_reasons[probe_key] = _mesh_probe(model, training, gpus, mesh, mbs[0], c)
            reason = probe_reasons[probe_key]
        if reason is not None:
            generated += 1
            invalid += 1
            log.add(reason, f"tp={mesh.tp} pp={mesh.pp} cp={mesh.cp} dp={mesh.dp} ep={mesh.ep}")
            continue
        valid.append((mesh, mbs))
    all_mbs = sorted({mb for _, mbs in valid for mb in mbs})
    with warnings.catch_warnings():
        if not valid:  # no mesh passed: numpy's means over an empty geometry set warn, and mean nothing
            warnings.simplefilter("ignore", RuntimeWarning)
        # a fine-tuning stack's own kernel stretch and launch cost (`stacks.stack_calibration`), as its tables price them
        bounds = _pair_bounds(model, training, cluster, gpus, valid, all_mbs, stacks.stack_calibration(cal, c.stack),
                              c.framework, stack.attention_kernel, c.fsdp_flat_params, c.sequence_parallel)
    # visit pairs in increasing bound order, ties in generation order (a stable sort)
    order = np.argsort(bounds.bound_s, kind="stable")
    pairs = _visit_order(bounds, order)
    pair_count = len(order)

    # --- level 2: knobs, branch and bound ---------------------------------------------------------
    k = max(c.top_k, 1) + 1  # keep one spare so alternatives exclude the best
    band = error_band(model, cluster.gpu.name, gpus)
    tie_rel = band.half_width_rel * TIE_SHARE_OF_BAND if band else MIN_TIE_REL
    ranked = _RankedBlocks(k, max(tie_rel, MIN_TIE_REL))
    closest: tuple[int, Layout, MemoryBreakdown] | None = None
    faster = 0
    grids: dict[tuple[int, int, int], list[Setting]] = {}
    grid_reasons: dict[tuple[int, int, int], _GridRejections] = {}
    option_counts: dict[tuple[int, int, int, bool], int] = {}
    option_totals: dict[tuple[int, int, bool], int] = {}

    def grid_of(mesh: Mesh) -> list[Setting]:
        """Knob settings of a mesh (memoized: they depend only on (dp, tp, cp))."""
        grid_key = (mesh.dp, mesh.tp, mesh.cp)
        if grid_key not in grids:
            grids[grid_key] = settings(mesh, cluster, c)
        return grids[grid_key]

    grid_knobs: dict[tuple[int, int, int], KnobArrays] = {}

    def knobs_of(grid_key: tuple[int, int, int], grid: list[Setting]) -> KnobArrays:
        """A grid's knobs as arrays (memoized per grid)."""
        if grid_key not in grid_knobs:
            grid_knobs[grid_key] = KnobArrays.of(grid)
        return grid_knobs[grid_key]

    def option_count(mesh: Mesh, mb: int) -> int:
        """Pipeline options of one (mesh, micro-batch) pair (memoized: they depend only on (pp,
        dp, micro-batch) and whether ep > 1, which combined 1F1B needs)."""
        option_key = (mesh.pp, mesh.dp, mb, mesh.ep > 1)
        if option_key not in option_counts:
            option_counts[option_key] = len(pipeline_options(model, training, mesh, mb, c))
        return option_counts[option_key]

    def mesh_knob_count(mesh: Mesh, mbs: list[int]) -> int:
        """Layouts of every pair of one mesh (memoized per (pp, dp, ep > 1): its micro-batches are dp's)."""
        key = (mesh.pp, mesh.dp, mesh.ep > 1)
        if key not in option_totals:
            option_totals[key] = sum(option_count(mesh, mb) for mb in mbs)
        return option_totals[key] * len(grid_of(mesh))

    overlap = cal.overlap(c.framework)
    # layouts of all pairs: meshes of one (pp, dp, tp, cp, ep > 1) have the same count (grid and options)
    shapes: dict[tuple[int, int, int, int, bool], tuple[Mesh, list[int], int]] = {}
    for mesh, mbs in valid:
        shape = (mesh.pp, mesh.dp, mesh.tp, mesh.cp, mesh.ep > 1)
        first = shapes.get(shape)
        shapes[shape] = (mesh, mbs, 1) if first is None else (first[0], first[1], first[2] + 1)
    total_knobs = sum(n * mesh_knob_count(mesh, mbs) for mesh, mbs, n in shapes.values())
    visited_knobs = 0
    gpipe_dominated = 0  # layouts skipped as dominated GPipe (counted into the log at the end)
    # per (pp, dp, tp, cp, micro-batch, ep > 1): pipeline options, grid key, knob grid, its memory
    # rejections and the pair's layout count
    pair_shapes: dict[tuple[int, int, int, int, int, bool], tuple[list[tuple[int, str]], tuple[int, int, int], list[Setting], _GridRejections, int]] = {}
    ref = reference_step_s or 0.0
    # per (mesh degrees, micro-batch, option): the settings its activation floor puts over the usable
    # memory, and its full-recompute ones (`_floor_over`); None where no floor is claimed
    floors: dict[tuple, _FloorVerdict | None] = {}
    floor_masks: dict[tuple, tuple] = {}  # `_FloorVerdict.of`'s shared masks
    # the activation floors themselves, by what they read of a layout (`stage_table.FLOOR_FIELDS`)
    # that varies within a search: meshes of other expert-parallel degrees, foldings or data-parallel
    # degrees at the same micro-batch count share one (Qwen3-235B-A22B / 256 H100: 1,892 floors
    # for 10,338 verdicts)
    floor_values: dict[tuple, np.ndarray | None] = {}
    orders = _RankOrders()  # tables and memory prices shared between a mesh's rank orders
    for done, (lb, pair, mesh_index, mb, per_mb_s, kappa) in enumerate(pairs):
        mesh = bounds.meshes[mesh_index]
        if progress is not None:
            progress(done, pair_count)
        pair_key = (mesh.pp, mesh.dp, mesh.tp, mesh.cp, mb, mesh.ep > 1)
        pair_shape = pair_shapes.get(pair_key)
        if pair_shape is None:
            grid_key = (mesh.dp, mesh.tp, mesh.cp)
            grid = grid_of(mesh)
            if grid_key not in grid_reasons:
                grid_reasons[grid_key] = _GridRejections.of([_memory_reason(x) for x in grid])
            options = pipeline_options(model, training, mesh, mb, c)
            pair_shape = pair_shapes[pair_key] = (options, grid_key, grid, grid_reasons[grid_key], len(options) * len(grid))
        options, grid_key, grid, rejections, n = pair_shape
        visited_knobs += n
        generated += n
        pair_tables: dict[PipeOption, StageTable] = {}  # this pair's tables, per option without combined 1F1B
        if ranked.full and lb >= max(ranked.threshold_s, ref * bounds.kappa_max):
            # pairs are sorted by bound (ranking units): every later pair is pruned too, and none of
            # them can be faster than the reference (its kappa is at most kappa_max)
            later = total_knobs - visited_knobs
            generated += later
            pruned += n + later
            break
        option_bounds: list[float] | None = None
        option_floors: np.ndarray | None = None  # (options, pp) what the bounds add up (`_PairTimes.bounds`)
        ga = training.global_batch // (mb * mesh.dp)  # micro-batches per step
        # what the options' bounds read of the ranking, which changes only where a table's settings
        # enter it (`ranked.add`): whether it holds k layouts, and its threshold in seconds (over
        # this pair's kappa) or the reference
        full = ranked.full
        threshold = max(ranked.threshold_s / kappa, ref) if full else math.inf
        for at, option in enumerate(options):
            vpp, schedule = option.vpp, option.schedule
            near_threshold = True
            if schedule == "gpipe" and c.schedule != "gpipe":
                # Dominated: GPipe has exactly 1F1B's step time (same bubble, same work) and holds
                # all micro-batches' activations instead of at most pp, so it never ranks higher.
                pruned += len(grid)
                if not gpipe_dominated:
                    log.add(GPIPE_DOMINATED, "every pipelined mesh; pin --schedule gpipe to price it", 0)
                gpipe_dominated += len(grid)
                continue
            if full:  # bound the layout before building its table: cheap bound first
                if _bubble_bound(per_mb_s, mesh.pp, vpp, ga, schedule in SPLIT_BACKWARD_SCHEDULES) * (1 - BOUND_MARGIN) >= threshold:
                    pruned += len(grid)
                    continue
                if option_bounds is None:  # the first option the pair bounds: every option's at once
                    option_bounds, option_floors = bounds.pair_times(pair).bounds(mesh.pp, options, ga, overlap)
                bound = option_bounds[at]
                if bound * (1 - BOUND_MARGIN) >= threshold:
                    pruned += len(grid)
                    continue
                # within the margin of the threshold only the table's own bound decides
                near_threshold = bound * (1 + BOUND_MARGIN) >= threshold
            base: Layout | None = None
            partition = _partition(model.num_layers, mesh.pp, option)
            if option.a2a_overlap and ranked.steps and not (full and near_threshold):
                # Combined 1F1B runs no full recompute; when the activations alone put every other
                # setting over the usable memory (`stage_table.activation_floor`), nothing of this
                # option can fit: its table is not built. Its settings are counted as they would be
                # priced (memory rejections whose reasons have their examples already), its
                # full-recompute ones under the rule that refuses them. The floor's settings over
                # it are memoized on all the floor reads of the layout (`floor_key`).
                floor_key = (mesh.tp, mesh.pp, mesh.cp, mesh.dp, mesh.ep, mesh.etp, mesh.moe_parallel_folding, mb, option)
                if floor_key in floors:
                    floor_over = floors[floor_key]
                else:
                    # what the floor reads: FLOOR_FIELDS of the layout (tp, cp, sp and etp, the mesh's;
                    # the micro-batch and its count; combined 1F1B, the option's; the rest, framework,
                    # stack, kernels and offload, the search's), and the partition, schedule and
                    # virtual stages (pp and the option)
                    value_key = (mesh.tp, mesh.cp, mesh.sp_, mesh.etp, mesh.pp, mb, training.global_batch // (mb * mesh.dp), option)
                    if value_key in floor_values:
                        floor = floor_values[value_key]
                    else:
                        base = table_layout(mesh, mb, option, grid[0], stack, gpus, training)
                        floor = floor_values[value_key] = activation_floor(model, training, cluster, base, partition, schedule, vpp, cal)
                    floor_over = floors[floor_key] = (
                        None if floor is None else _FloorVerdict.of(floor, usable, grid_key, knobs_of(grid_key, grid).mode, floor_masks)
                    )
                if floor_over is not None and floor_over.all_refused and floor_over.have_examples(rejections, log):
                    floor_over.count(rejections, log)
                    pruned += len(grid)
                    floored += len(grid)
                    continue
            degrees_key = (mesh.tp, mesh.pp, mesh.cp, mesh.dp, mesh.ep, mesh.etp, mesh.moe_parallel_folding, mb)
            memory_key = (*degrees_key, option)
            verdict = orders.verdict(memory_key)
            if verdict is not None and not len(verdict.fits) and not (full and near_threshold):
                # another rank order's memory prices left no setting that fits: priced and counted
                # the same, and the table (which only the bound near the threshold would read) not built
                priced += len(grid)
                verdict.count(rejections, log)
                continue
            # combined 1F1B changes how a table is timed and what its ranks hold in flight, not the
            # table: an option and its combined twin share one (`stage_table.build_table` reads no
            # schedule knob of its mesh; tests/planner/test_search_bounds.py checks the two equal)
            if base is None:
                base = table_layout(mesh, mb, option, grid[0], stack, gpus, training)
            twin = option._replace(a2a_overlap=False)
            table = pair_tables.get(twin)
            if table is None:
                table = pair_tables[twin] = orders.table(
                    (*degrees_key, twin), partial(build_table, model, training, cluster, gpus, base, partition, cal), base, cal
                )
            else:
                table = table.sharing(mesh=base)
            if full and near_threshold and time_lower_bound(table, vpp, cal) >= threshold:
                pruned += len(grid)
                continue
            prices = orders.memory(
                memory_key, partial(price_memory, table, grid, schedule, vpp, cal, knobs_of(grid_key, grid))
            )
            priced += len(grid)
            if verdict is not None:  # another rank order's prices, priced and counted the same
                verdict.count(rejections, log)
                if not len(verdict.fits):
                    continue
                peaks, fits = verdict.peaks, verdict.fits
            else:
                peaks, fits, closest = _memory_verdict(
                    prices, memory_key, orders, mesh, mb, option, grid, knobs_of(grid_key, grid), rejections, log, closest,
                    stack, gpus, training, cluster, usable, host_usable, ranks_per_node, loading_by_stage,
                )
                if not len(fits):
                    continue
            feasible += len(fits)
            # An order that places the communication and the data-parallel groups as an earlier one
            # has its table's prices and bounds (`_RankOrders.outcome`): bounded there, bounded here
            placed = orders.placed(memory_key, table)
            same = (placed, *data_parallel_strides(table.mesh))
            seen, earlier_s = orders.outcome(same)
            if seen and earlier_s is None:
                bounded += len(fits)
                continue
            # Bounded, not timed: when every fitting setting's step is bounded above the ranking's
            # threshold (and the reference) and a layout already kept is strictly faster and no
            # larger than each, none of them can enter the top k, the tie window or the Pareto front
            # (`_all_bounded`). First by each setting's own bound from the option's per-rank floors
            # without recompute that level 3 summed (`_PairTimes.bounds`) plus the table's recompute
            # seconds of each mode, at most the table's own floors, before its phase arrays are
            # computed (the modes' bounds alone seldom decide from these); then from the table's
            if full and option_floors is not None:
                pair_floors = option_floors[at][None, :] + table.recompute
                if _all_bounded(ranked, threshold, kappa, table, knobs_of(grid_key, grid), fits,
                                peaks[fits], vpp, cal, pair_floors, None):
                    bounded += len(fits)
                    orders.keep_outcome(same, None)
                    continue
            phases, table_mode_lb, rank_floors = orders.phases(placed, table, vpp, cal)
            if full and _all_bounded(ranked, threshold, kappa, table, knobs_of(grid_key, grid),
                                     fits, peaks[fits], vpp, cal, rank_floors, table_mode_lb):
                bounded += len(fits)
                orders.keep_outcome(same, None)
                continue
            # every setting is timed (as cheap as timing a subset: the work is per numpy call), the
            # ones that fit are kept; an earlier order's step seconds where it places alike
            if earlier_s is None:
                timed = price_time(table, grid, copy.copy(prices), vpp, cal, phases)
                assert timed.step_s is not None
                earlier_s = timed.step_s
                orders.keep_outcome(same, earlier_s)
            step_s = earlier_s[fits]
            if reference_step_s is not None:
                faster += int(np.count_nonzero(step_s < reference_step_s * (1 - 1e-9)))
            # ranked by the conservative figure: seconds x (1 + the kernels' slow-end margin)
            ranked.add(step_s * kappa, peaks[fits], (mesh, mb, option, grid, fits))
            full = ranked.full
            threshold = max(ranked.threshold_s / kappa, ref) if full else math.inf
    if progress is not None:
        progress(pair_count, pair_count)
    if gpipe_dominated:
        log.count(GPIPE_DOMINATED, gpipe_dominated)
    for floor_over in floors.values():
        if floor_over is not None:
            floor_over.flush(log)
    for rejections in grid_reasons.values():
        rejections.flush(log)

    ranked_all = ranked.ranked(stack)
    inputs = PlanInputs(model=model, cluster=cluster, gpus=gpus, training=training, constraints=c)
    groups = fold_equivalents(ranked_all, c.top_k + 1, ranked.tie_rel)
    groups, tie_note = choose_among_ties(groups, ranked.tie_rel, usable)
    best_list = []
    for i, group in enumerate(groups):
        cand = _candidate(
            model, training, cluster, gpus, group[0].layout.build(gpus, training), cal, refine=refine and i == 0, usable=usable
        )
        cand.equivalents = [describe(r.layout.build(gpus, training)) for r in group[1 : 1 + MAX_EQUIVALENTS_LISTED]]
        cand.equivalent_count = len(group) - 1
        best_list.append(cand)
    best = best_list[0] if best_list else None
    if best is not None:
        best.placement = place(cluster, gpus, best.layout)
    pareto = ranked_all.pareto()
    plan = Plan(
        inputs=inputs,
        best=best,
        alternatives=best_list[1 : c.top_k + 1],
        pareto=[_candidate(model, training, cluster, gpus, r.layout.build(gpus, training), cal, refine=False, kernels=False)
                for r in pareto],
        rejections=log.as_list(),
        closest_miss=None if best is not None or closest is None else _closest(closest, usable),
        calibration=cal.source,
        stats=SearchStats(
            generated=generated,
            invalid=invalid,
            pruned=pruned,
            priced=priced,
            feasible=feasible,
            floored=floored,
            dominated=bounded,
            seconds=time.perf_counter() - t0,
            faster_than_reference=faster if reference_step_s is not None else None,
        ),
    )
    plan.why = explain(plan, usable)
    if tie_note:
        plan.why.append(tie_note)
    plan.stats.seconds = time.perf_counter() - t0
    return plan


TIE_SHARE_OF_BAND = 0.25
"""Two layouts of one job whose predicted step times differ by less than this share of the
regime's error half-width (`cost_models.error_band`) are a tie. The band measures how far the model
is off for one layout; the *difference* between two layouts of the same job is known far better
(same kernels, same fabric, same framework: most of the error is shared), and a quarter of the
band is taken as the resolution of such a comparison: 2.9% for dense Hopper, 5.4% for MoE."""

MIN_TIE_REL = 0.005
"""Ties are never narrower than 0.5% (without bands, or with very tight ones)."""

MAX_EQUIVALENTS_LISTED = 8


def _moving_parts(r: _Ranked) -> float:
    """Fewer is simpler: doublings of the context-parallel degree and of the virtual stages (each
    adds a ring step or a chunk boundary per micro-batch), and a non-default rank order."""
    lay = r.layout
    return math.log2(lay.mesh.cp) + math.log2(lay.option.vpp) + float(lay.mesh.order != DEFAULT_ORDER)


def fold_equivalents(view: _RankedView, groups_wanted: int, tie_rel: float) -> list[list[_Ranked]]:
    """The fastest layouts, with layouts of the same price (step time equal to 1 ns, peak memory
    to 1 MiB: another rank order, another CP / DP split of equal cost) folded into one group whose
    first member is the simplest (`_moving_parts`). Groups in step order, at least `groups_wanted`
    of them and every group within the tie window of the fastest."""
    if not len(view.step_s):
        return []
    order = np.argsort(view.step_s, kind="stable")
    fastest = float(view.step_s[order[0]])
    groups: dict[tuple[float, int], list[_Ranked]] = {}
    for i in order:
        step = float(view.step_s[i])
        key = (round(step, 9), int(view.peak_bytes[i]) >> 20)
        if key not in groups and len(groups) >= groups_wanted and step > fastest * (1 + tie_rel):
            break
        groups.setdefault(key, []).append(view._named(int(i)))
    out = [sorted(members, key=_moving_parts) for members in groups.values()]
    return out


def choose_among_ties(groups: list[list[_Ranked]], tie_rel: float, usable_bytes: int) -> tuple[list[list[_Ranked]], str]:
    """Within the tie window of the fastest group (`TIE_SHARE_OF_BAND`), prefer fewer moving parts
    (lower CP, fewer virtual stages), then more memory headroom (in whole GiB), then the faster.
    Returns the groups with the chosen one first, and a sentence when it is not the fastest."""
    if len(groups) < 2:
        return groups, ""
    fastest = groups[0][0].step_s
    tied = [g for g in groups if g[0].step_s <= fastest * (1 + tie_rel)]

    def key(g: list[_Ranked]) -> tuple:
        r = g[0]
        return (_moving_parts(r), -((usable_bytes - r.peak_bytes) >> 30), r.step_s)

    chosen = min(tied, key=key)
    rest = [g for g in groups if g is not chosen]
    if chosen is groups[0]:
        return groups, ""
    note = (
        f"Chosen over a layout predicted {100 * (chosen[0].step_s / fastest - 1):.1f}% faster: the two are "
        f"within the model's resolution ({100 * tie_rel:.1f}%, a quarter of the error band), and this one "
        f"has fewer moving parts or more memory headroom ({(usable_bytes - chosen[0].peak_bytes) / GIB:.1f} "
        f"vs {(usable_bytes - groups[0][0].peak_bytes) / GIB:.1f} GiB free)."
    )
    return [chosen, *rest], note


def _candidate(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    layout: Layout,
    cal: Calibration,
    *,
    refine: bool,
    usable: int | None = None,
    kernels: bool = True,
) -> Candidate:
    """Price a layout for the Plan; with `refine`, re-cut its pipeline stages with CP-SAT and keep
    the better of the even and optimized partitions; with `kernels`, where its kernel rates come
    from and its conservative figure (`report.kernels_dict`; the Pareto front's points go without)."""
    ctx = pricing_context(model, training, cluster, gpus, layout, validate=False)
    est: Estimate = price(ctx, calibration=cal)
    if refine and layout.pp > 1:
        from planner.partition import optimize_partition

        better = optimize_partition(model, training, cluster, gpus, layout, cal, capacity_bytes=usable)
        if better is not None:
            ctx2 = pricing_context(model, training, cluster, gpus, layout, better, validate=False)
            est2 = price(ctx2, calibration=cal)
            if (usable is None or est2.peak_bytes <= usable) and est2.step_s < est.step_s:
                est = est2
    provenance = kernels_dict(model, training, cluster, est.layout, cal) if kernels else None
    return Candidate(
        layout=layout, partition=list(est.partition.chunk_layers),
        estimate=estimate_dict(model, cluster.name, est, cluster.gpu.name, training, provenance),
    )


def _closest(closest: tuple[int, Layout, MemoryBreakdown], usable: int) -> ClosestMiss:
    over, layout, worst = closest
    return ClosestMiss(
        layout=layout,
        peak_bytes=int(worst.total),
        usable_bytes=usable,
        over_by_bytes=over,
        worst_stage=worst.stage,
        breakdown=worst.as_dict(),
    )
