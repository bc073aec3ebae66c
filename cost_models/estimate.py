"""`estimate()`: price one layout. Memory of every pipeline stage, and the step time built from
compute, exposed communication, pipeline bubble and the optimizer step.

The step time is `cost_models.step_time`'s schedule: every piece of work on the resource that runs
it (the compute stream, the NVLink domain, the scale-out NICs), communication hidden only behind
compute that runs at the same time and that the framework overlaps it with, and never less than
the busiest channel's traffic. Its parts (`TimeBreakdown`) add up to the step.
Throughput: tokens/s = global batch tokens / step. MFU = model FLOPs (full-attention convention,
`cost_models.flops`) / (step x GPUs x dense peak of the training precision).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration, default_calibration
from cost_models.context import PricingContext
from cost_models.finetune import FineTune, adapter_params_per_token
from cost_models.flops import StepFlops, step_flops
from cost_models.layout import Layout, LayoutError, validate_layout
from cost_models.memory import MemoryBreakdown, bytes_per_node, model_loading_bytes_per_node
from cost_models.pipeline import bubble_fraction
from cost_models.stage_data import KnobPrices, Setting, StageTable
from cost_models.stage_table import build_table, price_memory
from cost_models.stages import StagePartition
from cost_models.step_time import price_time
from model_specs.spec import ModelSpec, TrainingSpec


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
    comm_wait: float  # a saturated link: traffic beyond what the compute it overlaps lasts
    bubble: float
    optimizer: float
    overhead: float

    @property
    def total(self) -> float:
        return (
            self.compute + self.recompute + self.tp_comm + self.cp_comm + self.ep_comm + self.pp_comm
            + self.dp_comm + self.comm_wait + self.bubble + self.optimizer + self.overhead
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
            "comm_wait_s": self.comm_wait,
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
    host_capacity_bytes: int = 0  # host RAM per node; 0 = not checked
    ranks_per_node: int = 1
    loading_bytes_per_node: int = 0  # host RAM while the model is built (`memory.loading_bytes_per_node`)
    nvme_capacity_bytes: int = 0  # NVMe per node usable for offload (ZeRO-Infinity); 0 = none

    @property
    def offloaded_bytes_per_node(self) -> int:
        """Offloaded bytes a node's host RAM holds during training (`memory.bytes_per_node`)."""
        return int(bytes_per_node(max(m.host_optimizer for m in self.memory), self.ranks_per_node))

    @property
    def host_bytes_per_node(self) -> int:
        """The node's host RAM peak: training's offloaded state, or building the model if larger."""
        return max(self.offloaded_bytes_per_node, self.loading_bytes_per_node)

    @property
    def host_fits(self) -> bool:
        return not self.host_capacity_bytes or self.host_bytes_per_node <= self.host_capacity_bytes

    @property
    def nvme_bytes_per_node(self) -> int:
        """Offloaded state a node keeps on its NVMe drives (ZeRO-Infinity), bytes."""
        return int(bytes_per_node(max(m.nvme for m in self.memory), self.ranks_per_node))

    @property
    def nvme_fits(self) -> bool:
        return self.nvme_bytes_per_node <= self.nvme_capacity_bytes

    @property
    def peak_memory(self) -> MemoryBreakdown:
        return max(self.memory, key=lambda m: m.total)

    @property
    def peak_bytes(self) -> int:
        return int(self.peak_memory.total)

    @property
    def fits(self) -> bool:
        """GPU memory of the worst rank, host memory and NVMe of a node all suffice."""
        return self.peak_bytes <= self.capacity_bytes and self.host_fits and self.nvme_fits

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


def pricing_context(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    layout: Layout,
    partition: StagePartition | None = None,
    *,
    validate: bool = True,
) -> PricingContext:
    """Resolve a layout and its partition. Raises `LayoutError` listing every violated constraint
    (skip the check with `validate=False` when the caller generated a valid layout)."""
    if validate:
        problems = validate_layout(model, training, gpus, layout, partition)
        if problems:
            raise LayoutError(problems)
    lay = layout.resolved(gpus, training)
    if partition is None:
        partition = StagePartition.for_layout(model.num_layers, lay)
    elif (partition.pp, partition.vpp) != (lay.pp, lay.vpp) or partition.num_layers != model.num_layers:
        raise ValueError(
            f"partition is for pp={partition.pp} x vpp={partition.vpp} over {partition.num_layers} layers; "
            f"layout has pp={lay.pp} x vpp={lay.vpp} and the model {model.num_layers} layers"
        )
    return PricingContext(model, training, cluster, gpus, lay, partition)


def setting_of(layout: Layout) -> Setting:
    return Setting(
        layout.zero_stage, layout.dp_shard_, layout.recompute, layout.offload_optimizer, layout.offload_params,
        offload_nvme=layout.offload_device == "nvme", hpz=layout.zero_hpz_partition_size,
        quantized_weights=layout.zero_quantized_weights, quantized_gradients=layout.zero_quantized_gradients,
    )


def memory_breakdowns(prices: KnobPrices, row: int = 0) -> tuple[MemoryBreakdown, ...]:
    pp = prices.parameters.shape[1]
    return tuple(
        MemoryBreakdown(
            stage=r,
            parameters=float(prices.parameters[row, r]),
            gradients=float(prices.gradients[row, r]),
            optimizer=float(prices.optimizer[row, r]),
            activations=float(prices.activations[row, r]),
            logits=float(prices.logits[row, r]),
            comm_buffers=float(prices.comm_buffers[row, r]),
            reserve=float(prices.reserve[row, r]),
            host_optimizer=float(prices.host_optimizer[row, r]),
            nvme=float(prices.nvme[row, r]),
        )
        for r in range(pp)
    )


def estimate_from_prices(table: StageTable, layout: Layout, prices: KnobPrices, row: int = 0) -> Estimate:
    """Assemble the Estimate of setting `row` of priced knobs (memory and time)."""
    assert prices.parts is not None and prices.stage_time is not None
    training = table.training
    parts = {k: float(v[row]) for k, v in prices.parts.items()}
    time = TimeBreakdown(**{k.removesuffix("_s"): v for k, v in parts.items()})
    flops = step_flops(
        table.model, training.seq_len, training.global_batch, layout.recompute,
        float(table.recomputed_layers.sum()) / table.model.num_layers,
        training.frozen_base, adapter_params_per_token(table.model, FineTune.of(training)),
    )
    return Estimate(
        layout=layout,
        partition=table.partition,
        memory=memory_breakdowns(prices, row),
        capacity_bytes=table.cluster.gpu.memory_bytes,
        time=time,
        flops=flops,
        gpus=table.gpus,
        tokens_per_step=training.tokens_per_step,
        peak_flops_per_s=table.cluster.gpu.peak(training.precision),
        stage_times_s=tuple(float(x) for x in prices.stage_time[row]),
        host_capacity_bytes=table.cluster.host_memory_bytes,
        nvme_capacity_bytes=table.cluster.nvme_bytes,
        ranks_per_node=min(table.cluster.gpus_per_node, table.gpus),
        loading_bytes_per_node=int(model_loading_bytes_per_node(
            table.model, layout.framework, layout.zero_stage, layout.zero_init, min(table.cluster.gpus_per_node, table.gpus),
        )),
    )


def price(ctx: PricingContext, calibration: Calibration | None = None) -> Estimate:
    """Full estimate of a resolved context."""
    cal = calibration or default_calibration()
    lay = ctx.layout
    table = build_table(ctx.model, ctx.training, ctx.cluster, ctx.gpus, lay, ctx.partition, cal)
    settings = [setting_of(lay)]
    prices = price_memory(table, settings, lay.schedule_, lay.vpp, cal)
    prices = price_time(table, settings, prices, lay.vpp, cal)
    return estimate_from_prices(table, lay, prices)


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
    ctx = pricing_context(model, training, cluster, gpus, layout, partition)
    return price(ctx, calibration=calibration)
