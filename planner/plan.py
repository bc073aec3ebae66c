"""`Plan`: the JSON-serializable result of a search (versioned schema).

A Plan carries its inputs (so it can be re-priced, exported or executed without anything else),
the chosen candidate with its Estimate, stage partition and placement, the runner-up
alternatives, the Pareto front of throughput against memory headroom, why other layouts were
rejected (counts by constraint), the closest miss when nothing fits, and search statistics.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from cluster_specs.spec import MAX_GPUS_PER_NODE, ClusterSpec
from cost_models.layout import (
    AttentionKernel,
    ElementwiseKernels,
    FinetuneStack,
    Layout,
    NormKernel,
    OptimizerState,
    Schedule,
)
from cost_models.zero3_gathers import parse_version
from model_specs.spec import ModelSpec, TrainingSpec

PLAN_SCHEMA_VERSION = 1


class SearchConstraints(BaseModel):
    """What the user pins or bounds. Unset fields are searched."""

    model_config = ConfigDict(extra="forbid")

    memory_headroom: float = Field(0.05, ge=0.0, lt=1.0, description="fraction of GPU memory kept free")
    tp: int | None = Field(None, ge=1)
    pp: int | None = Field(None, ge=1)
    cp: int | None = Field(None, ge=1)
    ep: int | None = Field(None, ge=1)
    dp: int | None = Field(None, ge=1)
    zero_stage: int | None = Field(None, ge=0, le=3)
    max_zero_stage: int = Field(
        3, ge=0, le=3,
        description="the highest ZeRO stage the user's stack runs: 1 for a Megatron-Core before 0.10, whose "
        "distributed optimizer is all it shards (no FSDP)",
    )
    micro_batch: int | None = Field(None, ge=1)
    recompute: str | None = Field(None, pattern="^(none|selective|full|op_sac)$")
    schedule: Schedule | None = Field(
        None, description="pin the pipeline schedule (zero_bubble, zbv, dualpipev, looped_bfs: framework fsdp)"
    )
    framework: str = Field("megatron", pattern="^(megatron|fsdp|deepspeed)$")
    cross_entropy: str | None = Field(
        None, pattern="^(eager|loss_parallel|vocab_parallel|fused|chunked|fused_linear)$",
        description="loss kernel; default by framework (and stack)",
    )
    stack: FinetuneStack | None = Field(
        None,
        description="fine-tuning stack every layout runs in (Layout.stack): hf (HF Trainer / accelerate + PEFT) or "
        "torchtune; default for lora / qlora: hf (planner.finetune), none for full training",
    )
    optimizer_state: OptimizerState = Field("full", description="Adam's moments for every layout (Layout.optimizer_state)")
    optimizer_in_backward: bool = Field(False, description="torchtune's optimizer_in_bwd for every layout")
    offload_activations: bool = Field(False, description="a stack's activation offloading for every layout")
    search_techniques: bool = Field(
        True,
        description="with a stack: also search its memory techniques (activation checkpointing and offloading, 8-bit "
        "AdamW, optimizer-in-backward, the chunked / fused loss) and keep the fastest plan that fits "
        "(planner.finetune); False: price the pinned ones only",
    )
    allow_8bit_optimizer: bool = Field(
        True, description="with a stack: 8-bit AdamW may be searched (it changes the numerics of the optimizer)"
    )
    elementwise_kernels: ElementwiseKernels = Field(
        "fused",
        description="the memory-bound kernels the user's stack runs (Layout.elementwise_kernels): fused "
        "(Megatron-Core, torchtitan with torch.compile) or eager (torchtitan without compile, HF Transformers); "
        "every layout is priced with them",
    )
    norm_kernel: NormKernel = Field(
        "fused", description="the RMSNorm kernel of the user's stack (Layout.norm_kernel), for every layout priced"
    )
    attention_kernel: AttentionKernel | None = Field(
        None,
        description="the attention kernel of the user's stack (Layout.attention_kernel), for every layout priced: "
        "fused (Transformer Engine / cuDNN attention, FlashAttention-3), flash2 (FlashAttention-2, PyTorch SDPA's "
        "default flash backend) or triton_flash (FlashAttention in Triton: llm-foundry's attn_impl triton); default by "
        "framework (megatron fused, fsdp and deepspeed flash2)",
    )
    allow_offload: bool = True
    sequence_parallel: bool = Field(
        True,
        description="the user's stack runs Megatron's sequence parallelism beside TP (every TP > 1 layout is priced "
        "with it); false: a stack before it (Megatron-LM before v3.0, 2022, and the Megatron-DeepSpeed of 2021: "
        "Korthikanti et al., arXiv 2205.05198, introduced it), whose TP layouts replicate norms and dropout",
    )
    selective_recompute: bool = Field(
        True,
        description="the user's stack recomputes selectively (Megatron's core-attention recompute, torchtitan's "
        "op-level SAC); false: a stack that checkpoints whole layers only (Megatron-LM before v3.0, 2022): the "
        "search tries no recompute and full recompute",
    )
    allow_quantized_comm: bool = Field(
        False,
        description="search ZeRO++'s lossy collectives too (qwZ int8 weight gathers, qgZ int4 gradient "
        "reduce-scatters; DeepSpeed ZeRO-3): they change the numerics, so only when asked",
    )
    allow_moe_a2a_overlap: bool = Field(
        True,
        description="search Megatron-Core's combined 1F1B (Layout.moe_a2a_overlap, "
        "--overlap-moe-expert-parallel-comm) for MoE models: off for a Megatron-Core that predates it "
        "(merged in August-September 2025)",
    )
    moe_parallel_folding: bool = Field(
        True,
        description="the user's Megatron-Core folds expert parallelism over TP x CP x DP (MoE parallel folding, "
        "Megatron-Core 0.10); off for 0.9 and older, where EP is carved out of DP, expert TP is TP and every "
        "layout is priced so (Layout.moe_parallel_folding)",
    )
    fsdp_flat_params: bool = Field(
        False,
        description="framework fsdp: the user's FSDP is FSDP1 (FlatParameter: llm-foundry / Composer, Accelerate's "
        "fsdp_version 1), which gathers into a buffer its parameters are views of (no per-layer copy-out); every "
        "layout is priced so (Layout.fsdp_flat_params). False: FSDP2's fully_shard",
    )
    megatron_fsdp_gradient_fusion: bool = Field(
        True,
        description="framework megatron: the user's Megatron FSDP (ZeRO-2/3) keeps gradient-accumulation fusion "
        "(Megatron-Core 0.14+); off for NeMo 2.3 / 2.4 and Megatron-Core 0.12 / 0.13, which turn it off under "
        "Megatron FSDP, and every layout is priced so (Layout.megatron_fsdp_gradient_fusion)",
    )
    framework_version: str | None = Field(
        None,
        description="framework deepspeed: the user's DeepSpeed release (a number such as 0.3.13), priced as it runs "
        "ZeRO-3 (before 0.5.5: one synchronised gather per parameter; Layout.framework_version, "
        "cost_models.zero3_gathers); None: today's release, what the exports are written for",
    )
    max_tp: int | None = Field(
        None, ge=1, le=MAX_GPUS_PER_NODE, description="default: the NVLink domain size (tensor parallelism never leaves it)"
    )
    top_k: int = Field(5, ge=1, le=100, description="alternatives returned")

    @model_validator(mode="after")
    def _zero_pin_within_the_stack(self) -> SearchConstraints:
        if self.zero_stage is not None and self.zero_stage > self.max_zero_stage:
            raise ValueError(f"zero_stage={self.zero_stage} exceeds max_zero_stage={self.max_zero_stage}")
        if self.fsdp_flat_params and self.framework != "fsdp":
            raise ValueError(f"fsdp_flat_params (FSDP1) needs framework fsdp, not {self.framework}")
        if not self.selective_recompute and self.recompute in ("selective", "op_sac"):
            raise ValueError(f"recompute={self.recompute} needs a stack with selective recompute (selective_recompute is false)")
        if not self.megatron_fsdp_gradient_fusion and self.framework != "megatron":
            raise ValueError(f"megatron_fsdp_gradient_fusion=False needs framework megatron, not {self.framework}")
        if self.framework_version is not None:
            if self.framework != "deepspeed":
                raise ValueError(f"framework_version: releases are told apart for framework deepspeed only, not {self.framework}")
            parse_version(self.framework_version)  # a ValueError naming the field
        explicit = "framework" in self.model_fields_set  # else the stack's own (planner.finetune)
        if explicit and self.stack is not None and self.framework not in (("fsdp", "deepspeed") if self.stack == "hf" else ("fsdp",)):
            raise ValueError(f"stack {self.stack} does not run on framework {self.framework}")
        return self


class PlanInputs(BaseModel):
    model: ModelSpec
    cluster: ClusterSpec
    gpus: int
    training: TrainingSpec
    constraints: SearchConstraints = SearchConstraints()


class PlacedGroup(BaseModel):
    """One parallel dimension as laid over the topology."""

    dim: str  # tp | cp | ep | dp | pp | dp_shard | expert_dp
    size: int
    stride: int
    first_group_ranks: list[int]  # global ranks of the group containing rank 0
    tier: str  # where its traffic flows: intra_domain | inter_node | inter_leaf ...
    bus_bandwidth_bytes_per_s: float
    latency_s: float


class Placement(BaseModel):
    order: str  # rank order, fastest-varying first (Megatron's tp-cp-ep-dp-pp)
    nodes: int
    gpus_per_node: int
    groups: list[PlacedGroup]


class Candidate(BaseModel):
    """A priced layout."""

    layout: Layout
    partition: list[int]  # layers per chunk (pp x vpp chunks)
    estimate: dict[str, Any]  # cost_models.report.estimate_dict
    placement: Placement | None = None
    equivalent_count: int = Field(0, description="other layouts of the same price folded into this one")
    equivalents: list[str] = Field(default_factory=list, description="some of them (rank order / split)")

    @property
    def step_s(self) -> float:
        return float(self.estimate["step_s"])

    @property
    def tokens_per_s(self) -> float:
        return float(self.estimate["tokens_per_s"])


HOST_MEMORY_REASON = (
    "host memory: the offloaded state or the model-loading peak of a node's ranks exceeds the node's usable host RAM"
)
"""The `Rejection.reason` of layouts that fit on the GPUs but not in a node's host RAM (the search
counts them, the explanation names them whatever their rank)."""

NVME_REASON = "NVMe: the states a node's ranks offload to NVMe (ZeRO-Infinity) exceed the node's NVMe capacity"
"""The `Rejection.reason` of layouts whose ZeRO-Infinity states do not fit a node's NVMe."""


class Rejection(BaseModel):
    reason: str  # the constraint, e.g. "memory: ZeRO-0 exceeds capacity" or "tp: crosses the NVLink domain"
    count: int
    example: str  # one concrete layout and numbers, e.g. "tp=8 pp=1 ...: 93.1 GiB on stage 0, 76.0 GiB usable"


class ClosestMiss(BaseModel):
    layout: Layout
    peak_bytes: int
    usable_bytes: int
    over_by_bytes: int
    worst_stage: int
    breakdown: dict[str, int]


class SearchStats(BaseModel):
    generated: int  # layouts enumerated
    invalid: int  # rejected by validation
    pruned: int  # skipped by a bound that proves they cannot win (counted, not priced)
    priced: int  # estimates computed
    feasible: int  # priced and fitting
    floored: int = 0
    """Of `pruned`: layouts refused without pricing because the activations their option holds
    already exceed the usable GPU memory (`stage_table.activation_floor`; combined 1F1B, whose
    full-recompute settings the rule refuses). They are counted in `rejections` as priced ones are."""
    dominated: int = 0
    """Of `feasible`: layouts whose memory fits but whose step was bounded, not timed: a lower bound
    puts each above the k-th best step and a layout already found is faster and no larger
    (`planner.search`), so none can rank or be on the Pareto front."""
    seconds: float
    faster_than_reference: int | None = None  # fitting layouts strictly faster than a reference step time


class Plan(BaseModel):
    schema_version: int = PLAN_SCHEMA_VERSION
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())
    inputs: PlanInputs
    best: Candidate | None
    alternatives: list[Candidate] = []
    pareto: list[Candidate] = []
    rejections: list[Rejection] = []
    closest_miss: ClosestMiss | None = None
    why: list[str] = []  # sentences explaining the choice, or why nothing fits
    calibration: str = ""  # which calibration priced it
    kernel_profile: dict[str, Any] | None = Field(
        None,
        description="the cluster's measured kernel profile (`autopar profile`) the plan was priced with, layered "
        "over the shipped atlas: its device, date and digest, and which of the plan's kernel lookups it measured "
        "(planner.kernel_profile.profile_note); None: the shipped atlas alone",
    )
    stats: SearchStats

    @property
    def feasible(self) -> bool:
        return self.best is not None

    @model_serializer(mode="wrap")
    def _without_absent_profile(self, handler: Any) -> dict[str, Any]:
        """`kernel_profile` only where a profile priced the plan: a plan priced with the shipped atlas
        alone serializes as it did before the field existed (stored plans, exports)."""
        out: dict[str, Any] = handler(self)
        if out.get("kernel_profile", 0) is None:
            del out["kernel_profile"]
        return out
