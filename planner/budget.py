"""The work a search would do, counted before it runs (`estimate_work`), and the budget a service
holds it to (`check_budget`).

The search (`planner.search.search`) enumerates meshes (every factorization of the GPU count into
tp x pp x cp x dp, the expert grids, the rank orders), pairs each valid mesh with the micro-batches
that divide its batch, offers every pair its pipeline options (schedules, virtual stages), and
prices every knob setting (ZeRO stage and group, recompute, offload) of each option against one
stage table. Branch and bound prunes most of that when layouts fit; when none fits nothing is
pruned, so the budget counts the worst case:

    tables   (mesh, micro-batch, pipeline option) triples: the stage tables the search may build
    layouts  tables x knob settings (and 1 per mesh the planner's rules reject, as the search
             counts them): the layouts it may price, an upper bound of its `stats.generated`
    bytes    what it may hold, the sum of
             - the ranking: every feasible layout's step seconds and peak bytes, and every timed
               setting's step seconds kept for the rank orders that place alike (`RANKED_BYTES`),
               and a block per table that has one (`BLOCK_BYTES`), as if every layout fit and
               were timed;
             - the partitions' layer masks (`cost_models.stage_table._partition_index`, one byte per
               pipeline rank and layer, plus `INDEX_BYTES_PER_LAYER`) of the largest distinct
               partitions its memo keeps (`PARTITION_MEMO` of them);
             - the per-layer pricing memos (`cost_models.stage_table`: `layer_times`,
               `_layer_acts`, `_layer_arrays`, up to `LAYER_MEMO` shard geometries each),
               `MEMO_BYTES_PER_LAYER` per layer and geometry;
             - the settings' state bytes memo (`cost_models.stage_table._STATE_BYTES`: up to
               `STATE_MEMO` tables' `STATE_ARRAYS` float64 arrays per setting and pipeline rank),
               counted for the largest tables;
             - the price arrays of the largest table (`KNOB_ARRAYS` float64 per setting and
               pipeline rank).

Counting walks the same enumeration (`planner.space`) and the search's validity probe of each mesh
shape, without pricing anything: 0.2-0.6 s for DeepSeek-V3 on 131,072 GPUs (49,491 meshes). `bench.plan_budget` runs searches
against their estimate (the measured growth of peak memory stays below `bytes`).
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass

from cluster_specs.spec import ClusterSpec
from model_specs.spec import ModelSpec, TrainingSpec
from planner.plan import SearchConstraints
from planner.search import _mesh_probe, max_tp_of, mesh_rejection
from planner.space import meshes, micro_batches, pipeline_options, settings

STATE_MEMO = 1 << 12
"""Tables whose state bytes `cost_models.stage_table._state_bytes_cached` keeps (its `KeptMemo` starts over
at that many entries)."""
STATE_ARRAYS = 5
"""float64 arrays per setting and pipeline rank in one of its entries (parameters, gradients,
optimizer states, host and NVMe bytes)."""
KNOB_ARRAYS = 12
"""float64 arrays per pipeline rank and knob setting that pricing one table's grid allocates
(`cost_models.stage_table.KnobPrices`: peak, parameters, gradients, optimizer, activations, host,
NVMe, ... and the step-time terms of `price_time`)."""
RANKED_BYTES = 8 * 3
"""Bytes kept per feasible layout for the ranking (`planner.search._RankedBlocks`: its step time
and peak memory as float64), and per timed setting for the rank orders that place alike
(`planner.search._RankOrders.outcome`: its step time, float64)."""
BLOCK_BYTES = 400
"""Bytes kept per priced table that has a feasible layout (its `_RankedBlocks` block: the tuple,
the mesh and the index array's header)."""
PARTITION_MEMO = 1024
"""Partitions whose layer index `cost_models.stage_table._partition_index` keeps (its lru_cache)."""
INDEX_BYTES_PER_LAYER = 8 * 22
"""`_partition_index`'s int64 arrays per layer: the owner rank, 20 bincount bins
(`stage_table._RANK_QUANTITIES`) and, for an interleaved or V-shape partition, the layers grouped by
rank (`PartitionIndex.by_rank`)."""
LAYER_MEMO = 4096
"""Shard geometries whose per-layer arrays the pricing memos keep (`cost_models.stage_table`:
`lru_cache(maxsize=4096)` on `layer_times`, `_layer_acts`, `_layer_arrays`)."""
MEMO_BYTES_PER_LAYER = 64 + 8 * (20 + 5 + 20)
"""Bytes those memos keep per layer and geometry: `_layer_arrays`' 8 float64 arrays spread over the
layers, and the geometry's (`stage_table._Geometry`) 20 quantities and 5 peak rows of every layer
and the 20 sums of its class runs (`_Geometry.class_runs`; per layer of one class, a model of more
classes keeps 160 bytes more per layer for each)."""


@dataclass(frozen=True)
class WorkEstimate:
    meshes: int  # meshes enumerated
    tables: int  # (mesh, micro-batch, pipeline option) triples
    layouts: int  # knob settings over every table: layouts the search may price
    bytes: int  # what the search may hold (module docstring)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def estimate_work(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: int, c: SearchConstraints | None = None
) -> WorkEstimate:
    """Count what planning this job would enumerate, without pricing anything. A fine-tuning job is
    planned in its stack (`planner.finetune.search_finetune`): one search per combination of the
    stack's techniques, one after another, so their layouts and tables add up and the bytes are the
    largest search's."""
    from planner.finetune import finetune_constraints, technique_grid

    c = finetune_constraints(training, c or SearchConstraints(), gpus)
    if c.stack is None or not c.search_techniques:
        return _estimate_search(model, training, cluster, gpus, c)
    parts = [
        _estimate_search(model, training, cluster, gpus, c.model_copy(update=combo))
        for combo in technique_grid(training, c, gpus)
    ]
    return WorkEstimate(
        max(p.meshes for p in parts), sum(p.tables for p in parts), sum(p.layouts for p in parts),
        max(p.bytes for p in parts),
    )


def _estimate_search(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: int, c: SearchConstraints
) -> WorkEstimate:
    """Count what one `planner.search.search` under `c` would enumerate."""
    layers = model.num_layers
    tp_limit = max_tp_of(cluster, c)
    mbs_by_dp: dict[int, list[int]] = {}
    options_by_key: dict[tuple[int, int, int, bool], list[tuple[int, int, bool, bool, str]]] = {}
    grid_sizes: dict[tuple[int, int, int], int] = {}
    partitions: dict[tuple[int, int, bool, bool, str], int] = {}  # distinct partition -> its mask bytes
    n_meshes = tables = layouts = 0
    cells: dict[int, int] = {}  # settings x pipeline ranks of a table -> how many tables have it
    probes: dict[tuple[int, ...], bool] = {}
    for mesh in meshes(model, cluster, gpus, c):
        n_meshes += 1
        mbs = mbs_by_dp.get(mesh.dp)
        if mbs is None:
            mbs = mbs_by_dp[mesh.dp] = micro_batches(training, mesh.dp, c)
        if mesh_rejection(mesh, cluster, c, tp_limit) is not None or not mbs:
            layouts += 1  # the search counts a rejected mesh as one generated layout
            continue
        # the search's own validity probe, memoized as it does (every valid order is a permutation)
        key = (mesh.tp, mesh.pp, mesh.cp, mesh.dp, mesh.ep, mesh.etp, mbs[0])
        valid = probes.get(key)
        if valid is None:
            valid = probes[key] = _mesh_probe(model, training, gpus, mesh, mbs[0], c) is None
        if not valid:
            layouts += 1
            continue
        grid_key = (mesh.dp, mesh.tp, mesh.cp)
        grid = grid_sizes.get(grid_key)
        if grid is None:
            grid = grid_sizes[grid_key] = len(settings(mesh, cluster, c))
        for mb in mbs:
            option_key = (mesh.pp, mesh.dp, mb, mesh.ep > 1)
            options = options_by_key.get(option_key)
            if options is None:
                options = options_by_key[option_key] = [
                    (mesh.pp, o.vpp, o.embedding_slot, o.loss_slot, o.schedule)
                    for o in pipeline_options(model, training, mesh, mb, c)
                ]
                for shape in options:
                    partitions.setdefault(shape, mesh.pp * layers + INDEX_BYTES_PER_LAYER * layers)
            tables += len(options)
            layouts += len(options) * grid
            if options:
                cells[grid * mesh.pp] = cells.get(grid * mesh.pp, 0) + len(options)
    held = (
        RANKED_BYTES * layouts + BLOCK_BYTES * tables
        + sum(heapq.nlargest(PARTITION_MEMO, partitions.values()))
        + MEMO_BYTES_PER_LAYER * layers * min(tables, LAYER_MEMO)
        + 8 * STATE_ARRAYS * _largest_sum(cells, STATE_MEMO)
        + 8 * KNOB_ARRAYS * max(cells, default=0)
    )
    return WorkEstimate(n_meshes, tables, layouts, int(held))


def _largest_sum(counts: dict[int, int], n: int) -> int:
    """The sum of the `n` largest values of a multiset given as {value: count}."""
    total = 0
    for value in sorted(counts, reverse=True):
        take = min(n, counts[value])
        total += take * value
        n -= take
        if n == 0:
            break
    return total


@dataclass(frozen=True)
class Budget:
    """What one search may cost: layouts priced and bytes held (`WorkEstimate`)."""

    max_layouts: int
    max_bytes: int

    def refusal(self, work: WorkEstimate) -> str | None:
        """Why `work` is over the budget, or None."""
        over = []
        if work.layouts > self.max_layouts:
            over.append(f"{work.layouts:,} layouts to price (at most {self.max_layouts:,})")
        if work.bytes > self.max_bytes:
            over.append(f"about {work.bytes / 2**30:.1f} GiB to hold (at most {self.max_bytes / 2**30:.1f} GiB)")
        if not over:
            return None
        return (
            f"this search is over its work budget: {' and '.join(over)}, from {work.meshes:,} meshes and "
            f"{work.tables:,} stage tables. Narrow it: pin constraints (tp, pp, cp, ep, micro_batch, "
            "zero_stage, recompute, schedule), plan fewer GPUs, or a model with fewer layers or experts"
        )
