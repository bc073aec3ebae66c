"""What is trained: the shape of a decoder-only transformer.

`ModelSpec` is a frozen pydantic model. It describes dense and mixture-of-experts decoders with
multi-head, grouped-query, multi-query or multi-head latent attention (DeepSeek's MLA). Everything
the cost models need is derived from it; nothing about parallelism lives here.

Conventions
- A "layer" is one transformer block (attention + MLP or MoE).
- `ffn_hidden_size` is the width of a *dense* MLP; `moe_ffn_hidden_size` the width of one routed
  expert; `shared_expert_ffn_hidden_size` the width of one shared expert.
- Layer `i` (0-based) is an MoE layer when the model has routed experts, `i >= first_k_dense_layers`,
  `i % moe_layer_freq == moe_layer_offset` and `i not in dense_layers`. DeepSeek's `moe_layer_freq`
  has offset 0 (layers 0, f, 2f, ...); Qwen's `decoder_sparse_step` s has offset s - 1 (layers s-1,
  2s-1, ...) and `mlp_only_layers` maps to `dense_layers`.
- Layer `i` uses the sliding window when `sliding_window` is set and either `i` is listed in
  `sliding_window_layers` or, without that list, `i % sliding_window_every == 0`. With
  `window_kind == "chunked"` (Llama 4) those layers attend inside fixed chunks of `sliding_window`
  tokens (query i sees keys j <= i with i // w == j // w) instead of a sliding window.
- Norms per layer: two (`norm_placement` "pre": before attention and MLP, the common case; "post":
  after each, OLMo-2) or four ("sandwich": before and after each, Gemma 2/3).
- Hybrid models (`hybrid_pattern`, Megatron-Core's `hybrid_override_pattern`, Nemotron-H): every
  layer is ONE pre-norm block `x + mixer(norm(x))` whose mixer is named by one symbol per layer:
  `M` a Mamba-2 mixer, `*` self-attention, `-` a dense MLP (`ffn_hidden_size`), `E` an MoE (routed
  and shared experts as above). Layer `i` is an MoE layer iff its symbol is `E`. Sources:
  Megatron-Core `megatron/core/models/mamba/mamba_model.py` and `megatron/core/ssm/mamba_block.py`
  (`hybrid_override_pattern`, symbols M * - E), transformers `NemotronHBlock` (one RMSNorm, one
  mixer, one residual per layer).
- Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs", SSD; Megatron-Core
  `megatron/core/ssm/mamba_mixer.py`; transformers `NemotronHMamba2Mixer`): `mamba_num_heads` H
  heads of width `mamba_head_dim` P (d_inner = H x P), `mamba_groups` G groups of B / C of width
  `mamba_state_size` N, a depthwise causal conv1d of `mamba_conv_kernel` taps over x, B, C
  (conv_dim = d_inner + 2 G N), and the chunked SSD scan over chunks of `mamba_chunk_size` tokens.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

MlpKind = Literal["swiglu", "geglu", "gelu", "relu", "relu2", "silu"]
"""MLP activation. `swiglu`/`geglu` are gated (three matrices); the rest have two matrices.
`relu2` is squared ReLU (Nemotron)."""

GATED_MLPS: frozenset[str] = frozenset({"swiglu", "geglu"})

HYBRID_SYMBOLS: dict[str, str] = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
"""Layer symbols of a hybrid pattern (Megatron-Core `hybrid_override_pattern`,
`megatron/core/ssm/mamba_hybrid_layer_allocation.py` `Symbols`: MAMBA 'M', ATTENTION '*', MLP '-',
MOE 'E') and the mixer each names."""


class RopeScaling(BaseModel):
    """RoPE frequency scaling for long context, as HF `config.json`'s `rope_scaling` gives it.
    `rope_type` is HF's name (`llama3`: Llama-3.1's wavelength-dependent scaling; `yarn`: YaRN,
    DeepSeek-V3 and GPT-OSS; `linear`, `dynamic`, ...). Unused fields stay None. Shapes, memory and
    FLOPs do not depend on it; exporters pass it to the training framework."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rope_type: str
    factor: float | None = Field(None, gt=0)
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = Field(None, gt=0)
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None


HYBRID_FIELDS: tuple[str, ...] = (
    "hybrid_pattern", "mamba_num_heads", "mamba_head_dim", "mamba_state_size", "mamba_groups", "mamba_conv_kernel",
    "mamba_chunk_size", "mamba_conv_bias", "mamba_proj_bias",
)
"""`ModelSpec` fields of hybrid Mamba-2 models (left out of a plain model's serialization)."""


MAX_LAYERS = 1024
"""Deepest model a spec may describe (8 x the deepest preset, Llama-3.1-405B's 126 layers): every
stage table the planner builds holds arrays over the layers, and interleaved schedules offer a
virtual-stage count per divisor of the layers."""
MAX_EXPERTS = 4096
"""Most routed experts per MoE layer (2 x the most published, Switch-C's 2048: Fedus et al. 2022,
arXiv 2101.03961; the checkpoint google/switch-c-2048); the planner tries an expert-parallel degree
per divisor of it."""
MAX_MOE_TOP_K = 64
"""Most experts a token is routed to (8 x DeepSeek-V3's, Qwen3-MoE's and Kimi K2's 8)."""
MAX_SHARED_EXPERTS = 64
"""Most shared experts (DeepSeek-V3 has 1, DeepSeek-V2 2, Qwen1.5-MoE 4)."""


class ModelSpec(BaseModel):
    """Shape of a decoder-only transformer. All sizes are element counts, not bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    family: str = Field("llama", description="architecture family, e.g. llama, mixtral, deepseek_v3, gpt2")

    vocab_size: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    num_heads: int = Field(gt=0)
    num_kv_heads: int | None = Field(None, gt=0, description="defaults to num_heads (MHA)")
    head_dim: int | None = Field(None, gt=0, description="defaults to hidden_size // num_heads")
    ffn_hidden_size: int = Field(gt=0, description="dense MLP width")
    mlp: MlpKind = "swiglu"

    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    qkv_bias: bool = False
    attn_out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = Field(False, description="RMSNorm on q and k (Qwen3, Gemma 3, OLMo-2)")
    qk_norm_scope: Literal["head", "projection"] = Field(
        "head", description="qk_norm over each head's width (Qwen3, Gemma 3) or over the whole q / k "
        "projection (OLMo-2: num_heads * head_dim and num_kv_heads * head_dim scales)"
    )
    norm_placement: Literal["pre", "post", "sandwich"] = Field(
        "pre", description="pre: norms before attention and MLP; post: after them (OLMo-2); "
        "sandwich: before and after (Gemma 2/3, four norms per layer)"
    )
    tie_embeddings: bool = False
    position_embedding: Literal["rope", "learned", "alibi"] = "rope"
    max_position_embeddings: int = Field(8192, gt=0)
    rope_theta: float | None = Field(None, gt=0, description="RoPE base (HF rope_theta); None = 10000")
    rope_scaling: RopeScaling | None = Field(None, description="RoPE scaling for long context (HF rope_scaling)")
    parallel_residual: bool = Field(False, description="attention and MLP read the same input (GPT-NeoX)")
    sliding_window: int | None = Field(None, gt=0, description="attention window in tokens, if any")
    sliding_window_every: int = Field(
        1, ge=1, description="every n-th layer (0, n, 2n, ...) uses the window; 1 = all layers"
    )
    sliding_window_layers: tuple[int, ...] | None = Field(
        None, description="explicit 0-based indices of windowed layers; overrides sliding_window_every"
    )
    window_kind: Literal["sliding", "chunked"] = Field(
        "sliding", description="windowed layers slide (Mistral, Gemma) or attend in fixed chunks (Llama 4)"
    )
    attention_sinks: bool = Field(False, description="one learned sink logit per head (GPT-OSS)")
    embedding_norm: bool = Field(False, description="a norm right after the token embedding (BLOOM)")

    # Multi-head latent attention (DeepSeek-V2/V3). When attention == "mla" the fields below are used
    # instead of head_dim for q/k/v sizes.
    attention: Literal["standard", "mla"] = "standard"
    q_lora_rank: int | None = Field(None, gt=0, description="MLA: None means a direct q projection")
    kv_lora_rank: int | None = Field(None, gt=0)
    qk_rope_head_dim: int | None = Field(None, gt=0)
    qk_nope_head_dim: int | None = Field(None, gt=0)
    v_head_dim: int | None = Field(None, gt=0)

    # Mixture of experts.
    num_experts: int = Field(0, ge=0, le=MAX_EXPERTS, description="routed experts per MoE layer; 0 = dense model")
    moe_top_k: int = Field(0, ge=0, le=MAX_MOE_TOP_K)
    moe_ffn_hidden_size: int | None = Field(None, gt=0, description="width of one routed expert")
    num_shared_experts: int = Field(0, ge=0, le=MAX_SHARED_EXPERTS)
    shared_expert_ffn_hidden_size: int | None = Field(None, gt=0, description="width of one shared expert")
    shared_expert_gate: bool = Field(False, description="sigmoid gate hidden->1 on the shared expert (Qwen2-MoE)")
    first_k_dense_layers: int = Field(0, ge=0)
    moe_layer_freq: int = Field(1, ge=1)
    moe_layer_offset: int = Field(0, ge=0, description="MoE layers are those with i % moe_layer_freq == offset")
    dense_layers: tuple[int, ...] = Field((), description="layers forced dense (Qwen's mlp_only_layers)")
    router_bias: bool = False
    router_score_correction_bias: bool = Field(False, description="DeepSeek-V3 aux-loss-free bias per expert")
    moe_router_groups: int = Field(
        0, ge=0, description="expert groups of group-limited routing (DeepSeek n_group; Megatron "
        "--moe-router-num-groups); 0 = none"
    )
    moe_router_group_topk: int = Field(
        0, ge=0, description="groups a token may reach (DeepSeek topk_group; Megatron --moe-router-group-topk): "
        "DeepSeek-V3 sends a token to at most 4 of 8 groups, one group per node in its EP layout"
    )
    mtp_layers: int = Field(
        0, ge=0, description="multi-token-prediction modules (DeepSeek-V3): priced beside the LM head in full "
        "training (cost_models.stage_table); not counted in params or model FLOPs"
    )

    # Hybrid state-space models (Nemotron-H; module doc). None: every layer is attention + MLP / MoE.
    hybrid_pattern: str | None = Field(
        None, description="one symbol per layer (M Mamba-2, * attention, - MLP, E MoE), Megatron-Core's "
        "hybrid_override_pattern; each layer is one pre-norm block around that mixer"
    )
    mamba_num_heads: int | None = Field(None, gt=0, description="Mamba-2 heads H (d_inner = H x head dim)")
    mamba_head_dim: int | None = Field(None, gt=0, description="Mamba-2 head width P (elements)")
    mamba_state_size: int | None = Field(None, gt=0, description="SSM state width N (HF ssm_state_size, d_state)")
    mamba_groups: int = Field(1, ge=1, description="groups of B and C (HF n_groups, Megatron mamba_num_groups)")
    mamba_conv_kernel: int = Field(4, ge=1, description="taps of the depthwise causal conv1d (d_conv)")
    mamba_chunk_size: int = Field(128, ge=1, description="tokens per chunk of the SSD scan (HF chunk_size)")
    mamba_conv_bias: bool = Field(True, description="conv1d bias (HF use_conv_bias)")
    mamba_proj_bias: bool = Field(False, description="in_proj / out_proj biases (HF use_bias)")
    notes: tuple[str, ...] = Field(
        (), description="what the config reader left out or read as cost-free, for the user (e.g. the "
        "vision tower of a multimodal config whose text model is priced; Granite's multipliers)"
    )

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A model without a hybrid pattern serializes without the Mamba fields (all at their
        defaults then), so plain models' JSON (plans, exports, stored specs) is as before."""
        data = handler(self)
        if self.hybrid_pattern is None and isinstance(data, dict):
            for key in HYBRID_FIELDS:
                data.pop(key, None)
        return data

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        problems: list[str] = []
        kv = self.kv_heads
        if self.num_heads % kv:
            problems.append(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({kv})")
        if self.attention == "mla":
            for f in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                if getattr(self, f) is None:
                    problems.append(f"{f} is required when attention is 'mla'")
        if self.num_experts:
            if not 0 < self.moe_top_k <= self.num_experts:
                problems.append(f"moe_top_k ({self.moe_top_k}) must be in 1..num_experts ({self.num_experts})")
            if self.moe_ffn_hidden_size is None:
                problems.append("moe_ffn_hidden_size is required when num_experts > 0")
            if self.first_k_dense_layers >= self.num_layers:
                problems.append("first_k_dense_layers must be below num_layers")
            elif self.moe_layer_offset >= self.moe_layer_freq:
                problems.append(
                    f"moe_layer_offset ({self.moe_layer_offset}) must be below moe_layer_freq ({self.moe_layer_freq})"
                )
            elif not self.moe_layer_count:
                problems.append("the MoE layer pattern selects no layer")
            if self.moe_router_groups and (
                self.num_experts % self.moe_router_groups or not 0 < self.moe_router_group_topk <= self.moe_router_groups
            ):
                problems.append(
                    f"moe_router_groups ({self.moe_router_groups}) must divide num_experts and "
                    f"moe_router_group_topk ({self.moe_router_group_topk}) be in 1..groups"
                )
        elif self.moe_top_k or self.num_shared_experts:
            problems.append("moe_top_k / num_shared_experts need num_experts > 0")
        for what, indices in (("dense_layers", self.dense_layers), ("sliding_window_layers", self.sliding_window_layers)):
            bad = [i for i in indices or () if not 0 <= i < self.num_layers]
            if bad:
                problems.append(f"{what} {bad} outside 0..{self.num_layers - 1}")
        if self.sliding_window_layers is not None and self.sliding_window is None:
            problems.append("sliding_window_layers needs sliding_window")
        if self.parallel_residual and self.norm_placement != "pre":
            problems.append("parallel_residual blocks have pre-norms only")
        if self.attention == "mla" and self.norm_placement != "pre":
            problems.append("MLA models have pre-norms only")
        problems += self._hybrid_problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _hybrid_problems(self) -> list[str]:
        """A hybrid pattern names one known symbol per layer, Mamba layers have their shape, MoE
        symbols match the expert fields, and the block is the pre-norm one Nemotron-H builds."""
        pattern = self.hybrid_pattern
        mamba_fields = ("mamba_num_heads", "mamba_head_dim", "mamba_state_size")
        if pattern is None:
            given = [f for f in mamba_fields if getattr(self, f) is not None]
            return [f"{', '.join(given)} need a hybrid_pattern with Mamba layers (M)"] if given else []
        out: list[str] = []
        unknown = sorted(set(pattern) - set(HYBRID_SYMBOLS))
        if unknown:
            out.append(f"hybrid_pattern has unknown symbol(s) {unknown} (known: M Mamba-2, * attention, - MLP, E MoE)")
        if len(pattern) != self.num_layers:
            out.append(f"hybrid_pattern has {len(pattern)} symbols for {self.num_layers} layers")
        if "M" in pattern:
            missing = [f for f in mamba_fields if getattr(self, f) is None]
            if missing:
                out.append(f"Mamba layers (M) need {', '.join(missing)}")
            elif self.mamba_num_heads % self.mamba_groups:  # type: ignore[operator]
                out.append(f"mamba_num_heads ({self.mamba_num_heads}) must be a multiple of mamba_groups ({self.mamba_groups})")
        if ("E" in pattern) != (self.num_experts > 0):
            out.append("MoE layers (E) in a hybrid_pattern need num_experts > 0, and routed experts need E layers")
        if self.first_k_dense_layers or self.dense_layers or self.moe_layer_freq != 1 or self.moe_layer_offset:
            out.append("a hybrid_pattern places the MoE layers itself (E): no first_k_dense_layers / dense_layers / moe_layer_freq")
        if self.norm_placement != "pre" or self.parallel_residual:
            out.append("hybrid layers are single pre-norm blocks (no post / sandwich norms, no parallel residual)")
        if self.attention == "mla" or self.sliding_window is not None:
            out.append("hybrid attention layers are standard full attention (no MLA, no sliding window)")
        return out

    # ---- derived shape -------------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def attention_kind(self) -> Literal["mha", "gqa", "mqa", "mla"]:
        if self.attention == "mla":
            return "mla"
        if self.kv_heads == self.num_heads:
            return "mha"
        return "mqa" if self.kv_heads == 1 else "gqa"

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of queries and keys (elements)."""
        if self.attention == "mla":
            assert self.qk_rope_head_dim and self.qk_nope_head_dim
            return self.qk_rope_head_dim + self.qk_nope_head_dim
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def v_dim(self) -> int:
        """Per-head width of values (elements)."""
        if self.attention == "mla":
            assert self.v_head_dim
            return self.v_head_dim
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def norms_per_layer(self) -> int:
        """Hidden-size norms in one block: 1 in a hybrid model (one pre-norm per mixer), 4 with
        sandwich norms (Gemma 2/3), else 2."""
        if self.hybrid_pattern is not None:
            return 1
        return 4 if self.norm_placement == "sandwich" else 2

    # ---- hybrid layers (module doc) --------------------------------------------------------------
    @property
    def is_hybrid(self) -> bool:
        return self.hybrid_pattern is not None

    @property
    def has_mamba(self) -> bool:
        """A hybrid model with at least one Mamba-2 layer (M)."""
        return "M" in (self.hybrid_pattern or "")

    def layer_mixer(self, index: int) -> str:
        """What layer `index` holds: "transformer" (attention + MLP / MoE) in a plain model, else the
        single mixer its hybrid symbol names: "mamba", "attention", "mlp" or "moe"."""
        if self.hybrid_pattern is None:
            return "transformer"
        return HYBRID_SYMBOLS[self.hybrid_pattern[index]]

    def has_attention(self, index: int) -> bool:
        """Layer `index` runs self-attention (every layer of a plain model, `*` of a hybrid)."""
        return self.layer_mixer(index) in ("transformer", "attention")

    def has_ffn(self, index: int) -> bool:
        """Layer `index` runs a dense MLP or an MoE (every layer of a plain model, `-` / `E`)."""
        return self.layer_mixer(index) in ("transformer", "mlp", "moe")

    def is_mamba_layer(self, index: int) -> bool:
        return self.layer_mixer(index) == "mamba"

    @property
    def tp_blocks_per_layer(self) -> int:
        """Tensor-parallel blocks (a column-parallel GEMM ... row-parallel GEMM pair, one TP
        all-reduce or all-gather + reduce-scatter each) per layer: attention and MLP in a plain
        layer (2), the one mixer of a hybrid layer (1; Megatron-Core's MambaMixer is in_proj
        column-parallel, out_proj row-parallel, `megatron/core/ssm/mamba_mixer.py`)."""
        return 1 if self.hybrid_pattern is not None else 2

    @property
    def mamba_inner(self) -> int:
        """d_inner = H x P (elements): width of x, z and the scan output."""
        assert self.mamba_num_heads and self.mamba_head_dim
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the depthwise conv1d: x, B and C (d_inner + 2 G N)."""
        assert self.mamba_state_size
        return self.mamba_inner + 2 * self.mamba_groups * self.mamba_state_size

    @property
    def mamba_in_proj_width(self) -> int:
        """Output width of in_proj: z (d_inner), x B C (conv_dim) and dt (one per head)."""
        assert self.mamba_num_heads
        return self.mamba_inner + self.mamba_conv_dim + self.mamba_num_heads

    @property
    def gated_mlp(self) -> bool:
        return self.mlp in GATED_MLPS

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        if self.hybrid_pattern is not None:
            return index < len(self.hybrid_pattern) and self.hybrid_pattern[index] == "E"
        return (
            self.is_moe
            and index >= self.first_k_dense_layers
            and index % self.moe_layer_freq == self.moe_layer_offset
            and index not in self.dense_layers
        )

    @cached_property
    def moe_layer_count(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def shared_expert_width(self) -> int:
        """Intermediate width of one shared expert: `shared_expert_ffn_hidden_size`, else the routed
        experts' `moe_ffn_hidden_size` (0 for a dense model)."""
        return self.shared_expert_ffn_hidden_size or self.moe_ffn_hidden_size or 0

    @property
    def shared_experts_width(self) -> int:
        """Intermediate width of all shared experts of an MoE layer together (0 without any): what
        Megatron-Core's `--moe-shared-expert-intermediate-size` takes."""
        return self.num_shared_experts * self.shared_expert_width

    @property
    def dense_layer_count(self) -> int:
        """Layers with a dense MLP (`-` layers of a hybrid model)."""
        if self.hybrid_pattern is not None:
            return self.hybrid_pattern.count("-")
        return self.num_layers - self.moe_layer_count

    def uses_sliding_window(self, index: int) -> bool:
        if self.sliding_window is None or not self.has_attention(index):
            return False
        if self.sliding_window_layers is not None:
            return index in self.sliding_window_layers
        return index % self.sliding_window_every == 0


Precision = Literal["bf16", "fp16", "fp8", "fp32"]


MAX_SEQ_LEN = 2**22
"""Longest sequence a job may name (4M tokens; published long-context runs reach 1M)."""
MAX_GLOBAL_BATCH = 2**24
"""Most sequences per step a job may name (16.7M; published pre-training uses up to ~16k): every
number that drives enumeration is bounded, so no request holds a planner worker for long."""
MAX_GLOBAL_BATCH_TOKENS = 2**34
"""Most tokens per step (17 billion)."""

Method = Literal["full", "lora", "qlora"]
QuantFormat = Literal["nf4_double", "nf4", "int8", "fp8"]
LoraTargetPreset = Literal["all-linear", "attention"]
LORA_ATTENTION_NAMES: tuple[str, ...] = (
    "q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
)
"""Attention projections as PEFT's `target_modules` matches them in the HuggingFace Llama / Qwen /
Mistral / DeepSeek implementations (MLA's low-rank factors are the last four)."""
LORA_MLP_NAMES: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
"""MLP projections (a non-gated MLP has up_proj and down_proj only; expert MLPs answer to the same names)."""
LORA_MODULE_NAMES: tuple[str, ...] = (*LORA_ATTENTION_NAMES[:4], *LORA_MLP_NAMES, *LORA_ATTENTION_NAMES[4:])
"""Every linear module a LoRA target list may name."""
MAX_LORA_RANK = 65536
DEFAULT_LORA_RANK = 16
"""Rank when `lora_rank` is not given (the seeds' fine-tuning guide and most PEFT recipes: 8-64)."""


def param_bytes_of(precision: str) -> int:
    """Bytes of one working weight in `precision` (`TrainingSpec.param_bytes`)."""
    return 4 if precision == "fp32" else 2


class TrainingSpec(BaseModel):
    """How it is trained: sequence length, global batch, numeric precision and optimizer.

    `global_batch` counts sequences; give `global_batch_tokens` instead to have it derived
    (it must be a multiple of `seq_len`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq_len: int = Field(gt=0, le=MAX_SEQ_LEN, description="tokens per sequence (at most 2**22)")
    global_batch: int = Field(0, ge=0, le=MAX_GLOBAL_BATCH, description="sequences per optimizer step (at most 2**24)")
    global_batch_tokens: int | None = Field(None, gt=0, le=MAX_GLOBAL_BATCH_TOKENS, description="at most 2**34")
    precision: Precision = Field("bf16", description="compute precision of the GEMMs")
    optimizer: Literal["adamw", "sgd"] = "adamw"
    grad_dtype: Literal["bf16", "fp32"] = Field(
        "bf16", description="gradient buffer dtype; Megatron accumulates in fp32 (+2 bytes/param)"
    )
    method: Method = Field(
        "full",
        description="full: every weight trained; lora: base weights frozen in the compute dtype, low-rank "
        "adapters trained (Hu et al. 2021); qlora: base weights frozen and stored quantized (`quant_format`), "
        "adapters trained in the compute dtype (Dettmers et al. 2023)",
    )
    lora_rank: int | None = Field(
        None, ge=1, le=MAX_LORA_RANK, description=f"adapter rank r (lora / qlora; default {DEFAULT_LORA_RANK})"
    )
    lora_alpha: float | None = Field(
        None, gt=0, le=1e6, description="adapter scaling numerator (alpha / r scales the update); default 2 x rank; "
        "no cost, carried to exports",
    )
    lora_targets: LoraTargetPreset | tuple[str, ...] | None = Field(
        None,
        description="modules that get adapters: all-linear (every projection of attention and MLP / experts, "
        "not the router or LM head: PEFT's 'all-linear'), attention (q, k, v, o or MLA's factors), or a "
        "list of PEFT module names (`LORA_MODULE_NAMES`); default all-linear",
    )
    quant_format: QuantFormat | None = Field(
        None,
        description="qlora base-weight storage: nf4_double (4-bit NormalFloat with double-quantized "
        "constants, the QLoRA default; bitsandbytes, torchao's NF4Tensor), nf4, int8 (LLM.int8), or fp8 "
        "(an FP8-stored frozen base, Transformer Engine's fp8 parameters: MLPerf's Llama-2-70B LoRA); "
        "default nf4_double",
    )
    dora: bool = Field(
        False,
        description="lora / qlora: weight-decomposed adapters (DoRA, Liu et al. 2024; PEFT use_dora, torchtune "
        "use_dora): a trained magnitude per output feature and, every forward, the norm of W + BA per module",
    )
    trainable_embeddings: bool = Field(
        False,
        description="lora / qlora: the token embedding and the LM head are trained beside the adapters "
        "(PEFT modules_to_save=[embed_tokens, lm_head]): their gradients and optimizer states are full size",
    )
    master_weights: bool | None = Field(
        None,
        description="keep the trained weights in float32 (a master copy under mixed precision); False: train "
        "them in the compute dtype with optimizer states in that dtype (torchtune's default, HF models loaded "
        "in bf16); default: the stack's (cost_models.stacks)",
    )
    mean_tokens_per_sequence: int | None = Field(
        None, gt=0, le=MAX_SEQ_LEN,
        description="the sequences are padded, not packed: real tokens per sequence on average (throughput "
        "counts these; memory is priced at seq_len, the longest padded batch); default: packed, every "
        "position a real token",
    )

    @field_validator("global_batch_tokens")
    @classmethod
    def _tokens_within_the_batch_bound(cls, tokens: int | None, info: ValidationInfo) -> int | None:
        """The sequences `global_batch_tokens` derives are bounded like `global_batch` (2**24)."""
        seq_len = info.data.get("seq_len")
        if tokens is not None and seq_len and tokens // seq_len > MAX_GLOBAL_BATCH:
            raise ValueError(
                f"{tokens} tokens / seq_len {seq_len} = {tokens // seq_len} sequences per step: at most "
                f"{MAX_GLOBAL_BATCH} (2**24), the bound of global_batch"
            )
        return tokens

    @model_validator(mode="after")
    def _derive_batch(self) -> TrainingSpec:
        if self.global_batch_tokens is not None:
            if self.global_batch_tokens % self.seq_len:
                raise ValueError(
                    f"global_batch_tokens ({self.global_batch_tokens}) is not a multiple of seq_len ({self.seq_len})"
                )
            seqs = self.global_batch_tokens // self.seq_len
            if self.global_batch and self.global_batch != seqs:
                raise ValueError(
                    f"global_batch ({self.global_batch}) disagrees with global_batch_tokens / seq_len ({seqs})"
                )
            object.__setattr__(self, "global_batch", seqs)
        if self.global_batch <= 0:
            raise ValueError("global_batch (sequences) or global_batch_tokens is required")
        self._check_method()
        return self

    def _check_method(self) -> None:
        """Adapter fields belong to lora / qlora, the base-weight format to qlora only."""
        if self.method == "full":
            given = [f for f in ("lora_rank", "lora_alpha", "lora_targets") if getattr(self, f) is not None]
            given += [f for f in ("dora", "trainable_embeddings") if getattr(self, f)]
            if given:
                raise ValueError(f"{', '.join(given)} apply to method lora or qlora, not full")
        if self.mean_tokens_per_sequence is not None and self.mean_tokens_per_sequence > self.seq_len:
            raise ValueError(
                f"mean_tokens_per_sequence ({self.mean_tokens_per_sequence}) exceeds seq_len ({self.seq_len}), "
                "the padded length"
            )
        if self.quant_format is not None and self.method != "qlora":
            raise ValueError(f"quant_format applies to method qlora, not {self.method}")
        if self.method == "qlora" and self.quant_format != "fp8" and self.precision not in ("bf16", "fp16"):
            raise ValueError(
                f"qlora dequantizes its base weights to a 16-bit compute dtype: precision {self.precision} is not "
                "supported (bitsandbytes' bnb_4bit_compute_dtype is bf16 or fp16)"
            )
        targets = self.lora_targets
        if isinstance(targets, tuple):
            if not targets:
                raise ValueError("lora_targets: an empty list adapts nothing (give module names or all-linear)")
            unknown = sorted(set(targets) - set(LORA_MODULE_NAMES))
            if unknown:
                raise ValueError(
                    f"lora_targets: unknown module name(s) {unknown}; known: {', '.join(LORA_MODULE_NAMES)}"
                )
            if len(set(targets)) != len(targets):
                raise ValueError("lora_targets: a module is named twice")

    # ---- training method (full fine-tuning / pre-training, LoRA, QLoRA) ----------------------------
    @property
    def frozen_base(self) -> bool:
        """Whether the base weights are frozen (no gradients, no optimizer states): LoRA and QLoRA."""
        return self.method != "full"

    @property
    def lora_rank_(self) -> int:
        return self.lora_rank or DEFAULT_LORA_RANK

    @property
    def lora_alpha_(self) -> float:
        return self.lora_alpha if self.lora_alpha is not None else 2.0 * self.lora_rank_

    @property
    def lora_modules(self) -> tuple[str, ...]:
        """The PEFT module names that get adapters (empty for full training)."""
        if not self.frozen_base:
            return ()
        targets = self.lora_targets or "all-linear"
        if targets == "all-linear":
            return LORA_MODULE_NAMES
        if targets == "attention":
            return LORA_ATTENTION_NAMES
        return tuple(targets)

    @property
    def quant_format_(self) -> QuantFormat | None:
        """The base-weight storage format of qlora (None otherwise)."""
        if self.method != "qlora":
            return None
        return self.quant_format or "nf4_double"

    @property
    def quantized_weight_bytes(self) -> float:
        """Bytes per stored element of a quantized base weight (qlora), with its constants.

        NF4 packs two 4-bit codes per byte (0.5 bytes) and keeps one float32 absmax per block of 64
        (32/64 bits = 0.0625 bytes); double quantization stores those constants as 8-bit values with
        one float32 constant per 256 of them: 8/64 + 32/(64 x 256) bits (Dettmers et al. 2023, QLoRA
        Sec. 3: "0.127 bits per parameter"), 0.5159 bytes in all. int8 (LLM.int8, Dettmers et al.
        2022): one byte per element; its float32 scale per output row (4 / in_features bytes) is left
        out (< 0.1% for in_features >= 4096). fp8: one byte (E4M3) and a scale per tensor. The compute
        dtype's bytes for a 16-bit base (lora)."""
        fmt = self.quant_format_
        if fmt == "nf4_double":
            return (4 + 8 / 64 + 32 / (64 * 256)) / 8
        if fmt == "nf4":
            return (4 + 32 / 64) / 8
        if fmt in ("int8", "fp8"):
            return 1.0  # fp8: one byte per element and one float32 scale per tensor (left out)
        return float(self.param_bytes)

    @property
    def tokens_per_step(self) -> int:
        """Real tokens per step: every position when packed, `mean_tokens_per_sequence` per sequence
        when padded (what published fine-tuning throughput counts)."""
        return self.global_batch * (self.mean_tokens_per_sequence or self.seq_len)

    @property
    def bitsandbytes_base(self) -> bool:
        """qlora with a 4-bit / 8-bit base (bitsandbytes, torchao NF4): not tensor- or pipeline-parallel."""
        return self.method == "qlora" and self.quant_format_ != "fp8"

    # ---- bytes per parameter (mixed precision, ZeRO paper section 3.1) -------------------------
    @property
    def param_bytes(self) -> int:
        """Bytes of one working (compute-dtype) weight. FP8 training keeps bf16 weights (the FP8
        copies are transient casts), so fp8 is 2 bytes here too."""
        return param_bytes_of(self.precision)

    @property
    def grad_bytes(self) -> int:
        if self.precision == "fp32":
            return 4
        return 4 if self.grad_dtype == "fp32" else 2

    @property
    def optimizer_bytes(self) -> int:
        """Optimizer state bytes per parameter: fp32 master weight + Adam m + v = 12 (AdamW under
        mixed precision); 8 in fp32 training (no separate master copy); SGD without momentum keeps
        only the master copy (4) under mixed precision."""
        if self.optimizer == "adamw":
            return 8 if self.precision == "fp32" else 12
        return 0 if self.precision == "fp32" else 4

    @property
    def bytes_per_param(self) -> int:
        """Model-state bytes per parameter: 2 + 2 + 12 = 16 for mixed-precision AdamW."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def activation_bytes(self) -> int:
        """Bytes of one activation element (bf16/fp16/fp8 training keep activations in 16 bits)."""
        return 4 if self.precision == "fp32" else 2
