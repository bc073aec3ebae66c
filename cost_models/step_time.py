"""Step time: every piece of work on the resource that runs it, each second counted once.

Resources of a rank. The *compute stream* runs GEMMs, attention and the memory-bound kernels.
Two *channels* carry communication (`cost_models.comm`): `INTRA`, the NVLink / PCIe domain, and
`INTER`, the rank's share of its node's scale-out NICs. A collective occupies the channel of its
group (a group that leaves the domain occupies `INTER`); collectives on one channel queue on it,
channels and the compute stream run side by side.

The schedule of one micro-batch on pipeline rank r (`compose`), forward phase then backward phase:

    forward   F        compute of the rank's layers (and the LM head on the last stage)
              + TPf    TP/SP collectives: blocking (a GEMM waits for its all-gather, the residual
                       add for its reduce-scatter), except the share `Overlap.tp` hidden behind the
                       GEMMs when TP comm overlap is on (`Layout.tp_comm_overlap`: Transformer
                       Engine userbuffers, Megatron-LM `--tp-comm-overlap`); none of it under
                       Megatron-FSDP before Blackwell, which needs several CUDA queues where the
                       overlap needs one (`fsdp_drops_comm_overlap`; so for CPf and CPb)
              + CPf    ring attention: at each of the cp - 1 ring steps the next K/V block is sent
                       while this block's attention runs, so a step costs max(send, attention /
                       cp) (Liu et al. 2023, "Ring Attention"; Megatron-Core / Transformer Engine's
                       context parallelism overlaps the same way). All-gather attention
                       (`cp_attention = allgather_mask`) gathers K/V before it attends: blocking.
              + EPf    MoE dispatch and combine all-to-alls, and under expert TP the all-gather of
                       the routed rows over the expert-TP group and their reduce-scatter (on that
                       group's channel): blocking (the experts need their tokens, the next layer
                       its output), except `Overlap.ep`
              + Zf     ZeRO-3 / FSDP parameter all-gathers (without a pipeline also FSDP's
                       ZeRO-1/2, which free the parameters after each backward), prefetched one
                       layer ahead (FSDP2's implicit forward prefetch, Megatron-FSDP's and
                       DeepSpeed's prefetch): a
                       layer's gather hides behind the previous layer's compute only, so the phase
                       exposes sum over layers of max(0, gather - compute of one layer), plus the
                       first layer's gather, which nothing hides; FSDP2 copies each gathered
                       layer out of the flat buffer on the compute stream
                       (`FSDP2_COPY_OUT_BYTES_PER_BYTE`)
    backward  B (+ R)  compute of the backward (+ the recompute forward)
              + TPb    as TPf (Megatron's sequence-parallel backward also re-gathers the inputs for
                       the weight gradients, overlapped with the input-gradient GEMM: twice the
                       traffic on the channel, the forward's exposure)
              + CPb    ring steps sending K, V and dK, dV behind attention-backward blocks
              + EPb    the backward all-to-alls (and the recompute forward's, under full recompute)
              + Zb     ZeRO-3 gathers again and the per-layer gradient reduce-scatter (ZeRO-2/3), a
                       layer's behind the compute of one layer's backward, plus the last layer's
                       reduce-scatter, which nothing hides; FSDP2's copy-out after each gather and
                       copy-in before each reduce-scatter run on the compute stream
    Each phase lasts max(compute + what is exposed, busiest channel): no channel carries more
    traffic than the phase lasts (the excess is reported as `comm_wait_s`).
    Hidden is not free: a collective's kernels hold `COMM_SMS` SMs while they run (NCCL runs one
    thread block per channel, each on an SM), so the compute beside them runs on the rest. Every
    second of NVLink / NIC traffic that runs beside compute (`comm_beside_compute`: the channel's
    busy time less what the phase exposes, at most the phase's compute) stretches that compute by
    `COMM_SMS / sm_count` seconds (`comm_sm_share`; counted in `compute_s`). The once-per-step
    gradient reduction and parameter gather stretch the last backward and the first forward the
    same way.
    The pipeline send/recv of each of the rank's vpp chunk boundaries (activations forward,
    gradients backward) hides `Overlap.pp` of itself (batched isend/irecv in the 1F1B steady state).
    DualPipeV pairs the forward chunk of one micro-batch with the backward chunk of another
    ("F&B", DeepSeek-V3 report Sec. 3.2.1; torchtitan's `pipeline_parallel_expert_parallel_overlap`
    runs the two on two threads that alternate compute and EP communication), and so does
    Megatron-Core's combined 1F1B (`Layout.moe_a2a_overlap`, --overlap-moe-expert-parallel-comm,
    "1F1B A2A overlap": a micro-batch's dispatch and combine beside the adjacent one's forward or
    backward compute, user guide "Combined 1F1B: Expert-Parallel All-to-All Overlap"): the MoE all-to-alls
    of both hide behind the compute of both, so the pair lasts max(F + B, busiest channel of both),
    and the communication kernels hold `COMM_SMS` of the GPU's SMs meanwhile (the compute
    of a rank with expert-parallel traffic runs on the rest).

The step (`compose`):
    pipeline   m x slowest micro-batch + (sum_r t_r - max_r t_r) / v         (Narayanan et al. 2021)
               zero bubble: each other rank's t_r less twice its weight-gradient share W_r, which
               fills the idle slots: (p - 1)(F + B - W) / v (Qi et al. 2024; `cost_models.pipeline`)
               zbv: max(0, t_r - 3 W_r) / 2 per other rank; dualpipev: max(0, t_r + B_r - 3 W_r) / 2
               (`pipeline.rank_idle`: the chunk formulas with chunks of half the rank's layers)
    + gradient reduction once per step (ZeRO-0 all-reduce, ZeRO-1 reduce-scatter, the all-reduce
      across replicas of hybrid sharding) in the window Megatron's `--overlap-grad-reduce` gives it:
      the last micro-batch's backward, bucket by bucket, and the pipeline drain after this rank's
      last backward (rank r idles while ranks r-1 .. 0 finish theirs); its last bucket
      (`REDUCE_BUCKET_PARAMS`) is never hidden
    + the parameter all-gather of a sharded optimizer (ZeRO-1/2) in the window of the first
      micro-batch's forward (`--overlap-param-gather`) and the pipeline warm-up before it
    + the optimizer step (HBM-bound, or over the host link when offloaded) + `step_overhead_s`
    and never less than the busiest channel's traffic of the whole step (a roofline over channels).

What the search prunes with bounds this from below (`pipelined_floor`): `mode_lower_bounds` with
every knob but the recompute mode at its cheapest (no ZeRO traffic, no optimizer), and
`setting_lower_bounds` per setting.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from cluster_specs.catalog import gpu_generation
from cost_models import stacks, zero3_gathers
from cost_models.calibration import Calibration, stack_key
from cost_models.comm import CHANNELS, HOST, INTER, INTRA, RING_KINDS, Group, collective_cost
from cost_models.compute import hbm_bandwidth
from cost_models.interning import KeptMemo
from cost_models.memory import HOST_GRAD_BYTES
from cost_models.mesh import mesh_strides
from cost_models.pipeline import FB_PAIRED_SCHEDULES, SPLIT_BACKWARD_SCHEDULES, ZB_WEIGHT_SHARE, rank_idle
from cost_models.stage_data import RECOMPUTE_MODES, KnobArrays, KnobPrices, Setting, Sharding, StageTable
from cost_models.stage_table import head_gemm_elements, layer_classes

if TYPE_CHECKING:
    from cluster_specs.spec import ClusterSpec, GPUSpec
    from cost_models.kernels.collectives import SizeCurve
    from cost_models.layout import Layout
    from model_specs.spec import TrainingSpec

STEP_PARTS = (
    "compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s", "comm_wait_s",
    "bubble_s", "optimizer_s", "overhead_s",
)
"""The parts of a step's seconds, in the order they are added (they sum to the step)."""

REDUCE_BUCKET_PARAMS = 40_000_000
"""Parameters per gradient bucket: Megatron-Core `DistributedDataParallelConfig.bucket_size`
default (max(40M, 1M x dp) elements; the 40M floor is used). The last bucket's reduction starts
when the backward ends and is never hidden."""

CPU_ADAM_PARAMS_PER_CORE_S = 15e6
"""Parameters one CPU core steps per second with DeepSpeed's vectorized CPU-Adam when DRAM is not the
limit: an assumption, neither fitted nor measured here (DeepSpeed's ZeRO-Offload tutorial says only
that DeepSpeedCPUAdam is 5-7x faster than PyTorch's CPU Adam). A profile of the user's host should
replace it; `ClusterSpec.cpu_cores` scales it."""
HOST_MEMORY_EFFICIENCY = 0.7
"""Share of the node's peak DRAM bandwidth (`ClusterSpec.host_memory_bandwidth_bytes_per_s`) a
streaming kernel reaches: STREAM triad on two-socket servers runs at roughly 70% of the channels' peak."""


def host_adam_seconds_per_param(cl: ClusterSpec, tr: TrainingSpec) -> float:
    """Seconds per parameter of the node's CPU optimizer step (all its cores on the node's
    partitions): the slower of its DRAM traffic and its cores' Adam throughput. DRAM bytes per
    parameter: read the float32 gradient partition (`memory.HOST_GRAD_BYTES`), read and write the
    optimizer states (fp32 master, m, v: 2 x 12 for AdamW), write the 16-bit weight sent back
    (30 bytes for AdamW in bf16), the host-side twin of the GPU step's HBM traffic."""
    traffic = HOST_GRAD_BYTES + 2 * tr.optimizer_bytes + tr.param_bytes
    memory = traffic / (cl.host_memory_bandwidth_bytes_per_s * HOST_MEMORY_EFFICIENCY)
    cores = 1.0 / (cl.cpu_cores * CPU_ADAM_PARAMS_PER_CORE_S)
    return max(memory, cores)


QWZ_BYTES_PER_ELEMENT = 1.0
"""ZeRO++ qwZ: bytes per weight element on the wire, int8 with block-wise scales (the paper's "reduces
all-gather volume by half" from 16 bits; the per-block float scales are under 1% and left out)."""
QGZ_BYTES_PER_ELEMENT = 0.5
"""ZeRO++ qgZ: bytes per gradient element on the wire, int4 (the paper's 4x less than fp16)."""
QWZ_HBM_BYTES_PER_ELEMENT = 3.0
"""HBM bytes per gathered weight element of qwZ's kernels: dequantize reads int8 and writes 16 bits
(the quantization of the rank's own shard, 3 bytes per shard element, is 1/N of it and left out)."""
QGZ_HBM_BYTES_PER_ELEMENT = 5.0
"""HBM bytes per gradient element of qgZ's kernels: quantize (read 16 bits, write 4) and, after the
all-to-all, dequantize and reduce (read 4 bits, write 16)."""

FSDP2_COPY_OUT_BYTES_PER_BYTE = 2.0
"""HBM bytes per gathered weight byte of FSDP2's all-gather copy-out: after each parameter all-gather
(forward and backward), `foreach_all_gather_copy_out` splits the flat output into the unsharded
parameters (`torch.split_with_sizes_copy`: read it, write them) on the compute stream, before the
layer runs (torch `distributed/fsdp/_fully_shard/_fsdp_collectives.py`, `_fsdp_param_group.py`
`wait_for_unshard`). Its reduce-scatter copy-in (`foreach_reduce_scatter_copy_in`: `torch._chunk_cat`
of the unsharded gradients into the flat reduce-scatter input) reads each gradient in the parameter
dtype and writes it in the reduce dtype, per layer and micro-batch, on the stream that ran the
backward: param bytes + grad bytes per trained element. FSDP1 (`Layout.fsdp_flat_params`) gathers
into the flat parameter its parameters are views of (no copy-out), but casts its flat gradient to the
reduce dtype and pads it to a multiple of the world size before the reduce-scatter (torch
`distributed/fsdp/_runtime_utils.py`, `_post_backward_hook` / `_get_reduce_scatter_tensors`): priced
as the same copy-in. Megatron-Core and DeepSpeed gather into, and reduce from, buffers the
parameters and gradients are views of. Megatron FSDP (ZeRO-2/3) without gradient-accumulation fusion
(`Layout.megatron_fsdp_gradient_fusion` False: NeMo 2.3 / 2.4 turn it off, nemo/lightning/
megatron_parallel.py and scripts/performance/utils.py; Megatron-Core 0.12 / 0.13 assert it off for
optim_grads(_params), megatron/training/arguments.py) has each weight GEMM write `param.grad`, which
its hook then copies into the reduce buffer (custom_fsdp `_grad_acc`: `param.main_grad.copy_(
param.grad)`): the copy-in's bytes, per layer and micro-batch."""

COMM_SMS = 20
"""SMs the communication kernels hold while they run beside compute: "only 20 SMs are sufficient
to fully utilize the bandwidths of IB and NVLink" (DeepSeek-V3 technical report, Sec. 3.2.2, H800
with 132 SMs). NCCL launches one thread block per channel, each on its own SM, and its default
channel counts on NVSwitch and multi-NIC nodes are of that order (16-32), so 20 is the low end of
what a collective takes. Compute beside them runs on the other SMs: DualPipe's F&B pairs and
Megatron's combined 1F1B for the whole pair (`comm_sm_slowdown`; Megatron-Core gives no figure for
its EP overlap, so the same 20 is an assumption there), every other overlap for the seconds its
collectives run beside compute (`comm_sm_share`)."""


def fb_paired(mesh: Layout) -> bool:
    """Whether a micro-batch's forward runs beside another's backward with the all-to-alls of both
    hidden behind their compute: DualPipeV (pp > 1), or Megatron's combined 1F1B
    (`Layout.moe_a2a_overlap`)."""
    return (mesh.pp > 1 and mesh.schedule_ in FB_PAIRED_SCHEDULES) or mesh.moe_a2a_overlap


def beside_sm_share(t: StageTable) -> float:
    """`comm_sm_share` of the table's GPU, 0 where F&B pairs run (their compute pays the SMs for the
    whole pair: `comm_sm_slowdown`)."""
    return 0.0 if fb_paired(t.mesh) else comm_sm_share(t.cluster.gpu.sm_count)


def comm_sm_share(sm_count: int | None) -> float:
    """Share of a GPU's SMs that collectives running beside compute hold (`COMM_SMS` / SMs): each
    second of communication hidden behind compute stretches that compute by this many seconds (the
    compute runs on the other SMs meanwhile). 0 on a device without SMs (the CPU runtime)."""
    return COMM_SMS / sm_count if sm_count else 0.0


def comm_beside_compute(busy: np.ndarray, exposed: np.ndarray, compute: np.ndarray) -> np.ndarray:
    """Seconds of collective traffic that run beside compute in one window, (J, pp): the
    SM-driven channels' (`INTRA`, `INTER`; the host link's copies run on copy engines) busy seconds
    less the communication the window exposes (which runs while compute waits), each channel at most
    the window's compute. `busy` (J, CHANNELS, pp); `exposed`, `compute` broadcast to (J, pp)."""
    intra, inter = busy[:, INTRA], busy[:, INTER]
    cap = np.minimum(intra, compute) + np.minimum(inter, compute)
    return np.minimum(np.maximum(intra + inter - exposed, 0.0), cap)


def comm_sm_slowdown(sm_count: int | None) -> float:
    """Factor on compute seconds while `COMM_SMS` SMs carry communication: sm / (sm - 20); 1 on a
    device without SMs (the CPU runtime), as `comm_sm_share` is 0 there."""
    if not sm_count:
        return 1.0
    return sm_count / max(sm_count - COMM_SMS, 1)


_FULL = np.array([0.0, 0.0, 1.0, 0.0])[:, None]
"""Rows of RECOMPUTE_MODES (none, selective, full, op_sac) that re-run whole layers, as a (4, 1) mask."""


@dataclass(frozen=True)
class DataParallelTimes:
    """Data-parallel and ZeRO communication of one table, per (ZeRO stage, sharding group) pair
    (axis 0) and pipeline rank (last axis), seconds. Channel axes have `CHANNELS` entries."""

    exposed_f: np.ndarray  # (pairs, pp) per micro-batch: forward gathers the prefetch cannot hide
    exposed_b: np.ndarray  # (pairs, pp) per micro-batch: backward gathers + reduce-scatters not hidden
    traffic_f: np.ndarray  # (pairs, CHANNELS, pp) per micro-batch, forward
    traffic_b: np.ndarray  # (pairs, CHANNELS, pp) per micro-batch, backward
    reduce: np.ndarray  # (pairs, CHANNELS, pp) once per step: gradient reduction
    reduce_tail: np.ndarray  # (pairs, pp) once per step: its last bucket
    gather: np.ndarray  # (pairs, CHANNELS, pp) once per step: sharded optimizer's parameter all-gather
    optimizer: np.ndarray  # (pairs, pp, 3) optimizer step on the GPU / offloaded to host memory / to NVMe
    param_copy: np.ndarray  # (pairs, pp, 2) per micro-batch and pass: the weight shard copied from host memory / NVMe
    kernels_f: np.ndarray  # (pairs, pp) per micro-batch: the sharding's HBM-bound kernels on the compute stream, forward
    kernels_b: np.ndarray  # (pairs, pp) ... backward (ZeRO++ (de)quantization, FSDP2's copy-out, the gradients' copy-in,
    # a stack's autocast gradient casts and gradient accumulation)
    exposed_r: np.ndarray  # (pairs, pp) per micro-batch under full recompute: the recompute's own gathers
    # (per-parameter ZeRO-3, `cost_models.zero3_gathers`; 0 where the backward's gather serves the recompute)
    kernels_recompute: np.ndarray  # (pairs, pp) per micro-batch, under full recompute only: a stack's autocast
    # casts of the float32 weights again in each checkpointed layer's re-run forward (`stacks.cast_bytes`)


FULL_RECOMPUTE = RECOMPUTE_MODES.index("full")
"""Row of RECOMPUTE_MODES whose settings re-run each checkpointed layer's forward whole."""

PER_PAIR_ENTRIES = 1 << 14
"""Prices `_PER_PAIR` keeps; it starts over at this many (the memo then simply misses)."""
_PER_PAIR: KeptMemo[tuple] = KeptMemo(PER_PAIR_ENTRIES)
"""`data_parallel_times`'s per-collective prices by (collective, calibration, bus efficiency, each
pair's group), the groups being `Group.strided`'s shared objects; an entry keeps its calibration and
groups (`KeptMemo`)."""

_SECONDS: KeptMemo[np.ndarray] = KeptMemo(1 << 15)
"""`data_parallel_times`'s collective seconds by (id of a `_PER_PAIR` price, the bytes). An entry
keeps its price (`KeptMemo`): `_PER_PAIR` may start over between the prices of one table and their
seconds, and a price dropped from it and from here dies with the table's pricing, so its id can
come back as another calibration's price (the leave-one-family-out refits of `bench.fit_calibration`
once read such stale seconds: llm-foundry's fsdp refit landed on compute 1.1214 in the full run and
1.1266 alone, on the code of 2b7096f)."""


def data_parallel_times(t: StageTable, shardings: tuple[Sharding, ...], cal: Calibration) -> DataParallelTimes:
    """ZeRO and data-parallel collectives of table `t` for each (ZeRO stage, sharding group) pair.

    Volumes (Rajbhandari et al. 2020): ZeRO-0 all-reduces gradients once per step (2 Psi); ZeRO-1
    reduce-scatters them and all-gathers the updated weights (2 Psi); ZeRO-2 reduce-scatters each
    layer's gradients as its backward ends and all-gathers weights once per step; ZeRO-3 / FSDP
    all-gathers each layer's weights for its forward and again for its backward and
    reduce-scatters its gradients (3 Psi per micro-batch). Without a pipeline, FSDP frees the
    unsharded parameters after every backward, so its ZeRO-1/2 all-gather them in every
    micro-batch's forward instead of once per step (torch FSDP2 reshards after backward; FSDP1's
    SHARD_GRAD_OP likewise; torch's pipelining stages keep them to the step's last backward).
    Hybrid sharding all-reduces each rank's gradient shard across the dp / dp_shard replicas. Dense weights use the sharding group
    (dp_shard x cp ranks), expert weights the expert-data-parallel group. Per-layer collectives
    use the table's layer classes (`StageTable.class_*`), the rest the rank's totals (embedding
    and LM head included)."""
    return _with_compute(t, _weight_collectives(t, shardings, cal), cal)


@dataclass(frozen=True)
class _WeightCollectives:
    """What `data_parallel_times` prices of a table's weights alone, per (ZeRO stage, sharding group)
    pair (axis 0) and pipeline rank (last axis), seconds: everything but what the layers' compute
    hides of their gathers and reduce-scatters and what the micro-batch count adds (a stack's
    gradient accumulation), so that the tables of one mesh at other micro-batch counts share it
    (`_dp_grid`; Qwen3-235B-A22B / 256 H100, the plan_speed job: 922 of these for 2,095 tables' data-parallel
    times)."""

    layer_f: np.ndarray  # (pairs, K) one layer's forward gathers, per layer class
    layer_b: np.ndarray  # (pairs, K) its backward gathers + layer-wise reduce-scatters
    per_parameter: bool  # gathered per parameter tensor (`zero3_gathers`): nothing hides behind compute
    first_gather: np.ndarray  # (pairs, pp) the rank's first layer's forward gathers (nothing before to hide behind)
    rest_gather: np.ndarray  # (pairs, pp) ... and the embedding / head / final norm's
    last_rs: np.ndarray  # (pairs, pp) the rank's last layer's reduce-scatter
    rest_rs: np.ndarray  # (pairs, pp) ... and the embedding / head / final norm's
    held: np.ndarray  # (pairs, pp) gradient elements the rank holds while it accumulates
    owner: str | None  # the stack that owns the weights (`stacks.weights_owner`)
    hbm: float  # HBM bytes per second of the rank's memory-bound kernels
    traffic_f: np.ndarray  # the rest as in `DataParallelTimes`
    traffic_b: np.ndarray
    reduce: np.ndarray
    reduce_tail: np.ndarray
    gather: np.ndarray
    optimizer: np.ndarray
    param_copy: np.ndarray
    kernels_f: np.ndarray
    kernels_b: np.ndarray  # (without the gradient accumulation)
    exposed_r: np.ndarray
    kernels_recompute: np.ndarray


def _with_compute(t: StageTable, w: _WeightCollectives, cal: Calibration) -> DataParallelTimes:
    """`data_parallel_times` of table `t` from its weight collectives `w`: a layer's gathers and
    reduce-scatters hide behind a share (`Overlap.zero3`) of its forward / backward compute seconds
    (none where they go per parameter tensor), and a stack accumulates gradients over the table's
    micro-batches (`stacks.accumulation_bytes`)."""
    m, counts = t.mesh, t.class_counts
    if w.per_parameter:
        deficit_f, deficit_b = w.layer_f, w.layer_b
    else:
        zero3 = cal.overlap(m.framework).zero3
        deficit_f = np.maximum(0.0, w.layer_f - zero3 * t.class_forward[None, :])
        deficit_b = np.maximum(0.0, w.layer_b - zero3 * t.class_backward[None, :])
    exposed_f = deficit_f @ counts.T + w.first_gather + w.rest_gather
    exposed_b = deficit_b @ counts.T + w.last_rs + w.rest_rs
    kernels_b = w.kernels_b
    accumulate = stacks.accumulation_bytes(t.training, w.owner, m.optimizer_state, m.grad_accum_)
    if accumulate:
        kernels_b = kernels_b + accumulate * w.held / w.hbm
    for a in (exposed_f, exposed_b, kernels_b):
        a.flags.writeable = False
    return DataParallelTimes(
        exposed_f, exposed_b, w.traffic_f, w.traffic_b, w.reduce, w.reduce_tail, w.gather, w.optimizer, w.param_copy,
        w.kernels_f, kernels_b, w.exposed_r, w.kernels_recompute,
    )


def _weight_collectives(t: StageTable, shardings: tuple[Sharding, ...], cal: Calibration) -> _WeightCollectives:
    """`_WeightCollectives` of table `t` for each (ZeRO stage, sharding group) pair (the volumes and
    sources: `data_parallel_times`): its `_WeightVolumes` priced over the groups its rank order
    places (`_price_volumes`)."""
    stv = mesh_strides(t.mesh)
    return _price_volumes(t, _weight_volumes(t, shardings, cal), stv.dp_cp, stv.expert_dp, cal)


@dataclass(frozen=True)
class _PerTensor:
    """What `_price_volumes` reads of a release that gathers per parameter tensor
    (`zero3_gathers.PER_PARAMETER`), per layer class (1, K) unless said: collectives per layer."""

    gathered: np.ndarray  # dense tensors gathered
    reduced: np.ndarray  # dense gradients reduce-scattered
    gathered_e: np.ndarray  # expert tensors gathered
    reduced_e: np.ndarray  # expert gradients reduce-scattered
    again: np.ndarray  # share of the dense tensors the recompute gathers again (the rest are kept)
    fill_d: np.ndarray  # (pairs, K) seconds of the recompute's zero fill and copy-out, dense ...
    fill_e: np.ndarray  # ... and expert
    rest_gathered: np.ndarray  # (1, pp) tensors of the embedding / head / final norm gathered
    rest_reduced: np.ndarray  # (1, pp) ... and reduce-scattered


@dataclass(frozen=True)
class _WeightVolumes:
    """What `_weight_collectives` computes of a table's weights without reading its rank order, per
    (ZeRO stage, sharding group) pair (axis 0): which collectives run (masks, (pairs, 1)), the bytes
    each moves (dense and expert: pairs, of one layer of each class (pairs, K), else of the rank
    (pairs, pp)), and all that runs on the compute stream or the host link, in seconds as in
    `_WeightCollectives` (HBM-bound kernels, the optimizer step, the offloaded shard's copies).
    The order only places the groups these bytes cross (`mesh_strides`), so `_price_volumes`
    prices them over each order's groups, and the rank orders of one mesh share them (`_dp_grid`;
    Qwen3-235B-A22B / 256 H100, the plan_speed job: 922 `_WeightCollectives` from 463 of these)."""

    shardings: tuple[Sharding, ...]  # the pairs
    gather_f: np.ndarray  # the forward gathers weights in every micro-batch (ZeRO-3; FSDP's ZeRO-1/2 without a pipeline)
    z3: np.ndarray  # the backward gathers them again (ZeRO-3)
    layerwise_rs: np.ndarray  # gradients reduce-scattered as each layer's backward ends (ZeRO-2/3)
    z0: np.ndarray  # gradients all-reduced once per step
    z1: np.ndarray  # gradients reduce-scattered once per step
    gather_once: np.ndarray  # updated weights all-gathered once per step (ZeRO-1/2 but FSDP's regather)
    replicated: np.ndarray  # the gradient shard all-reduced across replicas (hybrid sharding)
    layer_gather: tuple[np.ndarray, np.ndarray]  # (pairs, K) forward gathers of one layer, dense and expert
    layer_back: tuple[np.ndarray, np.ndarray]  # (pairs, K) its backward gathers
    layer_rs: tuple[np.ndarray, np.ndarray]  # (pairs, K) its layer-wise reduce-scatters
    rest_gather: tuple[np.ndarray, np.ndarray]  # (pairs, pp) the embedding / head / final norm's forward gathers
    rest_rs: tuple[np.ndarray, np.ndarray]  # (pairs, pp) ... and reduce-scatters
    gather: tuple[np.ndarray, np.ndarray]  # (pairs, pp) the rank's forward gathers
    back: tuple[np.ndarray, np.ndarray]  # (pairs, pp) its backward gathers
    grads: tuple[np.ndarray, np.ndarray]  # (1, pp) its gradients, once per step
    grads_rs: tuple[np.ndarray, np.ndarray]  # (pairs, pp) its layer-wise reduce-scatters (qgZ's int4)
    shard_grads: np.ndarray  # (pairs, pp) its dense gradient shard (all-reduced across replicas)
    updated: tuple[np.ndarray, np.ndarray]  # (1, pp) its trainable weights, gathered once per step
    bucket: np.ndarray  # (1, pp) the last gradient bucket
    per_tensor: _PerTensor | None  # where the release gathers per parameter tensor
    held: np.ndarray  # the rest as in `_WeightCollectives`
    owner: str | None
    hbm: float
    optimizer: np.ndarray
    param_copy: np.ndarray
    kernels_f: np.ndarray
    kernels_b: np.ndarray
    kernels_recompute: np.ndarray


def _weight_volumes(t: StageTable, shardings: tuple[Sharding, ...], cal: Calibration) -> _WeightVolumes:
    """`_WeightVolumes` of table `t` for each (ZeRO stage, sharding group) pair (the volumes and
    sources: `data_parallel_times`). Read-only arrays."""
    m, tr, cl, gpus = t.mesh, t.training, t.cluster, t.gpus
    pp = m.pp
    zero = np.array([s.zero for s in shardings], dtype=np.int64)[:, None]  # (pairs, 1)
    pb, gb = tr.param_bytes, tr.grad_bytes
    # ZeRO++ volumes (Wang et al. 2023, Sec. 3): qwZ gathers int8 weights, qgZ reduces int4 gradients;
    # hpZ's backward gathers the secondary 16-bit shard (made from the forward's gathered weights)
    qwz = np.array([s.qwz for s in shardings])[:, None]
    qgz = np.array([s.qgz for s in shardings])[:, None]
    hpz = np.array([s.hpz > 1 for s in shardings])[:, None]
    w_fwd = np.where(qwz, min(1.0, QWZ_BYTES_PER_ELEMENT / pb), 1.0)  # (pairs, 1) gathered bytes per stored byte
    w_bwd = np.where(hpz, 1.0, w_fwd)
    g_rs = np.where(qgz, QGZ_BYTES_PER_ELEMENT / gb, 1.0)  # reduced bytes per gradient byte
    hbm = hbm_bandwidth(cl.gpu, stacks.stack_calibration(cal, m.stack), stack_key(m.framework, m.fsdp_flat_params))
    z3 = zero >= 3
    layerwise_rs = zero >= 2  # reduce-scatter as each layer's backward ends (ZeRO-2/3, FSDP)
    # the runtime's single-replica layouts run no FSDP at any ZeRO stage (`stacks.UNWRAPPED`): no copy-out
    # or copy-in kernels, and their float32 weights are cast by autocast
    owner = stacks.weights_owner(m.framework, m.stack, m.dp_, m.cp)
    unwrapped = (zero == 0) | (owner == stacks.UNWRAPPED)
    fsdp = m.framework == "fsdp" and owner != stacks.UNWRAPPED
    fsdp2 = fsdp and not m.fsdp_flat_params
    # FSDP frees a layer's unsharded parameters after its backward (FSDP2's reshard after backward,
    # FSDP1's SHARD_GRAD_OP), so without a pipeline its ZeRO-1/2 gather them again in every
    # micro-batch's forward (`runtime.parallelize`'s ZeRO-1/2). torch's pipelining stages keep them
    # until the step's last backward (`set_reshard_after_backward(False)`), and Megatron's
    # distributed optimizer and DeepSpeed keep them: they gather the updated ones once per step
    regather = fsdp and m.pp == 1
    gather_f = z3 | ((zero >= 1) & regather)

    # --- per layer class: bytes of one layer's gathers and reduce-scatters, (pairs, K) --------------
    # gathers move stored weight bytes (a frozen base included); reductions the trainable gradients
    cwd, cwe = t.class_weight_bytes[0][None, :], t.class_weight_bytes[1][None, :]
    ctd, cte = t.class_trainable[0][None, :], t.class_trainable[1][None, :]
    layer_gather = (cwd * w_fwd, cwe * w_fwd)
    layer_back = (cwd * w_bwd, cwe * w_bwd)
    layer_rs = (ctd * gb * g_rs, cte * gb * g_rs)
    counts = t.class_counts  # (pp, K)
    per_parameter = zero3_gathers.gather_mode(m.framework, m.framework_version) == zero3_gathers.PER_PARAMETER
    # ZeRO++'s quantize / dequantize kernels run on the compute stream, HBM-bound, per layer and pass
    elements_k = (cwd + cwe) / pb
    quant_f_k = np.where(z3 & qwz, QWZ_HBM_BYTES_PER_ELEMENT * elements_k / hbm, 0.0)
    quant_b_k = np.where(z3 & qwz & ~hpz, quant_f_k, 0.0) + np.where(z3 & qgz, QGZ_HBM_BYTES_PER_ELEMENT * (ctd + cte) / hbm, 0.0)
    # so do FSDP2's copy-out after each gather (not FSDP1's: its flat parameters are views of the
    # gathered buffer) and the gradients' copy-in before each reduce-scatter: FSDP's, and Megatron
    # FSDP's copy of each weight GEMM's param.grad without gradient-accumulation fusion
    copy_out = FSDP2_COPY_OUT_BYTES_PER_BYTE * (cwd + cwe) / hbm
    copy_out_f_k = np.where(gather_f & fsdp2, copy_out, 0.0)
    copy_out_b_k = np.where(z3 & fsdp2, copy_out, 0.0)
    unfused_megatron = m.framework == "megatron" and not m.megatron_fsdp_gradient_fusion
    copies_in = layerwise_rs & (fsdp or unfused_megatron)
    copy_in_k = np.where(copies_in, (ctd + cte) * (pb + gb) / hbm, 0.0)
    # the embedding / LM head / final norm (not in a layer class): nothing runs before them to hide
    # behind (the root of FSDP2 is gathered first)
    rest_wd = t.weight_bytes[0] - counts @ t.class_weight_bytes[0]  # (pp,) bytes
    rest_we = t.weight_bytes[1] - counts @ t.class_weight_bytes[1]
    rest_td = t.trainable[0] - counts @ t.class_trainable[0]  # (pp,) elements
    rest_te = t.trainable[1] - counts @ t.class_trainable[1]
    rest_gather = (rest_wd[None, :] * w_fwd, rest_we[None, :] * w_fwd)
    rest_rs = (rest_td[None, :] * gb * g_rs, rest_te[None, :] * gb * g_rs)
    per_tensor = None
    if per_parameter:
        # one collective per parameter tensor, each after a device sync: nothing hides behind compute,
        # and the recompute's forward gathers again (`cost_models.zero3_gathers`); it gathers every
        # tensor (each zero-filled and copied out, as in the forward), and the backward then finds
        # `kept` of the dense ones still gathered
        tens = np.array([zero3_gathers.layer_tensors(t.model, i, m.tp) for i in layer_classes(t.model)[0]], dtype=float).T
        ng, nr, nge, nre, kept = (tens[i][None, :] for i in range(5))
        fill = zero3_gathers.GATHER_HBM_BYTES_PER_BYTE * w_fwd / hbm
        edge = zero3_gathers.edge_tensors(t.model, m.tp)
        per_tensor = _PerTensor(
            ng, nr, nge, nre, (ng - kept) / np.maximum(ng, 1.0), fill * cwd, fill * cwe,
            np.where(rest_wd > 0, edge.gathered, 0)[None, :], np.where(rest_td > 0, edge.reduced, 0)[None, :],
        )
    # the compute-stream kernels, per layer and of the embedding / head / final norm
    rest_copy_out = FSDP2_COPY_OUT_BYTES_PER_BYTE * (rest_wd + rest_we)[None, :] / hbm
    rest_copy_out_f = np.where(gather_f & fsdp2, rest_copy_out, 0.0)
    rest_copy_out_b = np.where(z3 & fsdp2, rest_copy_out, 0.0)
    # (FSDP copies the token-embedding tables' gradients in too; Megatron's hooks on them are
    # `compute.embedding_gradient_time`'s, in the compute already)
    rest_copied = rest_td + rest_te - (0.0 if fsdp else np.minimum(rest_td, t.embedding_grad_elements))
    rest_copy_in = np.where(copies_in, rest_copied[None, :] * (pb + gb) / hbm, 0.0)
    if per_parameter:  # the gathered tensors' zero fill and copy-out, the gradients' copy-in (zero3_gathers)
        gathered_f, gathered_b = zero3_gathers.GATHER_HBM_BYTES_PER_BYTE * np.stack([
            np.where(gather_f, (cwd + cwe) * w_fwd, 0.0), np.where(z3, (cwd + cwe) * w_bwd, 0.0)]) / hbm
        copy_out_f_k = copy_out_f_k + gathered_f
        copy_out_b_k = copy_out_b_k + gathered_b
        copy_in_k = copy_in_k + np.where(layerwise_rs, zero3_gathers.REDUCE_HBM_BYTES_PER_BYTE * (ctd + cte) * gb * g_rs / hbm, 0.0)
    kernels_f = (quant_f_k + copy_out_f_k) @ counts.T + rest_copy_out_f
    kernels_b = (quant_b_k + copy_out_b_k + copy_in_k) @ counts.T + rest_copy_out_b + rest_copy_in

    # a stack's float32 weights under autocast (`stacks.autocast_weights`; ZeRO-0 only: FSDP gathers
    # bf16 parameters): every GEMM weight cast to the compute dtype in each forward, again in a
    # checkpointed layer's recompute, and its bf16 gradient cast back in the backward
    cast_f, cast_b = stacks.cast_bytes(tr, owner)
    gemm_weights = t.gemm_weight_elements[None, :]
    kernels_f = kernels_f + np.where(unwrapped, cast_f * gemm_weights / hbm, 0.0)
    kernels_b = kernels_b + np.where(unwrapped, cast_b * gemm_weights / hbm, 0.0)
    recompute_layers = np.divide(t.recomputed_layers, t.layers, out=np.zeros(pp), where=t.layers > 0)[None, :]
    head = np.zeros(pp)
    head[t.partition.head_rank] = head_gemm_elements(t.model, m.tp) if cast_f else 0.0
    kernels_recompute = np.where(
        unwrapped, cast_f * recompute_layers * np.maximum(t.gemm_weight_elements - head, 0.0)[None, :] / hbm, 0.0
    )

    # --- rank totals: bytes per micro-batch and once per step ------------------------------------------
    WD, WE = t.weight_bytes[0][None, :], t.weight_bytes[1][None, :]
    D, E = t.trainable[0][None, :], t.trainable[1][None, :]
    z0, z1, z12 = zero == 0, zero == 1, (zero >= 1) & (zero <= 2)
    dense_shard = np.array([s.shard * m.cp for s in shardings], dtype=float)[:, None]  # the sharding groups' ranks
    replicated = np.array([(m.dp_ * m.cp) // (s.shard * m.cp) > 1 for s in shardings])[:, None]
    # the last bucket of a once-per-step reduction (ZeRO-0/1) waits for the whole backward
    bucket = np.minimum(D + E, REDUCE_BUCKET_PARAMS) * gb

    # --- optimizer step ------------------------------------------------------------------------------
    expert_shard = np.maximum(1.0, np.array([s.shard * m.cp * m.tp for s in shardings], dtype=float)[:, None] // (m.ep * m.etp_))
    local = np.where(zero >= 1, D / dense_shard, D) + np.where(zero >= 1, E / expert_shard, E)
    # HBM traffic per local parameter: read and write the optimizer states (fp32 master, m, v: 2 x
    # 12 bytes for AdamW), read the gradient, write the working weight
    moved = 2 * tr.optimizer_bytes + tr.grad_bytes + tr.param_bytes
    if owner is not None:  # a stack's trained weights are the optimizer's (read and written), no master
        moved = stacks.optimizer_step_bytes(tr, owner, m.optimizer_state, m.optimizer_fused)
    optimizer = np.empty(local.shape + (3,))
    optimizer[..., 0] = local * moved / hbm
    # offloaded (ZeRO-Offload, Ren et al. 2021): the gradient partition goes down the rank's host link,
    # the node's CPU cores step every rank's partition, the updated weights come back up; one after
    # the other (the step needs the whole gradient, the next forward the new weights)
    ranks_per_node = min(gpus, cl.gpus_per_node)
    link = local * (tr.grad_bytes + tr.param_bytes) / cl.host_to_device_bytes_per_s
    cpu = ranks_per_node * local * host_adam_seconds_per_param(cl, tr)
    optimizer[..., 1] = link + cpu
    # ZeRO-Infinity's NVMe tier (Rajbhandari et al. 2021): the node's drives read every rank's
    # optimizer states and float32 gradient partition in and write the states back, swapped through
    # pinned buffers one sub-group at a time, beside the CPU step as DeepSpeed's pipelined swapper does
    # (a cluster without NVMe has no NVMe tier: the capacity check refuses it; the 1 byte/s floor
    # only keeps these seconds finite)
    nvme_read = ranks_per_node * local * (tr.optimizer_bytes + HOST_GRAD_BYTES) / max(cl.nvme_read_bytes_per_s, 1.0)
    nvme_write = ranks_per_node * local * tr.optimizer_bytes / max(cl.nvme_write_bytes_per_s, 1.0)
    optimizer[..., 2] = link + np.maximum(cpu, nvme_read + nvme_write)
    # ZeRO-3 parameter offload: before each gather (forward and backward) the rank's weight shard
    # crosses the host link (ZeRO-Infinity, Rajbhandari et al. 2021, Sec. 5; FSDP CPUOffload); from
    # NVMe it is read into pinned buffers first, prefetched, so the slower of the two paces it (the
    # node's drives serve all of its ranks)
    shard_bytes = WD / dense_shard + WE / expert_shard
    param_copy = np.empty(shard_bytes.shape + (2,))
    param_copy[..., 0] = np.where(zero >= 3, shard_bytes / cl.host_to_device_bytes_per_s, 0.0)
    from_nvme = ranks_per_node * shard_bytes / max(cl.nvme_read_bytes_per_s, 1.0)
    param_copy[..., 1] = np.where(zero >= 3, np.maximum(param_copy[..., 0], from_nvme), 0.0)
    # a stack's gradient accumulation (`stacks.accumulation_bytes`: autograd's in-place add from the
    # second micro-batch on, `_with_compute`) runs over the gradients the rank holds while it
    # accumulates: unsharded below ZeRO-2 (as `stage_table`'s memory holds them), its shard from ZeRO-2 on
    held = np.where(zero >= 2, D / dense_shard + E / expert_shard, D + E)
    volumes = _WeightVolumes(
        shardings, gather_f, z3, layerwise_rs, z0, z1, z12 & (not regather), (zero > 0) & replicated, layer_gather, layer_back,
        layer_rs, rest_gather, rest_rs, (WD * w_fwd, WE * w_fwd), (WD * w_bwd, WE * w_bwd), (D * gb, E * gb),
        (D * gb * g_rs, E * gb * g_rs), D * gb / dense_shard, (D * pb, E * pb), bucket, per_tensor, held, owner, hbm, optimizer,
        param_copy, kernels_f, kernels_b, kernels_recompute,
    )
    _freeze(volumes)
    return volumes


def _freeze(obj: object) -> None:
    """Mark the arrays of a dataclass object read-only: in its fields and their tuples, and in a
    nested dataclass's (its instance dict holds the fields: no slots)."""
    for value in vars(obj).values():
        for v in value if type(value) is tuple else (value,):
            if type(v) is np.ndarray:
                v.setflags(write=False)
            elif hasattr(v, "__dataclass_fields__"):
                _freeze(v)


def _price_volumes(t: StageTable, v: _WeightVolumes, dp_cp: int, expert_dp: int, cal: Calibration) -> _WeightCollectives:
    """`_WeightCollectives` of table `t` from its weight volumes `v`: each collective's bytes priced
    over the groups of the table's degrees at the rank order's strides of the data x context group
    (`dp_cp`) and the expert-data-parallel group (`expert_dp`: `mesh_strides`), which is all that
    reads the order; the compute-stream and host-link seconds are `v`'s own."""
    m = t.mesh
    shardings = v.shardings
    pairs, pp = len(shardings), m.pp
    framework_eff = cal.overlap(m.framework).bus_efficiency
    key = (id(t.cluster), id(cal), framework_eff, id(shardings), m.cp, m.dp_, m.expert_dp, dp_cp, expert_dp, t.gpus)
    costs = _PAIR_COSTS.get(key)
    if costs is None:
        costs = _PAIR_COSTS.put(key, (t.cluster, cal, shardings), _pair_costs(
            t.cluster, cal, framework_eff, shardings, m.cp, m.dp_, m.expert_dp, dp_cp, expert_dp, t.gpus
        ))
    ag_shard, rs_shard, ag_back, ag_edp, rs_edp, ar_full, ar_edp, ar_repl, shard_gs, edp_g = costs
    seconds, on_channels = _collective_seconds, _on_channels
    gather_f, z3, layerwise_rs = v.gather_f, v.z3, v.layerwise_rs

    # --- per layer class: gathers and reduce-scatters of one layer, (pairs, K) -------------------
    counts = t.class_counts  # (pp, K)
    gather_k = seconds(v.layer_gather[0], ag_shard) + seconds(v.layer_gather[1], ag_edp)
    gather_back_k = seconds(v.layer_back[0], ag_back) + seconds(v.layer_back[1], ag_edp)
    rs_k = seconds(v.layer_rs[0], rs_shard) + seconds(v.layer_rs[1], rs_edp)
    zf_k = np.where(gather_f, gather_k, 0.0)
    zb_k = np.where(z3, gather_back_k, 0.0) + np.where(layerwise_rs, rs_k, 0.0)
    deficit_r = np.zeros_like(zf_k)
    pt = v.per_tensor
    if pt is not None:
        # one collective per parameter tensor, each after a device sync: nothing hides behind compute,
        # and the recompute's forward gathers again (`cost_models.zero3_gathers`)
        host = np.array([[zero3_gathers.host_seconds(g.size, cal.kernel_launch_s)] for g in shard_gs])  # (pairs, 1)
        host_e = zero3_gathers.host_seconds(edp_g.size, cal.kernel_launch_s)

        def each(nbytes: np.ndarray, n: np.ndarray, cost: tuple, host_s: Any) -> np.ndarray:
            """`n` collectives of nbytes / n each, and their host seconds."""
            n = np.broadcast_to(n, np.broadcast_shapes(np.shape(nbytes), np.shape(n)))
            one = seconds(np.where(n > 0, nbytes / np.maximum(n, 1.0), 0.0), cost)
            return n * (one + host_s)

        dense_gather = each(v.layer_gather[0], pt.gathered, ag_shard, host)
        expert_gather = each(v.layer_gather[1], pt.gathered_e, ag_edp, host_e)
        gather_k = dense_gather + expert_gather
        gather_back_k = each(v.layer_back[0], pt.gathered, ag_back, host) + each(v.layer_back[1], pt.gathered_e, ag_edp, host_e)
        rs_k = each(v.layer_rs[0], pt.reduced, rs_shard, host) + each(v.layer_rs[1], pt.reduced_e, rs_edp, host_e)
        zf_k = np.where(gather_f, gather_k, 0.0)
        zb_k = np.where(z3, gather_back_k, 0.0) + np.where(layerwise_rs, rs_k, 0.0)
        # the recompute gathers every tensor again but the dense ones the backward finds kept
        deficit_r = np.where(z3, pt.again * (dense_gather + pt.fill_d) + expert_gather + pt.fill_e, 0.0)
    # the embedding / LM head / final norm (not in a layer class) and the first layer's gather:
    # nothing runs before them to hide behind (the root of FSDP2 is gathered first)
    present = counts > 0
    first_gather = np.where(present[None, :, :], zf_k[:, None, :], 0.0).max(axis=2, initial=0.0)  # (pairs, pp)
    last_rs = np.where(present[None, :, :], np.where(layerwise_rs, rs_k, 0.0)[:, None, :], 0.0).max(axis=2, initial=0.0)
    rest_gather = np.where(gather_f, seconds(v.rest_gather[0], ag_shard) + seconds(v.rest_gather[1], ag_edp), 0.0)
    rest_rs = np.where(layerwise_rs, seconds(v.rest_rs[0], rs_shard) + seconds(v.rest_rs[1], rs_edp), 0.0)
    if pt is not None:  # every layer's collectives are exposed already; the ends' tensors one by one
        first_gather = last_rs = np.zeros_like(first_gather)
        rest_gather = np.where(gather_f, each(v.rest_gather[0], pt.rest_gathered, ag_shard, host), 0.0)
        rest_rs = np.where(layerwise_rs, each(v.rest_rs[0], pt.rest_reduced, rs_shard, host), 0.0)
    exposed_r = deficit_r @ counts.T

    # --- per micro-batch traffic by channel, rank totals ------------------------------------------
    gather_d, gather_e = seconds(v.gather[0], ag_shard), seconds(v.gather[1], ag_edp)
    back_d, back_e = seconds(v.back[0], ag_back), seconds(v.back[1], ag_edp)
    rs_d, rs_e = seconds(v.grads[0], rs_shard), seconds(v.grads[1], rs_edp)
    rs_layer_d, rs_layer_e = seconds(v.grads_rs[0], rs_shard), seconds(v.grads_rs[1], rs_edp)
    traffic_f = np.where(gather_f[:, :, None], on_channels(gather_d, ag_shard) + on_channels(gather_e, ag_edp), 0.0)
    traffic_b = np.where(z3[:, :, None], on_channels(back_d, ag_back) + on_channels(back_e, ag_edp), 0.0)
    traffic_b += np.where(layerwise_rs[:, :, None], on_channels(rs_layer_d, rs_shard) + on_channels(rs_layer_e, rs_edp), 0.0)

    # --- once per step ------------------------------------------------------------------------------
    reduce = np.zeros((pairs, CHANNELS, pp))
    gather = np.zeros((pairs, CHANNELS, pp))
    z0, z1 = v.z0, v.z1
    reduce += np.where(
        z0[:, :, None], on_channels(seconds(v.grads[0], ar_full), ar_full) + on_channels(seconds(v.grads[1], ar_edp), ar_edp), 0.0
    )
    reduce += np.where(z1[:, :, None], on_channels(rs_d, rs_shard) + on_channels(rs_e, rs_edp), 0.0)
    repl = np.where(v.replicated, seconds(v.shard_grads, ar_repl), 0.0)
    reduce += on_channels(repl, ar_repl)
    # ZeRO-1/2 all-gather the updated weights: the trainable ones (all of them, or the adapters);
    # where FSDP gathers in every forward, those gathers do it
    updated_d, updated_e = seconds(v.updated[0], ag_shard), seconds(v.updated[1], ag_edp)
    gather += np.where(v.gather_once[:, :, None], on_channels(updated_d, ag_shard) + on_channels(updated_e, ag_edp), 0.0)
    # the last bucket of a once-per-step reduction (ZeRO-0/1) waits for the whole backward
    reduce_tail = np.where(z0, seconds(v.bucket, ar_full), np.where(z1, seconds(v.bucket, rs_shard), 0.0))
    for a in (zf_k, zb_k, first_gather, rest_gather, last_rs, rest_rs, traffic_f, traffic_b, reduce, reduce_tail, gather, exposed_r):
        a.setflags(write=False)
    return _WeightCollectives(
        zf_k, zb_k, pt is not None, first_gather, rest_gather, last_rs, rest_rs, v.held, v.owner, v.hbm, traffic_f, traffic_b,
        reduce, reduce_tail, gather, v.optimizer, v.param_copy, v.kernels_f, v.kernels_b, exposed_r, v.kernels_recompute,
    )


class _PairCosts(NamedTuple):
    """The `_per_pair` prices `_price_volumes` reads (`_pair_costs`), and the groups it reads again."""

    ag_shard: tuple  # all-gather over each pair's sharding group
    rs_shard: tuple  # reduce-scatter over it
    ag_back: tuple  # the backward's all-gather: over hpZ's secondary group where it is on
    ag_edp: tuple  # all-gather over the expert-data-parallel group
    rs_edp: tuple  # reduce-scatter over it
    ar_full: tuple  # all-reduce over the whole data x context group
    ar_edp: tuple  # all-reduce over the expert-data-parallel group
    ar_repl: tuple  # all-reduce over each pair's replicas (hybrid sharding)
    shard_groups: list[Group]  # each pair's sharding group
    edp_group: Group  # the expert-data-parallel group


_PAIR_COSTS: KeptMemo[_PairCosts] = KeptMemo(1 << 12)
"""`_pair_costs`' memo in `_price_volumes`, keyed on its arguments (the cluster, calibration and
pairs by identity: an entry keeps them)."""


def _pair_costs(
    cl: ClusterSpec, cal: Calibration, framework_eff: float, shardings: tuple[Sharding, ...], cp: int, dp: int,
    expert_dp_size: int, dp_cp: int, expert_dp: int, gpus: int,
) -> _PairCosts:
    """The `_PairCosts` of `shardings` (the pairs) on a mesh of context and data-parallel degrees
    `cp`, `dp` and `expert_dp_size` expert-data-parallel ranks whose order puts those groups at
    strides `dp_cp` and `expert_dp`."""
    made: dict[tuple[int, int], Group] = {}

    def group(size: int, stride: int) -> Group:
        """One Group object per (size, stride), so `_per_pair` prices each once."""
        g = made.get((size, stride))
        if g is None:
            g = made[size, stride] = Group.strided(cl, size, stride, gpus)
        return g

    pairs = len(shardings)
    shard_gs = [group(s.shard * cp, dp_cp) for s in shardings]
    repl_gs = [group((dp * cp) // (s.shard * cp), dp_cp * s.shard * cp) for s in shardings]
    back_gs = [group(s.hpz * cp, dp_cp) if s.hpz > 1 else shard_gs[i] for i, s in enumerate(shardings)]
    full_g = group(dp * cp, dp_cp)
    edp_g = group(expert_dp_size, expert_dp)
    return _PairCosts(
        _per_pair("all_gather", shard_gs, cal, framework_eff), _per_pair("reduce_scatter", shard_gs, cal, framework_eff),
        _per_pair("all_gather", back_gs, cal, framework_eff), _per_pair("all_gather", [edp_g] * pairs, cal, framework_eff),
        _per_pair("reduce_scatter", [edp_g] * pairs, cal, framework_eff),
        _per_pair("all_reduce", [full_g] * pairs, cal, framework_eff), _per_pair("all_reduce", [edp_g] * pairs, cal, framework_eff),
        _per_pair("all_reduce", repl_gs, cal, framework_eff), shard_gs, edp_g,
    )


def _per_pair(kind: str, groups: list[Group], cal: Calibration, framework_eff: float) -> tuple:
    """(seconds per byte, latency seconds, channel one-hot (pairs, CHANNELS), the size curve of
    every pair where they share one (else None), the pairs grouped by size curve) of one
    collective over each pair's group at the framework's bus efficiency `framework_eff` (priced once
    per distinct group; memoized: `_PER_PAIR`)."""
    key = (kind, id(cal), framework_eff, *map(id, groups))
    hit = _PER_PAIR.get(key)
    if hit is not None:
        return hit
    priced: dict[int, tuple[float, float]] = {}
    for g in groups:
        if id(g) not in priced:
            priced[id(g)] = collective_cost(kind, g, cal)  # type: ignore[arg-type]
    per_byte = np.array([priced[id(g)][0] for g in groups])[:, None] / framework_eff
    lat = np.array([priced[id(g)][1] for g in groups])[:, None]
    onehot = np.zeros((len(groups), CHANNELS))
    onehot[np.arange(len(groups)), [g.channel for g in groups]] = 1.0
    rows: dict[int, tuple[SizeCurve, list[int]]] = {}  # pairs by size curve, priced together
    for i, g in enumerate(groups):
        c = g.curve if kind in RING_KINDS and g.size > 1 else None
        if c is not None:
            rows.setdefault(id(c), (c, []))[1].append(i)
    curves = list(rows.values())
    whole = curves[0][0] if len(curves) == 1 and len(curves[0][1]) == len(groups) else None
    for a in (per_byte, lat, onehot):
        a.flags.writeable = False
    return _PER_PAIR.put(key, (cal, groups), (per_byte, lat, onehot, whole, curves))


def _collective_seconds(nbytes: np.ndarray, cost: tuple) -> np.ndarray:
    """Alpha-beta seconds x the measured size ratio of each pair's span (`comm.size_ratio`) of
    `nbytes` over the groups of a `_per_pair` price, memoized on the price (`_per_pair`'s shared
    tuples, by identity: the entry keeps its price) and the bytes (`_SECONDS`: the tables of one
    search repeat their volumes); the array returned is read-only."""
    nb = np.asarray(nbytes)
    key = (id(cost), nb.shape, nb.dtype.char, nb.tobytes())
    hit = _SECONDS.get(key)
    if hit is not None:
        return hit
    out = _alpha_beta_seconds(nb, cost)
    out.flags.writeable = False
    return _SECONDS.put(key, cost, out)


def _alpha_beta_seconds(nbytes: np.ndarray, cost: tuple) -> np.ndarray:
    """`_collective_seconds` without the memo."""
    per_byte, lat, _, whole, curves = cost
    out = np.where(nbytes > 0, nbytes * per_byte + lat, 0.0)
    if whole is not None:
        return out * whole.at_positive(nbytes)  # (out is 0 where nbytes <= 0)
    if curves:
        nb = nbytes if np.shape(nbytes) == out.shape else np.broadcast_to(nbytes, out.shape)
        ratio = np.ones(out.shape)
        for c, idx in curves:
            ratio[idx] = c.at_positive(nb[idx])
        out = out * ratio
    return out


def _on_channels(sec: np.ndarray, cost: tuple) -> np.ndarray:
    """(pairs, X) seconds -> (pairs, CHANNELS, X) on each pair's channel of a `_per_pair` price."""
    return cost[2][:, :, None] * sec[:, None, :]


@dataclass(frozen=True)
class PhaseArrays:
    """What one micro-batch costs on each pipeline rank apart from the ZeRO knobs: per recompute
    mode (axis 0: none, selective, full) where it matters, seconds."""

    sum_f: np.ndarray  # (pp,) forward compute + exposed TP / CP / EP
    sum_b: np.ndarray  # (modes, pp) backward (+ recompute) compute + exposed TP / CP / EP
    busy_f: np.ndarray  # (modes, CHANNELS, pp) forward traffic per channel (TP, CP, EP, pipeline, host)
    busy_b: np.ndarray  # (modes, CHANNELS, pp)
    pp_exposed: float  # pipeline send/recv exposed per micro-batch
    parts: np.ndarray  # (5, modes, pp): compute, recompute, TP, CP, EP exposed per micro-batch
    weight_grad: np.ndarray  # (pp,) the weight-gradient share W of the backward compute (zero bubble)
    tp_hidden_f: np.ndarray  # (pp,) TP/SP traffic TP comm overlap hides in the forward
    tp_hidden_b: np.ndarray  # (modes, pp) ... and in the backward (`fsdp_drops_comm_overlap`)
    cp_hidden_f: np.ndarray  # (pp,) ring-attention traffic hidden behind attention in the forward
    cp_hidden_b: np.ndarray  # (modes, pp) ... and in the backward
    compute_f: np.ndarray  # (pp,) forward compute alone (what collectives can run beside)
    compute_b: np.ndarray  # (modes, pp) backward (+ recompute) compute alone


def phase_arrays(t: StageTable, vpp: int, cal: Calibration) -> PhaseArrays:
    """`PhaseArrays` of table `t` with `vpp` virtual stages (module doc)."""
    m = t.mesh
    ov = cal.overlap(m.framework)
    pp = m.pp
    eps = t.ep_per_moe_layer
    # DualPipeV's F&B pairs and Megatron's combined 1F1B hide the all-to-alls behind compute run
    # beside the comm kernels (module doc)
    fb_pairs = fb_paired(m)
    ep_exposed_share = 0.0 if fb_pairs else 1 - ov.ep
    if fb_pairs:
        slow = np.where((t.moe_layers > 0) & (eps > 0), comm_sm_slowdown(t.cluster.gpu.sm_count), 1.0)
        forward = t.forward * slow
        backward = (t.compute - t.forward) * slow
        recompute = t.recompute * slow[None, :]
        compute = t.compute * slow
    else:  # no stretch: the table's own seconds (x 1.0, the same floats)
        forward, backward, recompute, compute = t.forward, t.compute - t.forward, t.recompute, t.compute
    full = _FULL * t.recomputed_layers[None, :]  # (modes, pp) layers re-run in the backward
    full_moe = _FULL * t.recomputed_moe[None, :]
    tp_hidden = ov.tp if t.tp_overlap else 0.0
    tau = t.tp_per_layer
    tp_f = t.layers * tau
    tp_f_exp = tp_f * (1 - tp_hidden)
    tp_b_layers = (t.layers[None, :] + full) * tau
    tp_b_exp = tp_b_layers * (1 - tp_hidden)
    tp_b_busy = t.layers[None, :] * tau * t.tp_backward_traffic + full * tau
    share = np.divide(full, np.maximum(t.layers, 1.0)[None, :])  # recomputed share of the rank's layers
    cp_f_exp, cp_b_exp0 = t.cp_exposed
    cp_f_busy, cp_b_busy0 = t.cp_busy
    cp_b_exp = cp_b_exp0[None, :] + share * cp_f_exp[None, :]
    cp_b_busy = cp_b_busy0[None, :] + share * cp_f_busy[None, :]
    ep_f = t.moe_layers * eps
    ep_b = (t.moe_layers[None, :] + full_moe) * eps
    p2p_one_way = vpp * t.p2p if pp > 1 else 0.0

    sum_f = forward + tp_f_exp + cp_f_exp + ep_f * ep_exposed_share
    sum_b = backward[None, :] + recompute + tp_b_exp + cp_b_exp + ep_b * ep_exposed_share
    tp_ch, cp_ch, ep_ch, pp_ch, etp_ch = t.channels
    etp_share = t.etp_per_moe_layer / eps if eps > 0 else 0.0  # expert-TP exchange on its own group's channel
    # each channel's traffic, its groups' added in this order from zero: TP, CP, EP, expert TP,
    # pipeline (the forward's is the same in every recompute mode), and on the host link the
    # offloaded layers' saved tensors, to the host in the forward and back in the backward, on a
    # copy stream beside the compute
    offloaded = t.offloaded_acts / t.cluster.host_to_device_bytes_per_s
    traffic = (  # (channel, forward seconds, backward seconds) of each group
        (tp_ch, tp_f, tp_b_busy), (cp_ch, cp_f_busy, cp_b_busy), (ep_ch, ep_f * (1 - etp_share), ep_b * (1 - etp_share)),
        (etp_ch, ep_f * etp_share, ep_b * etp_share), (pp_ch, p2p_one_way, p2p_one_way), (HOST, offloaded, offloaded),
    )
    busy_f = np.empty((len(_FULL), CHANNELS, pp))
    busy_b = np.empty((len(_FULL), CHANNELS, pp))
    for channel in range(CHANNELS):
        on_f: Any = 0.0
        on_b: Any = 0.0
        for ch, f, b in traffic:
            if ch == channel:
                on_f = on_f + f
                on_b = on_b + b
        busy_f[:, channel] = on_f
        busy_b[:, channel] = on_b
    parts = np.empty((5, len(_FULL), pp))
    parts[0] = compute
    parts[1] = recompute
    parts[2] = tp_f_exp[None, :] + tp_b_exp
    parts[3] = cp_f_exp[None, :] + cp_b_exp
    parts[4] = (ep_f[None, :] + ep_b) * ep_exposed_share
    weight_grad = ZB_WEIGHT_SHARE * backward
    tp_hidden_f = tp_f * tp_hidden
    tp_hidden_b = tp_b_layers * tp_hidden
    return PhaseArrays(
        sum_f, sum_b, busy_f, busy_b, 2 * p2p_one_way * (1 - ov.pp), parts, weight_grad, tp_hidden_f, tp_hidden_b,
        cp_f_busy - cp_f_exp, cp_b_busy - cp_b_exp, forward, backward[None, :] + recompute,
    )


SINGLE_QUEUE_GENERATIONS = ("hopper", "ampere", "volta")
"""GPU generations on which Megatron-LM's TP / SP overlap needs one CUDA hardware queue
(`CUDA_DEVICE_MAX_CONNECTIONS=1`): "this requirement no longer exists since the Blackwell
architecture" (megatron/training/arguments.py, `validate_args`)."""


def fsdp_drops_comm_overlap(t: StageTable, zero: np.ndarray) -> np.ndarray | None:
    """(J,) True where a setting runs Megatron-FSDP (framework megatron, ZeRO-2/3) beside tensor or
    context parallelism on a GPU before Blackwell; None where no setting of the table can.
    Megatron-LM's `validate_args` asserts `CUDA_DEVICE_MAX_CONNECTIONS` > 1 for FSDP ("FSDP always
    requires ... larger than one"), while tensor and context parallelism need 1 so that each
    collective is scheduled before the kernel it hides behind ("try not to use them together since
    they require different CUDA_MAX_CONNECTIONS settings"). With several hardware queues the GEMM or
    attention kernel launched after a collective can take every SM first and the collective waits
    behind it: what TP comm overlap (`Overlap.tp`) and the ring-attention exchange would hide is
    priced exposed."""
    m = t.mesh
    if m.framework != "megatron" or not overlap_needs_one_queue(m.tp, m.cp, t.cluster.gpu):
        return None
    return zero >= 2


def overlap_needs_one_queue(tp: int, cp: int, gpu: GPUSpec) -> bool:
    """Whether this mesh's TP / CP communication overlap needs `CUDA_DEVICE_MAX_CONNECTIONS=1` on
    `gpu` (`SINGLE_QUEUE_GENERATIONS`), which Megatron-FSDP forbids (`fsdp_drops_comm_overlap`)."""
    return (tp > 1 or cp > 1) and gpu.vendor == "nvidia" and gpu_generation(gpu.name) in SINGLE_QUEUE_GENERATIONS


def compose(
    t: StageTable,
    knobs: KnobArrays,
    dp: DataParallelTimes,
    phases: PhaseArrays,
    vpp: int,
    cal: Calibration,
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Step seconds of every setting of `knobs` (module doc): (step (J,), per-micro-batch time of
    every rank (J, pp), the parts (J,) named in `STEP_PARTS`, which sum to the step). The mesh's
    schedule sets the bubble (`pipeline.rank_idle`) and whether a forward runs beside a backward."""
    m = t.mesh
    ov = cal.overlap(m.framework)
    pp, mb_count = m.pp, m.grad_accum_
    J = len(knobs.zero)
    mode, pair = knobs.mode, knobs.sharding
    rows = np.arange(J)

    # the sharding's compute-stream kernels lengthen the compute that collectives run beside
    kernels_f, kernels_b = dp.kernels_f[pair], dp.kernels_b[pair]  # (J, pp)
    kernels_b = kernels_b + np.where((mode == FULL_RECOMPUTE)[:, None], dp.kernels_recompute[pair], 0.0)
    compute_f = phases.compute_f[None, :] + kernels_f
    compute_b = phases.compute_b[mode] + kernels_b
    sum_f = phases.sum_f[None, :] + kernels_f + dp.exposed_f[pair]
    exposed_b = dp.exposed_b[pair] + _FULL[mode] * dp.exposed_r[pair]  # the recompute's own gathers, where it has them
    sum_b = phases.sum_b[mode] + kernels_b + exposed_b
    lost = fsdp_drops_comm_overlap(t, knobs.zero)
    if lost is not None:  # Megatron-FSDP beside TP / CP before Blackwell: what their overlap hides is exposed
        lost_f = lost[:, None] * (phases.tp_hidden_f + phases.cp_hidden_f)[None, :]  # (J, pp)
        lost_b = lost[:, None] * (phases.tp_hidden_b + phases.cp_hidden_b)[mode]
        sum_f = sum_f + lost_f
        sum_b = sum_b + lost_b
        tp_lost = lost[:, None] * (phases.tp_hidden_f[None, :] + phases.tp_hidden_b[mode])
        cp_lost = lost_f + lost_b - tp_lost
    busy_f, busy_b = _busy(knobs, dp, phases)  # (J, CHANNELS, pp)
    # collectives beside compute hold COMM_SMS of the SMs: the compute they overlap stretches
    sm_share = beside_sm_share(t)
    if sm_share:
        stolen_f = sm_share * comm_beside_compute(busy_f, sum_f - compute_f, compute_f)
        stolen_b = sm_share * comm_beside_compute(busy_b, sum_b - compute_b, compute_b)
        sum_f = sum_f + stolen_f
        sum_b = sum_b + stolen_b
    t_f = np.maximum(sum_f, np.maximum.reduce(busy_f, axis=1))
    t_b = np.maximum(sum_b, np.maximum.reduce(busy_b, axis=1))
    if fb_paired(m):  # F&B: a forward and a backward chunk share one window
        per_mb = np.maximum(sum_f + sum_b, np.maximum.reduce(busy_f + busy_b, axis=1)) + phases.pp_exposed
    else:
        per_mb = t_f + t_b + phases.pp_exposed
    slow = per_mb.argmax(axis=1)
    if pp == 1:
        bubble = np.zeros(J)
    else:  # every rank but the slowest idles
        idle = rank_idle(m.schedule_, per_mb, t_b, phases.weight_grad[None, :], vpp)
        bubble = idle.sum(axis=1) - idle[rows, slow]

    # once per step: windows of the last backward (+ drain) and the first forward (+ warm-up)
    ranks = np.arange(pp, dtype=float)[None, :]
    # the ranks' mean (numpy's `mean`: the sum over the ranks, divided by pp)
    drain = ranks * (np.add.reduce(t_b, axis=1, keepdims=True) / pp) / vpp if pp > 1 else 0.0
    warmup = ranks * (np.add.reduce(t_f, axis=1, keepdims=True) / pp) / vpp if pp > 1 else 0.0
    free_b = np.maximum(0.0, t_b[:, None, :] - busy_b) + (drain[:, None, :] if pp > 1 else 0.0)
    free_f = np.maximum(0.0, t_f[:, None, :] - busy_f) + (warmup[:, None, :] if pp > 1 else 0.0)
    reduce = dp.reduce[pair]
    exposed_reduce = np.maximum.reduce(np.maximum(0.0, reduce - ov.dp * free_b), axis=1)  # (J, pp)
    exposed_reduce = np.maximum(exposed_reduce, dp.reduce_tail[pair])
    gather = dp.gather[pair]
    exposed_gather = np.maximum.reduce(np.maximum(0.0, gather - ov.dp * free_f), axis=1)
    if sm_share:  # the last backward and the first forward stretch under the hidden reduction / gather
        stolen_reduce = sm_share * comm_beside_compute(reduce, exposed_reduce, compute_b)
        stolen_gather = sm_share * comm_beside_compute(gather, exposed_gather, compute_f)
    else:
        stolen_reduce = stolen_gather = np.zeros_like(exposed_reduce)
    tier = knobs.offload.astype(np.int64) * (1 + knobs.offload_nvme.astype(np.int64))  # 0 GPU, 1 host, 2 NVMe
    optimizer = dp.optimizer[pair, :, tier]  # (J, pp)
    tail = exposed_reduce + stolen_reduce + optimizer
    tail_rank = tail.argmax(axis=1)
    gather_rank = (exposed_gather + stolen_gather).argmax(axis=1)
    gather_s = exposed_gather[rows, gather_rank]

    at = phases.parts[:, mode, slow]  # (5, J) at the slowest rank
    parts = np.empty((len(STEP_PARTS), J))
    np.multiply(mb_count, at, out=parts[:5])
    parts[0] += mb_count * (kernels_f + kernels_b)[rows, slow]
    parts[0] += stolen_reduce[rows, tail_rank] + stolen_gather[rows, gather_rank]
    if sm_share:
        parts[0] += mb_count * (stolen_f + stolen_b)[rows, slow]
    if lost is not None:
        parts[2] += mb_count * tp_lost[rows, slow]
        parts[3] += mb_count * cp_lost[rows, slow]
    parts[5] = mb_count * phases.pp_exposed
    parts[6] = mb_count * (dp.exposed_f[pair, slow] + exposed_b[rows, slow]) + exposed_reduce[rows, tail_rank] + gather_s
    parts[7] = mb_count * (per_mb - phases.pp_exposed - sum_f - sum_b)[rows, slow]
    parts[8] = bubble
    parts[9] = optimizer[rows, tail_rank]
    overhead = _step_overhead(t, cal)
    parts[10] = overhead
    step = np.add.reduce(parts, axis=0)
    # roofline over channels: a rank's whole-step traffic on one channel
    traffic = channel_traffic(t, knobs, dp, phases, (busy_f, busy_b))  # (J, CHANNELS, pp)
    busiest = np.maximum.reduce(traffic, axis=(1, 2)) + overhead
    excess = np.maximum(0.0, busiest - step)
    parts[7] += excess
    step = step + excess
    return step, per_mb, dict(zip(STEP_PARTS, parts, strict=True))


def _step_overhead(t: StageTable, cal: Calibration) -> float:
    """Fixed seconds per step of table `t`'s layout: a fine-tuning stack's loop replaces its
    framework's fitted fixed cost (`cost_models.stacks`); the cluster's own fixed cost
    (`Calibration.step_overhead_s`, from its profiles) adds to either."""
    m = t.mesh
    if m.stack is None:
        return cal.step_overhead(stack_key(m.framework, m.fsdp_flat_params))
    return stacks.stack_overhead_s(cal, m.stack, m.grad_accum_) + cal.step_overhead_s


def once_per_step_floor(t: StageTable, knobs: KnobArrays, cal: Calibration) -> np.ndarray:
    """(J,) seconds `compose` adds to every setting's step beyond the micro-batches and the bubble
    that `mode_lower_bounds` bounds: the busiest rank's once-per-step tail (the exposed gradient
    reduction, never less than its last bucket `reduce_tail` nor 0, and the optimizer step at the
    setting's tier, `DataParallelTimes.optimizer`; the tail's SMs stolen from the last backward are
    not counted) and the fixed step overhead. `compose`'s step holds the tail of its tail rank (the
    largest) and the overhead as separate parts, and its roofline only raises it, so
    `mode_lower_bounds` of the setting's mode plus this is still a bound
    (tests/planner/test_search_bounds.py checks it against every priced step)."""
    dp = _dp_grid(t, knobs.shardings, cal, _dp_table_key(t, cal))
    return _BoundParts.of(dp, knobs, beside_sm_share(t), t.mesh.grad_accum_).tail + _step_overhead(t, cal)


def setting_lower_bounds(t: StageTable, knobs: KnobArrays, vpp: int, cal: Calibration, rank_floors: np.ndarray) -> np.ndarray:
    """(J,) seconds no setting of `knobs` can beat on table `t` with `vpp` virtual stages, each the
    larger of two bounds of its own step (`compose`):
    - its micro-batches and bubble (`pipelined_floor`), from each rank's micro-batch floor of the
      setting's mode (`rank_floors`: `mode_rank_floors`, or floors below them) raised by what the
      setting's sharding adds to both passes of every micro-batch on that rank (its compute-stream
      kernels, the gathers and reduce-scatters the compute leaves exposed, and under full
      recompute the recompute's own; the exposed seconds less the SM share of them, as exposing a
      second of traffic can take that much from the SMs the floor counts the hidden traffic as
      holding), plus what the step adds once (`once_per_step_floor`);
    - the roofline: the busiest channel of any rank over the step carries at least the sharding's
      own traffic (every micro-batch's ZeRO gathers and reduce-scatters, the once-per-step
      gradient reduction and parameter gather), plus the fixed step overhead.
    Never below `mode_lower_bounds` plus `once_per_step_floor` (up to float rounding);
    tests/planner/test_search_bounds.py checks it against every priced step. The search's Pareto
    check reads it: a ZeRO-3 setting whose exposed gathers double its step is bounded here, not
    timed."""
    dp = _dp_grid(t, knobs.shardings, cal, _dp_table_key(t, cal))
    parts = _BoundParts.of(dp, knobs, beside_sm_share(t), t.mesh.grad_accum_)
    overhead = _step_overhead(t, cal)
    micro_batches = pipelined_floor(rank_floors[knobs.mode] + parts.added, t, vpp) + (parts.tail + overhead)
    return np.maximum(micro_batches, parts.roofline + overhead)


@dataclass(frozen=True)
class _BoundParts:
    """What `setting_lower_bounds` reads of a table's data-parallel times, per setting: what its
    sharding adds to one micro-batch on each rank, (J, pp), under full recompute the recompute's
    share too; its once-per-step tail (`once_per_step_floor` less the overhead), (J,); the roofline
    of its sharding's own traffic over the step, (J,). Memoized on the `DataParallelTimes` and
    `KnobArrays` objects (tables of one data-parallel key share the first, a grid's tables the
    second), the SM share of the table's schedule and its micro-batch count."""

    added: np.ndarray
    tail: np.ndarray
    roofline: np.ndarray

    @classmethod
    def of(cls, dp: DataParallelTimes, knobs: KnobArrays, sm_share: float, grad_accum: int) -> _BoundParts:
        key = (id(dp), id(knobs), sm_share, grad_accum)
        hit = _BOUND_PARTS.get(key)
        if hit is not None:
            return hit
        mode, pair = knobs.mode, knobs.sharding
        tier = knobs.offload.astype(np.int64) * (1 + knobs.offload_nvme.astype(np.int64))  # 0 GPU, 1 host, 2 NVMe
        # a second of exposed gathers can shrink the SMs the floors count as taken by the hidden
        # traffic (`comm_beside_compute` subtracts what a window exposes) by at most `sm_share` of it
        kept = 1.0 - sm_share
        added = dp.kernels_f + dp.kernels_b + kept * (dp.exposed_f + dp.exposed_b)  # (pairs, pp)
        added_by_recompute = dp.kernels_recompute + kept * dp.exposed_r  # (pairs, pp), full recompute only
        tail = np.maximum.reduce(np.maximum(dp.reduce_tail, 0.0)[:, :, None] + dp.optimizer, axis=1)  # (pairs, tiers)
        traffic = grad_accum * (dp.traffic_f + dp.traffic_b) + dp.reduce + dp.gather  # (pairs, CHANNELS, pp)
        parts = cls(added[pair] + _FULL[mode] * added_by_recompute[pair], tail[pair, tier], np.maximum.reduce(traffic, axis=(1, 2))[pair])
        return _BOUND_PARTS.put(key, (dp, knobs), parts)


_BOUND_PARTS: KeptMemo[_BoundParts] = KeptMemo(1 << 14)
"""`_BoundParts.of`'s memo; an entry keeps its `DataParallelTimes` and `KnobArrays` (`KeptMemo`)."""


def channel_traffic(
    t: StageTable, knobs: KnobArrays, dp: DataParallelTimes, phases: PhaseArrays,
    busy: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Seconds each rank's channels are busy over a whole step, (J, CHANNELS, pp): every
    micro-batch's TP / CP / EP / pipeline traffic, ZeRO gathers and reduce-scatters, and the
    once-per-step gradient reduction and parameter gather. No step is shorter than its busiest
    channel (`compose`'s roofline). `busy`: `_busy`'s result when the caller has it."""
    pair = knobs.sharding
    busy_f, busy_b = busy if busy is not None else _busy(knobs, dp, phases)
    return t.mesh.grad_accum_ * (busy_f + busy_b) + dp.reduce[pair] + dp.gather[pair]


def _busy(knobs: KnobArrays, dp: DataParallelTimes, phases: PhaseArrays) -> tuple[np.ndarray, np.ndarray]:
    """Seconds each channel is busy in one micro-batch's forward and backward, (J, CHANNELS, pp):
    the phase's traffic, the ZeRO collectives, and under parameter offload the weight shard's copy
    over the host link in each pass."""
    mode, pair = knobs.mode, knobs.sharding
    busy_f = phases.busy_f[mode] + dp.traffic_f[pair]
    busy_b = phases.busy_b[mode] + dp.traffic_b[pair]
    if knobs.offload_params.any():
        source = dp.param_copy[pair, :, knobs.offload_nvme.astype(np.int64)]  # (J, pp)
        copy = np.where(knobs.offload_params[:, None], source, 0.0)
        busy_f = busy_f.copy()
        busy_b = busy_b.copy()
        busy_f[:, HOST] += copy
        busy_b[:, HOST] += copy
    return busy_f, busy_b


def mode_lower_bounds(t: StageTable, vpp: int, cal: Calibration, phases: PhaseArrays | None = None) -> np.ndarray:
    """(modes,) seconds no setting of table `t` can beat with each recompute mode (`RECOMPUTE_MODES`):
    `pipelined_floor` of the mode's per-rank floors (`mode_rank_floors`): its own backward phase, which holds its recompute forward, the
    collectives that forward repeats, and their SMs (the first entry, no recompute, is the table's
    bound). `compose` times a setting of that mode from the same phase, and its other knobs (ZeRO
    traffic, once-per-step reduction, optimizer, offload) only add to it
    (tests/planner/test_search_bounds.py checks every priced step of the reference meshes against
    it). All modes at once, row by row the same float operations as one mode's."""
    ph = phase_arrays(t, vpp, cal) if phases is None else phases
    return pipelined_floor(mode_rank_floors(t, ph), t, vpp)


def mode_rank_floors(t: StageTable, ph: PhaseArrays) -> np.ndarray:
    """(modes, pp) seconds of one micro-batch on each rank that no setting of a recompute mode can
    beat, from the table's phase arrays `ph`: compute, the knob-independent exposed communication
    (TP, CP, EP), the SMs that traffic takes from the compute it runs beside (ZeRO traffic only
    adds to it), and the pipeline send/recv exposed."""
    exposed = ph.sum_f[None, :] + ph.sum_b - t.compute[None, :]  # (modes, pp)
    share = beside_sm_share(t)
    if share:  # the SMs the knob-independent traffic takes (ZeRO traffic only adds to it)
        f = comm_beside_compute(ph.busy_f, (ph.sum_f - ph.compute_f)[None], ph.compute_f[None])
        b = comm_beside_compute(ph.busy_b, ph.sum_b - ph.compute_b, ph.compute_b)
        exposed = exposed + share * (f + b)
    return t.compute[None, :] + exposed + ph.pp_exposed


def pipelined_floor(per: np.ndarray, t: StageTable, vpp: int) -> np.ndarray:
    """(rows,) seconds no step can beat whose ranks each take at least `per` (rows, pp) seconds per
    micro-batch on table `t`'s pipeline: its micro-batch count times the slowest rank, plus the
    other ranks' sum over `vpp` (the bubble; nothing for one rank or for a schedule whose weight
    passes may fill it: zero_bubble, zbv, dualpipev). It grows with every rank's seconds, so floors
    below a setting's own per-rank times give a bound of its step; every knob (recompute, ZeRO
    traffic, once-per-step reduction, optimizer, offload) only adds to those, and the channel
    rooflines only raise the step."""
    worst = np.maximum.reduce(per, axis=1)  # `per.max(axis=1)`, `per.sum(axis=1)` without their wrappers
    pp = per.shape[1]
    bubble_free = t.mesh.schedule_ in SPLIT_BACKWARD_SCHEDULES
    bubble = (np.add.reduce(per, axis=1) - worst) / vpp if pp > 1 and not bubble_free else 0.0
    return t.mesh.grad_accum_ * worst + bubble


def price_time(
    t: StageTable, settings: list[Setting], prices: KnobPrices, vpp: int, cal: Calibration,
    phases: PhaseArrays | None = None,
) -> KnobPrices:
    """Seconds per step for every setting (`cost_models.step_time`: the composition and its
    sources), filled into `prices` (step, per-rank micro-batch time, named parts). `phases`: the
    table's `phase_arrays` at `vpp` when the caller has them already."""
    J = len(settings)
    knobs = prices.knobs if prices.knobs is not None and len(prices.knobs.zero) == J else KnobArrays.of(settings)
    dp = _dp_grid(t, knobs.shardings, cal, _dp_table_key(t, cal))
    step, per_mb, parts = compose(t, knobs, dp, phase_arrays(t, vpp, cal) if phases is None else phases, vpp, cal)
    prices.stage_time = per_mb
    prices.parts = parts
    prices.step_s = step
    return prices


def time_lower_bound(t: StageTable, vpp: int, cal: Calibration) -> float:
    """Seconds no knob setting of a built table can beat: `mode_lower_bounds` without recompute."""
    return float(mode_lower_bounds(t, vpp, cal)[0])


DP_ENTRIES = 1 << 14
"""Entries each `_dp_grid` memo keeps; it starts over at this many (the memo then simply misses)."""
_DP_GRIDS: KeptMemo[DataParallelTimes] = KeptMemo(DP_ENTRIES)
_DP_WEIGHTS: KeptMemo[_WeightCollectives] = KeptMemo(DP_ENTRIES)
_DP_VOLUMES: KeptMemo[_WeightVolumes] = KeptMemo(DP_ENTRIES)
"""`_dp_grid`'s memos: the data-parallel times by (`_dp_table_key`, the pairs), their weight
collectives by (`_dp_weight_key`, the pairs), the weight volumes those price by (`_dp_volume_key`,
the pairs); each entry keeps the job objects its key names by id (cluster, training, calibration,
model: `KeptMemo`)."""


def _dp_grid(
    t: StageTable, shardings: tuple[Sharding, ...], cal: Calibration, table_key: tuple
) -> DataParallelTimes:
    """`step_time.data_parallel_times` of a table's (ZeRO stage, sharding group) pairs, memoized on
    `_dp_table_key` and the pairs (the entry keeps the job objects alive, so their ids are not
    reused): tables of one mesh and micro-batch count share them; those of one mesh at other
    micro-batch counts their weight collectives (`_WeightCollectives`, memoized on `_dp_weight_key`:
    only `_with_compute` runs again), and those of other rank orders whose data-parallel groups
    keep their strides the weight collectives too; the other rank orders of a mesh share its weight
    volumes (`_WeightVolumes`, memoized on `_dp_volume_key`: only `_price_volumes` runs again;
    Qwen3-235B-A22B / 256 H100, the plan_speed job: 463 volumes priced 922 times, where keying the weight
    collectives on the order itself made 1,076). Read-only."""
    key = (table_key, shardings)
    hit = _DP_GRIDS.get(key)
    if hit is not None:
        return hit
    objs = (t.cluster, t.training, cal, t.model)
    weight_key = _dp_weight_key(t, table_key)
    weights = _memo(_DP_WEIGHTS, (weight_key, shardings), objs, lambda: _price_volumes(
        t, _memo(_DP_VOLUMES, (weight_key[0], shardings), objs, lambda: _weight_volumes(t, shardings, cal)),
        weight_key[1], weight_key[2], cal,
    ))
    return _memo(_DP_GRIDS, key, objs, lambda: _with_compute(t, weights, cal))


def _memo(memo: KeptMemo[Any], key: tuple, objs: tuple[object, ...], make: Any) -> Any:
    """`memo`'s value under `key`, else `make()`, kept there with the objects `objs` the key names by id."""
    hit = memo.get(key)
    return hit if hit is not None else memo.put(key, objs, make())


DP_ARRAY_FIELDS = (
    "weight_bytes", "trainable", "class_counts", "class_weight_bytes", "class_trainable", "embedding_grad_elements",
    "gemm_weight_elements", "recomputed_layers", "layers", "class_forward", "class_backward",
)
"""The arrays of a table that its data-parallel times read: its weight volumes all but the last two
(`_weight_volumes`: the rank's weights and trainable elements, the layer classes, the gradients the
compute holds, the autocast GEMM weights, the layers and those re-run), `_with_compute` the layer
classes' compute seconds."""
_DP_ARRAYS = operator.attrgetter(*DP_ARRAY_FIELDS)


DP_VOLUME_MESH_FIELDS = (
    "framework", "fsdp_flat_params", "megatron_fsdp_gradient_fusion", "stack", "optimizer_state", "optimizer_fused",
    "framework_version", "tp", "cp", "dp_", "pp", "ep", "etp_",
)
"""The fields of a table's mesh that its weight volumes read (`_weight_volumes`; `_price_volumes` the
degrees that size the groups): the framework (its FSDP flavour, Megatron FSDP's gradient fusion, its
release), the optimizer of its stack, the degrees and the expert grid."""
DP_MESH_FIELDS = (*DP_VOLUME_MESH_FIELDS, "order", "moe_parallel_folding", "grad_accum_")
"""... and its data-parallel times: the rank order (`mesh_strides`: where the groups lie) and the
micro-batch count (`_with_compute`)."""
_DP_MESH = operator.attrgetter(*DP_MESH_FIELDS)


def _dp_table_key(t: StageTable, cal: Calibration) -> tuple:
    """What `step_time.data_parallel_times` reads of a table besides the knobs: the cluster,
    training, calibration and model objects (by identity: `_dp_grid`'s entries keep them), the GPU
    count, the head rank, the mesh's `DP_MESH_FIELDS` and the bytes of the table's arrays
    (`DP_ARRAY_FIELDS`), in this order.

    Kept on the table (`StageTable.dp_key_memo`) with the calibration, the mesh and the arrays it
    read, and returned again for the same calibration and mesh: a table's arrays are read-only, and
    no field of a built table is replaced but its mesh (the search's combined-1F1B twin) and with it
    the rank order's communication (`stage_table.reorder`). A copy on another mesh computes its key
    again, from the bytes it holds where its arrays are the very same objects. The search asks for
    it once per bound and pricing of a table (Qwen3-235B-A22B / 256 H100, the plan_speed job: 18,028
    times, 5,282 of them answered from the memo, 8,062 for a copy on another mesh, 4,684 for a table
    without one)."""
    held = t.dp_key_memo
    if held is not None and held[0] is cal and held[1] is t.mesh:
        return held[4]
    sources = _DP_ARRAYS(t)
    if held is not None and all(map(operator.is_, held[2], sources)):
        arrays = held[3]
    else:
        arrays = tuple([a.tobytes() for a in sources])
    key = (id(t.cluster), id(t.training), id(cal), id(t.model), t.gpus, t.partition.head_rank, _DP_MESH(t.mesh), arrays)
    t.dp_key_memo = (cal, t.mesh, sources, arrays, key)
    return key


def _dp_volume_key(table_key: tuple) -> tuple:
    """What `step_time._weight_volumes` reads of a table besides the knobs: its `_dp_table_key` less
    the rank order, the micro-batch count (its mesh's `DP_VOLUME_MESH_FIELDS` alone) and the layer
    classes' compute seconds (all arrays but the last two)."""
    return (*table_key[:6], table_key[6][:len(DP_VOLUME_MESH_FIELDS)], table_key[7][:-2])


def _dp_weight_key(t: StageTable, table_key: tuple) -> tuple:
    """What `step_time._weight_collectives` reads of table `t` (of key `table_key`) besides the
    knobs: its volume key (`_dp_volume_key`) and where the rank order places the data-parallel
    groups, the strides of the data x context group and the expert-data-parallel group
    (`data_parallel_strides`), in this order."""
    return (_dp_volume_key(table_key), *data_parallel_strides(t.mesh))


def data_parallel_strides(mesh: Layout) -> tuple[int, int]:
    """Where `mesh`'s rank order places its data-parallel groups: the rank strides of the data x
    context group and of the expert-data-parallel group (`mesh_strides`). All that a table's
    data-parallel times read of the order (`_price_volumes`); the rest of its prices read the order
    through the table's placed communication alone (`stage_table.reorder`)."""
    stv = mesh_strides(mesh)
    return stv.dp_cp, stv.expert_dp


__all__ = [
    "DataParallelTimes", "PhaseArrays", "STEP_PARTS", "channel_traffic", "compose", "data_parallel_strides", "data_parallel_times",
    "mode_lower_bounds", "mode_rank_floors", "once_per_step_floor", "pipelined_floor", "setting_lower_bounds",
    "phase_arrays", "price_time", "time_lower_bound",
]
