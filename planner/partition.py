"""Pipeline stage partition with OR-Tools CP-SAT.

The problem
    Cut the model's L layers into C = pp x vpp contiguous chunks, at least one layer each but the
    first and the last (the embedding's and the LM head's, which may hold none); chunk c
    runs on pipeline rank c % pp (`cost_models.stages`). Optionally choose, per rank, how many of
    its layers use full activation recompute: the first k_r layers of the rank in model order, as
    `cost_models.stage_table` counts `Layout.recompute_layers`.
    Every rank's memory must fit its capacity; the slowest rank's micro-batch time is minimized
    (it sets the steady state of the pipeline, `cost_models.estimate`: m x max_r t_r + bubble).
    Ties go to the solution with the least recompute time, so recompute is chosen only where
    memory needs it (and the bubble, sum_r t_r / v, is no larger than necessary).

Data (`PartitionData`, plain numbers; `build_partition_data` fills it from the cost models)
    per layer i:  t_i   forward + backward seconds of one micro-batch, with the per-layer exposed
                        communication the cost model charges (TP, CP, EP)
                  rt_i  extra seconds when the layer is fully recomputed
                  s_i   model-state bytes (weights, gradients, optimizer states after ZeRO)
                  a_i   activation bytes kept per micro-batch without recompute
                  af_i  activation bytes kept per micro-batch with full recompute (its input)
    per rank r:   f_r   micro-batches in flight at the rank's peak (`in_flight_micro_batches`)
                  fixed seconds and bytes (p2p, buffers, CUDA context, ...)
    extras:       embedding seconds / bytes on rank 0 (chunk 0), LM head + loss seconds and
                  bytes (its states and the logits) on the last chunk's rank (pp - 1; 0 in a V), and the
                  working set of one layer being recomputed (on ranks that recompute at all).
    All bytes are what the rank reserves, allocator fragmentation included.

The model (`_variables`, `_memory`, `_slowest_rank`; integer prefix sums P[j] over layers [0, j))
    start[c]  integer, c = 0..C: first layer of chunk c; start[0] = 0, start[C] = L and
              start[c+1] >= start[c] + 1 (contiguous chunks, each >= 1 layer; the first and last
              chunks >= 0, `_cut_variables`). With vpp > 1 the
              chunks of one rank differ by at most `chunk_spread` layers (default 1): the stage
              model sees a rank's chunks as equal slices of its work, as Megatron builds them.
    redo[c]   integer: the first redo[c] layers of chunk c are recomputed; a later chunk of the
              same rank recomputes only when the earlier one recomputes all of its layers (so a
              rank recomputes a prefix of its layers). "uniform": sum over the rank's chunks
              = min(K, layers of the rank), one K for all ranks.
    Per-chunk sums are element lookups P[start[c+1]] - P[start[c]] (and P[start[c] + redo[c]]
    for the recomputed part), so layers of different kinds (dense/MoE, windowed) cost exactly
    what they cost. A shared boundary is looked up once, so the sums telescope.
    memory    fixed_r + sum over chunks of rank r of (keep_r(chunk) - saved_r(recomputed part))
              + the largest working set among its recomputed layers <= capacity, where keep_r
              sums s_i + f_r a_i and saved_r sums f_r (a_i - af_i).
    time      T_r = fixed_r + sum over chunks of rank r of (t(chunk) + rt(recomputed part)).
    Solved in two phases: minimize T_max >= T_r; then, holding T_max, minimize total recompute
    time and after it the peak memory (headroom). Phase 2 stops as soon as its headroom is proved
    within `HEADROOM_GAP_BYTES` of the best (its least recompute is then proved too): it is a
    tie-break, not a price, and proving the last megabytes of headroom took up to 1 s.

Resolution: CP-SAT works on integers. Times are rounded to `time_resolution_s` (default 10 ns; a
stage of L layers is off by at most L x 5 ns), bytes to `byte_resolution` (default 64 KiB) with
each layer's bytes rounded up and the capacity down, so a cut the solver accepts fits in the float
model too. `PartitionResult` reports times and bytes re-evaluated in floats (`evaluate`).

Determinism: one search worker, a fixed seed, and a deterministic work limit (`work_limit`,
default `DEFAULT_WORK_LIMIT` of CP-SAT deterministic time) that stops the search: the same request
gives the same cut on any machine and under any CPU load. `time_limit_s` is a wall-clock safety net
only. The status says whether the slowest rank's time was proved minimal ("optimal")
or not ("feasible"; also when the solver found nothing in time and the even cut is returned).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Literal

from ortools.sat.python import cp_model

from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration, default_calibration
from cost_models.compute import ShardGeometry, lm_head_time, trained_mtp_layers
from cost_models.context import PricingContext
from cost_models.estimate import Estimate, price
from cost_models.layout import Layout
from cost_models.memory import MemoryBreakdown
from cost_models.pipeline import chunk_rank, in_flight_micro_batches, is_v_shape
from cost_models.stage_table import LayerKind, layer_kinds
from cost_models.stages import StagePartition
from model_specs.spec import ModelSpec, TrainingSpec

RecomputeChoice = Literal["none", "per_rank", "uniform"]
Status = Literal["optimal", "feasible", "infeasible", "unknown"]

DEFAULT_WORK_LIMIT = 0.5
"""CP-SAT deterministic time per solve phase: what stops the search. It counts work, not seconds,
so the same request gives the same cut on any machine and under any load."""
HEADROOM_GAP_BYTES = 2**30
"""Default of `partition_layers(headroom_gap_bytes=...)`: phase 2 (least recompute, then most
headroom, at phase 1's time) stops once its worst rank's memory is proved within this many bytes of
the least any cut at that time reaches (CP-SAT's `absolute_gap_limit`). On the 27 pipelined cuts
of `bench.partition_tie_break` no cut loses more than 0.2 GiB of headroom against a phase 2 run to
its full work limit and none recomputes more. It bounds phase 2 where the proof is slow: the best cut
of Llama-3-405B / 16,384 H100 took 0.12 s instead of 1.1 s under the calibration before the
2026-11-26 refit (the refit's numbers make that proof quick either way), Llama-3-70B / 128 A100's
TP2 PP4 vpp10 cut 1.3 s instead of 1.7 s."""
DEFAULT_TIME_LIMIT_S = 60.0
"""Wall-clock safety net only (a solve that reaches it says so in its message)."""
DEFAULT_TIME_RESOLUTION_S = 1e-8
DEFAULT_BYTE_RESOLUTION = 2**16
DEFAULT_CHUNK_SPREAD = 1
SEED = 20240601


# =============================================================================================
# Data
# =============================================================================================


@dataclass(frozen=True)
class PartitionData:
    """Everything the solver needs, as plain numbers (seconds per micro-batch, bytes per rank).

    `recompute` says what the solver may choose: "none" (no layer is fully recomputed),
    "per_rank" (each rank picks its own count k_r) or "uniform" (one count K for all ranks, each
    recomputing min(K, its layers): what `Layout.recompute_layers` and Megatron's
    `--recompute-num-layers` express). With "uniform", `recompute_layers` pins K."""

    pp: int
    vpp: int
    layer_time_s: tuple[float, ...]
    layer_recompute_time_s: tuple[float, ...]
    layer_state_bytes: tuple[float, ...]
    layer_activation_bytes: tuple[float, ...]
    layer_recompute_activation_bytes: tuple[float, ...]
    in_flight: tuple[float, ...]
    capacity_bytes: float
    rank_time_s: tuple[float, ...] = ()  # fixed seconds per rank; empty = zeros
    rank_bytes: tuple[float, ...] = ()  # fixed bytes per rank; empty = zeros
    embedding_time_s: float = 0.0  # rank 0 (chunk 0)
    embedding_bytes: float = 0.0
    head_time_s: float = 0.0  # the last chunk's rank (`head_rank`): final norm, LM head, loss
    head_bytes: float = 0.0  # its states and the logits
    layer_working_bytes: tuple[float, ...] = ()  # full activations while recomputed; empty = zeros
    recompute: RecomputeChoice = "none"
    recompute_layers: int | None = None
    notes: tuple[str, ...] = field(default=())  # how the data was derived (approximations)
    v_shape: bool = False  # chunks placed as a V (zbv, dualpipev): the head on rank 0

    def __post_init__(self) -> None:
        n = self.num_layers
        for name in ("layer_recompute_time_s", "layer_state_bytes", "layer_activation_bytes", "layer_recompute_activation_bytes", "layer_working_bytes"):
            if (name != "layer_working_bytes" or getattr(self, name)) and len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {n} layers")
        for name in ("in_flight", "rank_time_s", "rank_bytes"):
            value = getattr(self, name)
            if (name == "in_flight" or value) and len(value) != self.pp:
                raise ValueError(f"{name} has {len(value)} entries for pp={self.pp}")
        if self.pp < 1 or self.vpp < 1:
            raise ValueError("pp and vpp must be >= 1")
        if self.recompute not in ("none", "per_rank", "uniform"):
            raise ValueError(f"recompute must be none|per_rank|uniform, not {self.recompute!r}")
        if self.recompute_layers is not None and self.recompute != "uniform":
            raise ValueError("recompute_layers pins the uniform count; it needs recompute='uniform'")

    @property
    def num_layers(self) -> int:
        return len(self.layer_time_s)

    @property
    def chunks(self) -> int:
        return self.pp * self.vpp

    @property
    def head_rank(self) -> int:
        return self.chunk_rank(self.chunks - 1)

    def chunk_rank(self, c: int) -> int:
        return chunk_rank(c, self.pp, self.v_shape)

    def rank_chunks(self, rank: int) -> list[int]:
        """The chunks of `rank`, in model order."""
        return [c for c in range(self.chunks) if self.chunk_rank(c) == rank]

    def next_chunk_of_rank(self, c: int) -> int | None:
        """The rank's chunk after chunk `c` in model order (None: `c` is its last)."""
        own = self.rank_chunks(self.chunk_rank(c))
        i = own.index(c)
        return own[i + 1] if i + 1 < len(own) else None

    def stage_partition(self, chunk_layers: tuple[int, ...] | list[int]) -> StagePartition:
        return StagePartition(tuple(chunk_layers), self.pp, self.vpp, self.v_shape)

    def fixed_time_s(self, rank: int) -> float:
        t = self.rank_time_s[rank] if self.rank_time_s else 0.0
        if rank == 0:
            t += self.embedding_time_s
        if rank == self.head_rank:
            t += self.head_time_s
        return t

    def fixed_bytes(self, rank: int) -> float:
        b = self.rank_bytes[rank] if self.rank_bytes else 0.0
        if rank == 0:
            b += self.embedding_bytes
        if rank == self.head_rank:
            b += self.head_bytes
        return b


@dataclass(frozen=True)
class PartitionResult:
    """The solver's answer. `chunk_layers` is empty unless a partition was found."""

    status: Status
    chunk_layers: tuple[int, ...]
    recompute_per_rank: tuple[int, ...]
    max_stage_time_s: float  # float re-evaluation; inf when nothing was found
    rank_time_s: tuple[float, ...] = ()
    rank_bytes: tuple[float, ...] = ()
    recompute_layers: int | None = None  # the uniform count K (recompute="uniform")
    solve_time_s: float = 0.0
    message: str = ""
    min_peak_bytes: float | None = None  # when infeasible: the least worst-rank memory any cut reaches

    @property
    def ok(self) -> bool:
        return self.status in ("optimal", "feasible")

    def stage_partition(self, pp: int, vpp: int = 1, v_shape: bool = False) -> StagePartition:
        if not self.ok:
            raise ValueError(f"no partition ({self.status}): {self.message}")
        return StagePartition(self.chunk_layers, pp, vpp, v_shape)


def evaluate(data: PartitionData, chunk_layers: tuple[int, ...] | list[int], recompute_per_rank: tuple[int, ...] | list[int] | None = None) -> tuple[list[float], list[float]]:
    """(seconds, bytes) of every rank for a given cut, in floats, with the solver's semantics:
    rank r recomputes the first `recompute_per_rank[r]` of its layers in model order."""
    part = data.stage_partition(chunk_layers)
    ks = list(recompute_per_rank) if recompute_per_rank is not None else [0] * data.pp
    times, mem = [], []
    for r in range(data.pp):
        layers = part.rank_layers(r)
        k = min(ks[r], len(layers))
        t, b, working = data.fixed_time_s(r), data.fixed_bytes(r), 0.0
        for j, i in enumerate(layers):
            t += data.layer_time_s[i]
            b += data.layer_state_bytes[i]
            if j < k:
                t += data.layer_recompute_time_s[i]
                b += data.in_flight[r] * data.layer_recompute_activation_bytes[i]
                if data.layer_working_bytes:
                    working = max(working, data.layer_working_bytes[i])
            else:
                b += data.in_flight[r] * data.layer_activation_bytes[i]
        b += working
        times.append(t)
        mem.append(b)
    return times, mem


# =============================================================================================
# Integer scaling
# =============================================================================================


@dataclass(frozen=True)
class _Scaled:
    """`PartitionData` as integer prefix sums: entry j sums layers [0, j). Times in units of the
    time resolution (rounded), bytes in units of the byte resolution (each layer rounded up)."""

    time: list[int]  # forward + backward
    recompute_time: list[int]
    keep: list[list[int]]  # [rank]: states + in-flight activations, layers kept
    saved: list[list[int]]  # [rank]: bytes full recompute saves (kept minus recomputed, rounded down)
    working: dict[int, list[int]]  # working-set size -> prefix count of layers with that size
    fixed_time: list[int]  # per rank
    fixed_bytes: list[int]
    capacity: int

    @property
    def total_recompute(self) -> int:
        return self.recompute_time[-1]


def _prefix(values: list[int]) -> list[int]:
    out = [0]
    for x in values:
        out.append(out[-1] + x)
    return out


def _scale(data: PartitionData, time_res: float, byte_res: float) -> _Scaled:
    def ticks(x: float) -> int:
        return round(x / time_res)

    def up(x: float) -> int:
        return math.ceil(x / byte_res - 1e-9)

    L, P = data.num_layers, data.pp
    keep, saved = [], []
    for r in range(P):
        f = data.in_flight[r]
        kept = [up(data.layer_state_bytes[i] + f * data.layer_activation_bytes[i]) for i in range(L)]
        redone = [up(data.layer_state_bytes[i] + f * data.layer_recompute_activation_bytes[i]) for i in range(L)]
        keep.append(_prefix(kept))
        saved.append(_prefix([max(0, k - x) for k, x in zip(kept, redone, strict=True)]))
    working: dict[int, list[int]] = {}
    sizes = [up(w) for w in data.layer_working_bytes] if data.layer_working_bytes else [0] * L
    for size in sorted(set(sizes) - {0}):
        working[size] = _prefix([int(w == size) for w in sizes])
    return _Scaled(
        time=_prefix([ticks(x) for x in data.layer_time_s]),
        recompute_time=_prefix([ticks(x) for x in data.layer_recompute_time_s]),
        keep=keep,
        saved=saved,
        working=working,
        fixed_time=[ticks(data.fixed_time_s(r)) for r in range(P)],
        fixed_bytes=[up(data.fixed_bytes(r)) for r in range(P)],
        capacity=math.floor(data.capacity_bytes / byte_res + 1e-9) if math.isfinite(data.capacity_bytes) else 2**50,
    )


# =============================================================================================
# Model: variables, constraints, objective
# =============================================================================================


ALL = object()  # redo[c] marker: every layer of the chunk is recomputed


@dataclass
class _Vars:
    start: list[cp_model.IntVar | int]  # [chunk 0..C]: first layer of the chunk (start[C] = L)
    redo: list  # [chunk]: how many of its first layers are recomputed (an IntVar, 0, or ALL)
    rank_time: list[cp_model.LinearExprT]
    rank_bytes: list[cp_model.LinearExprT]
    recompute_time: cp_model.LinearExprT
    uniform_k: cp_model.IntVar | None = None


class _Lookups:
    """prefix[index] as CP-SAT variables (element constraints), one per (table, index): a boundary
    shared by two chunks is looked up once, so sums over chunks telescope."""

    def __init__(self, m: cp_model.CpModel):
        self.m = m
        self.cache: dict[tuple[str, int], cp_model.IntVar] = {}

    def at(self, name: str, prefix: list[int], index: cp_model.IntVar | int) -> cp_model.IntVar | int:
        if isinstance(index, int):
            return prefix[index]
        key = (name, index.index)
        if key not in self.cache:
            target = self.m.new_int_var(min(prefix), max(prefix), f"{name}[{index.name}]")
            self.m.add_element(index, prefix, target)
            self.cache[key] = target
        return self.cache[key]


def _cut_variables(m: cp_model.CpModel, data: PartitionData, spread: int) -> list[cp_model.IntVar | int]:
    """start[c] for c = 0..C: contiguous chunks (start[0] = 0, start[C] = L) of at least one layer,
    but for the first and the last, which hold the embedding and the LM head (with the MTP modules)
    and may hold no layer (`StagePartition.problems`; DeepSeek-V3 report Sec. 3.2.1 puts the
    embedding, the output head and the MTP module on one rank with the shallowest and deepest
    layers). The chunks of one rank differ by at most `spread` layers (interleaving assumes equal
    chunks)."""
    L, C, P = data.num_layers, data.chunks, data.pp
    # chunks 1 .. C-2 hold a layer each: c - 1 of them start before chunk c, C - 1 - c at or after it
    start: list[cp_model.IntVar | int] = [0] + [m.new_int_var(c - 1, L - (C - 1 - c), f"start[{c}]") for c in range(1, C)] + [L]
    for c in range(C):
        m.add(start[c + 1] >= start[c] + (0 if c in (0, C - 1) and C > 1 else 1))
    for r in range(P):
        own = data.rank_chunks(r)
        for a in own:
            for b in own:
                if a != b:
                    m.add((start[a + 1] - start[a]) - (start[b + 1] - start[b]) <= spread)
    return start


def _recompute_variables(m: cp_model.CpModel, data: PartitionData, start: list) -> tuple[list, cp_model.IntVar | None]:
    """redo[c]: the first redo[c] layers of chunk c are recomputed. A rank recomputes a prefix of
    its layers in model order: a later chunk of the rank recomputes only if the earlier one
    recomputes all its layers. With "uniform", every rank recomputes min(K, its layers)."""
    L, C, P = data.num_layers, data.chunks, data.pp
    if data.recompute == "none":
        return [0] * C, None
    if data.recompute == "uniform" and data.recompute_layers is not None and data.recompute_layers >= L - C + 1:
        # every layer is recomputed (no rank holds more than L - C + 1 layers)
        return [ALL] * C, None
    redo = [m.new_int_var(0, L - C + 1, f"redo[{c}]") for c in range(C)]
    for c in range(C):
        m.add(redo[c] <= start[c + 1] - start[c])
        after = data.next_chunk_of_rank(c)
        if after is not None:
            whole = m.new_bool_var(f"whole[{c}]")
            m.add(redo[c] == start[c + 1] - start[c]).only_enforce_if(whole)
            m.add(redo[after] == 0).only_enforce_if(~whole)
    k = None
    if data.recompute == "uniform":
        k = m.new_int_var(0, L, "K")
        if data.recompute_layers is not None:
            m.add(k == min(data.recompute_layers, L))
        for r in range(P):
            own = range(r, C, P)
            k_r = sum(redo[c] for c in own)
            n_r = sum(start[c + 1] - start[c] for c in own)
            m.add(k_r <= k)
            capped = m.new_bool_var(f"k_is_K[{r}]")
            m.add(k_r == k).only_enforce_if(capped)
            m.add(k_r == n_r).only_enforce_if(~capped)
    return redo, k


def _working_set(m: cp_model.CpModel, at: _Lookups, s: _Scaled, start: list, ends: dict, chunks: list[int], name: str) -> cp_model.LinearExprT:
    """Bytes of the largest layer the rank recomputes (its full activations exist again during its
    backward); zero when it recomputes none. One indicator per distinct size and chunk."""
    own = [c for c in chunks if c in ends]
    if not s.working or not own:
        return 0
    biggest = m.new_int_var(0, max(s.working), f"working[{name}]")
    for size, count in s.working.items():
        for c in own:
            n = at.at(f"count{size}", count, ends[c]) - at.at(f"count{size}", count, start[c])
            has = m.new_bool_var(f"has[{c},{size}]")
            m.add(n <= len(count) * has)
            m.add(biggest >= size * has)
    return biggest


def _variables(m: cp_model.CpModel, data: PartitionData, s: _Scaled, spread: int) -> _Vars:
    """Cut, recompute counts, and per-rank time and memory expressions built from prefix sums."""
    C, P = data.chunks, data.pp
    start = _cut_variables(m, data, spread)
    redo, k = _recompute_variables(m, data, start)
    at = _Lookups(m)
    rank_time: list = [s.fixed_time[r] for r in range(P)]
    rank_bytes: list = [s.fixed_bytes[r] for r in range(P)]
    recompute_time: cp_model.LinearExprT = 0
    ends: dict[int, cp_model.IntVar] = {}  # chunk -> index after its last recomputed layer
    for c in range(C):
        r = data.chunk_rank(c)
        rank_time[r] += at.at("time", s.time, start[c + 1]) - at.at("time", s.time, start[c])
        rank_bytes[r] += at.at(f"keep{r}", s.keep[r], start[c + 1]) - at.at(f"keep{r}", s.keep[r], start[c])
        if redo[c] is ALL:
            end = ends[c] = start[c + 1]
        elif isinstance(redo[c], int):  # no recompute
            continue
        else:
            end = ends[c] = m.new_int_var(0, data.num_layers, f"redo_end[{c}]")
            m.add(end == start[c] + redo[c])
        redo_t = at.at("recompute", s.recompute_time, end) - at.at("recompute", s.recompute_time, start[c])
        rank_time[r] += redo_t
        recompute_time += redo_t
        rank_bytes[r] -= at.at(f"saved{r}", s.saved[r], end) - at.at(f"saved{r}", s.saved[r], start[c])
    for r in range(P):
        rank_bytes[r] += _working_set(m, at, s, start, ends, list(range(r, C, P)), str(r))
    return _Vars(start, redo, rank_time, rank_bytes, recompute_time, k)


def _memory(m: cp_model.CpModel, v: _Vars, s: _Scaled) -> None:
    """Every rank's memory fits its capacity."""
    for used in v.rank_bytes:
        m.add(used <= s.capacity)


def _slowest_rank(m: cp_model.CpModel, v: _Vars, s: _Scaled) -> cp_model.IntVar:
    """t_max >= every rank's time."""
    steps = [b - a for a, b in itertools.pairwise(s.time)] + [b - a for a, b in itertools.pairwise(s.recompute_time)]
    horizon = sum(max(0, x) for x in steps) + max(0, *s.fixed_time)
    t_max = m.new_int_var(min(0, *s.fixed_time), horizon, "t_max")
    for t in v.rank_time:
        m.add(t <= t_max)
    m.add(len(v.rank_time) * t_max >= sum(v.rank_time))  # redundant: the mean bounds the max
    # redundant (pigeonhole): some rank holds at least ceil(L / P) layers, so t_max is at least the
    # time of that many of the cheapest layers plus the least fixed time of a rank. The mean above
    # is fractional; this bound is what lets the solver prove an integral cut optimal (Llama-3-405B
    # PP8 VPP8: 16 of 126 layers on the busiest rank) instead of running to its work limit.
    P, L = len(v.rank_time), len(s.time) - 1
    cheapest = sorted(b - a for a, b in itertools.pairwise(s.time))[: -(-L // P)]
    m.add(t_max >= sum(cheapest) + min(s.fixed_time))
    return t_max


def _peak_memory(m: cp_model.CpModel, v: _Vars, s: _Scaled) -> cp_model.IntVar:
    """peak >= every rank's memory."""
    bound = max(row[-1] for row in s.keep) + max(s.fixed_bytes) + max(s.working, default=0)
    peak = m.new_int_var(0, bound, "peak")
    for used in v.rank_bytes:
        m.add(used <= peak)
    return peak


def _hint_even(m: cp_model.CpModel, v: _Vars, data: PartitionData) -> None:
    """Start the search from the even cut (the solver repairs it when it does not fit)."""
    bounds = _prefix(list(StagePartition.even(data.num_layers, data.pp, data.vpp, data.v_shape).chunk_layers))
    for c in range(1, data.chunks):
        m.add_hint(v.start[c], bounds[c])


@dataclass
class _Model:
    m: cp_model.CpModel
    v: _Vars
    t_max: cp_model.IntVar
    peak: cp_model.IntVar


def _build_model(data: PartitionData, s: _Scaled, spread: int, *, fit: bool = True) -> _Model:
    """Variables and constraints; each solve phase sets its own objective. `fit=False` drops the
    capacity (to measure the least peak memory of an infeasible case)."""
    m = cp_model.CpModel()
    v = _variables(m, data, s, spread)
    if fit:
        _memory(m, v, s)
    model = _Model(m, v, _slowest_rank(m, v, s), _peak_memory(m, v, s))
    _hint_even(m, v, data)
    return model


# =============================================================================================
# Solve
# =============================================================================================


def _solver(time_limit_s: float, work_limit: float = DEFAULT_WORK_LIMIT) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit_s, 1e-3)
    solver.parameters.max_deterministic_time = work_limit
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = SEED
    solver.parameters.cp_model_probing_level = 0  # probing the element encodings costs more than it saves
    return solver


def _read(solver: cp_model.CpSolver, v: _Vars, data: PartitionData) -> tuple[tuple[int, ...], tuple[int, ...], int | None]:
    C, P = data.chunks, data.pp
    bounds = [solver.value(x) for x in v.start]
    counts = tuple(bounds[c + 1] - bounds[c] for c in range(C))
    redo = [counts[c] if x is ALL else x if isinstance(x, int) else solver.value(x) for c, x in enumerate(v.redo)]
    ks = tuple(sum(redo[c] for c in data.rank_chunks(r)) for r in range(P))
    k = solver.value(v.uniform_k) if v.uniform_k is not None else data.recompute_layers
    return counts, ks, k


def _fix_hints(model: _Model, solver: cp_model.CpSolver) -> None:
    """Hint the next phase with this phase's solution."""
    m, v = model.m, model.v
    m.clear_hints()
    for x in v.start[1:-1]:
        m.add_hint(x, solver.value(x))
    for x in v.redo:
        if isinstance(x, cp_model.IntVar):
            m.add_hint(x, solver.value(x))


def partition_layers(
    data: PartitionData,
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    time_resolution_s: float = DEFAULT_TIME_RESOLUTION_S,
    byte_resolution: float = DEFAULT_BYTE_RESOLUTION,
    chunk_spread: int = DEFAULT_CHUNK_SPREAD,
    work_limit: float = DEFAULT_WORK_LIMIT,
    headroom_gap_bytes: float = HEADROOM_GAP_BYTES,
) -> PartitionResult:
    """Cut the layers into chunks (and choose recompute counts) minimizing the slowest rank's
    micro-batch time under every rank's memory capacity.

    Two phases: (1) minimize the slowest rank's time; (2) holding it, minimize recompute time,
    then the peak memory (headroom), stopping once that is proved within `headroom_gap_bytes`.
    Each phase gets `work_limit` of deterministic time. The status is phase 1's: "optimal" means
    the slowest rank's time is proved minimal. With vpp > 1 the chunks of one rank differ by at most `chunk_spread` layers: the
    stage-time model (and the interleaved schedule) sees a rank's chunks as equal parts of its
    work, and Megatron splits each rank's layers evenly over its virtual stages."""
    t0 = time.perf_counter()
    L, C = data.num_layers, data.chunks
    if C > L:
        return PartitionResult(
            "infeasible", (), (), math.inf,
            message=f"pp x vpp = {C} chunks need at least {C} layers; the model has {L}",
        )
    s = _scale(data, time_resolution_s, byte_resolution)
    model = _build_model(data, s, chunk_spread)
    model.m.minimize(model.t_max)
    solver = _solver(time_limit_s, work_limit)
    code = solver.solve(model.m)
    if code == cp_model.INFEASIBLE:
        least = _least_peak_bytes(data, time_limit_s, byte_resolution, chunk_spread, work_limit)
        msg = f"no cut fits {data.capacity_bytes / 2**30:.2f} GiB per rank"
        if least is not None:
            msg += f"; the best cut needs {least / 2**30:.2f} GiB on its worst rank"
        return PartitionResult("infeasible", (), (), math.inf, solve_time_s=time.perf_counter() - t0, message=msg, min_peak_bytes=least)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _even_fallback(data, time.perf_counter() - t0, f"the solver found no cut within {time_limit_s} s")
    status: Status = "optimal" if code == cp_model.OPTIMAL else "feasible"
    best = _read(solver, model.v, data)
    msg = (
        "slowest rank proved minimal" if status == "optimal"
        else f"work limit {work_limit} (deterministic time) reached before optimality was proved"
    )

    # Phase 2: same slowest-rank time, least recompute, then most headroom.
    model.m.add(model.t_max <= solver.value(model.t_max))
    _fix_hints(model, solver)
    gap = math.floor(headroom_gap_bytes / byte_resolution)
    # One tick of recompute outweighs any peak difference plus the gap, so a solution proved within
    # the gap has the least recompute.
    model.m.minimize(model.v.recompute_time * (model.peak.proto.domain[-1] + 1 + gap) + model.peak)
    solver2 = _solver(time_limit_s, work_limit)
    solver2.parameters.absolute_gap_limit = gap
    code2 = solver2.solve(model.m)
    if code2 in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        best = _read(solver2, model.v, data)
    counts, ks, k = best
    times, mem = evaluate(data, counts, ks)
    return PartitionResult(status, counts, ks, max(times), tuple(times), tuple(mem), k, time.perf_counter() - t0, msg)


def fit_recompute(data: PartitionData, chunk_layers: tuple[int, ...] | list[int]) -> list[int] | None:
    """The least recompute that makes a given cut fit (per rank, or one count K for "uniform"),
    or None when none does. Recompute only adds time, so the least that fits is the fastest."""
    counts = data.stage_partition(chunk_layers).rank_layer_counts()
    P = data.pp

    def fits(ks: list[int]) -> bool:
        return all(b <= data.capacity_bytes for b in evaluate(data, chunk_layers, ks)[1])

    if data.recompute == "none":
        options: list[list[int]] = [[0] * P]
    elif data.recompute_layers is not None:
        options = [[min(data.recompute_layers, n) for n in counts]]
    elif data.recompute == "uniform":
        options = [[min(k, n) for n in counts] for k in range(max(counts) + 1)]
    else:
        ks = []
        for r in range(P):
            ok = [k for k in range(counts[r] + 1) if evaluate(data, chunk_layers, [k if q == r else 0 for q in range(P)])[1][r] <= data.capacity_bytes]
            if not ok:
                return None
            ks.append(ok[0])
        options = [ks]
    return next((ks for ks in options if fits(ks)), None)


def _even_fallback(data: PartitionData, elapsed: float, why: str) -> PartitionResult:
    """The even cut (with the least recompute that fits) when the solver ran out of time."""
    even = StagePartition.even(data.num_layers, data.pp, data.vpp).chunk_layers
    ks = fit_recompute(data, even)
    if ks is None:
        return PartitionResult("unknown", (), (), math.inf, solve_time_s=elapsed, message=f"{why}, and the even cut does not fit")
    times, mem = evaluate(data, even, ks)
    k = (max(ks) if data.recompute_layers is None else data.recompute_layers) if data.recompute == "uniform" else None
    return PartitionResult("feasible", even, tuple(ks), max(times), tuple(times), tuple(mem), k, elapsed, f"{why}; returning the even cut")


def _least_peak_bytes(
    data: PartitionData, time_limit_s: float, byte_resolution: float, spread: int, work_limit: float = DEFAULT_WORK_LIMIT
) -> float | None:
    """Smallest worst-rank memory any cut reaches (recompute as allowed), in bytes: how far the
    capacity is from a feasible partition. None when the solver finds nothing in time."""
    s = _scale(data, DEFAULT_TIME_RESOLUTION_S, byte_resolution)
    model = _build_model(data, s, spread, fit=False)
    model.m.minimize(model.peak)
    solver = _solver(time_limit_s, work_limit)
    code = solver.solve(model.m)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return solver.objective_value * byte_resolution


# =============================================================================================
# Data from the cost models
# =============================================================================================


def _probe_partition(pp: int, vpp: int, first_chunk_layers: int, v_shape: bool = False) -> StagePartition:
    """Rank 0 holds layers [0, n) in chunk 0 and every other chunk is empty (a partial model:
    the cost model prices whatever layers a partition lists)."""
    return StagePartition((first_chunk_layers,) + (0,) * (pp * vpp - 1), pp, vpp, v_shape)


def _kind(model: ModelSpec, i: int) -> LayerKind:
    """Layers of one kind cost the same (`cost_models.stage_table.layer_kinds`: dense/MoE x
    windowed/full x mixer, so a hybrid model's Mamba, attention, MLP and MoE layers each weigh what
    they cost)."""
    return layer_kinds(model)[i]


def _states(mem: MemoryBreakdown) -> float:
    return mem.parameters + mem.gradients + mem.optimizer


class _Probe:
    """`cost_models.estimate.price` of `layout` with rank 0 holding layers [0, n) (cached)."""

    def __init__(self, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: int, cal: Calibration):
        self.args = (model, training, cluster, gpus)
        self.cal = cal
        self.cache: dict[tuple[str, int], Estimate] = {}

    def __call__(self, layout: Layout, n: int) -> Estimate:
        key = (layout.model_dump_json(), n)
        if key not in self.cache:
            part = _probe_partition(layout.pp, layout.vpp, n, is_v_shape(layout.schedule_, layout.pp))
            self.cache[key] = price(PricingContext(*self.args, layout, part), self.cal)
        return self.cache[key]


def build_partition_data(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    layout: Layout,
    calibration: Calibration | None = None,
    *,
    recompute: RecomputeChoice | None = None,
    capacity_bytes: float | None = None,
) -> PartitionData:
    """Per-layer and per-rank numbers of `layout` from the cost models.

    `recompute` (what the solver may choose) defaults to what the layout says: "none" unless the
    layout asks for full recompute, then "uniform" pinned to `layout.recompute_layers` (all layers
    when unset). Pass "per_rank" or "uniform" to let the solver pick the counts; layers it does
    not recompute keep `layout.recompute`'s mode (none or selective). `capacity_bytes` defaults to
    the GPU's memory.

    How the numbers are obtained (no cost formula is restated here): `cost_models.estimate.price`
    is run on probe partitions in which rank 0 holds layers [0, n) and every other rank none.
    The stage time and memory of a rank with no layers are its fixed parts; adding layer i to
    rank 0 adds its time, states and activations (one probe per layer kind and recompute mode).
    This is exact for everything the cost model sums per layer (compute, recompute, TP/EP
    communication, states, activations). The ZeRO-2/3 per-micro-batch collectives and the CP
    ring's exposed remainder are `max(0, comm - overlap x compute)` per rank: those are
    linearized around the even cut (layers probed at a typical rank's size, fixed seconds set so
    the even cut prices exactly as the cost model prices it). ZeRO-3 gather buffers are sized
    for the model's largest layer on every rank (see `notes`)."""
    cal = calibration or default_calibration()
    lay = layout.resolved(gpus, training)
    base_mode = "none" if lay.recompute == "full" else lay.recompute
    variants = {
        mode: lay.model_copy(update={"recompute": mode, "recompute_layers": None})
        for mode in {base_mode, "none", "full"}
    }
    base, full = variants[base_mode], variants["full"]
    P, L = lay.pp, model.num_layers
    frag = 1.0 + cal.fragmentation_of(lay.framework)
    probe = _Probe(model, training, cluster, gpus, cal)

    # --- fixed per rank: every rank empty (rank 0 keeps the embedding, the last the LM head) ----
    fixed_mem = probe(base, 0).memory
    in_flight = tuple(
        in_flight_micro_batches(lay.schedule_, P, lay.vpp, lay.grad_accum_, r, lay.framework, lay.moe_a2a_overlap)
        for r in range(P)
    )

    # --- per layer kind: what adding one layer to rank 0 adds ----------------------------------
    def added(layout_: Layout, i: int) -> tuple[float, float, float]:
        """(seconds, state bytes, activation bytes per micro-batch) of layer i on rank 0."""
        before, after = probe(layout_, i), probe(layout_, i + 1)
        t = after.stage_times_s[0] - before.stage_times_s[0]
        states = frag * (_states(after.memory[0]) - _states(before.memory[0]))
        acts = frag * (after.memory[0].activations - before.memory[0].activations) / in_flight[0]
        return t, states, acts

    # Probe each kind at a typical rank's size (the layer of that kind nearest to L / pp), where
    # the per-rank max(0, comm - overlap x compute) terms are in their usual regime.
    typical = L // P
    at: dict[LayerKind, int] = {}
    for i in sorted(range(L), key=lambda j: (abs(j - typical), j)):
        at.setdefault(_kind(model, i), i)
    per_kind: dict[LayerKind, tuple[float, float, float, float, float, float]] = {}
    for kind, i in at.items():
        t, states, acts = added(base, i)
        t_full, _, acts_full = added(full, i)
        working = added(variants["none"], i)[2]  # a recomputed layer's activations exist again
        per_kind[kind] = (t, max(0.0, t_full - t), states, acts, acts_full, working)
    rows = [per_kind[_kind(model, i)] for i in range(L)]

    # Fixed seconds per rank: anchored on the even cut, so the linear model reproduces the cost
    # model exactly there (and wherever the stage time is linear in the layers: ZeRO-0/1, no CP).
    v_shape = is_v_shape(lay.schedule_, P)
    even = StagePartition.even(L, P, lay.vpp, v_shape)
    head_rank = even.head_rank
    even_t = price(PricingContext(model, training, cluster, gpus, base, even), cal).stage_times_s
    fixed_t = [even_t[r] - sum(rows[i][0] for i in even.rank_layers(r)) for r in range(P)]

    # --- ZeRO-3 gather buffers: sized by the largest layer (taken over the whole model) ---------
    zero3_buffers = frag * (probe(base, L).memory[0].comm_buffers - fixed_mem[0].comm_buffers)

    # --- embedding and LM head, split out of the fixed parts of ranks 0 and pp - 1 -------------
    head_t = _lm_head_seconds(model, training, cluster, lay, cal)
    if head_rank > 0:
        emb_b = frag * _states(fixed_mem[0])
        head_b = frag * (_states(fixed_mem[head_rank]) + fixed_mem[head_rank].logits)
    else:  # one rank holds both (pp 1, or a V): states stay in rank_bytes
        emb_b, head_b = 0.0, frag * fixed_mem[0].logits
    rank_t = [fixed_t[r] - (head_t if r == head_rank else 0.0) for r in range(P)]
    # the multi-token-prediction blocks sit beside the head (`stage_table._mtp_sums`): the even cut
    # priced them in the head rank's fixed seconds, without recompute; full recompute of every
    # layer re-runs them too
    mtp = trained_mtp_layers(model, training.frozen_base)
    if mtp and lay.recompute == "full" and lay.recompute_layers is None:
        head_t += mtp * per_kind[_kind(model, L - 1)][1]
    mtp_b = 0.0
    if mtp and head_rank > 0:
        # and their memory (weights, states, activations in flight, their logits): what pricing every
        # layer on rank 0 adds to the head rank, which then holds nothing else
        held = full if lay.recompute == "full" else base
        mtp_b = frag * (probe(held, L).memory[head_rank].total - probe(held, 0).memory[head_rank].total)
    rank_b = [
        fixed_mem[r].total + zero3_buffers - (emb_b if r == 0 else 0.0) - (head_b if r == head_rank else 0.0)
        for r in range(P)
    ]
    head_b += mtp_b

    pinned = None
    if recompute is None:
        recompute = "uniform" if lay.recompute == "full" else "none"
        if lay.recompute == "full":
            pinned = L if lay.recompute_layers is None else lay.recompute_layers
    notes: list[str] = []
    if lay.zero_stage >= 2 or lay.cp > 1:
        notes.append(
            "ZeRO-2/3 per-micro-batch collectives and the CP ring's exposed time are linearized around the even cut"
        )
    if lay.zero_stage >= 3 or lay.recompute == "full":
        notes.append(
            "the last rank's loss peak and a layer's backward peak (ZeRO-3 buffers, recompute working set) "
            "are summed: an upper bound of the cost model, which takes the larger"
        )
    if lay.zero_stage >= 3 and len({r[2] for r in rows}) > 1:
        notes.append("ZeRO-3 gather buffers sized for the model's largest layer on every rank")
    return PartitionData(
        pp=P,
        vpp=lay.vpp,
        layer_time_s=tuple(r[0] for r in rows),
        layer_recompute_time_s=tuple(r[1] for r in rows),
        layer_state_bytes=tuple(r[2] for r in rows),
        layer_activation_bytes=tuple(r[3] for r in rows),
        layer_recompute_activation_bytes=tuple(r[4] for r in rows),
        in_flight=in_flight,
        capacity_bytes=float(cluster.gpu.memory_bytes if capacity_bytes is None else capacity_bytes),
        rank_time_s=tuple(rank_t),
        rank_bytes=tuple(rank_b),
        embedding_time_s=0.0,  # the cost model prices no time for the embedding lookup
        embedding_bytes=emb_b,
        head_time_s=head_t,
        head_bytes=head_b,
        layer_working_bytes=tuple(r[5] for r in rows),
        recompute=recompute,
        recompute_layers=pinned,
        notes=tuple(notes),
        v_shape=v_shape,
    )


def _lm_head_seconds(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, lay: Layout, cal: Calibration) -> float:
    """`lm_head_time` on the shard geometry the stage table uses (one micro-batch on one rank)."""
    g = ShardGeometry.of(lay, lay.micro_batch, training.seq_len)
    # scalar geometry: a float
    return float(lm_head_time(model, g, cluster.gpu, "bf16", training.activation_bytes, cal, training.frozen_base))


def optimize_partition(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    layout: Layout,
    calibration: Calibration | None = None,
    *,
    capacity_bytes: float | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    work_limit: float = DEFAULT_WORK_LIMIT,
) -> StagePartition | None:
    """The CP-SAT cut for `layout` with its own recompute setting, or None when pp == 1 or no cut
    fits. (The caller prices it with `cost_models.estimate` and keeps the better of it and the
    even cut.)"""
    lay = layout.resolved(gpus, training)
    if lay.pp == 1:
        return None
    data = build_partition_data(model, training, cluster, gpus, lay, calibration, capacity_bytes=capacity_bytes)
    result = partition_layers(data, time_limit_s=time_limit_s, work_limit=work_limit)
    return data.stage_partition(result.chunk_layers) if result.ok else None
