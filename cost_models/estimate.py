"""`estimate()`: price one layout. Memory of every pipeline stage, and the step time built from
compute, exposed communication, pipeline bubble and the optimizer step.

Step time (seconds):
    t_stage(s)  = micro-batch forward + backward + recompute on stage s, plus the TP / CP / EP
                  communication it cannot hide, plus ZeRO-3 gathers it cannot hide
    pipeline    = m * max_s t_stage(s) + (sum_s t_stage(s) - max_s t_stage(s)) / v
                  (equal stages: (m + (p-1)/v) * t_stage, the bubble of Narayanan et al. 2021)
    step        = pipeline + exposed data-parallel communication + optimizer step + overhead
Throughput: tokens/s = global batch tokens / step. MFU = model FLOPs (full-attention convention,
`cost_models.flops`) / (step x GPUs x dense peak of the training precision).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration, default_calibration
from cost_models.comm import Group, collective_time
from cost_models.compute import LayerTime, ShardGeometry, layer_time, lm_head_time
from cost_models.context import PricingContext
from cost_models.flops import StepFlops, step_flops
from cost_models.layout import Layout, LayoutError, validate_layout
from cost_models.memory import MemoryBreakdown, rank_params, stage_memory
from cost_models.mesh import MeshStrides, mesh_strides
from cost_models.pipeline import bubble_fraction
from cost_models.stages import StagePartition
from model_specs.params import count_params
from model_specs.spec import ModelSpec, TrainingSpec

OPTIMIZER_BYTES_PER_PARAM_MOVED = 16 + 12
"""AdamW step traffic per local parameter: read master, m, v (12) and the gradient, write master,
m, v (12) and the bf16 weight (2); with a 2-byte gradient that is 28 bytes."""


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds per optimizer step, on the critical path."""

    compute: float  # forward + backward of all micro-batches on the slowest stage
    recompute: float
    tp_comm: float  # exposed
    cp_comm: float
    ep_comm: float
    pp_comm: float
    dp_comm: float
    bubble: float
    optimizer: float
    overhead: float

    @property
    def total(self) -> float:
        return (
            self.compute + self.recompute + self.tp_comm + self.cp_comm + self.ep_comm + self.pp_comm
            + self.dp_comm + self.bubble + self.optimizer + self.overhead
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "compute_s": self.compute,
            "recompute_s": self.recompute,
            "tp_comm_s": self.tp_comm,
            "cp_comm_s": self.cp_comm,
            "ep_comm_s": self.ep_comm,
            "pp_comm_s": self.pp_comm,
            "dp_comm_s": self.dp_comm,
            "bubble_s": self.bubble,
            "optimizer_s": self.optimizer,
            "overhead_s": self.overhead,
        }


@dataclass(frozen=True)
class Estimate:
    layout: Layout  # resolved
    partition: StagePartition
    memory: tuple[MemoryBreakdown, ...]  # worst rank of every pipeline stage
    capacity_bytes: int
    time: TimeBreakdown
    flops: StepFlops
    gpus: int
    tokens_per_step: int
    peak_flops_per_s: float
    stage_times_s: tuple[float, ...] = field(default=())

    @property
    def peak_memory(self) -> MemoryBreakdown:
        return max(self.memory, key=lambda m: m.total)

    @property
    def peak_bytes(self) -> int:
        return int(self.peak_memory.total)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    @property
    def step_s(self) -> float:
        return self.time.total

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus

    @property
    def mfu(self) -> float:
        return self.flops.model_flops / (self.step_s * self.gpus * self.peak_flops_per_s)

    @property
    def hfu(self) -> float:
        return self.flops.hardware_flops / (self.step_s * self.gpus * self.peak_flops_per_s)

    @property
    def bubble_fraction(self) -> float:
        lay = self.layout
        return bubble_fraction(lay.schedule_, lay.pp, lay.vpp, lay.grad_accum_)


def _layer_time_cache(ctx: PricingContext, g: ShardGeometry, cal: Calibration) -> dict[tuple[bool, bool], LayerTime]:
    """Layers differ only by being dense/MoE and windowed or not: price each kind once."""
    model, train = ctx.model, ctx.training
    kinds: dict[tuple[bool, bool], LayerTime] = {}
    for i in range(model.num_layers):
        key = (model.is_moe_layer(i), model.uses_sliding_window(i))
        if key not in kinds:
            kinds[key] = layer_time(model, i, g, ctx.cluster.gpu, train.precision, train.activation_bytes, cal)
    return kinds


def _layer_key(model: ModelSpec, i: int) -> tuple[bool, bool]:
    return (model.is_moe_layer(i), model.uses_sliding_window(i))


@dataclass(frozen=True)
class _Groups:
    tp: Group
    cp: Group
    ep: Group
    pp: Group
    dp_cp: Group
    dp_shard: Group
    dp_replicate: Group
    expert_dp: Group


def _groups(ctx: PricingContext, st: MeshStrides) -> _Groups:
    lay, cl = ctx.layout, ctx.cluster
    dp_cp = lay.dp_ * lay.cp
    shard = lay.dp_shard_ * lay.cp
    edp = lay.expert_dp
    return _Groups(
        tp=Group.strided(cl, lay.tp, st.tp),
        cp=Group.strided(cl, lay.cp, st.cp),
        ep=Group.strided(cl, lay.ep, st.ep),
        pp=Group.strided(cl, 2 if lay.pp > 1 else 1, st.pp),
        dp_cp=Group.strided(cl, dp_cp, st.dp_cp),
        dp_shard=Group.strided(cl, shard, st.dp_cp),
        dp_replicate=Group.strided(cl, dp_cp // shard, st.dp_cp * shard),
        expert_dp=Group.strided(cl, edp, st.expert_dp),
    )


def estimate(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    layout: Layout,
    partition: StagePartition | None = None,
    calibration: Calibration | None = None,
) -> Estimate:
    """Price `layout`. Raises `LayoutError` listing every violated constraint."""
    problems = validate_layout(model, training, gpus, layout)
    if problems:
        raise LayoutError(problems)
    lay = layout.resolved(gpus, training)
    cal = calibration or default_calibration()
    if partition is None:
        partition = StagePartition.even(model.num_layers, lay.pp, lay.vpp)
    elif (partition.pp, partition.vpp) != (lay.pp, lay.vpp) or partition.num_layers != model.num_layers:
        raise ValueError(
            f"partition is for pp={partition.pp} x vpp={partition.vpp} over {partition.num_layers} layers; "
            f"layout has pp={lay.pp} x vpp={lay.vpp} and the model {model.num_layers} layers"
        )
    ctx = PricingContext(model, training, cluster, gpus, lay, partition)
    memory = tuple(stage_memory(ctx, r, cal) for r in range(lay.pp))
    time, stage_times = step_time(ctx, cal)
    flops = step_flops(
        model,
        training.seq_len,
        training.global_batch,
        lay.recompute,
        _recomputed_fraction(ctx),
    )
    return Estimate(
        layout=lay,
        partition=partition,
        memory=memory,
        capacity_bytes=cluster.gpu.memory_bytes,
        time=time,
        flops=flops,
        gpus=gpus,
        tokens_per_step=training.tokens_per_step,
        peak_flops_per_s=cluster.gpu.peak(training.precision),
        stage_times_s=tuple(stage_times),
    )


def _recomputed_fraction(ctx: PricingContext) -> float:
    lay = ctx.layout
    if lay.recompute != "full" or lay.recompute_layers is None:
        return 1.0
    counts = ctx.partition.rank_layer_counts()
    done = sum(min(lay.recompute_layers, n) for n in counts)
    return done / ctx.model.num_layers if ctx.model.num_layers else 0.0


def step_time(ctx: PricingContext, cal: Calibration) -> tuple[TimeBreakdown, list[float]]:
    """Critical-path seconds of one step and the per-micro-batch time of every stage."""
    model, train, lay, cl = ctx.model, ctx.training, ctx.layout, ctx.cluster
    gpu = cl.gpu
    ab = train.activation_bytes
    overlap = cal.overlap(lay.framework)
    st = mesh_strides(lay)
    groups = _groups(ctx, st)
    g = ShardGeometry(
        tokens=lay.micro_batch * train.seq_len / lay.cp,
        seq_len=train.seq_len,
        cp=lay.cp,
        tp=lay.tp,
        sp=lay.sp_,
        ep=lay.ep,
        etp=lay.etp_,
    )
    kinds = _layer_time_cache(ctx, g, cal)
    m = lay.grad_accum_
    h = model.hidden_size
    act_full = g.tokens * h * ab  # one micro-batch's hidden states on this CP rank, all TP shards

    # --- per-layer communication (one micro-batch) ------------------------------------------------
    if lay.tp > 1:
        if lay.sp_:
            one = collective_time("all_gather", act_full, groups.tp, cal) + collective_time("reduce_scatter", act_full, groups.tp, cal)
        else:
            one = collective_time("all_reduce", act_full, groups.tp, cal)
        tp_per_layer = 2 * one  # attention and MLP blocks, forward; backward repeats it
        tp_fwd, tp_bwd = tp_per_layer, tp_per_layer
    else:
        tp_fwd = tp_bwd = 0.0
    cp_per_layer = 0.0
    if lay.cp > 1:
        kv_heads = model.num_heads / lay.tp if model.attention == "mla" else max(model.kv_heads / lay.tp, 1.0)
        kv_bytes = lay.micro_batch * train.seq_len * kv_heads * (model.qk_head_dim + model.v_dim) * ab
        # ring: forward passes K,V around (all-gather volume); backward passes K,V and dK,dV
        cp_per_layer = 3 * collective_time("all_gather", kv_bytes, groups.cp, cal)
    ep_per_moe_layer = 0.0
    if model.is_moe and lay.ep > 1:
        routed = g.tokens / (lay.tp if lay.sp_ else 1) * model.moe_top_k
        a2a = collective_time("all_to_all", routed * h * ab, groups.ep, cal)
        ep_per_moe_layer = 4 * a2a  # dispatch + combine, forward and backward

    # --- ZeRO-3 per micro-batch gathers ------------------------------------------------------------
    dense_shard = lay.dp_shard_ * lay.cp
    zero3_mb_rank: list[float] = []
    for r in range(lay.pp):
        rp = rank_params(ctx, r)
        if lay.zero_stage >= 3:
            t = 2 * collective_time("all_gather", rp.dense * train.param_bytes, groups.dp_shard, cal)
            t += 2 * collective_time("all_gather", rp.expert * train.param_bytes, groups.expert_dp, cal)
        else:
            t = 0.0
        if lay.zero_stage >= 2 and m > 1:  # gradients reduce-scattered every micro-batch
            t += collective_time("reduce_scatter", rp.dense * train.grad_bytes, groups.dp_shard, cal)
            t += collective_time("reduce_scatter", rp.expert * train.grad_bytes, groups.expert_dp, cal)
        zero3_mb_rank.append(t)

    # --- per-stage micro-batch time ----------------------------------------------------------------
    stage_totals: list[float] = []
    parts: list[dict[str, float]] = []
    recompute_layers = lay.recompute_layers
    for r in range(lay.pp):
        layers = ctx.partition.rank_layers(r)
        n_re = len(layers) if recompute_layers is None else min(recompute_layers, len(layers))
        comp = reco = tp_c = cp_c = ep_c = 0.0
        for j, i in enumerate(layers):
            lt = kinds[_layer_key(model, i)]
            comp += lt.forward + lt.backward
            recomputed = lay.recompute == "full" and j < n_re
            if recomputed:
                reco += lt.forward
            elif lay.recompute == "selective":
                reco += lt.attention_fwd + 0.5 * lt.elementwise_fwd
            tp_c += tp_fwd * (2 if recomputed else 1) + tp_bwd
            if model.is_moe_layer(i):
                ep_c += ep_per_moe_layer * (1.5 if recomputed else 1)
        # Ring attention hides its exchange behind the attention kernel; what is left is exposed.
        if cp_per_layer:
            attn = sum(kinds[_layer_key(model, i)].attention_fwd for i in layers) * 3.5
            cp_c = max(0.0, cp_per_layer * len(layers) - overlap.cp * attn)
        if r == lay.pp - 1:
            comp += lm_head_time(model, g, gpu, "bf16", ab, cal)
        tp_c *= 1 - overlap.tp
        ep_c *= 1 - overlap.ep
        z3 = max(0.0, zero3_mb_rank[r] - overlap.zero3 * (comp + reco))
        pp_c = 0.0
        if lay.pp > 1:
            boundary = act_full / (lay.tp if lay.sp_ else 1)
            p2p = collective_time("p2p", boundary, groups.pp, cal)
            pp_c = 2 * p2p * lay.vpp * (1 - overlap.pp)
        total = comp + reco + tp_c + cp_c + ep_c + z3 + pp_c
        stage_totals.append(total)
        parts.append({"compute": comp, "recompute": reco, "tp": tp_c, "cp": cp_c, "ep": ep_c, "z3": z3, "pp": pp_c})

    slowest = max(range(lay.pp), key=lambda r: stage_totals[r])
    t_max = stage_totals[slowest]
    bubble = (sum(stage_totals) - t_max) / lay.vpp if lay.pp > 1 else 0.0

    # --- data-parallel gradient sync (once per step) ---------------------------------------------
    rp = rank_params(ctx, slowest)
    dp_t = _dp_sync_time(ctx, rp.dense, rp.expert, groups, cal)
    window = parts[slowest]["compute"] / 3.0 * 2.0  # the last micro-batch's backward
    dp_exposed = max(0.0, dp_t - overlap.dp * window)

    # --- optimizer ---------------------------------------------------------------------------------
    local = rp.dense / dense_shard if lay.zero_stage >= 1 else rp.dense
    expert_shard = max(1, (lay.dp_shard_ * lay.cp * lay.tp) // (lay.ep * lay.etp_))
    local += rp.expert / expert_shard if lay.zero_stage >= 1 else rp.expert
    moved = OPTIMIZER_BYTES_PER_PARAM_MOVED - 2 + train.grad_bytes
    if lay.offload_optimizer:
        # ZeRO-Offload: gradients down and weights up over PCIe, CPU Adam at host-link speed.
        opt_t = local * (train.grad_bytes + train.param_bytes + moved) / cl.host_to_device_bytes_per_s
    else:
        opt_t = local * moved / (gpu.memory_bandwidth_bytes_per_s * cal.hbm_efficiency)

    p = parts[slowest]
    time = TimeBreakdown(
        compute=m * p["compute"],
        recompute=m * p["recompute"],
        tp_comm=m * p["tp"],
        cp_comm=m * p["cp"],
        ep_comm=m * p["ep"],
        pp_comm=m * p["pp"],
        dp_comm=dp_exposed + m * p["z3"],
        bubble=bubble,
        optimizer=opt_t,
        overhead=cal.step_overhead_s,
    )
    return time, stage_totals


def _dp_sync_time(ctx: PricingContext, dense: float, expert: float, groups: _Groups, cal: Calibration) -> float:
    """Seconds of the once-per-step data-parallel synchronization of one rank's parameters.

    ZeRO-0: all-reduce of gradients (2 Psi volume). ZeRO-1: reduce-scatter of gradients and
    all-gather of updated weights (the same 2 Psi). ZeRO-2/3 reduce-scatter per micro-batch (priced
    with the micro-batch); once per step only the ZeRO-2 weight all-gather remains. Hybrid
    sharding adds an all-reduce of the shard across replicas."""
    lay, train = ctx.layout, ctx.training
    z = lay.zero_stage
    m = lay.grad_accum_
    total = 0.0
    for params, shard_group, full_group in (
        (dense, groups.dp_shard, groups.dp_cp),
        (expert, groups.expert_dp, groups.expert_dp),
    ):
        if params <= 0:
            continue
        gbytes = params * train.grad_bytes
        wbytes = params * train.param_bytes
        if z == 0:
            total += collective_time("all_reduce", gbytes, full_group, cal)
            continue
        if z == 1 or m == 1:
            total += collective_time("reduce_scatter", gbytes, shard_group, cal)
        if z <= 2:
            total += collective_time("all_gather", wbytes, shard_group, cal)
        if shard_group is groups.dp_shard and groups.dp_replicate.size > 1:
            total += collective_time("all_reduce", gbytes / shard_group.size, groups.dp_replicate, cal)
    return total


def model_summary(model: ModelSpec) -> dict[str, int]:
    pc = count_params(model)
    return {"params": pc.total, "active_params": pc.active}
