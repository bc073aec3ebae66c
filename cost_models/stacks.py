"""Fine-tuning stacks (`Layout.stack`): what each stores, saves and launches, read in its code.

A stack is the training loop a user runs on top of a framework: `hf` (transformers' Trainer or
accelerate with PEFT; FSDP or DeepSpeed ZeRO underneath, or one GPU) and `torchtune` (its recipes;
FSDP2 or one GPU). The two differ from the frameworks' own loops (Megatron-Core, torchtitan) in the
dtype of the trained weights and optimizer states, in what their eager modules save for backward,
in their loss and in how much host work a step and a micro-batch cost. Each default below names
the code it was read in (transformers 5.24, PEFT 0.21.2, torchtune at bd2a0fc7, torchao 0.18,
bitsandbytes' `Optimizer8bit`).

Trained weights (`trainable_bytes`): bytes per trained element of the weight, its gradient and
Adam's two moments, and whether the trained weight also exists as a compute-dtype copy during the
forward and backward.
- framework loops (no stack): 2-byte working weight + 2-byte gradient + 12 bytes of fp32 master,
  m and v (ZeRO paper's 16 bytes; `TrainingSpec.optimizer_bytes`).
- hf, adapters: PEFT's `get_peft_model(..., autocast_adapter_dtype=True)` (its default) upcasts
  the bf16 / fp16 adapter weights to float32, so adapters, their gradients and AdamW's moments
  (`torch.optim.AdamW` keeps `zeros_like(param)`) are float32: 4 + 4 + 8 bytes.
- hf, full: the weights stay in the dtype they were loaded in. transformers 5's `from_pretrained`
  loads `dtype="auto"` (the checkpoint's, bf16 for every model priced here) and `bf16=True` in
  TrainingArguments only turns autocast on, so a full fine-tune trains bf16 weights with bf16
  moments and no master (2 + 2 + 4) unless the user loads float32 (`master_weights`): then 4 + 4 + 8
  and autocast's cached bf16 copy of each GEMM weight (2 bytes, kept from its first use in the
  forward to the backward that needs it). The exporter writes either as it was priced (`dtype`
  float32 or bfloat16 beside `bf16=True`, `planner.exporters.hf`).
  The float32 weights' mechanism (`autocast_weights`) is torch's autocast: every op on its
  lower-precision list (`linear`, `matmul`, SDPA) casts a float32 argument to bf16 first
  (`cached_cast` in pytorch/pytorch `aten/src/ATen/autocast_mode.cpp`). With `cache_enabled` (the
  default) a cast is cached only for a float32 leaf that requires grad and is not a view: the
  trained weights. The cache is cleared when the outermost autocast region exits
  (`torch.autocast.__exit__`, `torch/amp/autocast_mode.py`: `clear_autocast_cache` once the nesting
  returns to 0), i.e. after each micro-batch's forward (Trainer's `compute_loss` runs inside
  `autocast_smart_context_manager`, the backward outside it). Each GEMM saves its bf16 weight for
  the input gradient, so the copy lives on until that weight's backward: 2 bytes per element of the
  GEMM weights (the layers' linears and the LM head; the token embedding's lookup and the norms'
  multiply are not on the list and read the float32 weight). Time, per micro-batch: the forward's
  cast of every GEMM weight (`CAST_FORWARD_BYTES`), again in a checkpointed layer's recompute
  (`torch.utils.checkpoint` re-enters autocast with the forward's state, a fresh region, so the
  weights are cast again), and the backward's cast of each bf16 weight gradient to the float32 leaf's
  dtype (autograd's `ToCopyBackward0`: `CAST_BACKWARD_BYTES`). Under FSDP (ZeRO >= 1) the wrapper's
  mixed-precision policy gathers bf16 parameters, so autocast finds nothing to cast there.
- gradient accumulation (every stack): autograd's `AccumulateGrad` adds each micro-batch's gradient
  into the step's `param.grad` in place from the second micro-batch on (read both, write the sum:
  `ACCUMULATE_PASSES` passes over the gradient's dtype); the first micro-batch's gradient is stored
  as it is.
- torchtune: `dtype: bf16` builds every parameter, adapters included, in bf16 and the optimizer
  (`torch.optim.AdamW`, or bitsandbytes' / torchao's) keeps its moments in the parameter's dtype:
  2 + 2 + 4, no master (`master_weights` False: torchtune's recipes have no mixed precision).
- quantized moments (`Layout.optimizer_state`): block-wise 8-bit, one byte per element and one
  float32 scale per block of 256 (bitsandbytes `Optimizer8bit` with block_wise, torchao
  `OptimState8bit.zeros`); 4-bit, half a byte and one float32 scale per block of 128 (torchao
  `OptimState4bit.zeros`). bitsandbytes' paged states live in CUDA unified memory
  (`bitsandbytes.functional.get_paged`): PyTorch's allocator never counts them, and what the GPU
  cannot hold pages out to the host, so they are priced in host memory, and the step moves them
  over the host link.
- optimizer in backward (`Layout.optimizer_in_backward`, torchtune's optimizer_in_bwd): the
  optimizer steps each parameter in its post-accumulate-grad hook and frees its gradient, so at
  most one parameter's gradient exists at a time.

Saved activations (`adapter_input_bytes`): the frozen base's linears save nothing for backward (no
weight gradient, and the input gradient needs only the weight); an adapted linear's A saves its
input. PEFT casts that input to the adapter's dtype in every adapted module (`_cast_input_dtype`
in `LoraLayer.forward`), so each adapted module keeps its own float32 copy of its input (4 bytes x
its input width per token) and A's float32 output; torchtune's and the runtime's adapters compute
in the input's dtype and keep the shared bf16 input once (q, k and v read one tensor). Measured on
CPU with transformers 5.24 and PEFT 0.21.2 and saved-tensor hooks: each adapted module adds 4 x
(in + r) bytes per token, exactly. torchtune's attention expands K and V to every query head before
SDPA (`MultiHeadAttention.forward`: `k.unsqueeze(2).expand(...).flatten(1, 2)`), so SDPA keeps
them at the query heads' width.

Loss: HF's `ForCausalLMLoss` upcasts the logits to float32 and calls cross-entropy (the eager
loss; the model's output keeps the bf16 logits); torchtune's model returns float32 logits itself
and its recipes delete them after the loss (`activations.EAGER_LOGIT_BYTES_UPCAST_IN_MODEL`);
torchtune's configs name `CEWithChunkedOutputLoss` (2024-2025) / `LinearCrossEntropyLoss`
(2025), which compute the float32 loss one of 8 chunks at a time: `chunked`. Liger's fused linear
cross-entropy (`use_liger_kernel` in TrainingArguments) and Cut Cross-Entropy never hold the
whole logits: `fused_linear`.

Defaults that are the stack's and not the user's (each config's own default): recompute (HF's
`gradient_checkpointing` False; torchtune's `enable_activation_checkpointing` True in every recipe
config), compile (both off by default: eager kernels, `Layout.elementwise_kernels`).

Host overheads (`stack_overhead_s`, the launch floor): a Python training loop pays per micro-batch
(collate and copy the batch, the forward's and backward's Python module calls, the loss scaling, the
metrics), per step (the optimizer's Python loop over parameters, zero_grad, the scheduler, logging)
and per kernel it dispatches through its eager modules more than Megatron-Core's or torchtitan's
loops do. The per-kernel cost is fitted (`Calibration.stack_overheads`, `bench/finetune_runs.py
--fit`); the published rows cannot separate the other two from it (module doc of
`calibration.StackOverhead`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cost_models.calibration import Calibration
from model_specs.spec import TrainingSpec

STACKS = ("hf", "torchtune")

FUSED_ADAMW_PASSES, FOREACH_ADAMW_PASSES = 7, 20
"""Passes over a trained element's tensors (each one weight-dtype element read or written) of AdamW's
step: fused (torch's `_fused_adamw`: read weight, gradient, m, v; write weight, m, v) and foreach
(torch's `_multi_tensor_adamw`, op by op: lerp of m 3, mul and addcmul of v 2 + 3, sqrt and the two
scalings of the denominator 2 + 2 + 2, addcdiv into the weight 4, weight decay 2)."""
FP32_BYTES = 4
CAST_FORWARD_BYTES = FP32_BYTES + 2
"""HBM bytes per GEMM weight element of autocast's cast in a forward (module doc): read the float32
weight (4), write its bf16 copy (2)."""
CAST_BACKWARD_BYTES = 2 + FP32_BYTES
"""HBM bytes per GEMM weight element of the backward's cast of the bf16 weight gradient to the
float32 weight's dtype (`ToCopyBackward0`): read 2, write 4."""
ACCUMULATE_PASSES = 3
"""Passes over a gradient element of autograd's in-place accumulation (`AccumulateGrad`: `grad +=
new`, read two tensors and write one), in every micro-batch after a step's first."""
INT8_BLOCK, INT4_BLOCK = 256, 128
"""Elements per float32 scale of block-wise 8-bit and 4-bit optimizer states (module doc)."""
SCALE_BYTES = 4


@dataclass(frozen=True)
class StackDefaults:
    """What a stack does unless the user says otherwise (module doc, per field)."""

    frameworks: tuple[str, ...]  # frameworks it runs on, its default first
    adapter_bytes: int  # bytes of a trained adapter element (and of its gradient and each moment)
    adapter_input_copies: bool  # each adapted module keeps its own float32 copy of its input
    master_weights: bool  # full fine-tuning keeps float32 trained weights
    recompute: str  # activation checkpointing unless the user turns it
    expands_kv: bool  # K and V expanded to the query heads before attention
    cross_entropy: str  # the loss kernel of its default config
    export: str  # the exporter that writes its files (planner.exporters)
    upcasts_logits: bool  # its model returns float32 logits and the loop frees them before the backward


STACK_DEFAULTS: dict[str, StackDefaults] = {
    "hf": StackDefaults(("fsdp", "deepspeed"), 4, True, False, "none", False, "eager", "hf", False),
    "torchtune": StackDefaults(("fsdp",), 2, False, False, "full", True, "chunked", "torchtune", True),
}


UNWRAPPED = "unwrapped"
"""Owner of the trained weights (`weights_owner`) of a layout of framework `fsdp` with no fine-tuning
stack at dp x cp = 1: the runtime builds no FSDP mesh there (`runtime.mesh.Meshes.fsdp` is None), so
nothing shards or casts its parameters; it trains the float32 weights it built under 16-bit autocast
(`runtime.train.Trainer._autocast`, `runtime.parallelize` module doc: "or autocast does without
FSDP") and steps them with `torch.optim.AdamW(foreach=True)`. torchtitan does the same on one device
(`torchtitan/distributed/utils.py` `maybe_enable_amp`: "the following code will only be executed for
DDP or single-device training", `torch.autocast` when FSDP is not enabled). Whatever the layout's ZeRO
stage says, such a layout stores float32 weights, gradients and AdamW moments (4 + 4 + 8 bytes per
trained element) and autocast's cached copy of each GEMM weight, and pays the casts and the gradient
accumulation of `autocast_weights` (module doc)."""


def weights_owner(framework: str, stack: str | None, dp: int, cp: int) -> str | None:
    """Whose rules keep a layout's trained weights (the `stack` argument of `trainable_bytes`,
    `cast_bytes`, `accumulation_bytes`, `optimizer_step_bytes`): the fine-tuning stack's; `UNWRAPPED`
    for the runtime's single-replica layouts (framework fsdp, no stack, dp x cp = 1); None, the
    framework's own mixed-precision rules (`TrainingSpec.param_bytes`, ...), otherwise."""
    if stack is None and framework == "fsdp" and dp * cp == 1:
        return UNWRAPPED
    return stack


def defaults(stack: str) -> StackDefaults:
    return STACK_DEFAULTS[stack]


def moment_bytes(optimizer_state: str, weight_bytes: float) -> float:
    """Bytes of Adam's two moments per trained element (module doc)."""
    if optimizer_state in ("int8", "int8_paged"):
        return 2 * (1 + SCALE_BYTES / INT8_BLOCK)
    if optimizer_state == "int4":
        return 2 * (0.5 + SCALE_BYTES / INT4_BLOCK)
    return 2 * weight_bytes


@dataclass(frozen=True)
class TrainedBytes:
    """Bytes per trained element under a stack: the stored weight, its gradient, the optimizer's
    states (`paged`: they live in unified memory, not PyTorch's allocator) and, per GEMM weight
    element (not per trained element: the embedding and the norms are not cast), autocast's cached
    compute-dtype copy of a float32 weight from the forward to its backward (`autocast_weights`)."""

    weight: float
    gradient: float
    optimizer: float
    copy: float
    paged: bool = False

    @property
    def total(self) -> float:
        return self.weight + self.gradient + self.optimizer + self.copy


def master_weights(training: TrainingSpec, stack: str | None) -> bool:
    """Whether the trained weights are float32: the user's `master_weights`, else the stack's
    default (module doc); adapters under PEFT are float32 whatever the base."""
    if stack == UNWRAPPED or (stack == "hf" and training.frozen_base):
        return True
    if training.master_weights is not None:
        return training.master_weights
    return defaults(stack).master_weights if stack else training.precision != "fp32"


def trainable_bytes(training: TrainingSpec, stack: str | None, optimizer_state: str = "full") -> TrainedBytes:
    """Bytes per trained element (module doc). Without a stack: the framework loops' mixed-precision
    Adam (`TrainingSpec.param_bytes`, `grad_bytes`, `optimizer_bytes`)."""
    if stack is None:
        return TrainedBytes(training.param_bytes, training.grad_bytes, training.optimizer_bytes, 0.0)
    fp32 = master_weights(training, stack)
    if stack == "hf" and training.frozen_base:
        weight = float(defaults(stack).adapter_bytes)
    else:
        weight = 4.0 if fp32 or training.precision == "fp32" else float(training.param_bytes)
    moments = moment_bytes(optimizer_state, weight) if training.optimizer == "adamw" else 0.0
    # autocast's cached bf16 copy of a float32 GEMM weight (module doc), per GEMM weight element
    copy = float(training.param_bytes) if autocast_weights(training, stack) else 0.0
    return TrainedBytes(weight, weight, moments, copy, optimizer_state in ("paged", "int8_paged"))


def autocast_weights(training: TrainingSpec, stack: str | None) -> bool:
    """Whether a stack trains float32 weights under 16-bit autocast (module doc): a full fine-tune
    whose weights are loaded in float32 (`master_weights`), with bf16 or fp16 compute. HF Trainer with
    `bf16=True` over a float32 model; a model loaded in bf16 trains without (pure bf16)."""
    return (stack is not None and not training.frozen_base and training.precision in ("bf16", "fp16")
            and master_weights(training, stack))


def cast_bytes(training: TrainingSpec, stack: str | None) -> tuple[float, float]:
    """(forward, backward) HBM bytes per GEMM weight element and micro-batch of autocast's casts
    (`CAST_FORWARD_BYTES`, `CAST_BACKWARD_BYTES`; a checkpointed layer's recompute casts again, as
    a forward); (0, 0) without float32 weights under autocast."""
    if not autocast_weights(training, stack):
        return 0.0, 0.0
    half = float(training.param_bytes)
    return FP32_BYTES + half, half + FP32_BYTES


def accumulation_bytes(training: TrainingSpec, stack: str | None, optimizer_state: str, micro_batches: int) -> float:
    """HBM bytes per gradient element a stack's gradient accumulation moves per micro-batch, on
    average over the step (module doc): `ACCUMULATE_PASSES` x the gradient's bytes in each of the
    micro_batches - 1 micro-batches after the first; 0 with one micro-batch or no stack."""
    if stack is None or micro_batches <= 1:
        return 0.0
    gradient = trainable_bytes(training, stack, optimizer_state).gradient
    return ACCUMULATE_PASSES * gradient * (micro_batches - 1) / micro_batches


def optimizer_step_bytes(training: TrainingSpec, stack: str, optimizer_state: str, fused: bool) -> float:
    """HBM bytes a stack's optimizer step moves per trained element (module doc): the fused kernel
    reads and writes the weight and the moments and reads the gradient once; the foreach one passes
    `FOREACH_ADAMW_PASSES` times over tensors of the weight's dtype."""
    tb = trainable_bytes(training, stack, optimizer_state)
    fused_bytes = 2 * tb.optimizer + tb.gradient + 2 * tb.weight
    if stack == UNWRAPPED:  # the runtime's torch.optim.AdamW(foreach=True) (`UNWRAPPED`)
        fused = False
    if fused or optimizer_state != "full":  # bitsandbytes' and torchao's 8 / 4-bit steps are single kernels
        return fused_bytes
    return fused_bytes * FOREACH_ADAMW_PASSES / FUSED_ADAMW_PASSES


def adapter_input_bytes(training: TrainingSpec, stack: str | None) -> tuple[float, bool]:
    """(bytes per element of the input an adapted module keeps, whether each module keeps its own
    copy): PEFT's float32 cast per module, or the compute dtype's shared input (module doc)."""
    if stack is not None and defaults(stack).adapter_input_copies:
        return float(defaults(stack).adapter_bytes), True
    return float(training.activation_bytes), False


@lru_cache(maxsize=64)
def stack_calibration(cal: Calibration, stack: str | None) -> Calibration:
    """`cal` with the stack's host seconds per kernel launch (`Calibration.stack_overheads`): an
    eager Python stack dispatches every op through its module calls (PEFT's adapter wrappers, HF's
    modules), which the launch floor of `cost_models.compute` counts kernel by kernel; and, where the
    stack has one (`StackOverhead.compute`), its own stretch of every kernel time in place of its
    framework's `Stack.compute`. Memoized, so the pricing caches keyed on the calibration's identity
    keep hitting."""
    if stack is None:
        return cal
    from dataclasses import replace

    o = cal.stack_overhead(stack)
    if o.compute is None:
        return replace(cal, kernel_launch_s=o.kernel_launch_s)
    # the stack's own stretch of its kernel times in place of its framework's (`StackOverhead.compute`)
    framework_stacks = {k: replace(v, compute=o.compute) for k, v in cal.stacks.items()}
    return replace(cal, kernel_launch_s=o.kernel_launch_s, stacks=framework_stacks)


def fragmentation(cal: Calibration, framework: str, stack: str | None, dp: int) -> float:
    """The caching allocator's reserved-over-allocated fraction: FSDP2's (`Calibration.
    fsdp_fragmentation`, its collectives' buffers of varying sizes) wherever FSDP shards, the plain
    one (`Calibration.fragmentation`) for a stack on one GPU, which runs without a sharding wrapper,
    as the runtime's single-replica layouts do (`stack` is the layout's `weights_owner`: `UNWRAPPED`)."""
    if stack is not None and dp == 1:
        return cal.fragmentation
    return cal.fragmentation_of(framework)


def stack_overhead_s(cal: Calibration, stack: str | None, micro_batches: int) -> float:
    """Seconds a stack's training loop adds to a step on the host: per step and per micro-batch
    (module doc; fitted constants in `Calibration.stack_overheads`). It takes the place of
    `Calibration.step_overhead_s`, the framework loops' fixed cost fitted on pre-training runs."""
    if stack is None:
        return 0.0
    o = cal.stack_overhead(stack)
    return o.step_s + micro_batches * o.micro_batch_s
