"""Physics of the step-time composition (cost_models.step_time), on every layout the search of a
reference job prices: the step is never shorter than its compute, nor than any channel's busy
time, and the exposed communication is at least the communication the compute cannot cover."""

from __future__ import annotations

import numpy as np
import pytest

from cluster_specs.presets import get_cluster
from cost_models import step_time
from cost_models.calibration import default_calibration
from cost_models.compute import hbm_bandwidth
from cost_models.estimate import setting_of
from cost_models.layout import Layout, validate_layout
from cost_models.stage_data import KnobArrays
from cost_models.stage_table import build_table, price_memory
from cost_models.stages import StagePartition
from cost_models.step_time import _dp_grid, _dp_table_key, price_time
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.plan import SearchConstraints
from planner.space import Stack, meshes, micro_batches, pipeline_options, settings, to_layout

JOBS = [
    # (model, cluster, gpus, seq_len, global batch, precision, framework): dense with TP/PP/CP,
    # MoE with EP across nodes, FSDP
    ("llama3-70b", "dgx-h100", 64, 8192, 64, "bf16", "megatron"),
    ("mixtral-8x7b", "dgx-h100", 32, 4096, 64, "bf16", "megatron"),
    ("llama3-8b", "dgx-h100", 16, 8192, 32, "bf16", "fsdp"),
    ("mixtral-8x7b", "dgx-h100", 32, 4096, 64, "bf16", "fsdp"),  # V-shape schedules with EP
]

COMM_PARTS = ("tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s", "comm_wait_s")


def _priced_tables(model_name, cluster_name, gpus, seq, gbs, precision, framework, limit=120):
    """The tables the search would price for this job (every mesh, its smallest micro-batch and
    first pipeline option), up to `limit`, with their knob grids."""
    model, cluster = get_model(model_name), get_cluster(cluster_name)
    training = TrainingSpec(seq_len=seq, global_batch=gbs, precision=precision)
    c = SearchConstraints(framework=framework)
    cal = default_calibration()
    out = []
    for mesh in meshes(model, cluster, gpus, c):
        if mesh.tp > cluster.domain_size:
            continue
        mbs = micro_batches(training, mesh.dp, c)
        if not mbs:
            continue
        mb = mbs[0]
        options = [o for o in pipeline_options(model, training, mesh, mb, c) if o.schedule != "gpipe"]
        if not options:
            continue
        option = options[-1]  # the most interleaved: the most p2p and warm-up
        grid = settings(mesh, cluster, c)
        layout = to_layout(mesh, mb, option, grid[0], Stack(framework), validate=False)
        if validate_layout(model, training, gpus, layout):
            continue  # the search's validation rejects it: not priced
        lay = layout.resolved(gpus, training)
        partition = StagePartition.for_layout(model.num_layers, lay)
        table = build_table(model, training, cluster, gpus, lay, partition, cal)
        out.append((table, grid, option.vpp, option.schedule))
        if len(out) >= limit:
            break
    assert out, "no layout priced"
    return out, cal


def _bare_compute_s(table) -> float:
    """Seconds of the slowest rank's forward + backward over the step, no SM taken from it."""
    return table.mesh.grad_accum_ * float(table.compute.max())


@pytest.mark.parametrize("job", JOBS, ids=[f"{j[0]}-{j[-1]}" for j in JOBS])
def test_step_is_bounded_by_compute_and_every_channel(job) -> None:
    tables, cal = _priced_tables(*job)
    checked = 0
    for table, grid, vpp, schedule in tables:
        prices = price_memory(table, grid, schedule, vpp, cal)
        timed = price_time(table, grid, prices, vpp, cal)
        knobs = KnobArrays.of(grid)
        phases = step_time.phase_arrays(table, vpp, cal)
        dp = _dp_grid(table, knobs.shardings, cal, _dp_table_key(table, cal))
        traffic = step_time.channel_traffic(table, knobs, dp, phases)  # (J, CHANNELS, pp)
        step = timed.step_s
        parts = timed.parts
        ga = table.mesh.grad_accum_
        # compute of the slowest rank over the step, recompute included
        compute = ga * (table.compute[None, :] + table.recompute[knobs.mode]).max(axis=1)
        assert np.all(step >= compute - 1e-9)
        busiest = traffic.max(axis=(1, 2))
        assert np.all(step >= busiest + cal.step_overhead_s - 1e-9)
        # the parts sum to the step, none negative
        total = sum(parts[k] for k in step_time.STEP_PARTS)
        np.testing.assert_allclose(total, step, rtol=1e-9)
        assert all(np.all(parts[k] >= -1e-12) for k in step_time.STEP_PARTS)
        # exposed communication >= communication minus the work it can hide behind
        exposed = sum(parts[k] for k in COMM_PARTS)
        cover = parts["compute_s"] + parts["recompute_s"] + parts["bubble_s"] + parts["optimizer_s"]
        assert np.all(exposed >= busiest - cover - 1e-9)
        checked += len(grid)
    assert checked > 100


def test_comm_beside_compute_counts_only_the_traffic_that_overlaps_compute() -> None:
    """Exposed communication runs while compute waits (no SMs taken from it); each channel overlaps at
    most the window's compute; the host link's copies (copy engines) take no SMs."""
    busy = np.zeros((3, step_time.CHANNELS, 1))
    busy[0, 0, 0] = 2.0  # 2 s on NVLink, 0.5 s of it exposed, 4 s of compute: 1.5 s beside compute
    busy[1, 1, 0] = 9.0  # 9 s on the NICs beside 4 s of compute: 4 s beside it at most
    busy[2, 2, 0] = 3.0  # host-link copies only
    exposed = np.array([[0.5], [0.0], [0.0]])
    compute = np.array([[4.0]])
    beside = step_time.comm_beside_compute(busy, exposed, compute)
    np.testing.assert_allclose(beside[:, 0], [1.5, 4.0, 0.0])
    assert step_time.comm_sm_share(132) == pytest.approx(20 / 132)
    assert step_time.comm_sm_share(None) == 0.0
    # F&B pairs pay the same SMs for the whole pair; a device without SMs pays nothing either way
    assert step_time.comm_sm_slowdown(132) == pytest.approx(132 / 112)
    assert step_time.comm_sm_slowdown(None) == 1.0


def test_hidden_collectives_stretch_the_compute_they_run_beside() -> None:
    """FSDP's ZeRO-3 gathers hide behind the layers' compute, which runs on the SMs the collectives
    leave (`step_time.COMM_SMS`): the priced compute exceeds the bare compute by at most 20/132 of
    the step's NVLink + NIC traffic, and more under ZeRO-3 than under ZeRO-1 on the same mesh."""
    model, training = get_model("llama3-8b"), TrainingSpec(seq_len=8192, global_batch=64)
    cluster, cal = get_cluster("dgx-h100"), default_calibration()
    stolen = {}
    for zero in (1, 3):
        lay = Layout(zero_stage=zero, micro_batch=1, framework="fsdp").resolved(64, training)
        table = build_table(model, training, cluster, 64, lay, StagePartition.for_layout(model.num_layers, lay), cal)
        grid = [setting_of(lay)]
        timed = price_time(table, grid, price_memory(table, grid, lay.schedule_, lay.vpp, cal), lay.vpp, cal)
        knobs = KnobArrays.of(grid)
        phases = step_time.phase_arrays(table, lay.vpp, cal)
        dp = _dp_grid(table, knobs.shardings, cal, _dp_table_key(table, cal))
        nccl = float(step_time.channel_traffic(table, knobs, dp, phases)[0, : step_time.HOST].sum())
        bare = _bare_compute_s(table)
        kernels = lay.grad_accum_ * float(dp.kernels_f[0, 0] + dp.kernels_b[0, 0])  # FSDP2's copies
        stolen[zero] = float(timed.parts["compute_s"][0]) - bare - kernels
        assert 0.0 < stolen[zero] <= 20 / 132 * nccl + 1e-9
    assert stolen[3] > stolen[1]


def test_fsdp2_copies_run_on_the_compute_stream() -> None:
    """FSDP2 copies each gathered layer out of the flat all-gather buffer (2 bytes moved per weight
    byte, forward and backward) and each gradient into the reduce-scatter buffer (param + grad bytes
    per element): HBM-bound kernels on the compute stream, priced in `compute_s`. Its ZeRO-1 gathers
    (and copies out) in every forward and reduces once per step: no per-micro-batch copy-in. FSDP1
    (`Layout.fsdp_flat_params`) gathers into the flat parameter (no copy-out) but casts its gradient
    into the reduce-scatter input. DeepSpeed gathers into and reduces from buffers the parameters
    are views of: no copies."""
    model, training = get_model("llama3-8b"), TrainingSpec(seq_len=8192, global_batch=64)
    cluster, cal = get_cluster("dgx-h100"), default_calibration()
    for framework, zero, flat in (("fsdp", 3, False), ("fsdp", 3, True), ("fsdp", 1, False), ("deepspeed", 3, False)):
        hbm = hbm_bandwidth(cluster.gpu, cal, framework)
        lay = Layout(zero_stage=zero, micro_batch=1, framework=framework, fsdp_flat_params=flat).resolved(64, training)
        table = build_table(model, training, cluster, 64, lay, StagePartition.for_layout(model.num_layers, lay), cal)
        grid = [setting_of(lay)]
        knobs = KnobArrays.of(grid)
        dp = _dp_grid(table, knobs.shardings, cal, _dp_table_key(table, cal))
        weights = float(table.weight_bytes.sum())
        elements = float(table.trainable.sum())
        copy_in = elements * (training.param_bytes + training.grad_bytes) / hbm
        if (framework, zero, flat) == ("fsdp", 3, True):  # FSDP1: the copy-in (its cast) only
            assert float(dp.kernels_f[0, 0]) == 0.0
            assert float(dp.kernels_b[0, 0]) == pytest.approx(copy_in, rel=1e-9)
        elif (framework, zero) == ("fsdp", 1):  # the forward's gathers only (module doc)
            assert float(dp.kernels_f[0, 0]) == pytest.approx(2 * weights / hbm, rel=1e-9)
            assert float(dp.kernels_b[0, 0]) == 0.0
        elif (framework, zero) == ("fsdp", 3):
            assert float(dp.kernels_f[0, 0]) == pytest.approx(2 * weights / hbm, rel=1e-9)
            assert float(dp.kernels_b[0, 0]) == pytest.approx(2 * weights / hbm + copy_in, rel=1e-9)
            timed = price_time(table, grid, price_memory(table, grid, lay.schedule_, lay.vpp, cal), lay.vpp, cal)
            kernels = lay.grad_accum_ * float(dp.kernels_f[0, 0] + dp.kernels_b[0, 0])
            assert float(timed.parts["compute_s"][0]) >= _bare_compute_s(table) + kernels
        else:
            assert float(dp.kernels_f[0, 0]) == float(dp.kernels_b[0, 0]) == 0.0


def test_tables_of_one_mesh_at_other_micro_batch_counts_share_their_weight_collectives() -> None:
    """The data-parallel times of two tables of one mesh (Llama 3 8B at 1,024 tokens on 64 H100,
    FSDP ZeRO-3 under the Hugging Face stack, which accumulates gradients) at micro-batch 1 and 2
    (2 and 1 micro-batches) price their weight collectives once
    (`step_time._DP_WEIGHTS`), and each equals `data_parallel_times` of its own table to the bit:
    the gathers the compute hides and the accumulation follow each table's micro-batches."""
    from cost_models.stage_data import Sharding

    model, training = get_model("llama3-8b"), TrainingSpec(seq_len=1024, global_batch=128)
    cluster, cal = get_cluster("dgx-h100"), default_calibration()
    shardings = (Sharding(3, 64), Sharding(3, 8), Sharding(1, 64))
    step_time._DP_GRIDS.clear()
    step_time._DP_WEIGHTS.clear()
    times = []
    for mb in (1, 2):
        lay = Layout(zero_stage=3, micro_batch=mb, framework="fsdp", stack="hf").resolved(64, training)
        table = build_table(model, training, cluster, 64, lay, StagePartition.for_layout(model.num_layers, lay), cal)
        dp = _dp_grid(table, shardings, cal, _dp_table_key(table, cal))
        fresh = step_time.data_parallel_times(table, shardings, cal)
        for name in step_time.DataParallelTimes.__dataclass_fields__:
            assert np.array_equal(getattr(dp, name), getattr(fresh, name)), name
        times.append(dp)
    assert len(step_time._DP_GRIDS) == 2 and len(step_time._DP_WEIGHTS) == 1
    assert times[0].traffic_f is times[1].traffic_f  # shared
    assert np.all(times[0].exposed_b[:2] > times[1].exposed_b[:2])  # a micro-batch of 2 hides more of the gathers
    assert not np.array_equal(times[0].kernels_b, times[1].kernels_b)  # 2 micro-batches accumulate, 1 does not


def test_fsdp_zero1_gathers_in_every_forward_megatron_once_per_step() -> None:
    """FSDP frees the unsharded parameters after each backward, so its ZeRO-1 all-gathers them in every
    micro-batch's forward (`runtime.parallelize`); Megatron's distributed optimizer keeps them and
    all-gathers the updated weights once per step."""
    model, training = get_model("llama3-8b"), TrainingSpec(seq_len=8192, global_batch=64)
    cluster, cal = get_cluster("dgx-h100"), default_calibration()
    for framework in ("fsdp", "megatron"):
        lay = Layout(zero_stage=1, micro_batch=1, framework=framework).resolved(64, training)
        table = build_table(model, training, cluster, 64, lay, StagePartition.for_layout(model.num_layers, lay), cal)
        knobs = KnobArrays.of([setting_of(lay)])
        dp = _dp_grid(table, knobs.shardings, cal, _dp_table_key(table, cal))
        per_mb, per_step = float(dp.traffic_f[0].sum()), float(dp.gather[0].sum())
        if framework == "fsdp":
            assert per_mb > 0 and per_step == 0.0
            assert float(dp.traffic_b[0].sum()) == 0.0  # no backward gather, one reduction per step
        else:
            assert per_mb == 0.0 and per_step > 0


def test_megatron_fsdp_without_gradient_fusion_copies_each_gradient() -> None:
    """Without gradient-accumulation fusion (NeMo 2.3 / 2.4 under Megatron FSDP) each weight GEMM writes
    param.grad and a hook copies it into the reduce buffer: param + grad bytes per trained element, per
    micro-batch, in the backward's compute-stream kernels, the token embedding's left to
    `compute.embedding_gradient_time`. The distributed optimizer (ZeRO-1) keeps the fusion, and so does
    Megatron FSDP by default (Megatron-Core 0.14+)."""
    model, training = get_model("llama3-8b"), TrainingSpec(seq_len=8192, global_batch=64)
    cluster, cal = get_cluster("dgx-h100"), default_calibration()
    hbm = hbm_bandwidth(cluster.gpu, cal, "megatron")
    embedding = model.vocab_size * model.hidden_size
    for zero, fused in ((3, False), (2, False), (3, True), (1, False)):
        lay = Layout(zero_stage=zero, micro_batch=1, megatron_fsdp_gradient_fusion=fused).resolved(64, training)
        table = build_table(model, training, cluster, 64, lay, StagePartition.for_layout(model.num_layers, lay), cal)
        knobs = KnobArrays.of([setting_of(lay)])
        dp = _dp_grid(table, knobs.shardings, cal, _dp_table_key(table, cal))
        copied = (float(table.trainable.sum()) - embedding) * (training.param_bytes + training.grad_bytes) / hbm
        expected = copied if zero >= 2 and not fused else 0.0
        assert float(dp.kernels_b[0, 0]) == pytest.approx(expected, rel=1e-9)
        assert float(dp.kernels_f[0, 0]) == 0.0
    problems = validate_layout(model, training, 64, Layout(framework="fsdp", megatron_fsdp_gradient_fusion=False))
    assert [p.field for p in problems] == ["megatron_fsdp_gradient_fusion"]
    with pytest.raises(ValueError, match="megatron_fsdp_gradient_fusion"):
        SearchConstraints(framework="fsdp", megatron_fsdp_gradient_fusion=False)
    c = SearchConstraints(megatron_fsdp_gradient_fusion=False)
    mesh = next(iter(meshes(model, cluster, 64, c)))
    option = pipeline_options(model, training, mesh, 1, c)[0]
    setting = settings(mesh, cluster, c)[0]
    assert not to_layout(mesh, 1, option, setting, Stack.of(c)).megatron_fsdp_gradient_fusion


def test_flat_params_are_fsdp_only() -> None:
    training = TrainingSpec(seq_len=4096, global_batch=64)
    problems = validate_layout(get_model("llama3-8b"), training, 64, Layout(fsdp_flat_params=True, framework="megatron"))
    assert [p.field for p in problems] == ["fsdp_flat_params"]
    with pytest.raises(ValueError, match="fsdp_flat_params"):
        SearchConstraints(framework="deepspeed", fsdp_flat_params=True)
    c = SearchConstraints(framework="fsdp", fsdp_flat_params=True)
    mesh = next(iter(meshes(get_model("llama3-8b"), get_cluster("dgx-h100"), 64, c)))
    option = pipeline_options(get_model("llama3-8b"), training, mesh, 1, c)[0]
    setting = settings(mesh, get_cluster("dgx-h100"), c)[0]
    assert to_layout(mesh, 1, option, setting, Stack.of(c)).fsdp_flat_params  # every layout of the search is FSDP1's


def test_more_zero3_traffic_never_makes_a_step_faster() -> None:
    """ZeRO-3 moves 3 Psi per micro-batch where ZeRO-1 moves 2 Psi per step: on the same mesh and
    micro-batch, with every other knob equal, ZeRO-3 is never faster (no free parallelism)."""
    tables, cal = _priced_tables("llama3-70b", "dgx-h100", 64, 8192, 64, "bf16", "megatron")
    compared = 0
    for table, grid, vpp, schedule in tables:
        prices = price_time(table, grid, price_memory(table, grid, schedule, vpp, cal), vpp, cal)
        by_key = {(s.dp_shard, s.recompute, s.offload_optimizer, s.zero_stage): float(prices.step_s[j]) for j, s in enumerate(grid)}
        for (shard, recompute, offload, zero), step in by_key.items():
            if zero == 3 and (shard, recompute, offload, 1) in by_key:
                assert step >= by_key[(shard, recompute, offload, 1)] - 1e-9
                compared += 1
    assert compared > 10


def test_expert_tp_exchange_is_priced_on_its_own_groups_channel() -> None:
    """Under expert TP with SP, Megatron-Core's alltoall dispatcher all-gathers the routed rows over
    the expert-TP group after the all-to-all and reduce-scatters them before the combine: the MoE
    layer's communication grows by one all-gather and one reduce-scatter of the gathered rows, and
    that part sits on the expert-TP group's channel (NVLink), not on the EP group's (scale-out)."""
    from cost_models.comm import INTER, INTRA, Group, collective_time
    from cost_models.mesh_comm import mesh_comm

    model, cluster, cal = get_model("mixtral-8x7b"), get_cluster("dgx-h100"), default_calibration()
    training = TrainingSpec(seq_len=4096, global_batch=256)
    folded = Layout(tp=4, ep=8, etp=1, sp=True).resolved(64, training)
    tp_experts = Layout(tp=4, ep=8, etp=4, sp=True).resolved(64, training)
    assert not validate_layout(model, training, 64, folded) and not validate_layout(model, training, 64, tp_experts)
    ep_only = mesh_comm(model, training, cluster, 64, folded, cal)[0]
    with_etp = mesh_comm(model, training, cluster, 64, tp_experts, cal)[0]
    assert ep_only[5] == 0.0
    rows = 4096 / 4 * model.moe_top_k * 4 * model.hidden_size * training.activation_bytes
    group = Group.strided(cluster, 4, 1, 64)
    expected = collective_time("all_gather", rows, group, cal) + collective_time("reduce_scatter", rows, group, cal)
    assert with_etp[5] == pytest.approx(expected)
    copies = model.moe_top_k * 4096 / 4 * model.hidden_size * training.activation_bytes
    for lay, comm in ((folded, ep_only), (tp_experts, with_etp)):  # EP ranks sit etp apart
        a2a = collective_time("all_to_all", copies, Group.strided(cluster, 8, lay.etp_, 64), cal)
        assert comm[2] == pytest.approx(2 * a2a + comm[5])
    partition = StagePartition.for_layout(model.num_layers, tp_experts)
    table = build_table(model, training, cluster, 64, tp_experts, partition, cal)
    assert table.channels[2] == INTER and table.channels[4] == INTRA
    assert table.etp_per_moe_layer == pytest.approx(expected)


def test_the_expert_grid_sets_the_ep_groups_links_and_keys_the_data_parallel_memo() -> None:
    """Without MoE parallel folding (Megatron-Core 0.9) an EP group strides over TP x CP: with
    TP2 x CP2 on 64 H100 its 8 ranks span 4 nodes instead of 2, so the all-to-all runs slower. The
    memoized data-parallel times are keyed on the grid, so tables of the two grids never share them."""
    from cost_models.comm import Group, collective_time
    from cost_models.mesh_comm import mesh_comm

    model, cluster, cal = get_model("mixtral-8x7b"), get_cluster("dgx-h100"), default_calibration()
    training = TrainingSpec(seq_len=8192, global_batch=64)
    folded = Layout(tp=2, cp=2, ep=8).resolved(64, training)
    unfolded = Layout(tp=2, cp=2, ep=8, moe_parallel_folding=False).resolved(64, training)
    copies = model.moe_top_k * 8192 / 2 / 2 * model.hidden_size * training.activation_bytes
    for lay, stride in ((folded, 2), (unfolded, 4)):
        a2a = collective_time("all_to_all", copies, Group.strided(cluster, 8, stride, 64), cal)
        comm = mesh_comm(model, training, cluster, 64, lay, cal)[0]
        assert comm[2] == pytest.approx(2 * a2a + comm[5])  # + the expert-TP exchange (etp = tp = 2, SP)
    assert mesh_comm(model, training, cluster, 64, unfolded, cal)[0][2] > mesh_comm(model, training, cluster, 64, folded, cal)[0][2]
    tables = [build_table(model, training, cluster, 64, lay, StagePartition.for_layout(model.num_layers, lay), cal)
              for lay in (folded, unfolded)]
    assert _dp_table_key(tables[0], cal) != _dp_table_key(tables[1], cal)


def test_megatron_fsdp_exposes_the_tp_traffic_its_overlap_would_hide_before_blackwell() -> None:
    """Megatron-FSDP needs CUDA_DEVICE_MAX_CONNECTIONS > 1 and TP comm overlap needs 1 before
    Blackwell (`step_time.fsdp_drops_tp_overlap`): on H100 a ZeRO-3 layout with TP pays its TP traffic
    as if the overlap were off, a ZeRO-1 layout keeps the overlap, and on GB200 both keep it."""
    from cost_models.estimate import estimate

    model, training = get_model("llama3-70b"), TrainingSpec(seq_len=8192, global_batch=64)

    def tp_s(cluster: str, zero: int, overlap: bool | None = None, framework: str = "megatron") -> float:
        lay = Layout(tp=4, zero_stage=zero, tp_comm_overlap=overlap, framework=framework)
        return estimate(model, training, get_cluster(cluster), 64, lay).time.as_dict()["tp_comm_s"]

    assert tp_s("dgx-h100", 3) == pytest.approx(tp_s("dgx-h100", 3, overlap=False))
    assert tp_s("dgx-h100", 2) == pytest.approx(tp_s("dgx-h100", 2, overlap=False))
    assert tp_s("dgx-h100", 1) < 0.5 * tp_s("dgx-h100", 1, overlap=False)
    assert tp_s("gb200-nvl72", 3) < 0.5 * tp_s("gb200-nvl72", 3, overlap=False)
    # torchtitan's async TP beside FSDP2 is not Megatron's userbuffers: left as priced
    assert tp_s("dgx-h100", 3, overlap=True, framework="fsdp") < tp_s("dgx-h100", 3, overlap=False, framework="fsdp")

    # the ring-attention exchange the same way: hidden behind attention with the distributed optimizer,
    # exposed (its whole traffic) beside Megatron-FSDP on H100
    long = TrainingSpec(seq_len=32768, global_batch=16)
    cal = default_calibration()

    def cp_parts(zero: int) -> tuple[float, float]:
        lay = Layout(cp=8, zero_stage=zero).resolved(64, long)
        table = build_table(model, long, get_cluster("dgx-h100"), 64, lay, StagePartition.for_layout(model.num_layers, lay), cal)
        grid = [setting_of(lay)]
        timed = price_time(table, grid, price_memory(table, grid, lay.schedule_, lay.vpp, cal), lay.vpp, cal)
        phases = step_time.phase_arrays(table, lay.vpp, cal)
        busy = lay.grad_accum_ * float(phases.cp_hidden_f[0] + phases.cp_hidden_b[0, 0])
        return float(timed.parts["cp_comm_s"][0]), busy

    exposed_1, hidden = cp_parts(1)
    exposed_3, _ = cp_parts(3)
    assert hidden > 0 and exposed_3 == pytest.approx(exposed_1 + hidden)


def _mixtral_pipeline(schedule: str, **extra):
    """Mixtral-8x7B on 64 H100, PP4 x EP8 across nodes (EP traffic on the NICs), priced step."""
    model, cluster, cal = get_model("mixtral-8x7b"), get_cluster("dgx-h100"), default_calibration()
    training = TrainingSpec(seq_len=4096, global_batch=128)
    fields = {"pp": 4, "vpp": 2, "ep": 8, "zero_stage": 1, "schedule": schedule, "framework": "fsdp", "order": "tp-cp-dp-ep-pp"}
    lay = Layout(**{**fields, **extra})
    assert validate_layout(model, training, 64, lay) == []
    lay = lay.resolved(64, training)
    table = build_table(model, training, cluster, 64, lay, StagePartition.for_layout(model.num_layers, lay), cal)
    grid = [setting_of(lay)]
    timed = price_time(table, grid, price_memory(table, grid, lay.schedule_, lay.vpp, cal), lay.vpp, cal)
    return table, {k: float(v[0]) for k, v in timed.parts.items()}, float(timed.step_s[0])


def test_dualpipev_hides_the_all_to_alls_behind_the_paired_compute_and_pays_the_sms() -> None:
    """DualPipeV's F&B pairs: EP traffic hides behind the compute of both micro-batches (none exposed
    while it fits), and the compute runs on 132 - 20 SMs (DeepSeek-V3 report, Sec. 3.2.2); ZB-V on the
    same V exposes the all-to-alls."""
    table, zbv, _ = _mixtral_pipeline("zbv")
    _, dpv, _ = _mixtral_pipeline("dualpipev")
    assert table.partition.head_rank == 0 and table.ep_per_moe_layer > 0
    assert zbv["ep_comm_s"] > 0
    assert dpv["ep_comm_s"] == 0.0
    bare = _bare_compute_s(table)
    assert dpv["compute_s"] == pytest.approx(bare * 132 / 112, rel=1e-9)
    # ZB-V's compute pays the SMs only for the seconds its pipeline / gradient traffic runs beside it
    assert bare < zbv["compute_s"] < dpv["compute_s"]
    # the head (LM head, loss) sits on rank 0 with the embedding: rank 0 computes more per micro-batch
    assert table.compute[0] > table.compute[1]


def test_zbv_bubble_is_below_interleaving_over_the_same_chunks() -> None:
    """(p - 1)(F + B - 3W) of half-rank chunks against interleaved 1F1B's (p - 1)(F + B) / 2."""
    _, zbv, _ = _mixtral_pipeline("zbv")
    _, inter, _ = _mixtral_pipeline("interleaved_1f1b", framework="megatron")
    assert 0 <= zbv["bubble_s"] < inter["bubble_s"]


def test_megatron_combined_1f1b_hides_the_all_to_alls_like_dualpipev() -> None:
    """--overlap-moe-expert-parallel-comm: the same F&B pairing under Megatron's interleaved 1F1B;
    Megatron-Core refuses it without interleaving when pipelined, and it needs two micro-batches."""
    _, plain, _ = _mixtral_pipeline("interleaved_1f1b", framework="megatron")
    table, paired, _ = _mixtral_pipeline("interleaved_1f1b", framework="megatron", moe_a2a_overlap=True)
    assert plain["ep_comm_s"] > 0 and paired["ep_comm_s"] == 0.0
    bare = _bare_compute_s(table)
    assert paired["compute_s"] == pytest.approx(bare * 132 / 112, rel=1e-9)
    assert bare < plain["compute_s"] < paired["compute_s"]
    model, training = get_model("mixtral-8x7b"), TrainingSpec(seq_len=4096, global_batch=128)
    refused = validate_layout(model, training, 64, Layout(pp=4, ep=8, moe_a2a_overlap=True))
    assert any(v.field == "moe_a2a_overlap" and "vpp" in v.message for v in refused)
    refused = validate_layout(model, training, 64, Layout(pp=4, vpp=2, ep=8, moe_a2a_overlap=True, framework="fsdp"))
    assert any(v.field == "moe_a2a_overlap" and "Megatron" in v.message for v in refused)


def test_equal_settings_share_one_read_only_knob_arrays() -> None:
    """`KnobArrays.of` is memoized by the settings' values: an equal list (a new search's grid)
    gets the very same object, whose arrays cannot be written, and another list another object."""
    cluster = get_cluster("dgx-h100")
    mesh = next(iter(meshes(get_model("llama3-8b"), cluster, 16, SearchConstraints())))
    grid = settings(mesh, cluster, SearchConstraints())
    knobs = KnobArrays.of(grid)
    assert KnobArrays.of(list(grid)) is knobs
    assert KnobArrays.of(grid[:-1]) is not knobs
    with pytest.raises(ValueError):
        knobs.mode[0] = 0
