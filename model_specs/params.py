"""Exact parameter counts of a `ModelSpec`, piece by piece.

Counts follow the HuggingFace reference implementations of each family: every weight matrix,
bias, norm scale (and shift, for LayerNorm), router and learned position table is counted once.
`total` is what a checkpoint stores; `active` is what one token touches (routed experts counted
`moe_top_k` times rather than `num_experts` times).

Convention for `active`: the whole stored model except the routed experts a token does not reach,
so the input embedding table and an untied LM head are in it (memory and exports need them).
Model cards of MoE models often leave the input table out because a lookup does no arithmetic
(OpenAI's GPT-OSS card: 5.13B active for gpt-oss-120b where `active` here is 5.71B, the difference
being the 0.58B token table): that figure is `active_compute`. FLOPs never use either: they come
from the matmul sizes in `cost_models.flops`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from model_specs.spec import ModelSpec


def mlp_params(spec: ModelSpec, width: int) -> int:
    """Parameters of one MLP (dense layer, one expert or one shared expert) of `width` neurons."""
    h = spec.hidden_size
    if spec.gated_mlp:
        n = 3 * h * width
        if spec.mlp_bias:
            n += 2 * width + h
    else:
        n = 2 * h * width
        if spec.mlp_bias:
            n += width + h
    return n


def norm_params(spec: ModelSpec, width: int) -> int:
    """A norm over `width` elements: scale only for RMSNorm, scale and shift for LayerNorm."""
    return width if spec.norm == "rmsnorm" else 2 * width


def attention_params(spec: ModelSpec) -> int:
    """Projections of one attention block (q, k, v, o or MLA's low-rank factors) and their norms."""
    h, nh = spec.hidden_size, spec.num_heads
    if spec.attention == "mla":
        assert spec.kv_lora_rank and spec.qk_rope_head_dim and spec.qk_nope_head_dim and spec.v_head_dim
        qk = spec.qk_head_dim
        if spec.q_lora_rank:
            q = h * spec.q_lora_rank + spec.q_lora_rank + spec.q_lora_rank * nh * qk  # a, norm, b
        else:
            q = h * nh * qk
        kv = h * (spec.kv_lora_rank + spec.qk_rope_head_dim) + spec.kv_lora_rank  # kv_a (+rope k), norm
        kv += spec.kv_lora_rank * nh * (spec.qk_nope_head_dim + spec.v_head_dim)  # kv_b
        o = nh * spec.v_head_dim * h
        n = q + kv + o
        if spec.qkv_bias:  # HF DeepSeek `attention_bias`: biases on q_a_proj and kv_a_proj_with_mqa only
            n += (spec.q_lora_rank or 0) + spec.kv_lora_rank + spec.qk_rope_head_dim
        if spec.attn_out_bias:
            n += h
        return n
    hd = spec.qk_head_dim
    q = h * nh * hd
    kv = 2 * h * spec.kv_heads * hd
    o = nh * hd * h
    n = q + kv + o
    if spec.qkv_bias:
        n += nh * hd + 2 * spec.kv_heads * hd
    if spec.attn_out_bias:
        n += h
    if spec.qk_norm:  # RMSNorm scales: per head (Qwen3, Gemma 3) or over the projection (OLMo-2)
        n += (nh + spec.kv_heads) * hd if spec.qk_norm_scope == "projection" else 2 * hd
    if spec.attention_sinks:
        n += nh
    return n


def mamba_params(spec: ModelSpec) -> int:
    """Parameters of one Mamba-2 mixer, as transformers' `NemotronHMamba2Mixer` and Megatron-Core's
    `MambaMixer` build it (Dao & Gu 2024, Sec. 7 "Mamba-2 architecture"):
    in_proj h x (2 d_inner + 2 G N + H) [z, x, B, C, dt] (+ bias with `mamba_proj_bias`), the
    depthwise conv1d conv_dim x 1 x d_conv (+ conv_dim bias), dt_bias, A_log and D (one per head),
    the gated RMSNorm over d_inner (its scale), out_proj d_inner x h (+ bias)."""
    h, heads = spec.hidden_size, spec.mamba_num_heads
    assert heads
    inner, conv, proj = spec.mamba_inner, spec.mamba_conv_dim, spec.mamba_in_proj_width
    n = h * proj + inner * h  # in_proj, out_proj
    if spec.mamba_proj_bias:
        n += proj + h
    n += conv * spec.mamba_conv_kernel + (conv if spec.mamba_conv_bias else 0)
    n += 3 * heads  # dt_bias, A_log, D
    n += inner  # gated RMSNorm scale
    return n


def router_params(spec: ModelSpec) -> int:
    n = spec.hidden_size * spec.num_experts
    if spec.router_bias:
        n += spec.num_experts
    if spec.router_score_correction_bias:
        n += spec.num_experts
    return n


def shared_experts_params(spec: ModelSpec) -> int:
    if not spec.num_shared_experts:
        return 0
    width = spec.shared_expert_width
    assert width
    n = spec.num_shared_experts * mlp_params(spec, width)
    if spec.shared_expert_gate:
        n += spec.hidden_size
    return n


def routed_expert_params(spec: ModelSpec) -> int:
    """Parameters of one routed expert."""
    assert spec.moe_ffn_hidden_size
    return mlp_params(spec, spec.moe_ffn_hidden_size)


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer block, split the way parallelism splits them."""

    attention: int
    norms: int
    dense_mlp: int  # 0 on MoE layers
    router: int  # 0 on dense layers
    shared_experts: int
    routed_experts: int  # all routed experts of the layer
    routed_active: int  # top-k of them
    mamba: int = 0  # the Mamba-2 mixer of a hybrid `M` layer (split over TP by heads, like attention)

    @property
    def total(self) -> int:
        return (
            self.attention + self.norms + self.dense_mlp + self.router + self.shared_experts + self.routed_experts
            + self.mamba
        )

    @property
    def active(self) -> int:
        return (
            self.attention + self.norms + self.dense_mlp + self.router + self.shared_experts + self.routed_active
            + self.mamba
        )

    @property
    def non_expert(self) -> int:
        """Everything but the routed experts: replicated across expert-parallel ranks."""
        return self.total - self.routed_experts


def layer_params(spec: ModelSpec, index: int) -> LayerParams:
    norms = spec.norms_per_layer * norm_params(spec, spec.hidden_size)
    mixer = spec.layer_mixer(index)
    if mixer == "mamba":
        return LayerParams(0, norms, 0, 0, 0, 0, 0, mamba_params(spec))
    if mixer == "attention":
        return LayerParams(attention_params(spec), norms, 0, 0, 0, 0, 0)
    attn = attention_params(spec) if mixer == "transformer" else 0
    if spec.is_moe_layer(index):
        per_expert = routed_expert_params(spec)
        return LayerParams(
            attention=attn,
            norms=norms,
            dense_mlp=0,
            router=router_params(spec),
            shared_experts=shared_experts_params(spec),
            routed_experts=spec.num_experts * per_expert,
            routed_active=spec.moe_top_k * per_expert,
        )
    return LayerParams(attn, norms, mlp_params(spec, spec.ffn_hidden_size), 0, 0, 0, 0)


@dataclass(frozen=True)
class ParamCounts:
    """Whole-model parameter counts (elements)."""

    embedding: int  # token table (+ learned position table, + BLOOM's embedding norm)
    lm_head: int  # 0 when tied to the embedding
    final_norm: int
    layers: tuple[LayerParams, ...]

    @cached_property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.final_norm + sum(layer.total for layer in self.layers)

    @cached_property
    def active(self) -> int:
        return self.embedding + self.lm_head + self.final_norm + sum(layer.active for layer in self.layers)

    @property
    def active_compute(self) -> int:
        """`active` without the input embedding table (a lookup): the model-card convention of
        GPT-OSS and of most MoE cards ("5.1B active")."""
        return self.active - self.embedding

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding - self.lm_head


@lru_cache(maxsize=128)
def count_params(spec: ModelSpec) -> ParamCounts:
    """Cached: specs are frozen."""
    h = spec.hidden_size
    embedding = spec.vocab_size * h
    if spec.position_embedding == "learned":
        embedding += spec.max_position_embeddings * h
    if spec.embedding_norm:  # lives on the first pipeline stage with the table
        embedding += norm_params(spec, h)
    lm_head = 0 if spec.tie_embeddings else spec.vocab_size * h
    layers = tuple(layer_params(spec, i) for i in range(spec.num_layers))
    return ParamCounts(embedding, lm_head, norm_params(spec, h), layers)


@dataclass(frozen=True)
class Linear:
    """One weight matrix of a transformer block as the HuggingFace modules hold it.

    `name` is the module name PEFT's `target_modules` matches (`spec.LORA_MODULE_NAMES`, the router
    is "gate"); `count` how many such modules the layer has (routed experts: one per expert);
    `split` how tensor parallelism cuts it: "column" (output features over tp), "row" (input
    features over tp), "replicated" (the router; under our per-rank counts every attention and MLP
    weight is divided by tp, MLA's down-projections included); `expert` whether it belongs to a
    routed expert (divided over ep x etp instead)."""

    name: str
    in_features: int
    out_features: int
    count: int = 1
    split: str = "column"
    expert: bool = False

    @property
    def params(self) -> int:
        """Weight elements of all `count` modules (biases, which PEFT does not adapt, left out)."""
        return self.count * self.in_features * self.out_features


def _mlp_linears(spec: ModelSpec, width: int, count: int, expert: bool) -> list[Linear]:
    h = spec.hidden_size
    out = [Linear("up_proj", h, width, count, "column", expert), Linear("down_proj", width, h, count, "row", expert)]
    if spec.gated_mlp:
        out.insert(0, Linear("gate_proj", h, width, count, "column", expert))
    return out


@lru_cache(maxsize=1024)
def layer_linears(spec: ModelSpec, index: int) -> tuple[Linear, ...]:
    """The GEMM weights of layer `index` (their elements sum to `cost_models.flops.layer_matmuls`'
    total with routed experts counted `num_experts` times instead of `moe_top_k`, and without a
    shared-expert gate)."""
    h, nh = spec.hidden_size, spec.num_heads
    out: list[Linear] = []
    if spec.is_mamba_layer(index):  # Mamba-2: in_proj column-parallel, out_proj row-parallel (over heads)
        return (Linear("in_proj", h, spec.mamba_in_proj_width), Linear("out_proj", spec.mamba_inner, h, split="row"))
    if spec.has_attention(index):
        if spec.attention == "mla":
            assert spec.kv_lora_rank and spec.qk_rope_head_dim and spec.qk_nope_head_dim and spec.v_head_dim
            qk = spec.qk_head_dim
            if spec.q_lora_rank:
                out += [Linear("q_a_proj", h, spec.q_lora_rank), Linear("q_b_proj", spec.q_lora_rank, nh * qk)]
            else:
                out.append(Linear("q_proj", h, nh * qk))
            out += [
                Linear("kv_a_proj_with_mqa", h, spec.kv_lora_rank + spec.qk_rope_head_dim),
                Linear("kv_b_proj", spec.kv_lora_rank, nh * (spec.qk_nope_head_dim + spec.v_head_dim)),
                Linear("o_proj", nh * spec.v_head_dim, h, split="row"),
            ]
        else:
            hd = spec.qk_head_dim
            out += [
                Linear("q_proj", h, nh * hd), Linear("k_proj", h, spec.kv_heads * hd), Linear("v_proj", h, spec.kv_heads * hd),
                Linear("o_proj", nh * hd, h, split="row"),
            ]
    if not spec.has_ffn(index):
        return tuple(out)
    if spec.is_moe_layer(index):
        assert spec.moe_ffn_hidden_size
        out.append(Linear("gate", h, spec.num_experts, split="replicated"))
        if spec.num_shared_experts:
            out += _mlp_linears(spec, spec.shared_expert_width, spec.num_shared_experts, expert=False)
        out += _mlp_linears(spec, spec.moe_ffn_hidden_size, spec.num_experts, expert=True)
    else:
        out += _mlp_linears(spec, spec.ffn_hidden_size, 1, expert=False)
    return tuple(out)


@lru_cache(maxsize=256)
def linear_names(spec: ModelSpec) -> tuple[str, ...]:
    """Names of the linear modules the model has, in layer order (each once)."""
    seen: dict[str, None] = {}
    for i in range(spec.num_layers):
        for x in layer_linears(spec, i):
            seen.setdefault(x.name, None)
    return tuple(seen)


def adapted_names(spec: ModelSpec, modules: tuple[str, ...]) -> tuple[str, ...]:
    """The names in `modules` the model has (what a LoRA target list adapts on this model)."""
    return tuple(n for n in linear_names(spec) if n in modules)


def adapter_params(spec: ModelSpec, index: int, modules: tuple[str, ...], rank: int, per_token: bool = False) -> int:
    """LoRA parameters of layer `index`: r x (in + out) per adapted module (A is r x in, B is
    out x r; Hu et al. 2021, Sec. 4), for every module whose name is in `modules`. `per_token`:
    those one token passes through (routed experts `moe_top_k` times, not `num_experts`)."""
    wanted = set(modules)
    return sum(
        rank * (x.in_features + x.out_features) * (spec.moe_top_k if per_token and x.expert else x.count)
        for x in layer_linears(spec, index) if x.name in wanted
    )


@dataclass(frozen=True)
class TrainableCounts:
    """Trainable and frozen parameters of a model under a training method (elements)."""

    trainable: int
    frozen: int
    adapters: int  # LoRA A and B matrices (0 for full training)

    @property
    def total(self) -> int:
        """What the trained model holds: the base and any adapters."""
        return self.trainable + self.frozen


def trainable_counts(spec: ModelSpec, method: str, modules: tuple[str, ...] = (), rank: int = 0) -> TrainableCounts:
    """Full training trains every parameter; LoRA / QLoRA freeze the whole base (embedding, norms,
    router and LM head included, PEFT's default) and train only the adapters."""
    pc = count_params(spec)
    if method == "full":
        return TrainableCounts(pc.total, 0, 0)
    adapters = sum(adapter_params(spec, i, modules, rank) for i in range(spec.num_layers))
    return TrainableCounts(adapters, pc.total, adapters)
