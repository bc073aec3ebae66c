"""Activation memory: bytes saved for backward by one layer for one micro-batch on one rank.

Starting point is Korthikanti et al. 2022 ("Reducing Activation Recomputation", Sec. 4): a GPT layer
saves s*b*h*(34 + 5*a*s/h) bytes in 16-bit training, all of it divided by t under tensor + sequence
parallelism. We keep its method (sum the tensors each op saves for backward) and adapt the terms to
how models are trained today; each adaptation is named where it is made:

- Fused (flash) attention: no s^2 score/softmax/dropout tensors. The kernel saves Q, K, V, the output
  O and a float32 log-sum-exp per (token, head). The 5*a*s/h term disappears.
- No dropout (modern LLM pre-training uses none): the three dropout masks (3*s*b*h bytes) disappear.
- GQA/MQA: K and V have `kv_heads` heads (at least one per TP rank: heads are replicated when
  tp > kv_heads). MLA: the down-projections' inputs and outputs are saved too.
- Gated MLPs (SwiGLU): the gate and up outputs (f each), the activation output and the product that
  feeds the down projection. Eager PyTorch saves 4 tensors of width f; Megatron's fused
  bias-SwiGLU saves the fc1 output (2f) and the product (f): 3f.
- MoE: router logits and probabilities in float32 and each routed token's expert MLP activations.
  The token copies depend on the dispatcher: PyTorch (torchtitan, framework `fsdp`) keeps the
  permuted copies before and after dispatch and the expert outputs for the weighted combine (three
  hidden-size copies per routed token); Megatron-Core's fused permute (`--moe-permute-fusion`,
  Transformer Engine's `moe_permute` / `moe_unpermute`, on in NVIDIA's recipes) keeps one, the
  expert GEMM input (FP8 under FP8 recipes), and applies the router probabilities inside the
  expert activation (`--moe-apply-probs-on-input`), so the combine keeps nothing more.
- Norms: a fused RMSNorm / LayerNorm kernel saves its 16-bit input and a float32 statistic per
  token (measured on an H100 with PyTorch's CUDA `nn.RMSNorm`: the bf16 input and a (tokens, 1)
  float32 rstd). An eager RMSNorm that upcasts (PyTorch's CPU decomposition, HF `LlamaRMSNorm`)
  saves the float32 upcast input and the float32 normalized output: 8 bytes per element
  (`Layout.norm_kernel = "eager_fp32"`). The final norm and the LM head input are counted with the
  logits.
- Sequence parallel divides the norm inputs and the replicated linear inputs by t (Megatron saves
  the sequence-sharded input and re-gathers it in backward). PyTorch-native TP (DTensor
  `PrepareModuleInput`, torchtitan; framework `fsdp`) saves the all-gathered full-sequence input of
  the column-parallel GEMMs (QKV, the MLP's first GEMMs) instead: those two are not divided.
- Context parallel divides the sequence by cp. Ring attention (`Layout.cp_attention = "ring"`:
  Megatron-Core, torch's `context_parallel`) keeps no full-sequence K/V. All-gather attention with a
  mask (`"allgather_mask"`: `runtime.context_parallel`, which runs on gloo) saves the all-gathered
  full-sequence K and V (the all-gather's output is SDPA's saved input) and the (s/cp x s) position
  mask, which SDPA converts from bool to an additive bias in the activation dtype and saves for
  backward (per layer, shared by the micro-batch's sequences). Measured under FakeTensorMode with
  the saved-tensor hooks: q (1,16,8192,128), K/V (1,4,16384,128), bool mask (8192,16384) -> saved
  K, V at 16 MiB each and a (8192,16384) bf16 bias of 256 MiB; Llama-3-8B TP2 x CP2, seq 16384,
  2 vs 4 layers traced: 1.21 GiB per layer, 0.27 GiB above the ring-attention count.

Recompute:
- "selective": the modules of `Layout.recompute_modules` are recomputed (default: core_attn under
  Megatron, as its own default; core_attn and act otherwise), as Megatron-Core's `--recompute-modules`: core_attn (the attention core: O and the
  log-sum-exp are not kept), act (the MLP / expert activation function: its output is not kept;
  Megatron's moe_act), layernorm (the two input norms: their outputs, the GEMM inputs, are not kept),
  mla_up_proj (MLA's query and key/value up-projections: Q, K, V are recomputed from the kept
  latents).
  Under framework `fsdp` (runtime.recompute, as torchtitan) the routed experts' activation is not
  recomputed (it runs per expert inside the grouped-experts module): routed tokens keep the full
  widths. Measured: Mixtral-8x7B EP8 over 64 ranks, selective, traced 71.1 GiB against 56.4 GiB
  priced with recomputed expert activations; 2 x 8192 routed rows x 14336 x 2 bytes per layer.
- "full": only the layer input is kept; one layer's full activations exist again during its
  backward (counted once per rank as the recompute working set).

Hybrid models (`ModelSpec.hybrid_pattern`): each layer is one block, its norm included: attention
(`attention_bytes`), MLP / MoE (`mlp_bytes`) or a Mamba-2 mixer (`mamba_bytes`). A Mamba mixer
keeps its block norm's input and in_proj's input, and then, per framework:
- megatron: Megatron-Core's `MambaMixer._ssm_training` runs mamba_ssm's fused
  `mamba_split_conv1d_scan_combined` (conv, scan, D, gate; `ctx.save_for_backward(zxbcdt, ...,
  out_x, ...)`: the in_proj output (2 d_inner + 2 G N + H, as the contiguous copy it is handed)
  and the scan output x d_inner), then its gated RMSNorm (input d_inner and a float32 rstd per
  group) and out_proj (input d_inner, FP8 under FP8 training); all split over TP by heads.
- fsdp / deepspeed (eager PyTorch, `runtime.model.Mamba2Mixer`, and transformers' NemotronH with
  the fused kernel, which passes the norm and out_proj into it): the region between in_proj and
  out_proj is checkpointed and keeps its input (the in_proj output) only, then out_proj's input.
Selective recompute (Megatron's `--recompute-modules`) has no Mamba module: only `layernorm`
applies (the norm output, in_proj's input, is not kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cost_models import op_sac
from cost_models.finetune import DORA_SAVED_BYTES
from model_specs.spec import ModelSpec

Framework = Literal["megatron", "fsdp", "deepspeed"]
EAGER_FP32_NORM_BYTES = 8  # float32 upcast input + float32 normalized output, per element
EAGER_FP32_FROZEN_NORM_BYTES = 4
"""The same norm with a frozen scale (LoRA, QLoRA): autograd keeps the float32 normalized output
only for the scale's gradient, so the float32 input remains (measured on the fake-world trace of
Llama-3-8B FSDP, LoRA: 2 x 64 MiB less per layer at 4k tokens, `bench.fake_world_memory`)."""

LSE_BYTES = 4  # float32 log-sum-exp saved per (token, head) by flash attention
ROUTER_BYTES = 4  # router logits / probabilities are float32


@dataclass(frozen=True)
class ActivationContext:
    """Everything that scales one layer's saved activations. Token counts are per rank."""

    seq_len_local: int  # tokens of one sequence on this rank (seq_len / cp)
    micro_batch: int
    tp: int
    sp: bool
    etp: int
    act_bytes: int  # bytes per activation element (2 for bf16/fp16/fp8 training)
    framework: Framework
    gemm_input_bytes: int = 2  # saved GEMM inputs: 1 under FP8 (Transformer Engine keeps the FP8 cast)
    norm_bytes: int = 2  # bytes per element a norm saves: act_bytes when fused, 8 for an eager fp32 RMSNorm
    cp: int = 1  # context-parallel degree (seq_len_local = seq_len / cp)
    cp_attention: str = "ring"  # ring | allgather_mask (module doc)
    recompute_modules: tuple[str, ...] = ("act", "core_attn")  # what "selective" recomputes (module doc)
    # a frozen base (LoRA / QLoRA; `adapter_saved_bytes`): the PEFT names of the adapted linears (None:
    # every weight is trained and every GEMM keeps its input), the bytes per element of the input an
    # adapted module keeps, whether each module keeps its own copy, and the adapter rank
    adapted: tuple[str, ...] | None = None
    adapter_input_bytes: float = 2.0
    adapter_copies: bool = False
    adapter_rank: int = 0
    expand_kv: bool = False  # K and V expanded to every query head before attention (torchtune)
    dora: bool = False  # DoRA's magnitude gradient keeps the base and adapter outputs (`dora_saved_bytes`)

    @property
    def tokens(self) -> int:
        return self.seq_len_local * self.micro_batch

    @property
    def gathered_input_divisor(self) -> int:
        """Divisor of the saved input of the column-parallel GEMMs: the sequence shard under
        Megatron's SP (re-gathered in backward), the all-gathered sequence under DTensor's SP."""
        return self.replicated_divisor if self.framework != "fsdp" else 1

    @property
    def replicated_divisor(self) -> int:
        """Divisor of tensors that are replicated across TP ranks unless sequence parallel is on."""
        return self.tp if self.sp else 1


def _mlp_act_widths(model: ModelSpec, framework: Framework) -> tuple[int, int]:
    """(saved widths without recompute, saved widths with selective recompute), in units of f.

    Without recompute: gated eager = gate, up, act(gate), product = 4; Megatron's fused bias-SwiGLU = 3
    (fc1 output 2f + product). Non-gated: act input + act output = 2. Squared ReLU in eager PyTorch
    (`relu(x).square()`) is 2 as well: ReLU saves its output, which `square` saves as its input, and
    the square feeds fc2 (measured with saved-tensor hooks on `runtime.model.FeedForward`: two
    (tokens, f) bf16 tensors). Selective recompute keeps what the two GEMMs need: fc1 output (2f
    gated, f otherwise)."""
    if model.gated_mlp:
        return (3 if framework == "megatron" else 4), 2
    return 2, 1


def _modules(ctx: ActivationContext, recompute: str) -> tuple[str, ...]:
    return ctx.recompute_modules if recompute == "selective" else ()


def attention_bytes(model: ModelSpec, ctx: ActivationContext, recompute: str) -> float:
    """Saved bytes of one attention block (including its input norm)."""
    t, ab = ctx.tokens, ctx.act_bytes
    rep = ctx.replicated_divisor
    h = model.hidden_size
    heads = model.num_heads / ctx.tp
    nb = ctx.norm_bytes
    modules = _modules(ctx, recompute)
    total = t * h * nb / rep  # norm input (the block input)
    frozen = ctx.adapted is not None and model.attention != "mla"
    if frozen:
        total += adapter_saved_bytes(ctx, ("q_proj", "k_proj", "v_proj"), h) + adapter_saved_bytes(ctx, ("o_proj",), h, shared=True)
        kv_out = model.kv_heads * (model.qk_head_dim + model.v_dim) / 2 / ctx.tp
        total += dora_saved_bytes(ctx, {"q_proj": heads * model.qk_head_dim, "k_proj": kv_out, "v_proj": kv_out, "o_proj": h})
    elif "layernorm" not in modules:
        total += t * h * ctx.gemm_input_bytes / ctx.gathered_input_divisor  # norm output = QKV input
    if model.attention == "mla":
        assert model.kv_lora_rank and model.qk_rope_head_dim
        ql = model.q_lora_rank or 0
        # q_a output (norm input) and q_b input; kv_a output (norm input + rope part) and kv_b input.
        # The down-projections are replicated over TP, so these tensors are too (unless sp).
        total += ((ql + model.kv_lora_rank) * (nb + ab) + model.qk_rope_head_dim * ab) * t / rep
        kv_heads = heads
    else:
        kv_heads = heads if ctx.expand_kv else max(model.kv_heads / ctx.tp, 1.0)
    q = heads * model.qk_head_dim
    kv = kv_heads * (model.qk_head_dim + model.v_dim)
    if not ("mla_up_proj" in modules and model.attention == "mla"):
        total += t * (q + kv) * ab  # Q, K, V saved by the attention kernel (MLA: up-projection outputs)
    if ctx.cp > 1 and ctx.cp_attention == "allgather_mask":
        total += t * kv * ab * (ctx.cp - 1)  # K, V saved at the all-gathered (full) sequence
        total += ctx.seq_len_local * ctx.seq_len_local * ctx.cp * ab  # SDPA's bias from the bool mask
    if "core_attn" not in modules:
        total += t * heads * model.v_dim * ab  # O: kernel output = output-projection input
        total += t * heads * LSE_BYTES
    if model.norm_placement == "sandwich":  # Gemma 2/3: a norm after the output projection saves its input
        total += t * h * nb / rep
    return total


def adapter_saved_bytes(ctx: ActivationContext, modules: tuple[str, ...], width: float, shared: bool = False) -> float:
    """Bytes a frozen base keeps of the input that `modules` (one input of `width` features per
    token) read: a frozen linear keeps nothing (no weight gradient; its input gradient needs only
    the weight), an adapted one keeps its input for A's gradient and A's rank-r output for B's
    (`cost_models.stacks`): PEFT a float32 copy per module (`adapter_copies`), torchtune and the
    runtime the compute-dtype input once for the modules that read it. `shared`: the input is
    already kept by another op (the attention output feeding o_proj), so only a copy adds to it."""
    assert ctx.adapted is not None
    n = sum(1 for m in modules if m in ctx.adapted)
    if not n:
        return 0.0
    t = ctx.tokens
    per_token = n * ctx.adapter_rank * ctx.adapter_input_bytes  # A's outputs
    if ctx.adapter_copies:
        per_token += n * width * ctx.adapter_input_bytes
    elif not shared:
        per_token += width * ctx.act_bytes
    return t * per_token


def dora_saved_bytes(ctx: ActivationContext, outputs: dict[str, float]) -> float:
    """What DoRA keeps beyond LoRA per adapted module (`finetune.DORA_SAVED_BYTES` per token and
    output feature); `outputs`: output features of each module."""
    if not ctx.dora or ctx.adapted is None:
        return 0.0
    return ctx.tokens * DORA_SAVED_BYTES * sum(w for m, w in outputs.items() if m in ctx.adapted)


def mlp_bytes(model: ModelSpec, ctx: ActivationContext, recompute: str, index: int) -> float:
    """Saved bytes of the MLP or MoE block of layer `index` (including its input norm)."""
    t, ab, h = ctx.tokens, ctx.act_bytes, model.hidden_size
    rep = ctx.replicated_divisor
    full_w, sel_w = _mlp_act_widths(model, ctx.framework)
    modules = _modules(ctx, recompute)
    act_recomputed = "act" in modules
    widths = sel_w if act_recomputed else full_w
    total = t * h * ctx.norm_bytes / rep  # norm input
    if model.norm_placement == "sandwich":  # Gemma 2/3: the post-MLP norm saves its input too
        total += t * h * ctx.norm_bytes / rep
    if ctx.adapted is not None and not model.is_moe_layer(index) and not act_recomputed:
        # a frozen dense MLP: the gate / up / down adapters keep their inputs; the product feeds a
        # frozen down projection unless it is adapted (`adapter_saved_bytes`)
        first = adapter_saved_bytes(ctx, ("gate_proj", "up_proj") if model.gated_mlp else ("up_proj",), h)
        f = model.ffn_hidden_size / ctx.tp
        down = adapter_saved_bytes(ctx, ("down_proj",), f)
        dora = dora_saved_bytes(ctx, {"gate_proj": f, "up_proj": f, "down_proj": h})
        return total + first + down + dora + t * f * (full_w - 1) * ab
    if "layernorm" not in modules:
        total += t * h * ctx.gemm_input_bytes / ctx.gathered_input_divisor  # norm output = first GEMM's input
    # one of the saved f-wide tensors is the second GEMM's input (kept in FP8 under FP8 training)
    f_bytes = (widths - 1) * ab + ctx.gemm_input_bytes if not act_recomputed else widths * ab
    if not model.is_moe_layer(index):
        return total + t * model.ffn_hidden_size / ctx.tp * f_bytes
    assert model.moe_ffn_hidden_size
    t_local = t / rep  # tokens this rank routes (sequence-sharded under SP)
    total += 2 * t_local * model.num_experts * ROUTER_BYTES  # router logits + probabilities
    if model.num_shared_experts:
        total += widths * t * model.shared_experts_width / ctx.tp * ab
    routed_widths = full_w if ctx.framework == "fsdp" else widths  # module doc: not recomputed
    return total + routed_expert_bytes(model, ctx, routed_widths)


def routed_expert_bytes(model: ModelSpec, ctx: ActivationContext, widths: int) -> float:
    """Saved bytes of the routed experts of one MoE layer: the token copies this rank's experts
    receive (module doc: one under Megatron's fused permute, three otherwise, hidden-size wide) and
    `widths` x the expert FFN width per copy."""
    assert model.moe_ffn_hidden_size
    ab, h = ctx.act_bytes, model.hidden_size
    routed = ctx.tokens / ctx.replicated_divisor * model.moe_top_k * (ctx.etp if ctx.sp else 1)
    # Megatron's fused permute keeps the expert input only (module doc)
    copies = routed * h * ctx.gemm_input_bytes if ctx.framework == "megatron" else 3 * routed * h * ab
    return copies + widths * routed * model.moe_ffn_hidden_size / ctx.etp * ab


def mamba_bytes(model: ModelSpec, ctx: ActivationContext, recompute: str) -> float:
    """Saved bytes of one Mamba-2 layer (its block norm included; module doc, per framework)."""
    t, ab, h, tp = ctx.tokens, ctx.act_bytes, model.hidden_size, ctx.tp
    total = t * h * ctx.norm_bytes / ctx.replicated_divisor  # block norm input
    if "layernorm" not in _modules(ctx, recompute):
        total += t * h * ctx.gemm_input_bytes / ctx.gathered_input_divisor  # norm output = in_proj input
    inner = model.mamba_inner
    total += t * model.mamba_in_proj_width / tp * ab  # zxbcdt: the fused kernel's / checkpoint's input
    if ctx.framework == "megatron":
        total += 2 * t * inner / tp * ab  # scan output out_x (kernel) and the gated output (norm input)
        total += t * model.mamba_groups / tp * ROUTER_BYTES  # the norm's float32 rstd per group
    return total + t * inner / tp * ctx.gemm_input_bytes  # out_proj input


def mamba_backward_transient_bytes(model: ModelSpec, ctx: ActivationContext) -> float:
    """Bytes a Mamba-2 layer's backward adds on top of the kept activations, one micro-batch on one
    rank: the recomputed conv / scan / gate region with its gradients (module doc: the region keeps
    only its input, so its intermediates exist again while its backward runs, one layer at a time).

    - megatron (mamba_ssm's fused `mamba_split_conv1d_scan_combined` backward, modelling choice):
      the chunk states it recomputes in float32 (ceil(s / Q) x H x N x P) and the gradient of its
      input (the in_proj width), split over TP.
    - fsdp / deepspeed (the eager region of `runtime.model.Mamba2Mixer`): per sequence of s tokens
      (padded to whole chunks) 10 s H Q (the Q x Q decay and score blocks, float32 and bf16, and
      their gradients) + 45 s H P (the float32 gate and norm) + 8 s H N + 15.5 s G N (B, C per
      head and group) + 3.5 s h + 3.5 ceil(s / Q) H N P (chunk states) bytes, heads and groups split
      over TP. Coefficients fitted by least squares to the live-storage tracker's peak over 45
      shapes (s 512-2048, H 8-48, P 32-128, N 32-128, G 1-8, Q 64-256, h 512-2048; largest
      error 6% of the transient), not derived term by term."""
    if not model.has_mamba:
        return 0.0
    heads, p, n = model.mamba_num_heads, model.mamba_head_dim, model.mamba_state_size
    assert heads and p and n
    g, q, tp, h = model.mamba_groups, model.mamba_chunk_size, ctx.tp, model.hidden_size
    chunks = -(-ctx.seq_len_local // q)
    s = chunks * q
    if ctx.framework == "megatron":
        per_seq = (4.0 * chunks * heads * n * p + ctx.act_bytes * s * model.mamba_in_proj_width) / tp
    else:
        per_seq = (10.0 * s * heads * q + 45.0 * s * heads * p + 8.0 * s * heads * n + 15.5 * s * g * n
                   + 3.5 * chunks * heads * n * p) / tp + 3.5 * s * h
    return per_seq * ctx.micro_batch


def op_sac_bytes(model: ModelSpec, index: int, ctx: ActivationContext) -> float:
    """Bytes layer `index` keeps under torchtitan's op-level selective checkpointing
    (`cost_models.op_sac`): the block input, every other matmul output, the attention output and
    its log-sum-exp; in an MoE layer also the router's outputs and the routed experts' activations
    (grouped matmuls, not recomputed)."""
    t, ab = ctx.tokens, ctx.act_bytes
    total = t * op_sac.saved_widths(model, index, ctx.tp, ctx.replicated_divisor) * ab
    if model.has_attention(index):
        total += t * model.num_heads / ctx.tp * LSE_BYTES
    if model.is_moe_layer(index):
        full_w, _ = _mlp_act_widths(model, ctx.framework)
        total += 2 * t / ctx.replicated_divisor * model.num_experts * ROUTER_BYTES
        total += routed_expert_bytes(model, ctx, full_w)
    return total


def layer_input_bytes(model: ModelSpec, ctx: ActivationContext) -> float:
    """The one tensor full recompute keeps per layer: its input."""
    return ctx.tokens * model.hidden_size * ctx.act_bytes / ctx.replicated_divisor


def layer_activation_bytes(model: ModelSpec, index: int, ctx: ActivationContext, recompute: str) -> float:
    """Bytes layer `index` keeps for backward per micro-batch under `recompute`
    (none | selective | full | op_sac)."""
    if recompute == "full":
        return layer_input_bytes(model, ctx)
    if recompute == "op_sac":
        return op_sac_bytes(model, index, ctx)
    mixer = model.layer_mixer(index)
    if mixer == "mamba":
        return mamba_bytes(model, ctx, recompute)
    if mixer == "attention":
        return attention_bytes(model, ctx, recompute)
    if mixer in ("mlp", "moe"):
        return mlp_bytes(model, ctx, recompute, index)
    return attention_bytes(model, ctx, recompute) + mlp_bytes(model, ctx, recompute, index)


LOGIT_BYTES = {"eager": 14, "loss_parallel": 10, "vocab_parallel": 6, "fused": 2, "chunked": 2.5, "fused_linear": 0}
"""Peak bytes per logit of the loss. eager PyTorch (`F.cross_entropy(logits.float(), ...)`): at the
start of the backward, the bf16 logits, the float32 log-softmax saved for backward, the float32
gradient nll_loss returns and the float32 gradient of log-softmax are alive together (2 + 4 + 4 + 4;
measured 14.1 bytes per logit on an H100 with the CUDA allocator and 14.3 with the CPU live-storage
tracker, Llama-3 vocabulary, 8192 tokens). DTensor's `loss_parallel` on vocabulary-sharded logits: the
bf16 logits, the float32 log-softmax it saves and one float32 gradient (2 + 4 + 4; measured 10.0 per
local logit with a fake 4-rank TP mesh and the live-storage tracker). Megatron's vocab-parallel cross-entropy: bf16 logits
and one float32 copy overwritten in place with the softmax gradient (2 + 4). A fused, chunked
kernel (flash-attn's / Liger's cross-entropy, llm-foundry's default) writes the gradient into the
bf16 logits (2). torchtune's chunked loss (`CEWithChunkedOutputLoss`, 8 chunks; the recipes compile it
with the model): the model returns the bf16 logits of all chunks and each chunk's compiled float32
loss keeps its per-token log-sum-exp, so the bf16 logits and one chunk's gradient (2 + 2 / 8 ... 2.5).
A fused linear cross-entropy (Liger's `LigerFusedLinearCrossEntropyLoss`, Cut Cross-Entropy) computes
the LM head and the loss block by block and never holds the logits (0 per logit; the head's input and
its gradient are counted with the head inputs)."""


EAGER_LOGIT_BYTES_UPCAST_IN_MODEL = 12
"""Peak bytes per logit of the eager loss where the model itself returns float32 logits and the loop
drops them before the backward: torchtune's `TransformerDecoder` returns `self.output(h).float()`
(torchtune/modules/transformer.py at 1814feb1, the commit of its optimization-flags table) and the
recipe deletes `logits` once the loss is computed ("free logits otherwise it peaks backward memory",
recipes/full_finetune_single_device.py), so the bf16 logits are gone when the backward starts: the
float32 log-softmax saved for backward and the two float32 gradients (4 + 4 + 4) of `LOGIT_BYTES`'s
eager 2 + 4 + 4 + 4. (The recipe's `training.compile_loss(self._loss_fn)` discards the compiled module
it returns for a plain CrossEntropyLoss, so the loss stays eager under `compile: True`.)"""


def logits_bytes(model: ModelSpec, ctx: ActivationContext, cross_entropy: str, upcast_in_model: bool = False) -> float:
    """Peak bytes of the LM head output and loss for one micro-batch on the last stage, with what
    the final norm and the LM head keep for backward (the norm's input and the head's input).
    `upcast_in_model`: the eager loss of a stack whose model returns float32 logits
    (`EAGER_LOGIT_BYTES_UPCAST_IN_MODEL`)."""
    head_inputs = ctx.tokens * model.hidden_size * (ctx.norm_bytes + ctx.gemm_input_bytes) / ctx.replicated_divisor
    per_logit = EAGER_LOGIT_BYTES_UPCAST_IN_MODEL if upcast_in_model and cross_entropy == "eager" else LOGIT_BYTES[cross_entropy]
    return ctx.tokens * model.vocab_size / ctx.tp * per_logit + head_inputs


RETAINED_LOGIT_BYTES = {"eager": 6, "loss_parallel": 6}
"""Bytes per logit a micro-batch keeps between its loss (computed in the forward) and its backward on
the last stage of a torch.distributed.pipelining schedule: the bf16 logits (the stage output, kept
for the stage's backward) and the float32 log-softmax the loss saves (2 + 4). Other kernels: their
full peak (`LOGIT_BYTES`) as an upper bound."""


def retained_logits_bytes(model: ModelSpec, ctx: ActivationContext, cross_entropy: str) -> float:
    """What one micro-batch's loss keeps until its backward (see `RETAINED_LOGIT_BYTES`), with the
    final norm's and the LM head's saved inputs."""
    head_inputs = ctx.tokens * model.hidden_size * (ctx.norm_bytes + ctx.gemm_input_bytes) / ctx.replicated_divisor
    per_logit = RETAINED_LOGIT_BYTES.get(cross_entropy, LOGIT_BYTES[cross_entropy])
    return ctx.tokens * model.vocab_size / ctx.tp * per_logit + head_inputs
