"""Where it runs: GPUs and clusters.

All rates are stored in SI base units: FLOP/s, bytes/s, seconds. Vendor units (GB/s, Gb/s,
TFLOPS) are converted once, when the catalog is loaded (`cluster_specs.catalog`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

Precision = Literal["bf16", "fp16", "fp8", "fp32"]

# ---- bounds on what a cluster may claim (the API and the CLI read the same specs) --------------
MIN_BANDWIDTH_BYTES_PER_S = 1e6
"""Slowest bandwidth a spec may give, bytes/s (1 MB/s, below 10 Mb/s Ethernet's 1.25 MB/s): a rate
near zero prices a collective at ~1e300 s, which overflows to infinity in the step-time sums."""
MAX_BANDWIDTH_BYTES_PER_S = 1e15
"""Fastest bandwidth a spec may give, bytes/s (1 PB/s: 125 x the fastest figure in the catalog,
B200's 8 TB/s of HBM3e, `data/gpus.yaml`)."""
MIN_PEAK_FLOPS_PER_S = 1e9
"""Slowest peak a GPU may claim, FLOP/s (1 GFLOP/s; the catalog's slowest device, the nominal CPU
rank of `local-cpu`, has 1.5e11)."""
MAX_PEAK_FLOPS_PER_S = 1e18
"""Fastest peak a GPU may claim, FLOP/s (200 x the catalog's fastest, GB200's 5e15 FP8)."""
MAX_LATENCY_S = 1.0
"""Longest per-step latency of a fabric, seconds (the catalog's slowest is 8e-5 s)."""
MAX_GPUS_PER_NODE = 1024
"""Most GPUs a node or NVLink domain may have: every tensor-parallel degree and ZeRO group the
planner tries divides the domain, and the runner agent starts one process per GPU of a node. The
largest announced NVLink domain is NVL576 (NVIDIA Rubin Ultra, GTC 2025); 1024 leaves room."""
MAX_DEVICE_MEMORY_BYTES = 2**44
"""Most memory one GPU may claim (16 TiB; the catalog's largest is B300's 288 GB)."""


def _bandwidth_or_zero(value: float) -> float:
    """0 (the resource is absent: no NIC, no NVMe, no GPU link) or a bandwidth within the bounds."""
    if value and not MIN_BANDWIDTH_BYTES_PER_S <= value <= MAX_BANDWIDTH_BYTES_PER_S:
        raise ValueError(
            f"{value:g} bytes/s is outside [{MIN_BANDWIDTH_BYTES_PER_S:g}, {MAX_BANDWIDTH_BYTES_PER_S:g}] "
            "(give 0 when there is none)"
        )
    return value


Bandwidth = Annotated[float, Field(ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S, allow_inf_nan=False)]
"""A bandwidth that must exist, bytes/s."""
OptionalBandwidth = Annotated[float, Field(ge=0, allow_inf_nan=False), AfterValidator(_bandwidth_or_zero)]
"""A bandwidth that is 0 when the resource is absent, bytes/s."""
Latency = Annotated[float, Field(ge=0, le=MAX_LATENCY_S, allow_inf_nan=False)]


MAX_MATMUL_SHARE = 1.5
"""Upper bound on `GPUSpec.matmul_share`: 1.5x either reference's share of its peak (A100 bf16 86.9%,
H100 FP8 70.9%) would exceed the peak itself, so a larger share is a wrong entry."""


class GPUSpec(BaseModel):
    """One accelerator. Peak FLOP/s are *dense* (no 2:4 sparsity) tensor-core peaks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    vendor: Literal["nvidia", "amd", "cpu"] = "nvidia"
    peak_flops_per_s: dict[str, float] = Field(
        description="dense peak per precision: bf16, fp16, fp8, fp32 (TF32 for NVIDIA)"
    )
    memory_bytes: int = Field(gt=0, le=MAX_DEVICE_MEMORY_BYTES, description="device memory (HBM/GDDR) in bytes")
    memory_bandwidth_bytes_per_s: Bandwidth
    link_bandwidth_bytes_per_s: OptionalBandwidth = Field(
        description="GPU-to-GPU fabric bandwidth per GPU, one direction (NVLink/xGMI/PCIe)"
    )
    tdp_w: float | None = None
    sm_count: int | None = Field(
        default=None,
        ge=1,
        description="streaming multiprocessors (NVIDIA) or compute units (AMD): the tiles a GEMM can run "
        "at once (wave quantization, cost_models.compute); None for devices without them (cpu)",
    )
    warpgroup_mma: bool = Field(
        default=False,
        description="the tensor-core peak needs warpgroup-level MMA instructions (Hopper's wgmma, Blackwell's "
        "tcgen05): kernels written with Ampere's warp-level mma.sync (FlashAttention-2) reach a fraction of it "
        "(`Calibration.flash2_warpgroup_share`)",
    )
    sustained_clock_fraction: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="tensor-core clock the board sustains under its power limit, as a fraction of the clock the "
        "peaks assume: GEMM and attention time use peak x this (`compute_peak`); MFU keeps the nominal peak",
    )
    matmul_share: dict[str, float] = Field(
        default_factory=dict,
        description="per precision: the share of its peak this GPU's best matmul reaches (measured maximum "
        "achievable matmul FLOP/s / peak), relative to the share of the GPU the calibration's efficiencies "
        "are fitted on (cluster_specs.catalog.MATMUL_REFERENCE); a precision without a measurement is 1",
    )
    source: str = Field(default="", description="datasheet the figures come from")
    kernel_profile: str = Field(
        default="", exclude=True, pattern=r"^[0-9a-f]{0,16}$",
        description="set by the service and `autopar plan --atlas`, not read from a cluster file: the digest of a "
        "measured kernel profile (`autopar profile`) this process prices the GPU's kernels with, layered over "
        "its shipped atlas (cost_models.kernels.overlay); empty: the shipped atlas alone",
    )

    @field_validator("kernel_profile")
    @classmethod
    def _profile_is_not_an_input(cls, v: str) -> str:
        if v:
            raise ValueError("is set by autopar itself (autopar plan --atlas FILE, a cluster's stored kernel profile), "
                             "not by a cluster file or request")
        return v

    def __hash__(self) -> int:  # the dict fields keep pydantic's generated hash from working
        return hash(
            (
                self.name,
                tuple(sorted(self.peak_flops_per_s.items())),
                self.memory_bytes,
                self.memory_bandwidth_bytes_per_s,
                self.link_bandwidth_bytes_per_s,
                self.sustained_clock_fraction,
                self.warpgroup_mma,
                tuple(sorted(self.matmul_share.items())),
                self.kernel_profile,
            )
        )

    def compute_peak(self, precision: str) -> float:
        """FLOP/s kernel times are priced against for `precision`: `peak` x `sustained_clock_fraction`
        x `matmul_share` (the calibration's efficiencies are shares of this; MFU divides by `peak`, as
        published figures do)."""
        share = self.matmul_share.get(self._peak_key(precision), 1.0)
        return self.peak(precision) * self.sustained_clock_fraction * share

    @model_validator(mode="after")
    def _check_matmul_share(self) -> GPUSpec:
        for precision, peak in self.peak_flops_per_s.items():
            if not MIN_PEAK_FLOPS_PER_S <= peak <= MAX_PEAK_FLOPS_PER_S:
                raise ValueError(
                    f"peak_flops_per_s[{precision!r}] = {peak:g} is outside "
                    f"[{MIN_PEAK_FLOPS_PER_S:g}, {MAX_PEAK_FLOPS_PER_S:g}] FLOP/s"
                )
        for precision, share in self.matmul_share.items():
            if precision not in self.peak_flops_per_s:
                raise ValueError(f"matmul_share names {precision!r}, which has no peak (has {sorted(self.peak_flops_per_s)})")
            if not 0 < share <= MAX_MATMUL_SHARE:
                raise ValueError(f"matmul_share[{precision!r}] = {share} is outside (0, {MAX_MATMUL_SHARE}]")
        return self

    def _peak_key(self, precision: str) -> str:
        """The precision whose peak `peak(precision)` returns (fp8 falls back to 16-bit)."""
        if precision in self.peak_flops_per_s or precision != "fp8":
            return precision
        return next((p for p in ("bf16", "fp16") if p in self.peak_flops_per_s), precision)

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for `precision`.

        fp8 falls back to bf16, then fp16, on GPUs without fp8 units (fp8 GEMMs would run in 16-bit
        there). Other missing precisions raise: V100 has no bf16 and we do not invent one.
        """
        peaks = self.peak_flops_per_s
        if precision in peaks:
            return peaks[precision]
        if precision == "fp8":
            for fallback in ("bf16", "fp16"):
                if fallback in peaks:
                    return peaks[fallback]
        raise KeyError(f"GPU {self.name} has no {precision} peak (has {sorted(peaks)})")


IntraNodeKind = Literal["nvswitch", "nvlink_mesh", "pcie_switch", "xgmi_mesh", "shared_memory"]
InterNodeKind = Literal["infiniband", "roce", "ethernet", "none"]


class IntraNodeFabric(BaseModel):
    """How GPUs inside one NVLink domain talk."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: IntraNodeKind
    bus_bandwidth_bytes_per_s: Bandwidth = Field(
        description="achievable NCCL bus bandwidth (nccl-tests busbw, ring) of a collective over the whole domain",
    )
    latency_s: Latency = Field(default=3e-6, description="per ring/tree step")
    source: str = Field(default="", description="where the figures come from")


class InterNodeNetwork(BaseModel):
    """The scale-out network between nodes (or NVLink domains)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: InterNodeKind = "infiniband"
    nics_per_node: int = Field(default=8, ge=0)
    nic_bandwidth_bytes_per_s: OptionalBandwidth = Field(
        default=50e9,
        description="per NIC, one direction: the line rate (NCCL reaches ~90%, left to calibration)",
    )
    rail_optimized: bool = True
    oversubscription: float = Field(default=1.0, ge=1.0, description="leaf-to-spine oversubscription ratio")
    nodes_per_leaf: int = Field(
        default=32, ge=1, description="nodes under one leaf switch (one scalable unit)"
    )
    latency_s: Latency = Field(default=5e-6, description="per hop step between nodes")
    source: str = Field(default="", description="where the figures come from")


class ClusterSpec(BaseModel):
    """A homogeneous cluster: identical nodes of `gpus_per_node` GPUs of one type.

    The job size is *not* part of the cluster: it is given separately (`gpus` or `nodes`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    gpu: GPUSpec
    gpus_per_node: int = Field(gt=0, le=MAX_GPUS_PER_NODE)
    intra_node: IntraNodeFabric
    nvlink_domain_size: int | None = Field(
        default=None, gt=0, le=MAX_GPUS_PER_NODE, description="GPUs in one NVLink domain; defaults to gpus_per_node (72 for NVL72)"
    )
    placement_segment_nodes: int | None = Field(
        default=None,
        gt=0,
        description="nodes the scheduler keeps together inside one NVLink domain when a job spans several "
        "(Slurm topology/block `--segment`): such a job is placed as whole segments, one per domain, so it "
        "sees domains of segment x gpus_per_node GPUs (`placement_domain`); None: jobs fill domains whole",
    )
    inter_node: InterNodeNetwork = InterNodeNetwork()
    host_memory_bytes: int = Field(default=2 * 1024**4, gt=0, description="CPU memory per node, for offload")
    host_to_device_bytes_per_s: Bandwidth = Field(
        default=50e9, description="PCIe bandwidth from host memory to one GPU, one direction"
    )
    host_memory_bandwidth_bytes_per_s: Bandwidth = Field(
        default=409.6e9,
        description="peak DRAM bandwidth of the node's CPU sockets in bytes/s (sockets x memory channels x "
        "MT/s x 8 bytes; the CPU's rated channel speed): bounds the CPU optimizer step and the offload copies",
    )
    cpu_cores: int = Field(
        default=64,
        ge=1,
        description="physical CPU cores per node (not hardware threads): they run the CPU optimizer",
    )
    nvme_bytes: int = Field(
        default=0,
        ge=0,
        description="local NVMe capacity per node usable for offload, in bytes (0 = none: ZeRO-Infinity's NVMe "
        "tier is refused)",
    )
    nvme_read_bytes_per_s: OptionalBandwidth = Field(
        default=0.0,
        description="aggregate sequential read bandwidth of the node's NVMe drives in bytes/s, all drives "
        "striped (as DeepSpeed's aio uses them)",
    )
    nvme_write_bytes_per_s: OptionalBandwidth = Field(
        default=0.0,
        description="aggregate sequential write bandwidth of the node's NVMe drives in bytes/s, all drives striped",
    )
    description: str = ""
    source: str = Field(default="", description="where the node-level figures come from")

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        d = self.domain_size
        if d % self.gpus_per_node:
            raise ValueError(
                f"nvlink_domain_size ({d}) must be a multiple of gpus_per_node ({self.gpus_per_node})"
            )
        net, g = self.inter_node, self.gpus_per_node
        seg = self.placement_segment_nodes
        if seg is not None and seg * g > d:
            raise ValueError(
                f"placement_segment_nodes ({seg}) x gpus_per_node ({g}) exceeds the NVLink domain ({d} GPUs)"
            )
        if net.kind != "none":
            if net.nics_per_node < 1 or net.nic_bandwidth_bytes_per_s <= 0:
                raise ValueError(f"inter_node kind {net.kind!r} needs nics_per_node >= 1 and a NIC bandwidth")
            if g % net.nics_per_node and net.nics_per_node % g:
                # Each GPU must get the same share of the NICs (topology.py relies on it).
                raise ValueError(
                    f"nics_per_node ({net.nics_per_node}) must divide gpus_per_node ({g}) or be a multiple of it"
                )
        if self.nvme_bytes > 0 and (self.nvme_read_bytes_per_s <= 0 or self.nvme_write_bytes_per_s <= 0):
            raise ValueError(
                f"nvme_bytes ({self.nvme_bytes}) > 0 needs nvme_read_bytes_per_s and nvme_write_bytes_per_s > 0 "
                f"(got {self.nvme_read_bytes_per_s} and {self.nvme_write_bytes_per_s})"
            )
        return self

    @property
    def domain_size(self) -> int:
        return self.nvlink_domain_size or self.gpus_per_node

    def placement_domain(self, world: int | None = None) -> int:
        """GPUs of a job of `world` GPUs that share one NVLink domain, in rank order.

        A job inside one domain gets it whole. A larger one is placed in segments of
        `placement_segment_nodes` nodes, one segment per domain (a segment never straddles a domain,
        and NVIDIA's GB200 NVL72 guidance is segment 16 of a rack's 18 trays for jobs of 128+
        GPUs: "Achieving Peak System and Workload Efficiency on NVIDIA GB200 NVL72 with Slurm Block
        Scheduling", NVIDIA Technical Blog 2025); the segment is the largest count up to that which
        divides the job's nodes (Slurm needs whole segments). `world` None: a job as large as the
        cluster's structure repeats (whole segments)."""
        d, seg = self.domain_size, self.placement_segment_nodes
        if seg is None or (world is not None and world <= d):
            return d
        if world is not None:
            nodes = -(-world // self.gpus_per_node)
            while nodes % seg:
                seg -= 1
        return seg * self.gpus_per_node

    @property
    def has_nvme(self) -> bool:
        """Whether the nodes have local NVMe for offload (ZeRO-Infinity's NVMe tier)."""
        return self.nvme_bytes > 0

    @property
    def nic_bandwidth_per_gpu_bytes_per_s(self) -> float:
        """Scale-out bandwidth one GPU can drive when every GPU of its node sends at once."""
        net = self.inter_node
        if net.kind == "none":
            return 0.0
        return net.nics_per_node * net.nic_bandwidth_bytes_per_s / self.gpus_per_node
