"""`Layout`: the parallel configuration of one training job, and its validation.

Vocabulary (docs/architecture.md): world size = dp x tp x pp x cp; global batch = micro_batch x grad_accum x dp.
Expert parallelism (`ep`) is carved out of the dp x cp x tp ranks as Megatron-Core 0.10+ does (MoE
parallel folding), or out of dp alone (`moe_parallel_folding=False`, Megatron-Core 0.9); expert tensor
parallelism (`etp`) defaults to `tp`. `dp_shard` is the ZeRO/FSDP sharding group (`dp_shard < dp` is hybrid
sharding: shard inside groups of `dp_shard` ranks, replicate across `dp / dp_shard` groups).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cost_models.pipeline import (
    SPLIT_BACKWARD_SCHEDULES,
    TORCH_ONLY_SCHEDULES,
    ZERO_BUBBLE_ZERO3,
    dualpipev_micro_batches_ok,
    interleaving_group,
    is_v_shape,
    zero_bubble_rounds_ok,
)
from cost_models.stages import StagePartition, megatron_split
from cost_models.zero3_gathers import DEEPSPEED_FEATURES, deepspeed_has, parse_version
from model_specs.params import adapted_names, linear_names
from model_specs.spec import MAX_GLOBAL_BATCH, ModelSpec, TrainingSpec

Recompute = Literal["none", "selective", "full", "op_sac"]
"""none; selective (Megatron: attention core + MLP activation recomputed); full (whole layers, all or
`recompute_layers` per stage); op_sac (torchtitan op-level selective checkpointing, `cost_models.op_sac`)."""
Schedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zbv", "dualpipev", "looped_bfs"]
"""gpipe; 1f1b; interleaved_1f1b (vpp > 1); zero_bubble: ZB1P (Qi et al. 2024), interleaved when
vpp > 1, torch.distributed.pipelining's ScheduleInterleavedZeroBubble; zbv (ZB-V) and dualpipev
(DeepSeek's DualPipeV): two chunks per rank placed as a V (vpp = 2), torch's ScheduleZBVZeroBubble
and ScheduleDualPipeV; looped_bfs: breadth-first (Lamy-Poirier 2022), every forward of a rank's
chunks then every backward, torch's ScheduleLoopedBFS (`cost_models.pipeline`)."""
Framework = Literal["megatron", "fsdp", "deepspeed"]
MoeDispatcher = Literal["alltoall", "flex"]
RecomputeModule = Literal["core_attn", "act", "layernorm", "mla_up_proj"]
DEFAULT_RECOMPUTE_MODULES: tuple[str, ...] = ("act", "core_attn")
"""What "selective" recomputes unless `Layout.recompute_modules` says otherwise, outside Megatron
(`runtime.recompute`: the attention core and the MLP activation)."""
MEGATRON_DEFAULT_RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn",)
"""Megatron-Core's default for --recompute-granularity selective (`TransformerConfig.recompute_modules`,
and Korthikanti et al. 2022's selective recompute: the attention core only)."""
CrossEntropy = Literal["eager", "loss_parallel", "vocab_parallel", "fused", "chunked", "fused_linear"]
NormKernel = Literal["fused", "eager_fp32"]
ElementwiseKernels = Literal["fused", "eager"]
CpAttention = Literal["ring", "allgather_mask"]
AttentionKernel = Literal["fused", "flash2", "triton_flash"]
OffloadDevice = Literal["cpu", "nvme"]
FinetuneStack = Literal["hf", "torchtune"]
"""A fine-tuning stack (`cost_models.stacks`): hf = Hugging Face Trainer / accelerate + PEFT (on FSDP or
DeepSpeed ZeRO, or one GPU), torchtune = torchtune's recipes (FSDP2, or one GPU)."""
OptimizerState = Literal["full", "paged", "int8", "int8_paged", "int4"]
"""Adam's moments: full (in the trained weights' dtype), paged (the same in CUDA unified memory:
bitsandbytes PagedAdamW), int8 (block-wise 8-bit: bitsandbytes AdamW8bit,
torchao AdamW8bit), int8_paged (bitsandbytes PagedAdamW8bit: in CUDA unified memory, paged to the host
under pressure), int4 (torchao AdamW4bit)."""

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
"""Megatron-Core's default rank order: TP innermost (fastest-varying rank), PP outermost."""
MAX_DEGREE = 2**20
"""Largest parallel degree a layout may name (a million GPUs): bounds every number that drives work."""


def default_attention_kernel(framework: str) -> AttentionKernel:
    """The attention kernel a framework runs unless told otherwise (`Layout.attention_kernel_`):
    Transformer Engine's fused attention under Megatron-Core, SDPA's FlashAttention-2 backend under
    the PyTorch stacks."""
    return "fused" if framework == "megatron" else "flash2"


class Layout(BaseModel):
    """One point of the search space. Missing degrees default to 1; `dp` defaults to what is left
    of the GPU count, `grad_accum` to what the global batch implies."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int = Field(1, ge=1, le=MAX_DEGREE, description="tensor-parallel degree")
    pp: int = Field(1, ge=1, le=MAX_DEGREE, description="pipeline-parallel degree")
    dp: int | None = Field(None, ge=1, le=MAX_DEGREE, description="data-parallel degree (derived when omitted)")
    cp: int = Field(1, ge=1, le=MAX_DEGREE, description="context-parallel degree")
    ep: int = Field(1, ge=1, le=MAX_DEGREE, description="expert-parallel degree, carved out of dp x cp")
    etp: int | None = Field(None, ge=1, le=MAX_DEGREE, description="expert tensor parallel; defaults to tp")
    vpp: int = Field(1, ge=1, le=MAX_DEGREE, description="virtual pipeline stages per pipeline rank")
    dp_shard: int | None = Field(None, ge=1, le=MAX_DEGREE, description="ZeRO/FSDP sharding group; defaults to dp")
    zero_stage: int = Field(1, ge=0, le=3, description="0 none, 1 optimizer, 2 +grads, 3 +params (FSDP)")
    micro_batch: int = Field(1, ge=1, le=MAX_GLOBAL_BATCH, description="sequences per micro-batch per data-parallel rank")
    grad_accum: int | None = Field(None, ge=1, le=MAX_GLOBAL_BATCH, description="micro-batches per step (derived when omitted)")
    recompute: Recompute = "none"
    recompute_modules: tuple[RecomputeModule, ...] | None = Field(
        None,
        description="with selective recompute: the modules recomputed, as Megatron-Core's --recompute-modules "
        "(core_attn, act = the MLP / expert activation (moe_act), layernorm, mla_up_proj); default core_attn "
        "under megatron (its default), core_attn + act otherwise (runtime.recompute)",
    )
    recompute_layers: int | None = Field(
        None, ge=0, description="with full recompute: layers per pipeline stage recomputed (None = all)"
    )
    sp: bool | None = Field(None, description="sequence parallel with TP; defaults to tp > 1")
    schedule: Schedule | None = Field(None, description="defaults to interleaved_1f1b when vpp > 1, else 1f1b")
    account_for_embedding_in_pipeline_split: bool = Field(
        False, description="Megatron-Core: the embedding takes one layer slot of the first pipeline chunk"
    )
    account_for_loss_in_pipeline_split: bool = Field(
        False, description="Megatron-Core: the loss (LM head) takes one layer slot of the last pipeline chunk"
    )
    decoder_first_pipeline_num_layers: int | None = Field(
        None, ge=0, description="Megatron-Core: layers on the first pipeline rank (the others split the rest)"
    )
    decoder_last_pipeline_num_layers: int | None = Field(
        None, ge=0, description="Megatron-Core: layers on the last pipeline rank (the others split the rest)"
    )
    offload_optimizer: bool = False
    offload_params: bool = Field(
        False,
        description="ZeRO-3 parameter offload (DeepSpeed offload_param to cpu, FSDP CPUOffload): each rank's "
        "weight shard lives in pinned host memory and is copied to the GPU before each gather",
    )
    offload_device: OffloadDevice = Field(
        "cpu",
        description="where offloaded optimizer states and weight shards live: cpu (pinned host memory, "
        "ZeRO-Offload) or nvme (ZeRO-Infinity: DeepSpeed's aio swaps them through pinned host buffers)",
    )
    zero_hpz_partition_size: int = Field(
        1, ge=1, le=MAX_DEGREE,
        description="ZeRO++ hpZ (DeepSpeed ZeRO-3): ranks holding a secondary 16-bit weight shard made at the "
        "end of the forward, so the backward all-gathers inside that group (one node) instead of the "
        "whole data-parallel group; 1 = off",
    )
    zero_quantized_weights: bool = Field(
        False, description="ZeRO++ qwZ (DeepSpeed ZeRO-3): weight all-gathers in block-quantized int8"
    )
    zero_quantized_gradients: bool = Field(
        False,
        description="ZeRO++ qgZ (DeepSpeed ZeRO-3): gradient reduce-scatter as int4 all-to-alls (hierarchical: "
        "inside the node, then across nodes)",
    )
    zero_init: bool = Field(
        True,
        description="the model is created sharded (deepspeed.zero.Init, meta-device init, Accelerate's "
        "cpu_ram_efficient_loading); off: every process materializes the whole model in host memory first",
    )
    activation_offload_layers: int = Field(
        0, ge=0,
        description="Megatron --cpu-offloading-num-layers: the saved activations of this many layers per pipeline "
        "stage go to host memory after their forward and come back before their backward, on a copy stream",
    )
    tp_comm_overlap: bool | None = Field(
        None,
        description="overlap TP/SP collectives with the GEMMs (Megatron --tp-comm-overlap with Transformer "
        "Engine userbuffers; torchtitan's async TP); defaults to on for megatron with sequence parallel",
    )
    order: str = DEFAULT_ORDER
    framework: Framework = Field(
        "megatron", description="execution framework whose overlap and kernels are assumed (calibration)"
    )
    framework_version: str | None = Field(
        None,
        description="the framework's release, where it changes what a step costs: deepspeed only, a release "
        "number such as 0.3.13 (before 0.5.5 ZeRO-3 gathers one parameter at a time, each after a device "
        "sync: cost_models.zero3_gathers); None: today's release, what every plan runs",
    )
    cross_entropy: CrossEntropy | None = Field(
        None,
        description="loss kernel: eager (fp32 upcast + log-softmax), loss_parallel (DTensor's vocabulary-"
        "sharded log-softmax), vocab_parallel (Megatron's fused "
        "fp32), fused (chunked, gradient written into the bf16 logits); default by framework",
    )
    norm_kernel: NormKernel = Field(
        "fused",
        description="RMSNorm kernel: fused (saves its 16-bit input and a float32 rstd per token: Transformer "
        "Engine, Apex, PyTorch's CUDA RMSNorm) or eager_fp32 (upcasts and saves the float32 input and "
        "normalized output: PyTorch's CPU decomposition, HF LlamaRMSNorm-style modules)",
    )

    elementwise_kernels: ElementwiseKernels = Field(
        "fused",
        description="memory-bound ops of a layer: fused (Transformer Engine / Apex kernels in Megatron-Core, "
        "torch.compile in torchtitan: one kernel per norm, rotary and activation) or eager (one kernel per "
        "PyTorch op, float32 upcasts in the norms and rotary: torchtitan without compile, HF Transformers); "
        "cost_models.compute.elementwise_bytes",
    )

    moe_token_dispatcher: MoeDispatcher = Field(
        "alltoall",
        description="MoE token dispatcher: alltoall (Megatron-Core's default, torchtitan: every routed copy "
        "sent) or flex (Megatron-Core's flex dispatcher with DeepEP: a token crosses to each remote node "
        "once and NVLink fans it out; with group-limited routing at most moe_router_group_topk nodes)",
    )

    moe_parallel_folding: bool = Field(
        True,
        description="MoE parallel folding (Megatron-Core 0.10+, expert_decoder_rank_generator): expert layers "
        "re-split the TP x CP x DP ranks of a stage as etp x ep x expert-dp. False: Megatron-Core 0.9 and "
        "older (and DeepSpeed-MoE), where expert parallelism is carved out of the data-parallel group alone "
        "(ep divides dp, next to it in the rank order) and expert TP is TP: an EP group strides over TP x CP",
    )

    moe_a2a_overlap: bool = Field(
        False,
        description="Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm): the MoE dispatch and "
        "combine all-to-alls of one micro-batch run beside the forward or backward compute of an adjacent one; "
        "needs expert parallelism, interleaving (vpp > 1) when pp > 1, and no full recompute",
    )

    fsdp_flat_params: bool = Field(
        False,
        description="framework fsdp only: FSDP1's FlatParameter (llm-foundry / Composer, Accelerate's fsdp_version 1): "
        "parameters are views of the flat gathered buffer, so no per-layer copy-out (its gradient is still cast "
        "into the reduce-scatter input). False: FSDP2's fully_shard (torchtitan, the runtime), which also copies "
        "each gathered layer out of the all-gather buffer on the compute stream",
    )

    megatron_fsdp_gradient_fusion: bool = Field(
        True,
        description="framework megatron, ZeRO-2/3 (Megatron FSDP): the weight-gradient GEMMs accumulate into the "
        "gradient buffer in their epilogue (gradient-accumulation fusion, which Megatron-Core 0.14+ keeps under "
        "FSDP). False: the stack turns the fusion off under Megatron FSDP (NeMo 2.3 / 2.4, Megatron-Core "
        "0.12 / 0.13), so each GEMM writes param.grad and a hook copies it into the buffer, per micro-batch",
    )

    fsdp_root_holds_ends: bool = Field(
        False,
        description="FSDP only: the token embedding and the final norm + LM head stay in the root group, "
        "gathered from the forward's start to the backward's end (torchtitan before pytorch/torchtitan#1094, "
        "2025-07-28; accelerate's transformer-based wrap policy); false: each end is an FSDP unit of its own "
        "(torchtitan since, the runtime); cost_models.fsdp_units",
    )
    attention_kernel: AttentionKernel | None = Field(
        None,
        description="attention kernel: fused (written for the GPU's own tensor cores: Transformer Engine's "
        "cuDNN attention in Megatron-Core, FlashAttention-3) or flash2 (FlashAttention-2: the flash-attn 2 "
        "package, PyTorch SDPA's flash backend, first in its default priority order) or triton_flash "
        "(FlashAttention written in Triton, flash-attn's flash_attn_triton.py on the pre-MLIR Triton: "
        "llm-foundry's attn_impl triton; cost_models.kernels.attention.TRITON_FLASH_SPEED); default by framework "
        "(megatron fused, fsdp and deepspeed flash2); cost_models.compute.attention_rate",
    )

    stack: FinetuneStack | None = Field(
        None,
        description="fine-tuning stack run on top of the framework (cost_models.stacks): hf (HF Trainer / "
        "accelerate + PEFT, framework fsdp or deepspeed) or torchtune (its recipes, framework fsdp); None: the "
        "framework's own training loop (Megatron-Core, torchtitan, DeepSpeed)",
    )
    optimizer_state: OptimizerState = Field(
        "full",
        description="Adam's moments: full (the trained weights' dtype), int8, int8_paged (bitsandbytes' paged "
        "8-bit, in unified memory), int4 (torchao); the quantized ones need a fine-tuning stack",
    )
    optimizer_in_backward: bool = Field(
        False,
        description="torchtune's optimizer_in_bwd: each parameter is stepped and its gradient freed in its "
        "post-accumulate-grad hook, so no step-wide gradient buffer exists (needs grad_accum 1)",
    )
    optimizer_fused: bool = Field(
        True,
        description="a stack's AdamW runs as one fused kernel (torch's fused=True: HF Trainer's default adamw_torch_fused, "
        "torchtune's configs) or, False, as torch's foreach implementation (torch.optim.AdamW's default on CUDA), "
        "which passes over the states op by op (cost_models.stacks.FOREACH_ADAMW_PASSES)",
    )
    offload_activations: bool = Field(
        False,
        description="torchtune's enable_activation_offloading: every tensor saved for backward goes to pinned "
        "host memory on a side stream after its forward and comes back before its backward",
    )
    cp_attention: CpAttention = Field(
        "ring",
        description="context-parallel attention: ring (K/V blocks passed around the CP group, no "
        "full-sequence K/V kept: Megatron-Core, torch's context_parallel) or allgather_mask (K/V "
        "all-gathered over the CP group and a dense (s/cp x s) mask passed to SDPA: runtime.context_parallel)",
    )

    @property
    def recompute_modules_(self) -> tuple[str, ...]:
        """The modules selective recompute covers (sorted, so equal sets price alike)."""
        if self.recompute_modules:
            return tuple(sorted(set(self.recompute_modules)))
        return MEGATRON_DEFAULT_RECOMPUTE_MODULES if self.framework == "megatron" else DEFAULT_RECOMPUTE_MODULES

    # ---- resolved values ----------------------------------------------------------------------
    def resolved(self, gpus: int, training: TrainingSpec) -> Layout:
        """Fill derived fields (dp, grad_accum, dp_shard, etp, sp, schedule). Raises
        `LayoutError` when they cannot be derived (e.g. degrees do not divide the GPU count)."""
        return self._copy_update(self.resolved_fields(gpus, training))

    def resolved_fields(self, gpus: int, training: TrainingSpec) -> dict[str, object]:
        """The derived fields `resolved` fills, by name (every one, derived or as given). Raises
        `LayoutError` as `resolved` does."""
        errors: list[Violation] = []
        model_par = self.tp * self.pp * self.cp
        dp = self.dp
        if dp is None:
            if gpus % model_par:
                errors.append(Violation("dp", f"tp x pp x cp = {model_par} does not divide the {gpus} GPUs"))
                raise LayoutError(errors)
            dp = gpus // model_par
        grad_accum = self.grad_accum
        if grad_accum is None:
            per_step = self.micro_batch * dp
            if training.global_batch % per_step:
                errors.append(
                    Violation(
                        "micro_batch",
                        f"global batch {training.global_batch} is not divisible by micro_batch x dp = "
                        f"{self.micro_batch} x {dp} = {per_step}",
                    )
                )
                raise LayoutError(errors)
            grad_accum = training.global_batch // per_step
        return {
            "dp": dp,
            "grad_accum": grad_accum,
            "dp_shard": self.dp_shard or dp,
            "etp": self.etp or self.tp,
            "sp": (self.tp > 1) if self.sp is None else self.sp,
            "schedule": self.schedule or ("interleaved_1f1b" if self.vpp > 1 else "1f1b"),
            "tp_comm_overlap": self.tp_comm_overlap_,
        }

    def _copy_update(self, update: dict[str, object]) -> Layout:
        """`self.model_copy(update=update)` without pydantic's generic path (the search resolves
        thousands of layouts): the same `__dict__` (field order kept), fields set, extra and
        private slots, for a Layout (extra forbidden, no private attributes). Subclasses take
        pydantic's own path. `update` holds field names only; values are not validated."""
        if type(self) is not Layout:
            return self.model_copy(update=update)
        copied = object.__new__(Layout)
        fields = dict(self.__dict__)
        fields.update(update)
        object.__setattr__(copied, "__dict__", fields)
        object.__setattr__(copied, "__pydantic_extra__", None)
        object.__setattr__(copied, "__pydantic_fields_set__", self.__pydantic_fields_set__ | update.keys())
        object.__setattr__(copied, "__pydantic_private__", None)
        return copied

    # Typed accessors for resolved layouts (they assert the field was resolved).
    @property
    def dp_(self) -> int:
        assert self.dp is not None, "call Layout.resolved() first"
        return self.dp

    @property
    def grad_accum_(self) -> int:
        assert self.grad_accum is not None, "call Layout.resolved() first"
        return self.grad_accum

    @property
    def dp_shard_(self) -> int:
        return self.dp_shard or self.dp_

    @property
    def etp_(self) -> int:
        return self.etp or self.tp

    @property
    def sp_(self) -> bool:
        return (self.tp > 1) if self.sp is None else self.sp

    @property
    def schedule_(self) -> Schedule:
        return self.schedule or ("interleaved_1f1b" if self.vpp > 1 else "1f1b")

    @property
    def uneven_split(self) -> bool:
        """Whether a Megatron-Core uneven pipeline split option is set (`stages.megatron_split`)."""
        return (
            self.account_for_embedding_in_pipeline_split or self.account_for_loss_in_pipeline_split
            or self.decoder_first_pipeline_num_layers is not None or self.decoder_last_pipeline_num_layers is not None
        )

    @property
    def tp_comm_overlap_(self) -> bool:
        """Resolved `tp_comm_overlap`: on by default for Megatron with sequence parallel (NeMo's
        performance recipes enable it), off otherwise."""
        if self.tp_comm_overlap is not None:
            return self.tp_comm_overlap
        return self.framework == "megatron" and self.tp > 1 and self.sp_

    @property
    def attention_kernel_(self) -> AttentionKernel:
        """Resolved `attention_kernel`: Megatron-Core runs Transformer Engine's fused (cuDNN) attention;
        PyTorch stacks (FSDP, DeepSpeed with Hugging Face models) run SDPA, whose default priority order
        puts the FlashAttention-2 backend first (`torch._C._get_sdp_priority_order()` in torch 2.13:
        flash, efficient, math, cuDNN; cuDNN attention stopped being preferred in pytorch/pytorch#138522,
        October 2024)."""
        if self.attention_kernel is not None:
            return self.attention_kernel
        return default_attention_kernel(self.framework)

    @property
    def cross_entropy_(self) -> CrossEntropy:
        if self.cross_entropy is not None:
            return self.cross_entropy
        if self.framework == "megatron":
            return "vocab_parallel"
        if self.stack == "torchtune":  # every torchtune recipe config's loss (cost_models.stacks)
            return "chunked"
        # PyTorch-native TP keeps the logits vocabulary-sharded under `loss_parallel` (torchtitan)
        return "loss_parallel" if self.framework == "fsdp" and self.tp > 1 else "eager"

    @property
    def communicator_groups(self) -> int:
        """Parallel dimensions of more than one rank (tp, pp, cp, ep, dp): one NCCL communicator
        each on a rank, whose buffers `Calibration.nccl_buffer_bytes_per_group` prices."""
        return sum(1 for d in (self.tp, self.pp, self.cp, self.ep, self.dp_) if d > 1)

    @property
    def world_size(self) -> int:
        return self.dp_ * self.tp * self.pp * self.cp

    @property
    def expert_dp(self) -> int:
        """Data-parallel degree of expert weights: (dp x cp x tp) / (ep x etp) ranks hold each
        expert shard (Megatron-Core's expert-data-parallel group)."""
        return self.dp_ * self.cp * self.tp // (self.ep * self.etp_)


def ep_next_to_dp(order: str) -> bool:
    """Whether `order` places ep beside dp, as Megatron-Core 0.9's RankGenerator requires ("The ep and
    dp must be adjacent in order") for an expert grid without MoE parallel folding."""
    return "ep-dp" in order or "dp-ep" in order


def _unfolded_expert_violations(lay: Layout) -> list[Violation]:
    """Megatron-Core 0.9's expert grid (`moe_parallel_folding=False`; its parallel_state.RankGenerator):
    ep divides dp (`data_parallel_size % expert_model_parallel_size`), ep sits next to dp in the order,
    and the experts are tensor-parallel over the TP group."""
    v: list[Violation] = []
    if lay.dp_ % lay.ep:
        v.append(Violation("ep", f"ep={lay.ep} must divide dp={lay.dp_} without MoE parallel folding "
                           "(expert parallelism is carved out of the data-parallel group)"))
    if lay.etp_ != lay.tp:
        v.append(Violation("etp", f"etp={lay.etp_} differs from tp={lay.tp}: expert TP needs MoE parallel folding"))
    if lay.ep > 1 and not ep_next_to_dp(lay.order):
        v.append(Violation("order", f"order {lay.order!r}: without MoE parallel folding ep must be next to dp"))
    return v


@dataclass(frozen=True)
class Violation:
    """One violated constraint: the offending field and a sentence saying why."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"

    @property
    def path(self) -> tuple[str, ...]:
        """Where the field lives in a job: under "layout", or under "training" for a field named
        "training.<name>" (a training field that this layout or model cannot run)."""
        parts = tuple(self.field.split("."))
        return parts if parts[0] == "training" else ("layout", *parts)


class LayoutError(ValueError):
    def __init__(self, violations: list[Violation]):
        self.violations = violations
        super().__init__("; ".join(str(v) for v in violations))


def validate_layout(
    model: ModelSpec, training: TrainingSpec, gpus: int, layout: Layout, partition: StagePartition | None = None
) -> list[Violation]:
    """Every constraint a layout violates, each naming its field. Empty list = valid.

    `layout` may be unresolved; derived fields are filled first (a failure to derive them is
    reported as a violation). An explicit `partition` (layers per chunk) is validated on its own
    terms: it must be cut for the layout's pp x vpp, cover the layers, and leave no middle chunk
    empty; the split options and Megatron's divisibility rule then do not apply."""
    try:
        lay = layout.resolved(gpus, training)
    except LayoutError as exc:
        return exc.violations
    v: list[Violation] = []
    tp, pp, cp, ep, dp = lay.tp, lay.pp, lay.cp, lay.ep, lay.dp_
    world = dp * tp * pp * cp
    if world != gpus:
        v.append(Violation("dp", f"dp x tp x pp x cp = {dp}x{tp}x{pp}x{cp} = {world}, but the job has {gpus} GPUs"))
    if model.num_heads % tp:
        v.append(Violation("tp", f"tp={tp} does not divide the {model.num_heads} attention heads"))
    if model.attention != "mla" and model.kv_heads % tp and tp % model.kv_heads:
        v.append(
            Violation("tp", f"tp={tp} neither divides nor is a multiple of the {model.kv_heads} KV heads")
        )
    if model.ffn_hidden_size % tp:
        v.append(Violation("tp", f"tp={tp} does not divide the dense FFN width {model.ffn_hidden_size}"))
    if model.vocab_size % tp and tp > 1:
        # Megatron pads the vocabulary to a multiple of tp; we allow it and pad in memory/FLOPs.
        pass
    if model.is_moe:
        if model.num_experts % ep:
            v.append(Violation("ep", f"ep={ep} does not divide the {model.num_experts} experts"))
        if (dp * cp * tp) % (ep * lay.etp_):
            v.append(
                Violation(
                    "ep",
                    f"ep x etp = {ep}x{lay.etp_} must divide dp x cp x tp = {dp}x{cp}x{tp} "
                    "(expert parallelism is carved out of the non-pipeline ranks)",
                )
            )
        if not lay.moe_parallel_folding:
            v += _unfolded_expert_violations(lay)
        assert model.moe_ffn_hidden_size
        if model.moe_ffn_hidden_size % lay.etp_:
            v.append(Violation("etp", f"etp={lay.etp_} does not divide the expert FFN width {model.moe_ffn_hidden_size}"))
    elif ep > 1:
        v.append(Violation("ep", f"ep={ep} needs a mixture-of-experts model; {model.name} is dense"))
    v += hybrid_violations(model, lay)
    v += mtp_violations(model, training, lay)
    if pp > model.num_layers:
        v.append(Violation("pp", f"pp={pp} exceeds the {model.num_layers} layers"))
    if lay.vpp > 1 and pp == 1:
        v.append(Violation("vpp", "virtual pipeline stages (vpp > 1) need pp > 1"))
    v += _split_violations(model, lay, partition)
    sched = lay.schedule_
    if sched == "interleaved_1f1b" and lay.vpp == 1:
        v.append(Violation("schedule", "interleaved_1f1b needs vpp > 1"))
    if is_v_shape(sched, pp) and lay.vpp != 2:
        v.append(Violation("vpp", f"the {sched} schedule places exactly two chunks per rank as a V: vpp=2, not {lay.vpp}"))
    if sched == "dualpipev" and pp > 1 and not dualpipev_micro_batches_ok(pp, lay.grad_accum_):
        v.append(Violation("grad_accum", f"dualpipev needs at least 2 x pp = {2 * pp} micro-batches (torch's "
                           f"ScheduleDualPipeV: one per stage), not {lay.grad_accum_}"))
    if sched in ("gpipe", "1f1b") and lay.vpp > 1:
        v.append(Violation("schedule", f"vpp={lay.vpp} needs the interleaved_1f1b, zero_bubble, zbv, dualpipev or "
                           f"looped_bfs schedule, not {sched}"))
    if sched == "zero_bubble" and pp > 1 and not zero_bubble_rounds_ok(pp, lay.grad_accum_):
        rounds = max(1, lay.grad_accum_ // pp)
        v.append(Violation("grad_accum", f"zero bubble runs the {lay.grad_accum_} micro-batches in {rounds} rounds "
                           "(max(1, m // pp), torch's ScheduleInterleavedZeroBubble): m must be a multiple of them"))
    interleaves = sched == "interleaved_1f1b" and pp > 1 and lay.framework != "deepspeed"  # deepspeed: no vpp
    if interleaves and interleaving_group(lay.framework, pp, lay.grad_accum_) is None:
        m = lay.grad_accum_
        why = (
            f"Megatron-Core runs interleaved 1F1B in groups of N micro-batches per virtual stage, pp={pp} <= N <= m, "
            f"with the last group (m % N) empty or at least pp: no N fits m={m}"
            if lay.framework == "megatron"
            else f"torch's ScheduleInterleaved1F1B runs the {m} micro-batches in m // pp rounds: m must be at least "
            f"pp={pp} and a multiple of the rounds"
        )
        v.append(Violation("grad_accum", why))
    if dp * lay.micro_batch * lay.grad_accum_ != training.global_batch:
        v.append(
            Violation(
                "grad_accum",
                f"micro_batch x grad_accum x dp = {lay.micro_batch}x{lay.grad_accum_}x{dp} "
                f"!= global batch {training.global_batch}",
            )
        )
    if cp > 1 and training.seq_len % (2 * cp):
        v.append(Violation("cp", f"cp={cp} needs seq_len divisible by 2 x cp (load-balanced causal chunks)"))
    if lay.sp_ and tp > 1 and training.seq_len // cp % tp:
        v.append(Violation("sp", f"sequence parallel needs the per-CP-rank sequence divisible by tp={tp}"))
    if lay.sp_ and tp == 1:
        v.append(Violation("sp", "sequence parallel needs tp > 1"))
    if lay.tp_comm_overlap and tp == 1:
        v.append(Violation("tp_comm_overlap", "TP communication overlap needs tp > 1"))
    dps = lay.dp_shard_
    if dp % dps:
        v.append(Violation("dp_shard", f"dp_shard={dps} does not divide dp={dp}"))
    if dps < dp and lay.zero_stage == 0:
        v.append(Violation("dp_shard", "hybrid sharding (dp_shard < dp) needs zero_stage >= 1"))
    v += framework_violations(lay)
    v += method_violations(training, lay)
    v += stack_violations(training, lay)
    if training.frozen_base and not adapted_names(model, training.lora_modules):
        v.append(Violation("training.lora_targets", f"none of {', '.join(training.lora_modules)} is a linear module of {model.name} "
                           f"(it has {', '.join(linear_names(model))})"))
    if lay.recompute_modules is not None:
        if lay.recompute != "selective":
            v.append(Violation("recompute_modules", "recompute_modules apply to selective recompute only"))
        if "mla_up_proj" in lay.recompute_modules and model.attention != "mla":
            v.append(Violation("recompute_modules", "mla_up_proj needs an MLA model (DeepSeek-V2/V3)"))
        if not lay.recompute_modules:
            v.append(Violation("recompute_modules", "an empty module list recomputes nothing: use recompute none"))
    if lay.recompute_layers is not None:
        if lay.recompute != "full":
            v.append(Violation("recompute_layers", "recompute_layers applies to full recompute only"))
        if lay.recompute_layers > -(-model.num_layers // pp):
            v.append(Violation("recompute_layers", f"more recomputed layers than a stage holds ({lay.recompute_layers})"))
    if lay.activation_offload_layers:
        if lay.framework != "megatron":
            v.append(Violation("activation_offload_layers", "activation CPU offload is Megatron-Core's (--cpu-offloading)"))
        if lay.activation_offload_layers >= -(-model.num_layers // pp):
            v.append(Violation("activation_offload_layers",
                               f"Megatron offloads fewer layers than a stage holds ({lay.activation_offload_layers})"))
        if lay.vpp > 1:
            v.append(Violation("activation_offload_layers", "Megatron's activation offload does not run with virtual stages"))
    if lay.offload_optimizer and lay.zero_stage == 0:
        v.append(Violation("offload_optimizer", "optimizer offload needs zero_stage >= 1 (ZeRO-Offload)"))
    if lay.offload_params:
        if lay.zero_stage < 3:
            v.append(Violation("offload_params", "parameter offload needs zero_stage 3 (ZeRO-Infinity / FSDP)"))
        if lay.framework == "megatron":
            v.append(Violation("offload_params", "Megatron-Core offloads optimizer states only (--optimizer-cpu-offload)"))
        if lay.framework == "fsdp" and not lay.offload_optimizer:
            v.append(Violation("offload_params", "FSDP's CPUOffload moves parameters, gradients and the optimizer "
                               "step together: set offload_optimizer too"))
        if lay.pp > 1:
            v.append(Violation("offload_params", "parameter offload runs with ZeRO-3 data parallelism, not pipelines"))
    if lay.offload_device == "nvme":
        if not (lay.offload_optimizer or lay.offload_params):
            v.append(Violation("offload_device", "nvme is where offloaded states go: set offload_optimizer or offload_params"))
        if lay.framework != "deepspeed" or lay.zero_stage < 3:
            v.append(Violation("offload_device", "NVMe offload is ZeRO-Infinity's: framework deepspeed with zero_stage 3"))
    v += zeropp_violations(lay)
    order_dims = lay.order.split("-")
    if sorted(order_dims) != sorted(["tp", "cp", "ep", "dp", "pp"]):
        v.append(Violation("order", f"order must be a permutation of tp-cp-ep-dp-pp, got {lay.order!r}"))
    return v


def framework_violations(lay: Layout) -> list[Violation]:
    """What the layout's framework cannot run (`Layout.framework`), each rule with its source, so a
    plan never prices what its export cannot express.

    - deepspeed: no context parallelism in DeepSpeed's training engine (its Ulysses "sequence
      parallelism" is a different, all-to-all scheme); the PipelineEngine runs one stage per rank
      with its 1F1B TrainSchedule (no interleaving, no GPipe schedule) and supports ZeRO stage 0-1
      only ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism", DeepSpeed pipeline docs).
    - fsdp (PyTorch FSDP2 / torchtitan): op-level SAC is its own; Megatron's uneven-split options
      are Megatron's (TP communication overlap exists in both: TE userbuffers, torchtitan's async TP).
    - megatron: op-level SAC is torchtitan's. Combined 1F1B (`moe_a2a_overlap`,
      --overlap-moe-expert-parallel-comm) is Megatron-Core's: it needs ep > 1, vpp > 1 when pp > 1,
      and no full recompute (Megatron-Core user guide, "Combined 1F1B: Expert-Parallel All-to-All
      Overlap"; Megatron-Bridge's overlap validation).
    - zero_bubble, zbv, dualpipev and looped_bfs are torch.distributed.pipelining's (torchtitan's
      InterleavedZeroBubble, ZBVZeroBubble, DualPipeV, LoopedBFS): Megatron-LM (core_v0.16) and
      DeepSpeed's pipeline engine have neither a breadth-first schedule nor one that splits the
      weight gradient; the split ones not with ZeRO-3, whose per-layer reshard drops the deferred
      weight gradients
      (tests/runtime/test_parallel_layouts.py measured it).
    - framework_version: only DeepSpeed's releases are told apart (`cost_models.zero3_gathers`),
      given as a release number."""
    v: list[Violation] = []
    fw = lay.framework
    if lay.recompute == "op_sac" and fw != "fsdp":
        v.append(Violation("recompute", "op_sac (torchtitan's op-level selective checkpointing) needs framework fsdp"))
    if lay.pp > 1 and lay.schedule_ in TORCH_ONLY_SCHEDULES and fw != "fsdp":
        v.append(Violation("schedule", f"the {lay.schedule_} schedule is torch.distributed.pipelining's: framework fsdp, not {fw}"))
    if lay.pp > 1 and lay.schedule_ in SPLIT_BACKWARD_SCHEDULES and lay.zero_stage == 3:
        v.append(Violation("zero_stage", ZERO_BUBBLE_ZERO3))
    if lay.fsdp_flat_params and fw != "fsdp":
        v.append(Violation("fsdp_flat_params", f"FSDP1's flat parameters are framework fsdp's, not {fw}'s"))
    if not lay.megatron_fsdp_gradient_fusion and fw != "megatron":
        v.append(Violation("megatron_fsdp_gradient_fusion", f"Megatron FSDP's gradient fusion is framework megatron's, not {fw}'s"))
    if lay.moe_a2a_overlap:
        if fw != "megatron":
            v.append(Violation("moe_a2a_overlap", f"combined 1F1B (--overlap-moe-expert-parallel-comm) is Megatron-Core's, not {fw}'s"))
        if lay.ep == 1:
            v.append(Violation("moe_a2a_overlap", "combined 1F1B overlaps expert-parallel all-to-alls: it needs ep > 1"))
        if lay.pp > 1 and lay.vpp == 1:
            v.append(Violation("moe_a2a_overlap", "combined 1F1B with pp > 1 needs interleaving (vpp > 1, Megatron-Core's rule)"))
        if lay.recompute == "full":
            v.append(Violation("moe_a2a_overlap", "combined 1F1B does not run with full recompute (Megatron-Core's rule)"))
        if lay.grad_accum_ < 2:
            v.append(Violation("moe_a2a_overlap", "combined 1F1B pairs one micro-batch's all-to-alls with another's "
                               "compute: it needs at least 2 micro-batches per step"))
    if lay.framework_version is not None:
        if fw != "deepspeed":
            v.append(Violation("framework_version", f"releases are told apart for framework deepspeed only, not {fw}"))
        else:
            try:
                parse_version(lay.framework_version)
            except ValueError as exc:
                v.append(Violation("framework_version", str(exc)))
            else:
                v += _release_violations(lay)
    if fw == "deepspeed":
        if lay.cp > 1:
            v.append(Violation("cp", "DeepSpeed has no context parallelism (framework deepspeed)"))
        if lay.pp > 1 and lay.vpp > 1:
            v.append(Violation("vpp", "DeepSpeed's pipeline engine runs one stage per rank (no virtual stages)"))
        if lay.pp > 1 and lay.schedule_ == "gpipe":
            v.append(Violation("schedule", f"DeepSpeed's pipeline engine runs 1F1B, not {lay.schedule_}"))
        if lay.pp > 1 and lay.zero_stage >= 2:
            v.append(Violation("zero_stage", "DeepSpeed's pipeline engine supports ZeRO stage 0-1 only"))
    if fw != "megatron":
        split = (
            lay.account_for_embedding_in_pipeline_split or lay.account_for_loss_in_pipeline_split
            or lay.decoder_first_pipeline_num_layers is not None or lay.decoder_last_pipeline_num_layers is not None
        )
        if split:
            v.append(Violation("account_for_embedding_in_pipeline_split",
                               f"the uneven-split options are Megatron-Core's (framework {fw}: give a partition)"))
    return v


def _release_violations(lay: Layout) -> list[Violation]:
    """What an older DeepSpeed release (`Layout.framework_version`) did not have yet
    (`zero3_gathers.DEEPSPEED_FEATURES`)."""
    v: list[Violation] = []
    version = lay.framework_version
    used = {
        "zero3": ("zero_stage", lay.zero_stage == 3),
        "nvme_offload": ("offload_device", lay.offload_device == "nvme" and (lay.offload_optimizer or lay.offload_params)),
        "zeropp": ("zero_hpz_partition_size", lay.zero_hpz_partition_size > 1 or lay.zero_quantized_weights
                   or lay.zero_quantized_gradients),
    }
    for feature, (field, on) in used.items():
        if on and not deepspeed_has(feature, version):
            v.append(Violation(field, f"DeepSpeed {version} predates {DEEPSPEED_FEATURES[feature][1]}"))
    return v


def mtp_violations(model: ModelSpec, training: TrainingSpec, lay: Layout) -> list[Violation]:
    """Megatron-Core's rules for combined 1F1B beside multi-token prediction (megatron-core 0.16.1,
    TransformerConfig.__post_init__: 'MTP layernum only supports 1 when enabling
    overlap_moe_expert_parallel_comm', and 'Pipeline model parallel size must be larger than 1 when
    enabling overlap_moe_expert_parallel_comm with MTP layer'). A frozen base trains no MTP module."""
    mtp = 0 if training.frozen_base else model.mtp_layers
    if not lay.moe_a2a_overlap or not mtp:
        return []
    if mtp > 1:
        return [Violation("moe_a2a_overlap", f"combined 1F1B runs with one MTP module, not {mtp} (Megatron-Core's rule)")]
    if lay.pp == 1:
        return [Violation("moe_a2a_overlap", "combined 1F1B with an MTP module needs pipeline parallelism, pp > 1 "
                          "(Megatron-Core's rule)")]
    return []


def hybrid_violations(model: ModelSpec, lay: Layout) -> list[Violation]:
    """What a hybrid Mamba-2 model (`ModelSpec.hybrid_pattern`) cannot run with.

    - tp: Megatron-Core's `MambaMixer` splits the Mamba heads and the B / C groups over TP
      (`megatron/core/ssm/mamba_mixer.py`: "nheads must be evenly divisble by tp_size", "ngroups
      must be evenly divisible by tp_size").
    - cp: Megatron-Core has context parallelism for Mamba layers only from core_v0.13.0
      (`megatron/core/ssm/mamba_context_parallel.py`, "Add Mamba context parallel", 2025-06-14: an
      all-to-all from sequence to head sharding around the conv and scan); the NeMo 25.04 /
      Megatron-Core 0.12 recipes that trained Nemotron-H run cp=1, and autopar does not price that
      all-to-all: refused rather than priced as ring attention.
    - op_sac: torchtitan's op-level SAC is not priced for Mamba layers."""
    if not model.is_hybrid:
        return []
    v: list[Violation] = []
    mamba = model.has_mamba
    if mamba and (model.mamba_num_heads or 0) % lay.tp:
        v.append(Violation("tp", f"tp={lay.tp} does not divide the {model.mamba_num_heads} Mamba heads"))
    if mamba and model.mamba_groups % lay.tp:
        v.append(Violation("tp", f"tp={lay.tp} does not divide the {model.mamba_groups} Mamba B/C groups (n_groups)"))
    if lay.cp > 1:
        v.append(Violation("cp", "context parallelism of hybrid Mamba models is not priced (Megatron-Core has it from "
                           "core_v0.13 as an all-to-all to head sharding, not ring attention): use cp=1"))
    if lay.recompute == "op_sac" and mamba:
        v.append(Violation("recompute", "op_sac is not priced for Mamba-2 layers: use full or selective recompute"))
    return v


def zeropp_violations(lay: Layout) -> list[Violation]:
    """ZeRO++ (Wang et al. 2023, "ZeRO++: Extremely Efficient Collective Communication for Giant Model
    Training"; DeepSpeed's `zero_hpz_partition_size`, `zero_quantized_weights`,
    `zero_quantized_gradients`) is DeepSpeed's and built on ZeRO-3. DeepSpeed has no hybrid
    sharding of its own: its ZeRO shards over every data-parallel rank, and hpZ is how it keeps the
    backward's gathers inside a node (a deepspeed layout with dp_shard < dp is refused here)."""
    v: list[Violation] = []
    hpz, dp = lay.zero_hpz_partition_size, lay.dp_
    used = hpz > 1 or lay.zero_quantized_weights or lay.zero_quantized_gradients
    if used and (lay.framework != "deepspeed" or lay.zero_stage != 3):
        field = "zero_hpz_partition_size" if hpz > 1 else (
            "zero_quantized_weights" if lay.zero_quantized_weights else "zero_quantized_gradients")
        v.append(Violation(field, "ZeRO++ (hpZ, qwZ, qgZ) is DeepSpeed's ZeRO-3: framework deepspeed with zero_stage 3"))
    if hpz > 1 and (dp % hpz or hpz == dp):
        v.append(Violation("zero_hpz_partition_size",
                           f"hpZ's secondary group ({hpz}) must divide the data-parallel size ({dp}) and be smaller"))
    if lay.framework == "deepspeed" and lay.dp_shard_ < dp:
        v.append(Violation("dp_shard", f"DeepSpeed shards over all {dp} data-parallel ranks (no hybrid sharding): "
                           f"with ZeRO-3, zero_hpz_partition_size={lay.dp_shard_} keeps the backward's gathers in groups of "
                           f"{lay.dp_shard_} instead"))
    return v


def method_violations(training: TrainingSpec, lay: Layout) -> list[Violation]:
    """What a training method cannot run with (`TrainingSpec.method`).

    QLoRA's 4-bit / int8 base weights are bitsandbytes tensors trained through PEFT with plain data
    parallelism, FSDP or DeepSpeed ZeRO (transformers' bitsandbytes integration, accelerate's
    FSDP-QLoRA with `bnb_4bit_quant_storage`); no tensor- or pipeline-parallel implementation shards
    them, and Megatron-Core has no bitsandbytes weights. LoRA runs in all three frameworks (PEFT
    under FSDP / DeepSpeed, Megatron-Bridge / NeMo PEFT under Megatron-Core)."""
    v: list[Violation] = []
    if training.method == "qlora" and training.quant_format_ == "fp8":
        if lay.framework != "megatron":
            v.append(Violation("training.quant_format", "an FP8-stored frozen base is Transformer Engine's fp8 parameters "
                               "(NeMo / Megatron-Core, MLPerf's Llama-2-70B LoRA): framework megatron"))
        return v
    if training.method != "qlora":
        return v
    if lay.framework == "megatron":
        v.append(Violation("framework", "qlora (bitsandbytes base weights) runs under fsdp or deepspeed, not megatron"))
    if lay.tp > 1:
        v.append(Violation("tp", "qlora's quantized base weights are not tensor-parallel (PEFT + bitsandbytes): use tp=1"))
    if lay.pp > 1:
        v.append(Violation("pp", "qlora's quantized base weights are not pipelined by any framework we export to: use pp=1"))
    return v


def stack_violations(training: TrainingSpec, lay: Layout) -> list[Violation]:
    """What a fine-tuning stack (`Layout.stack`, `cost_models.stacks`) cannot run, and the techniques
    only a fine-tuning stack runs, each with the code it was read in.

    - hf (transformers' Trainer, accelerate, PEFT): data parallelism with FSDP (accelerate's FSDP
      plugin) or DeepSpeed ZeRO under it; Trainer has no tensor, pipeline, context or expert
      parallelism of its own for training and no optimizer step in the backward; it offloads the
      checkpointed layer inputs only (`activation_checkpointing_kwargs` "offload", transformers 5).
    - torchtune (0.6.1): its LoRA / QLoRA / full recipes shard with FSDP2 (`training.shard_model`)
      over data parallel ranks; optimizer_in_bwd is read by the full fine-tuning recipes only and
      needs gradient_accumulation_steps 1 (`full_finetune_single_device.py` raises otherwise);
      enable_activation_offloading needs enable_activation_checkpointing (every recipe raises
      otherwise).
    - the quantized and paged optimizers, optimizer-in-backward and activation offloading outside
      Megatron (`offload_activations`) are the stacks' (bitsandbytes / torchao components they load);
      Megatron-Core, torchtitan and DeepSpeed's engine are priced without them.
    - DoRA and trainable embeddings are PEFT's and torchtune's adapters (torchtune's LoRA builders
      have no trainable embedding: refused there)."""
    v: list[Violation] = []
    st = lay.stack
    if st is None:
        for name, on in (("optimizer_state", lay.optimizer_state != "full"), ("optimizer_in_backward", lay.optimizer_in_backward),
                         ("offload_activations", lay.offload_activations)):
            if on:
                v.append(Violation(name, f"{name} is a fine-tuning stack's technique (stack hf or torchtune), not "
                                   f"framework {lay.framework}'s training loop"))
        if lay.cross_entropy in ("chunked", "fused_linear"):
            v.append(Violation("cross_entropy", f"the {lay.cross_entropy} loss is a fine-tuning stack's (torchtune's "
                               "chunked loss, Liger / Cut Cross-Entropy under HF): set stack"))
        if training.dora or training.trainable_embeddings:
            v.append(Violation("stack", "DoRA and trainable embeddings are PEFT's / torchtune's adapters: set stack hf or torchtune"))
        return v
    allowed = ("fsdp", "deepspeed") if st == "hf" else ("fsdp",)
    if lay.framework not in allowed:
        v.append(Violation("framework", f"stack {st} runs on {' or '.join(allowed)}, not {lay.framework}"))
    for dim in ("tp", "pp", "cp", "ep"):
        if getattr(lay, dim) > 1:
            v.append(Violation(dim, f"stack {st} trains with data parallelism (FSDP / ZeRO) only: {dim} must be 1"))
    if lay.cross_entropy in ("vocab_parallel", "loss_parallel"):
        v.append(Violation("cross_entropy", f"{lay.cross_entropy} is Megatron's / torchtitan's loss, not stack {st}'s"))
    if lay.cross_entropy == "fused" and st == "torchtune":
        v.append(Violation("cross_entropy", "torchtune's loss is chunked (CEWithChunkedOutputLoss) or eager"))
    if lay.optimizer_in_backward:
        if st != "torchtune":
            v.append(Violation("optimizer_in_backward", "HF Trainer steps the optimizer after the backward "
                               "(optimizer-in-backward is torchtune's optimizer_in_bwd)"))
        if training.frozen_base:
            v.append(Violation("optimizer_in_backward", "torchtune's optimizer_in_bwd is its full fine-tuning recipes' "
                               "(full_finetune_*); the LoRA recipes step after the backward"))
        if lay.grad_accum_ > 1:
            v.append(Violation("optimizer_in_backward", "torchtune's optimizer_in_bwd needs gradient_accumulation_steps=1 "
                               f"(grad_accum is {lay.grad_accum_})"))
        if lay.offload_optimizer:
            v.append(Violation("optimizer_in_backward", "optimizer_in_bwd steps on the GPU: not with optimizer offload"))
    if lay.offload_activations and lay.recompute != "full":
        v.append(Violation("offload_activations", "activation offloading needs activation checkpointing (recompute full): "
                           "torchtune's recipes refuse enable_activation_offloading without enable_activation_checkpointing, "
                           "and HF offloads the checkpointed layer inputs (activation_checkpointing_kwargs offload)"))
    if lay.framework == "fsdp" and lay.offload_optimizer != lay.offload_params:
        v.append(Violation("offload_optimizer", f"stack {st} offloads with FSDP's CPU offload (torchtune's fsdp_cpu_offload, "
                           "Accelerate's fsdp_offload_params): parameters, gradients and optimizer together"))
    if lay.optimizer_state != "full" and lay.offload_optimizer:
        v.append(Violation("optimizer_state", "the 8-bit / 4-bit optimizers step on the GPU: not with optimizer offload"))
    if lay.optimizer_state in ("paged", "int8_paged") and lay.framework == "deepspeed":
        v.append(Violation("optimizer_state", "DeepSpeed builds its own optimizer from ds_config: a paged bitsandbytes "
                           "optimizer runs under FSDP or one GPU"))
    if training.trainable_embeddings and st == "torchtune":
        v.append(Violation("training.trainable_embeddings", "torchtune's LoRA builders train no embedding beside the adapters"))
    return v


def _split_violations(model: ModelSpec, lay: Layout, partition: StagePartition | None) -> list[Violation]:
    """How the layers are cut into pp x vpp chunks (`cost_models.stages`)."""
    pp, vpp = lay.pp, lay.vpp
    if partition is not None:
        if (partition.pp, partition.vpp) != (pp, vpp):
            return [Violation("partition", f"cut for pp={partition.pp} x vpp={partition.vpp}, the layout has pp={pp} x vpp={vpp}")]
        if partition.v_shape != is_v_shape(lay.schedule_, pp):
            placed = "as a V" if partition.v_shape else "looped (chunk c on rank c % pp)"
            return [Violation("partition", f"chunks placed {placed}, which the {lay.schedule_} schedule does not do")]
        return [Violation("partition", p) for p in partition.problems(model.num_layers)]
    if lay.uneven_split:
        if pp == 1:
            return [Violation("pp", "uneven pipeline split options need pp > 1")]
        field = "decoder_first_pipeline_num_layers" if (
            lay.decoder_first_pipeline_num_layers is not None or lay.decoder_last_pipeline_num_layers is not None
        ) else "account_for_embedding_in_pipeline_split"
        try:
            chunks = megatron_split(
                model.num_layers, pp, vpp,
                account_for_embedding=lay.account_for_embedding_in_pipeline_split,
                account_for_loss=lay.account_for_loss_in_pipeline_split,
                first_stage_layers=lay.decoder_first_pipeline_num_layers,
                last_stage_layers=lay.decoder_last_pipeline_num_layers,
            )
        except ValueError as exc:
            return [Violation(field, str(exc))]
        return [Violation(field, p) for p in StagePartition(chunks, pp, vpp).problems(model.num_layers)]
    if vpp > 1 and model.num_layers % (pp * vpp):
        return [
            Violation(
                "vpp",
                f"vpp={vpp} x pp={pp} = {pp * vpp} chunks do not divide the {model.num_layers} layers "
                "(Megatron-Core splits unevenly with account_for_embedding_in_pipeline_split / "
                "account_for_loss_in_pipeline_split or decoder_first/last_pipeline_num_layers, or give a partition)",
            )
        ]
    return []
