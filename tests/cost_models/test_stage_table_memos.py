"""The stage tables' memos (`cost_models.stage_table`: `_geometry`, `build_table`'s `_TABLE_PARTS`,
the activation floor's `_saved_per_rank`; `compute.gemm_time`'s) are keyed on every field of the
mesh their values read, and hand back, to the bit, what pricing with every memo empty gives."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from cluster_specs.presets import get_cluster
from cost_models import mesh_comm, stage_table
from cost_models.calibration import default_calibration
from cost_models.compute import ShardGeometry
from cost_models.estimate import pricing_context
from cost_models.finetune import FineTune
from cost_models.layout import Layout
from cost_models.stage_data import StageTable
from cost_models.stages import StagePartition
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec

# (model, cluster, gpus, training, layout): MoE with multi-token prediction on a pipeline, a dense
# model under FSDP with activation offload, a LoRA stack, a capped full recompute
JOBS = [
    ("deepseek-v3", "dgx-h800", 256, dict(seq_len=4096, global_batch=1024),
     dict(tp=2, pp=8, ep=16, cp=1, micro_batch=1, recompute="full")),
    ("mixtral-8x7b", "dgx-h100", 64, dict(seq_len=4096, global_batch=256),
     dict(tp=4, pp=4, ep=2, micro_batch=2, recompute="full", recompute_layers=2, activation_offload_layers=1)),
    ("llama3-8b", "dgx-h100", 64, dict(seq_len=4096, global_batch=64),
     dict(tp=2, framework="fsdp", micro_batch=1, zero_stage=3, cp=2)),
    ("llama3-8b", "dgx-h100", 64, dict(seq_len=4096, global_batch=64, method="lora"),
     dict(framework="fsdp", stack="torchtune", micro_batch=1, zero_stage=3, recompute="full", offload_activations=True)),
]


def _rank_sums(model, geo, partition, limit):  # type: ignore[no-untyped-def]
    """`stage_table._rank_sums` with the MTP blocks `_order_free` gives it."""
    return stage_table._rank_sums(geo, partition, limit, stage_table._priced_mtp(model, partition, geo.ft))


def _job(i: int):
    name, cluster, gpus, training, layout = JOBS[i]
    return pricing_context(get_model(name), TrainingSpec(**training), get_cluster(cluster), gpus, Layout(**layout))


def _forget() -> None:
    """Every memo a table goes through, as in a fresh process."""
    for memo in (
        stage_table._GEOMETRIES, stage_table._TABLE_PARTS, stage_table._SAVED, stage_table._CP_EXPOSURES,
        mesh_comm._COMM_STORES,
    ):
        memo.clear()
    stage_table._layer_arrays.cache_clear()


def _assert_same_table(a: StageTable, b: StageTable) -> None:
    """Field for field the same values, arrays to the bit (dtype, shape and bytes)."""
    for f in fields(StageTable):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes()), f.name
        else:
            assert x == y, f.name


class _Reads:
    """A resolved Layout that records which of its fields are read: its properties (`sp_`,
    `dp_`, `communicator_groups`, ...) run on the recorder, so the fields they read are recorded."""

    def __init__(self, layout: Layout) -> None:
        object.__setattr__(self, "_layout", layout)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name: str) -> object:
        attr = getattr(Layout, name, None)
        if isinstance(attr, property):
            return attr.fget(self)  # type: ignore[misc]
        if name in Layout.model_fields:
            self.read.add(name)
            return getattr(self._layout, name)
        raise AssertionError(f"a table read {name!r} of its mesh, which is not a Layout field")


@pytest.mark.parametrize("job", range(len(JOBS)))
def test_the_memo_keys_cover_every_field_read(job: int) -> None:
    """`GEOMETRY_FIELDS` are all the geometry, the activation context and the fine-tuning state read
    of a mesh; with `TABLE_FIELDS`, all that `_order_free` reads (the rest of a table is
    `_placed_comm`'s, priced for every table)."""
    ctx = _job(job)
    cal = default_calibration()
    reads = _Reads(ctx.layout)
    g = ShardGeometry.of(reads, reads.micro_batch, ctx.training.seq_len)  # type: ignore[arg-type]
    ft = FineTune.of(ctx.training, reads.stack)  # type: ignore[arg-type]
    assert reads.read <= set(stage_table.GEOMETRY_FIELDS)
    reads = _Reads(ctx.layout)
    actx = stage_table.activation_context(ctx.training, reads, ctx.model)  # type: ignore[arg-type]
    assert reads.read <= set(stage_table.ACTIVATION_FIELDS) <= set(stage_table.GEOMETRY_FIELDS)
    geo = stage_table._geometry(ctx.model, ctx.training, ctx.cluster, cal, ctx.layout)
    assert (geo.g, geo.actx, geo.ft) == (g, actx, ft)
    reads = _Reads(ctx.layout)
    store = mesh_comm.comm_store(ctx.model, ctx.training, ctx.cluster, cal, ctx.gpus)
    stage_table._order_free(ctx.model, ctx.training, ctx.cluster, ctx.gpus, reads, ctx.partition, cal, geo, store)  # type: ignore[arg-type]
    assert reads.read <= set(stage_table.GEOMETRY_FIELDS) | set(stage_table.TABLE_FIELDS)
    assert {"recompute_layers", "dp", "cross_entropy"} <= reads.read


@pytest.mark.parametrize("job", range(len(JOBS)))
def test_the_placed_communication_reads_only_its_fields(job: int) -> None:
    """`_placed_comm` reads of a mesh only `PLACED_FIELDS` (its memo's key), and a table's placed
    communication from that memo is what pricing it again gives."""
    ctx = _job(job)
    cal = default_calibration()
    table = stage_table.build_table(ctx.model, ctx.training, ctx.cluster, ctx.gpus, ctx.layout, ctx.partition, cal)
    reads = _Reads(ctx.layout)
    fresh = stage_table._price_placed(
        ctx.model, ctx.training, ctx.cluster, ctx.gpus, reads, cal, table.class_attention_f, table.class_counts, {}  # type: ignore[arg-type]
    )
    assert reads.read <= set(stage_table.PLACED_FIELDS)
    assert {"tp", "order", "micro_batch"} <= reads.read
    for name, value in fresh.items():
        kept = getattr(table, name)
        assert (np.asarray(kept).tobytes(), type(kept)) == (np.asarray(value).tobytes(), type(value)), name


@pytest.mark.parametrize("job", range(len(JOBS)))
def test_a_memoized_table_is_the_fresh_one(job: int) -> None:
    """A table built from the memos that another rank order of the mesh and another knob setting
    filled equals, to the bit, the one built with every memo empty."""
    ctx = _job(job)
    cal = default_calibration()
    mesh = ctx.layout
    other_order = "tp-cp-pp-ep-dp" if mesh.order != "tp-cp-pp-ep-dp" else "tp-cp-ep-dp-pp"
    other = mesh.model_copy(update=dict(order=other_order, zero_stage=(mesh.zero_stage + 1) % 4))
    _forget()
    fresh = stage_table.build_table(ctx.model, ctx.training, ctx.cluster, ctx.gpus, mesh, ctx.partition, cal)
    _forget()
    stage_table.build_table(ctx.model, ctx.training, ctx.cluster, ctx.gpus, other, ctx.partition, cal)
    entries = len(stage_table._TABLE_PARTS)
    memoized = stage_table.build_table(ctx.model, ctx.training, ctx.cluster, ctx.gpus, mesh, ctx.partition, cal)
    assert len(stage_table._TABLE_PARTS) == entries == 1  # shared, not built again
    _assert_same_table(memoized, fresh)
    # every array of the shared parts is read-only (tables share them)
    (parts,) = stage_table._TABLE_PARTS.values()
    writeable = [name for name, value in parts.items() if isinstance(value, np.ndarray) and value.flags.writeable]
    assert not writeable and not memoized.compute.flags.writeable


@pytest.mark.parametrize("job", range(len(JOBS)))
def test_the_geometrys_quantities_are_a_full_recompute_of_every_layer(job: int) -> None:
    """`_Geometry.every_layer` and `every_peak`, which `_rank_sums` reads when full recompute
    re-runs every layer, hold what it builds for a limit that re-runs every layer of each rank; also
    on a probe partition of fewer layers than the model."""
    ctx = _job(job)
    cal = default_calibration()
    geo = stage_table._geometry(ctx.model, ctx.training, ctx.cluster, cal, ctx.layout)
    probe = StagePartition.even(ctx.model.num_layers // 2, ctx.partition.pp)
    for partition in (ctx.partition, probe):
        every = _rank_sums(ctx.model, geo, partition, None)
        limited = _rank_sums(ctx.model, geo, partition, ctx.model.num_layers)
        for a, b in zip(every, limited, strict=True):
            assert (a.shape, a.tobytes()) == (b.shape, b.tobytes())


def test_the_memos_start_over_when_full(monkeypatch) -> None:
    """Past their bounds the memos start over, and the tables they then give are the fresh ones."""
    ctx = _job(1)
    cal = default_calibration()
    _forget()
    fresh = stage_table.build_table(ctx.model, ctx.training, ctx.cluster, ctx.gpus, ctx.layout, ctx.partition, cal)
    monkeypatch.setattr(stage_table._GEOMETRIES, "limit", 1)
    monkeypatch.setattr(stage_table._TABLE_PARTS, "limit", 1)
    other = ctx.layout.model_copy(update=dict(micro_batch=1, grad_accum=ctx.layout.grad_accum_ * 2))
    stage_table.build_table(ctx.model, ctx.training, ctx.cluster, ctx.gpus, other, ctx.partition, cal)
    assert len(stage_table._GEOMETRIES) == len(stage_table._TABLE_PARTS) == 1
    _assert_same_table(
        stage_table.build_table(ctx.model, ctx.training, ctx.cluster, ctx.gpus, ctx.layout, ctx.partition, cal), fresh
    )


def _floor_of_each_mode(model, training, mesh, partition, schedule, vpp, cal) -> np.ndarray:
    """`activation_floor` mode by mode, from the saved bytes of the layers (`_layer_saved_bytes`),
    without its memo: each mode's per-rank sum a bincount of its own."""
    from cost_models import stacks

    cal = stacks.stack_calibration(cal, mesh.stack)
    per_layer = stage_table._layer_saved_bytes(model, stage_table.activation_context(training, mesh, model))
    owner = stage_table._partition_index(partition)[0]
    a_units, _ = stage_table._split_peaks(schedule, partition.pp, vpp, mesh.grad_accum_, mesh.framework, mesh.moe_a2a_overlap)
    floor = np.full(4, np.nan)
    for mode in (0, 1, 3):
        saved = np.bincount(owner, weights=per_layer[mode][: len(owner)], minlength=partition.pp)
        floor[mode] = float((a_units.max(axis=0) * saved).max()) + cal.cuda_context_bytes
    return floor


def test_the_activation_floor_is_each_modes_own() -> None:
    """`activation_floor`, its saved bytes per rank memoized (`_saved_per_rank`: all three modes in
    one bincount) and shared by meshes of other data-parallel degrees, is the floor each mode's own
    sums give, to the bit: on the whole model and on a probe partition, fresh and from the memo."""
    model, cluster = get_model("mixtral-8x7b"), get_cluster("dgx-h100")
    training = TrainingSpec(seq_len=4096, global_batch=256)
    cal = default_calibration()
    compared = 0
    _forget()
    for _fresh_then_memoized in range(2):
        for tp, pp, mb, vpp, schedule in ((2, 4, 1, 1, "1f1b"), (4, 4, 2, 2, "interleaved_1f1b"), (2, 2, 1, 1, "1f1b")):
            for dp in (64 // (tp * pp), 64 // (tp * pp) // 2):
                mesh = Layout(tp=tp, pp=pp, dp=dp, ep=2, vpp=vpp, micro_batch=mb, schedule=schedule)
                mesh = mesh.resolved(dp * tp * pp, training)
                for partition in (StagePartition.for_layout(model.num_layers, mesh), StagePartition.even(pp * 2, pp)):
                    got = stage_table.activation_floor(model, training, cluster, mesh, partition, schedule, vpp, cal)
                    want = _floor_of_each_mode(model, training, mesh, partition, schedule, vpp, cal)
                    assert got is not None and got.tobytes() == want.tobytes()
                    compared += 1
        assert len(stage_table._SAVED) == 2  # one entry per activation context (tp, mb), whatever pp, dp and partition
    assert compared == 24


def test_a_memoized_gemm_time_is_the_atlas_lookup() -> None:
    """`compute.gemm_time` memoizes scalar shapes per GPU and calibration: a hit is the fresh
    lookup to the bit, another calibration gets its own seconds, array shapes and lookups inside a
    recorder (`kernels.record`, which must see every lookup) bypass the memo."""
    from dataclasses import replace

    from cost_models import compute
    from cost_models.kernels.record import recording

    gpu = get_cluster("dgx-h100").gpu
    cal = default_calibration()
    slower = replace(cal, gemm_efficiency=cal.gemm_efficiency / 2)
    gemm = compute.Gemm(8192.0, 4096.0, 4096.0, 1)
    compute._GEMM_SECONDS.clear()
    fresh = compute.gemm_time(gemm, gpu.model_copy(), "bf16", 2, cal)  # an equal GPU, another object: its own entry
    first = compute.gemm_time(gemm, gpu, "bf16", 2, cal)
    again = compute.gemm_time(gemm, gpu, "bf16", 2, cal)
    assert first == again == fresh and len(compute._GEMM_SECONDS) == 2
    assert abs(compute.gemm_time(gemm, gpu, "bf16", 2, slower) / first - 2) < 1e-12
    batched = compute.gemm_time(compute.Gemm(np.array([8192.0, 4096.0]), 4096.0, 4096.0, 1), gpu, "bf16", 2, cal)
    assert len(compute._GEMM_SECONDS) == 3 and abs(batched[0] / first - 1) < 1e-14  # not memoized
    with recording() as lookups:
        assert compute.gemm_time(gemm, gpu, "bf16", 2, cal) == first
    assert (8192, 4096, 4096, "bf16") in lookups.gemm


@pytest.mark.parametrize("limit", [None, 2])
def test_rank_maxima_are_the_masked_maxima(limit) -> None:
    """`_rank_sums` takes each rank's largest layer, weights, dequantized copy and recompute working
    set over the run of layers the rank holds (`PartitionIndex.by_rank`, `held`, `starts`): the
    maxima of the layer rows masked to the rank's layers, to the bit, on one chunk per rank, on
    interleaved and V-shape chunks, and on probe partitions whose ranks hold few layers or none."""
    ctx = _job(1)
    cal = default_calibration()
    geo = stage_table._geometry(ctx.model, ctx.training, ctx.cluster, cal, ctx.layout)
    layers = ctx.model.num_layers
    partitions = [
        StagePartition.even(layers, 4), StagePartition.even(layers, 4, 2), StagePartition.even(layers, 2, 2, True),
        StagePartition((3, 0, 2, 0), 4), StagePartition((0, 2, 0, 1, 1, 0), 3, 2), StagePartition((0, 0), 2),
    ]
    for partition in partitions:
        index = stage_table._partition_index(partition)
        n = len(index.owner)
        if limit is None:
            rows = geo.every_peak[:, :n]
        else:
            arr = {k: v[:n] for k, v in geo.per_layer.items()}
            recomputed = np.cumsum(index.mine, axis=1)[index.owner, np.arange(n)] - 1 < limit
            rows = stage_table._peak_rows(arr, recomputed)
        want = np.where(index.mine[None, :, :], rows[:, None, :], 0.0).max(axis=2, initial=0.0)
        sums = _rank_sums(ctx.model, geo, partition, limit)
        largest, working, peaks = sums[2], sums[4], sums[15]
        assert np.vstack([largest, peaks, working]).tobytes() == want.tobytes(), partition
        assert (index.by_rank is None) == (partition.vpp == 1)


@pytest.mark.parametrize("job", range(len(JOBS)))
def test_the_activation_floor_reads_only_its_fields(job: int) -> None:
    """`activation_floor` reads of a mesh only `FLOOR_FIELDS` (the search shares one floor between
    the meshes equal in them, `planner.search`'s `floor_values`)."""
    ctx = _job(job)
    reads = _Reads(ctx.layout)
    stage_table.activation_floor(
        ctx.model, ctx.training, ctx.cluster, reads, ctx.partition, ctx.layout.schedule_, ctx.layout.vpp, default_calibration()  # type: ignore[arg-type]
    )
    assert reads.read <= set(stage_table.FLOOR_FIELDS)
    assert "framework" in reads.read


@pytest.mark.parametrize("job", [0, 1])
def test_ranks_of_one_layer_class_sum_as_the_bincount_does(job: int, monkeypatch) -> None:
    """Where every rank holds layers of one class (`_uniform_ranks`), `_rank_sums` reads its sums,
    maxima and class counts from the class's runs (`_Geometry.class_runs`) instead of a bincount:
    to the bit what the bincount gives, on DeepSeek-V3 (dense first layers, MoE after, MTP) and
    Mixtral, with one chunk per rank, interleaved, V-shape and probe partitions."""
    ctx = _job(job)
    cal = default_calibration()
    geo = stage_table._geometry(ctx.model, ctx.training, ctx.cluster, cal, ctx.layout)
    layers = ctx.model.num_layers
    partitions = [
        StagePartition.even(layers, 4), StagePartition.even(layers, 2, 2), StagePartition.even(layers, 2, 2, True),
        StagePartition.even(layers, 8), StagePartition((3, layers - 3), 2), StagePartition((2, 0, 1, 0), 4),
        StagePartition((0, 0), 2), StagePartition.even(layers, 1),
    ]
    fast = []
    for partition in partitions:
        fast.append(_rank_sums(ctx.model, geo, partition, None))
    monkeypatch.setattr(stage_table, "_uniform_ranks", lambda partition, of_layer, n_classes: None)
    uniform = 0
    for partition, got in zip(partitions, fast, strict=True):
        want = _rank_sums(ctx.model, geo, partition, None)
        uniform += stage_table._UNIFORM.get((partition, id(geo.of_layer))) not in (None, ())
        for a, b in zip(got, want, strict=True):
            assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes()), partition
    if len(geo.firsts) == 1:  # one layer class: every partition takes the class runs
        assert uniform == len(partitions)
    else:  # DeepSeek-V3: a rank holding dense and MoE layers takes the bincount
        assert 0 < uniform < len(partitions)
