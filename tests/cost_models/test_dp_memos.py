"""The data-parallel times' memos (`cost_models.step_time._dp_grid`: the weight volumes, which read
no rank order, their prices over each order's groups, the times with the layers' compute, and the
key kept on each table) are keyed on every field their values read, and hand back, to the bit,
what `data_parallel_times` gives with every memo empty."""

from __future__ import annotations

import operator
from dataclasses import replace

import numpy as np
import pytest

from cluster_specs.presets import get_cluster
from cost_models import stage_table, step_time
from cost_models.calibration import Calibration, default_calibration
from cost_models.layout import Layout
from cost_models.mesh import mesh_strides
from cost_models.stage_data import Sharding, StageTable
from cost_models.stages import StagePartition
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.space import ORDERS

# (model, cluster, gpus, training, layout): MoE on a pipeline with EP (the expert-data-parallel
# group's stride moves with the order), dense FSDP with CP under a fine-tuning stack (autocast casts,
# gradient accumulation), a DeepSpeed release that gathers per parameter tensor
JOBS = [
    ("mixtral-8x7b", "dgx-h100", 64, dict(seq_len=4096, global_batch=256),
     dict(tp=2, pp=2, ep=4, micro_batch=1, recompute="full")),
    ("llama3-8b", "dgx-h100", 64, dict(seq_len=4096, global_batch=128),
     dict(tp=2, cp=2, pp=2, framework="fsdp", stack="hf", micro_batch=1, zero_stage=3)),
    ("llama3-8b", "dgx-h100", 64, dict(seq_len=4096, global_batch=128),
     dict(tp=2, pp=2, framework="deepspeed", framework_version="0.3.13", micro_batch=1, zero_stage=3, recompute="full")),
]


def _forget() -> None:
    """Every memo the data-parallel times go through, as in a fresh process."""
    for memo in (step_time._PER_PAIR, step_time._SECONDS, step_time._DP_GRIDS, step_time._DP_WEIGHTS, step_time._DP_VOLUMES):
        memo.clear()


def _tables(job: int) -> tuple[list[StageTable], tuple[Sharding, ...], Calibration]:
    """The job's table at each rank order of `planner.space.ORDERS` (a new table each, as the search
    builds them), every ZeRO stage's pairs over the whole data x context group and a part of it,
    with ZeRO++ (hpZ, qwZ, qgZ) on one of them, and the calibration."""
    name, cluster, gpus, training, layout = JOBS[job]
    model, tr, cl, cal = get_model(name), TrainingSpec(**training), get_cluster(cluster), default_calibration()
    tables = []
    for order in ORDERS:
        lay = Layout(**layout, order=order).resolved(gpus, tr)
        tables.append(stage_table.build_table(model, tr, cl, gpus, lay, StagePartition.for_layout(model.num_layers, lay), cal))
    dp = tables[0].mesh.dp_
    shardings = (
        Sharding(0, 1), Sharding(1, dp), Sharding(2, dp), Sharding(3, dp), Sharding(3, dp // 2),
        Sharding(3, dp, hpz=2, qwz=True, qgz=True),
    )
    return tables, shardings, cal


def _assert_same(a: object, b: object) -> None:
    """Field for field the same values, arrays to the bit (dtype, shape and bytes)."""
    for name in b.__dataclass_fields__:  # type: ignore[attr-defined]
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(y, np.ndarray):
            assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes()), name
            assert not x.flags.writeable, name  # shared between tables: read-only
        else:
            assert x == y, name


@pytest.mark.parametrize("job", range(len(JOBS)))
def test_memoized_data_parallel_times_are_the_fresh_ones(job: int) -> None:
    """The data-parallel times of each rank order, from volumes another order filled and prices
    another order with the same strides filled, equal to the bit those priced with every memo
    empty; the orders share one `_WeightVolumes`, and price it once per pair of strides."""
    tables, shardings, cal = _tables(job)
    fresh = []
    for t in tables:
        _forget()
        fresh.append(step_time.data_parallel_times(t, shardings, cal))
    _forget()
    for t, want in zip(tables, fresh, strict=True):
        _assert_same(step_time._dp_grid(t, shardings, cal, step_time._dp_table_key(t, cal)), want)
    strides = {(s.dp_cp, s.expert_dp) for s in (mesh_strides(t.mesh) for t in tables)}
    assert len(step_time._DP_VOLUMES) == 1
    assert len(step_time._DP_WEIGHTS) == len(strides) > 1
    assert len(step_time._DP_GRIDS) == len(tables)  # keyed on the order itself


@pytest.mark.parametrize("job", range(len(JOBS)))
def test_the_volumes_read_no_rank_order(job: int) -> None:
    """One order's `_WeightVolumes` priced at another order's strides is that order's
    `_WeightCollectives` to the bit: the order places the groups and nothing else."""
    tables, shardings, cal = _tables(job)
    volumes = step_time._weight_volumes(tables[0], shardings, cal)
    for t in tables:
        stv = mesh_strides(t.mesh)
        _assert_same(step_time._price_volumes(t, volumes, stv.dp_cp, stv.expert_dp, cal),
                     step_time._weight_collectives(t, shardings, cal))
    assert (volumes.per_tensor is not None) == (JOBS[job][4].get("framework_version") is not None)


class _Reads:
    """A table (or a resolved Layout) that records which of its fields are read; a Layout's
    properties (`dp_`, `expert_dp`, `grad_accum_`, ...) run on the recorder, so the fields they read
    are recorded, and a table's mesh is a recorder too (its reads recorded with `mesh.`)."""

    _obj: object
    _read: set[str]
    _prefix: str

    def __init__(self, obj: object, read: set[str], prefix: str = "") -> None:
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_read", read)
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name: str) -> object:
        attr = getattr(type(self._obj), name, None)
        if isinstance(attr, property):
            return attr.fget(self)  # type: ignore[misc]
        self._read.add(self._prefix + name)
        value = getattr(self._obj, name)
        return _Reads(value, self._read, "mesh.") if name == "mesh" else value

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)


@pytest.mark.parametrize("job", range(len(JOBS)))
def test_the_memo_keys_cover_every_field_read(job: int) -> None:
    """Every field of a table and of its mesh that the data-parallel times read is one their table
    key reads (`_dp_table_key`); of those, the weight volumes read none that the volume key leaves
    out (the rank order, the MoE folding, the micro-batch count, the layer classes' compute), and
    pricing them reads the order only through the strides the weight key adds. The job objects the
    key names by id are those `_dp_grid`'s entries keep."""
    tables, shardings, cal = _tables(job)
    t = tables[1]
    table_reads: set[str] = set()
    key = step_time._dp_table_key(_Reads(t, table_reads), cal)  # type: ignore[arg-type]
    assert {"cluster", "training", "model"} <= table_reads  # by id: `_dp_grid`'s entries keep them
    left_out: set[str] = set()  # what the volume key leaves out
    operator.attrgetter(*step_time.DP_MESH_FIELDS[len(step_time.DP_VOLUME_MESH_FIELDS):])(_Reads(t, left_out).mesh)
    left_out = left_out - {"mesh"} | set(step_time.DP_ARRAY_FIELDS[-2:])
    assert left_out == {"mesh.order", "mesh.moe_parallel_folding", "mesh.grad_accum", "class_forward", "class_backward"}

    volume_reads: set[str] = set()
    volumes = step_time._weight_volumes(_Reads(t, volume_reads), shardings, cal)  # type: ignore[arg-type]
    assert volume_reads <= table_reads - left_out
    priced_reads: set[str] = set()
    stv = mesh_strides(t.mesh)
    weights = step_time._price_volumes(_Reads(t, priced_reads), volumes, stv.dp_cp, stv.expert_dp, cal)  # type: ignore[arg-type]
    assert priced_reads <= table_reads - left_out
    assert step_time._dp_weight_key(t, key) == (step_time._dp_volume_key(key), stv.dp_cp, stv.expert_dp)
    compute_reads: set[str] = set()
    step_time._with_compute(_Reads(t, compute_reads), weights, cal)  # type: ignore[arg-type]
    assert compute_reads <= table_reads
    # the orders of one mesh: one volume key, a table key each
    keys = [step_time._dp_table_key(other, cal) for other in tables]
    assert len({step_time._dp_volume_key(k) for k in keys}) == 1 and len(set(keys)) == len(tables)


def test_a_tables_key_is_kept_on_it_and_made_again_on_another_mesh() -> None:
    """`_dp_table_key` hands a table the very key it made for it (same calibration and mesh); a copy
    on another rank order (`stage_table.reorder`) gets that order's key, from its arrays' bytes it
    already holds, equal to a fresh build's; another calibration gets its own key."""
    tables, _, cal = _tables(0)
    t, other = tables[0], tables[1]
    key = step_time._dp_table_key(t, cal)
    assert step_time._dp_table_key(t, cal) is key
    moved = stage_table.reorder(t, other.mesh, cal)
    assert moved.dp_key_memo is t.dp_key_memo  # copied along: stale for the new mesh
    moved_key = step_time._dp_table_key(moved, cal)
    assert moved_key == step_time._dp_table_key(other, cal) != key
    assert moved.dp_key_memo is not None and t.dp_key_memo is not None
    assert moved.dp_key_memo[3] is t.dp_key_memo[3]  # the bytes read once
    assert step_time._dp_table_key(t, cal) is key  # the original's memo untouched
    # the search's combined-1F1B twin: the table of the same mesh, a copied memo
    twin = t.sharing(mesh=t.mesh.model_copy(update=dict(moe_a2a_overlap=True)))
    assert step_time._dp_table_key(twin, cal) == key
    recal = replace(cal)
    assert step_time._dp_table_key(t, recal) != key and step_time._dp_table_key(t, recal)[2] == id(recal)
