"""Import a HuggingFace `config.json` as a `ModelSpec`.

Supported `model_type`s are the keys of `FAMILIES`, a reviewed list: llama, mistral, mixtral,
qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss, gpt2, gpt_neox, bloom,
nemotron, phi3 and granite (Llama shapes: fused qkv / gate-up projections store the same
matrices), olmo2, gemma, gemma2, gemma3_text, llama4_text and nemotron_h (Nemotron-H, Nemotron Nano
2, Nemotron 3 Nano: hybrid Mamba-2 / attention / MLP / MoE layers from `hybrid_override_pattern`,
`ModelSpec.hybrid_pattern`). Anything else is refused with the list: a config is never read as a
Llama by guess. Fields that change the architecture in a way this reader does not model
(`UNMODELLED_FIELDS`: hybrid Mamba / linear-attention layer patterns outside nemotron_h, Jamba's
Mamba-1 interleaving, cross-attention layers, ...) and `layer_types` entries other than sliding /
full / chunked attention are refused by name as well. Multimodal configs are read from their `text_config`; their other
towers (`vision_config`, `audio_config`, ...) are named in `ModelSpec.notes` as not priced.

The per-family rules (`FAMILIES`) encode what the `transformers` modeling code builds but the config
does not say: which linears carry biases, gated or plain MLP, RMSNorm or LayerNorm and where the
norms sit, q/k norms and their width, tied embeddings by default, position encoding, the windowed
layer pattern, the MoE layer pattern, and the configuration class's defaults for fields a published
config leaves out (Gemma 3's `text_config` names no vocabulary size). Sources: the `modeling_*.py`
and `configuration_*.py` files of `transformers` (v4.40-5.x) for each family.

Fields read and known not to change parameters, FLOPs or memory are listed in `ModelSpec.notes`:
Granite's muP multipliers (`embedding_multiplier`, `residual_multiplier`, `attention_multiplier`,
`logits_scaling`: scalars), Gemma's logit soft-capping (an elementwise tanh, outside the matmul FLOP
count like every activation; flash-attention kernels fuse it) and query scaling.

Sizes are element counts. Multi-token-prediction modules (`num_nextn_predict_layers`) are recorded
in `mtp_layers` and not counted as layers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from model_specs.hf_fields import ConfigFields, ModelConfigError
from model_specs.spec import HYBRID_SYMBOLS, MlpKind, ModelSpec

__all__ = [
    "FAMILIES", "UNMODELLED_FIELDS", "ModelConfigError", "from_hf_config", "load_hf_config", "load_hf_spec",
]

# Spellings of each quantity, preferred first.
HIDDEN = ("hidden_size", "n_embd", "n_embed", "d_model")
LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
FFN = ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim")
VOCAB = ("vocab_size", "padded_vocab_size", "n_vocab")
POSITIONS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
ACT = ("hidden_act", "activation_function", "hidden_activation")
EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
TOP_K = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk", "moe_top_k", "top_k")
EXPERT_FFN = ("moe_intermediate_size", "expert_intermediate_size", "moe_ffn_hidden_size")
SHARED = ("n_shared_experts", "num_shared_experts")
SHARED_FFN = ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")


@dataclass(frozen=True)
class Family:
    """What the modeling code of a family builds that the config leaves implicit."""

    gated: bool = True  # SwiGLU/GeGLU: gate, up and down projections
    act: str = "silu"  # default activation when the config names none
    norm: str = "rmsnorm"
    positions: str = "rope"
    tie: bool = False  # default of tie_word_embeddings
    attention_bias: bool = False  # default of `attention_bias` (q, k, v and o biases)
    qkv_bias: bool | None = None  # fixed q/k/v bias, overriding attention_bias
    out_bias: bool | None = None  # fixed o bias, overriding attention_bias
    mlp_bias: bool = False  # default of `mlp_bias`
    ffn_mult: int | None = None  # dense width = ffn_mult * hidden when the config names none
    qk_norm: bool = False
    qwen_window: bool = False  # window only with use_sliding_window, on layers >= max_window_layers
    parallel_residual: bool = False  # default of use_parallel_residual
    embedding_norm: bool = False
    attention_sinks: bool = False
    router_bias: bool = False
    shared_expert_gate: bool = False
    score_correction: bool = False  # e_score_correction_bias unless topk_method says otherwise
    mla: bool = False  # multi-head latent attention is the only attention of the family
    expert_ffn_required: bool = False  # experts have their own width (moe_intermediate_size)
    norm_placement: str = "pre"  # ModelSpec.norm_placement: pre, post (OLMo-2), sandwich (Gemma 2/3)
    qk_norm_scope: str = "head"  # ModelSpec.qk_norm_scope: head (Qwen3, Gemma 3) or projection (OLMo-2)
    # Without `layer_types`: layer i is windowed iff (i + 1) % period != 0 (Gemma 2: period 2,
    # Gemma 3: `sliding_window_pattern`, default 6). None: every layer (Mistral-style).
    window_period: int | None = None
    window_period_key: str | None = None
    hybrid: bool = False  # Mamba-2 hybrid (Nemotron-H): the pattern and Mamba fields are read, not refused
    # The configuration class's defaults for fields a published config may leave out.
    defaults: dict[str, Any] = field(default_factory=dict)
    # Fields read and known to change no parameter, FLOP or byte: (field, why), noted on the spec.
    cost_free: tuple[tuple[str, str], ...] = ()


_GRANITE_MULTIPLIERS = tuple(
    (f, "a scalar multiplier (muP): changes no parameter count, FLOPs or memory")
    for f in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")
)
_GEMMA_SCALARS = (
    ("attn_logit_softcapping", "tanh soft-capping of attention scores: elementwise, outside the matmul FLOP "
     "count; priced as flash attention, which fuses it (eager attention would keep S x S scores)"),
    ("final_logit_softcapping", "tanh soft-capping of the logits: elementwise, outside the matmul FLOP count"),
    ("query_pre_attn_scalar", "the query scaling constant: no parameter or FLOP"),
)
_GEMMA3_DEFAULTS = {  # transformers Gemma3TextConfig() (the 27B text_config names only the shape)
    "vocab_size": 262_208, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "sliding_window": 4096, "query_pre_attn_scalar": 256,
}

_LLAMA = Family()
_QWEN2 = Family(qkv_bias=True, out_bias=False, qwen_window=True)
_QWEN3 = Family(qk_norm=True, qwen_window=True)
_QWEN3_MOE = Family(qk_norm=True, qwen_window=True, expert_ffn_required=True)
FAMILIES: dict[str, Family] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "mixtral": _LLAMA,
    "qwen2": _QWEN2,
    "qwen2_moe": Family(
        qkv_bias=True, out_bias=False, qwen_window=True, shared_expert_gate=True, expert_ffn_required=True
    ),
    "qwen3": _QWEN3,
    "qwen3_moe": _QWEN3_MOE,
    "deepseek_v2": Family(mla=True, expert_ffn_required=True),
    "deepseek_v3": Family(mla=True, expert_ffn_required=True, score_correction=True),
    "gpt_oss": Family(attention_bias=True, mlp_bias=True, attention_sinks=True, router_bias=True),
    "gpt2": Family(
        gated=False, act="gelu_new", norm="layernorm", positions="learned", tie=True,
        attention_bias=True, mlp_bias=True, ffn_mult=4,
    ),
    "gpt_neox": Family(
        gated=False, act="gelu", norm="layernorm", attention_bias=True, mlp_bias=True, parallel_residual=True,
    ),
    "bloom": Family(
        gated=False, act="gelu", norm="layernorm", positions="alibi", tie=True, attention_bias=True,
        mlp_bias=True, ffn_mult=4, embedding_norm=True,
    ),
    "nemotron": Family(gated=False, act="relu2", norm="layernorm"),
    "phi3": _LLAMA,  # qkv_proj and gate_up_proj are the fused q/k/v and gate/up matrices, no biases
    "granite": Family(cost_free=_GRANITE_MULTIPLIERS),
    "olmo2": Family(qk_norm=True, qk_norm_scope="projection", norm_placement="post"),
    "gemma": Family(act="gelu_pytorch_tanh", tie=True),
    "gemma2": Family(
        act="gelu_pytorch_tanh", tie=True, norm_placement="sandwich", window_period=2, cost_free=_GEMMA_SCALARS,
    ),
    "gemma3_text": Family(
        act="gelu_pytorch_tanh", tie=True, qk_norm=True, norm_placement="sandwich", window_period=6,
        window_period_key="sliding_window_pattern", defaults=_GEMMA3_DEFAULTS, cost_free=_GEMMA_SCALARS,
    ),
    # Llama 4: every `interleave_moe_layer_step`-th layer is MoE (routed experts `intermediate_size`
    # wide plus one shared expert as wide), the others dense `intermediate_size_mlp`; RoPE layers
    # attend in chunks of `attention_chunk_size`, every `no_rope_layer_interval`-th (NoPE) layer
    # globally. Its q/k norm is a weightless L2 norm: no parameters.
    "llama4_text": Family(cost_free=(("use_qk_norm", "a weightless L2 norm of q and k: no parameters"),)),
    # Nemotron-H / Nemotron Nano 2 / Nemotron 3 Nano (modeling_nemotron_h, configuration_nemotron_h):
    # `hybrid_override_pattern` (or `layers_block_type`) picks one mixer per layer; squared-ReLU MLPs
    # without gate; one shared expert of `moe_shared_expert_intermediate_size`; RMSNorm; untied.
    "nemotron_h": Family(gated=False, act="relu2", hybrid=True),
}

HYBRID_CONFIG_FIELDS = frozenset({
    "hybrid_override_pattern", "layers_block_type", "layer_block_types", "ssm_state_size", "mamba_d_state",
    "mamba_num_heads",
})
"""`UNMODELLED_FIELDS` a hybrid family (`Family.hybrid`) reads instead of refusing."""

_BLOCK_TYPES = {  # transformers' NemotronH layer-type names (both vocabularies) -> pattern symbols
    "mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-", "moe": "E",
}

UNMODELLED_FIELDS: dict[str, str] = {
    "hybrid_override_pattern": "a hybrid Mamba-2 / attention / MLP layer pattern (Nemotron-H)",
    "layers_block_type": "a per-layer block kind list (hybrid state-space models)",
    "layer_block_types": "a per-layer block kind list (hybrid state-space models)",
    "attn_layer_period": "Jamba's interleaving of attention and Mamba layers",
    "ssm_state_size": "state-space (Mamba) layers",
    "mamba_d_state": "state-space (Mamba) layers",
    "mamba_num_heads": "state-space (Mamba) layers",
    "full_attention_interval": "linear-attention (Gated DeltaNet) layers between full-attention ones (Qwen3-Next)",
    "linear_num_value_heads": "linear-attention (Gated DeltaNet) layers (Qwen3-Next)",
    "cross_attention_layers": "cross-attention layers into an image encoder (Llama 3.2 Vision)",
    "block_configs": "per-layer heterogeneous blocks (Nemotron-NAS)",
}
"""Config fields that change the architecture in ways the reader does not model: refused by name."""

KNOWN_LAYER_TYPES = frozenset({"sliding_attention", "full_attention", "chunked_attention"})

_GATED_ACTS: dict[str, MlpKind] = {"silu": "swiglu", "swish": "swiglu", "swiglu": "swiglu"}
_PLAIN_ACTS: dict[str, MlpKind] = {
    "relu": "relu", "relu2": "relu2", "relu_squared": "relu2", "squared_relu": "relu2", "silu": "silu",
    "swish": "silu",
}


def _mlp_kind(c: ConfigFields, fam: Family) -> MlpKind:
    act = c.text(*ACT, default=fam.act).lower().replace("-", "_")
    if act.startswith("gelu") or act in ("quick_gelu", "geglu"):
        return "geglu" if fam.gated else "gelu"
    table = _GATED_ACTS if fam.gated else _PLAIN_ACTS
    if act not in table:
        kind = "gated" if fam.gated else "plain"
        raise c.error(f"unsupported activation {act!r} for a {kind} MLP (supported: {sorted(table)} and gelu*)")
    return table[act]


def _kv_heads(c: ConfigFields) -> int | None:
    if c.has(*KV_HEADS):
        return c.integer(*KV_HEADS)
    if c.flag("multi_query", default=False):  # Falcon-style MQA
        return 1
    return None


def _window(c: ConfigFields, fam: Family, family: str, num_layers: int) -> dict[str, Any]:
    types = c.str_list("layer_types")
    if types is not None:
        unknown = sorted(set(types) - KNOWN_LAYER_TYPES)
        if unknown:
            raise c.error(
                f"layer_types names layer kinds {unknown} that autopar does not price "
                f"(it prices {sorted(KNOWN_LAYER_TYPES)})"
            )
        if len(types) != num_layers:
            raise c.error(f"layer_types has {len(types)} entries for {num_layers} layers")
        if "chunked_attention" in types and "sliding_attention" in types:
            raise c.error("layer_types mixes sliding and chunked attention: not priced")
    if family == "llama4_text":
        return _llama4_chunks(c, types, num_layers)
    window = c.integer("sliding_window", default=None)
    if fam.qwen_window and not c.flag("use_sliding_window", default=False):
        window = None
    if window is None:
        return {}
    if types is not None:
        layers = [i for i, t in enumerate(types) if t == "sliding_attention"]
    elif fam.qwen_window:
        layers = list(range(c.integer("max_window_layers", default=0), num_layers))
    elif fam.window_period is not None:
        period = c.integer(fam.window_period_key, default=fam.window_period) if fam.window_period_key else fam.window_period
        if period < 1:
            raise c.error(f"field '{fam.window_period_key}' must be >= 1, got {period}")
        layers = [i for i in range(num_layers) if (i + 1) % period]
    else:
        layers = list(range(num_layers))
    return _window_fields(window, layers, num_layers)


def _window_fields(window: int, layers: list[int], num_layers: int) -> dict[str, Any]:
    if not layers:
        return {}
    for every in range(1, num_layers + 1):  # prefer the compact periodic form when it fits
        if layers == list(range(0, num_layers, every)):
            return {"sliding_window": window, "sliding_window_every": every}
    return {"sliding_window": window, "sliding_window_layers": tuple(layers)}


def _llama4_chunks(c: ConfigFields, types: list[str] | None, num_layers: int) -> dict[str, Any]:
    """Llama 4's chunked attention: on the RoPE layers (`layer_types`, else `no_rope_layers` with 1
    for RoPE, else every layer but each `no_rope_layer_interval`-th, as Llama4TextConfig derives)."""
    chunk = c.integer("attention_chunk_size", default=None)
    if chunk is None:
        return {}
    flags = c.int_list("no_rope_layers")
    if types is not None:
        layers = [i for i, t in enumerate(types) if t == "chunked_attention"]
    elif flags:  # an empty list means "derive", as in Llama4TextConfig
        if len(flags) != num_layers:
            raise c.error(f"no_rope_layers has {len(flags)} entries for {num_layers} layers")
        layers = [i for i, rope in enumerate(flags) if rope]
    else:
        interval = c.integer("no_rope_layer_interval", default=4)
        if interval < 1:
            raise c.error(f"field 'no_rope_layer_interval' must be >= 1, got {interval}")
        layers = [i for i in range(num_layers) if (i + 1) % interval]
    out = _window_fields(chunk, layers, num_layers)
    return out | {"window_kind": "chunked"} if out else out


def _mla(c: ConfigFields) -> dict[str, Any]:
    return {
        "attention": "mla",
        "q_lora_rank": c.integer("q_lora_rank", default=None),
        "kv_lora_rank": c.integer("kv_lora_rank"),
        "qk_rope_head_dim": c.integer("qk_rope_head_dim"),
        "qk_nope_head_dim": c.integer("qk_nope_head_dim"),
        "v_head_dim": c.integer("v_head_dim"),
    }


def _llama4_moe(c: ConfigFields) -> dict[str, Any]:
    """Llama 4 (modeling_llama4.Llama4TextMoe): routed experts and one shared expert, both
    `intermediate_size` wide, no router bias; MoE layers from `moe_layers`, else every
    `interleave_moe_layer_step`-th layer (step - 1, 2 step - 1, ...)."""
    experts = c.integer(*EXPERTS, default=0)
    if not experts:
        return {}
    width = c.integer("intermediate_size")
    out: dict[str, Any] = {
        "num_experts": experts, "moe_top_k": c.integer(*TOP_K), "moe_ffn_hidden_size": width,
        "num_shared_experts": 1, "shared_expert_ffn_hidden_size": width,
    }
    num_layers = c.integer(*LAYERS)
    moe_layers = c.int_list("moe_layers")
    if moe_layers is not None:
        bad = [i for i in moe_layers if not 0 <= i < num_layers]
        if bad:
            raise c.error(f"moe_layers {bad} outside 0..{num_layers - 1}")
        chosen = set(moe_layers)
        return out | {"dense_layers": tuple(i for i in range(num_layers) if i not in chosen)}
    step = c.integer("interleave_moe_layer_step", default=1)
    if step < 1:
        raise c.error(f"field 'interleave_moe_layer_step' must be >= 1, got {step}")
    return out | {"moe_layer_freq": step, "moe_layer_offset": step - 1}


def _moe(c: ConfigFields, fam: Family, ffn: int | None) -> dict[str, Any]:
    experts = c.integer(*EXPERTS, default=0)
    if not experts:
        return {}
    if fam.expert_ffn_required:
        expert_ffn = c.integer(*EXPERT_FFN)
    else:  # Mixtral/GPT-OSS experts are intermediate_size wide
        expert_ffn = c.integer(*EXPERT_FFN, default=ffn)
        if expert_ffn is None:
            c.integer(*FFN)  # raises, naming the field
    out: dict[str, Any] = {
        "num_experts": experts,
        "moe_top_k": c.integer(*TOP_K),
        "moe_ffn_hidden_size": expert_ffn,
        "router_bias": fam.router_bias,
    }
    groups = c.integer("n_group", default=0) or 0
    if groups > 1:  # group-limited routing (DeepSeek-V2/V3): a token reaches topk_group groups
        out["moe_router_groups"] = groups
        out["moe_router_group_topk"] = c.integer("topk_group", default=groups)
    method = c.text("topk_method", default="noaux_tc" if fam.score_correction else None)
    out["router_score_correction_bias"] = method == "noaux_tc"
    shared_ffn = c.integer(*SHARED_FFN, default=None)
    shared = c.integer(*SHARED, default=1 if shared_ffn else 0)
    if shared:
        out |= {"num_shared_experts": shared, "shared_expert_ffn_hidden_size": shared_ffn}
        out["shared_expert_gate"] = fam.shared_expert_gate
    # Layer pattern: DeepSeek's moe_layer_freq f puts MoE on i % f == 0 (from first_k_dense_replace);
    # Qwen's decoder_sparse_step s puts it on (i + 1) % s == 0, minus mlp_only_layers.
    first_k = c.integer("first_k_dense_replace", "first_k_dense_layers", default=0)
    if c.has("decoder_sparse_step"):
        freq = c.integer("decoder_sparse_step")
        if freq < 1:
            raise c.error(f"decoder_sparse_step must be >= 1, got {freq}")
        offset = freq - 1
    else:
        freq, offset = c.integer("moe_layer_freq", default=1), 0
    dense = sorted(set(c.int_list("mlp_only_layers") or ()))
    while dense and dense[0] == first_k:  # a dense prefix is first_k_dense_layers
        dense.pop(0)
        first_k += 1
    out |= {"first_k_dense_layers": first_k, "moe_layer_freq": freq, "moe_layer_offset": offset}
    out["dense_layers"] = tuple(dense)
    return out


_ROPE_SCALING_FIELDS = (
    "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
    "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
)


def _rope(c: ConfigFields) -> dict[str, Any]:
    """`rope_theta` and `rope_scaling` (HF's `rope_type`, or the older `type`; `default` and
    null mean none). Keys autopar does not model (e.g. GPT-OSS's `truncate`) are dropped."""
    out: dict[str, Any] = {}
    theta = c.raw.get("rope_theta")
    if theta is not None:
        if isinstance(theta, bool) or not isinstance(theta, int | float):
            raise c.error(f"field 'rope_theta' must be a number, got {theta!r}")
        out["rope_theta"] = float(theta)
    scaling = c.raw.get("rope_scaling")
    if scaling is None:
        return out
    if not isinstance(scaling, Mapping):
        raise c.error(f"field 'rope_scaling' must be an object, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if not isinstance(kind, str):
        raise c.error(f"field 'rope_scaling' needs a string rope_type, got {kind!r}")
    if kind == "default":
        return out
    values: dict[str, Any] = {"rope_type": kind}
    for key in _ROPE_SCALING_FIELDS:
        v = scaling.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise c.error(f"field 'rope_scaling.{key}' must be a number, got {v!r}")
        values[key] = v
    out["rope_scaling"] = values
    return out


def _hybrid_pattern(c: ConfigFields) -> str:
    """The layer pattern of a hybrid config: `hybrid_override_pattern` (Megatron-Core's symbols)
    or `layers_block_type` / `layer_types` (transformers' names, mapped by `_BLOCK_TYPES`)."""
    if c.has("hybrid_override_pattern"):
        pattern = c.text("hybrid_override_pattern")
        unknown = sorted(set(pattern) - set(HYBRID_SYMBOLS))
        if unknown:
            raise c.error(f"hybrid_override_pattern has symbols {unknown} autopar does not price (M * - E)")
        return pattern
    for key in ("layers_block_type", "layer_block_types", "layer_types"):
        kinds = c.str_list(key)
        if kinds is not None:
            unknown = sorted(set(kinds) - set(_BLOCK_TYPES))
            if unknown:
                raise c.error(f"{key} names block kinds {unknown} that autopar does not price ({sorted(_BLOCK_TYPES)})")
            return "".join(_BLOCK_TYPES[k] for k in kinds)
    raise c.error(
        "missing required field 'hybrid_override_pattern' (also looked for: layers_block_type, layer_block_types, "
        "layer_types)"
    )


def _hybrid(c: ConfigFields) -> dict[str, Any]:
    """Nemotron-H's hybrid fields (transformers `NemotronHConfig`; its `__post_init__` aliases
    mamba_n_groups, mamba_d_conv, mamba_chunk_size, mamba_conv_bias; defaults are the class's)."""
    pattern = _hybrid_pattern(c)
    if c.has("moe_latent_size"):
        raise c.error("field moe_latent_size (latent MoE projections, Nemotron 3 Super) is not priced")
    out: dict[str, Any] = {
        "hybrid_pattern": pattern,
        "num_layers": len(pattern),
        "mlp": _mlp_kind(ConfigFields({"hidden_act": c.text("mlp_hidden_act", default="relu2")}, c.model_type),
                         FAMILIES["nemotron_h"]),
        "head_dim": c.integer("head_dim", "attention_head_dim", default=128),
        "qkv_bias": False,  # NemotronHAttention builds q, k, v, o without biases
        "attn_out_bias": False,
    }
    if "M" in pattern:
        heads = c.integer("mamba_num_heads")
        out |= {
            "mamba_num_heads": heads,
            "mamba_head_dim": c.integer("mamba_head_dim", default=c.integer("hidden_size") * c.integer(
                "expand", "mamba_expand", default=2) // heads),
            "mamba_state_size": c.integer("ssm_state_size", "mamba_d_state", default=128),
            "mamba_groups": c.integer("n_groups", "mamba_n_groups", default=8),
            "mamba_conv_kernel": c.integer("conv_kernel", "mamba_d_conv", default=4),
            "mamba_chunk_size": c.integer("chunk_size", "mamba_chunk_size", default=128),
            "mamba_conv_bias": c.flag("use_conv_bias", "mamba_conv_bias", default=True),
            "mamba_proj_bias": c.flag("use_bias", default=False),
        }
    if "E" not in pattern:  # the class defaults n_routed_experts = 8; only E layers build experts
        out |= {"num_experts": 0, "moe_top_k": 0, "moe_ffn_hidden_size": None, "num_shared_experts": 0,
                "shared_expert_ffn_hidden_size": None, "moe_router_groups": 0, "moe_router_group_topk": 0}
    else:
        # NemotronHMoE builds one shared NemotronHMLP of moe_shared_expert_intermediate_size whatever
        # n_shared_experts says; its router's e_score_correction_bias is a buffer (no parameter)
        shared = c.integer("moe_shared_expert_intermediate_size", default=7688)
        out |= {"num_shared_experts": 1, "shared_expert_ffn_hidden_size": shared, "shared_expert_gate": False,
                "router_score_correction_bias": False}
    return out


def _read(c: ConfigFields, family: str) -> dict[str, Any]:
    fam = FAMILIES[family]
    hidden = c.integer(*HIDDEN)
    num_layers = len(_hybrid_pattern(c)) if fam.hybrid else c.integer(*LAYERS)
    heads = c.integer(*HEADS)
    if family == "llama4_text":  # dense layers are intermediate_size_mlp wide; intermediate_size is the experts'
        ffn = c.integer("intermediate_size_mlp", default=None)
    else:
        ffn = c.integer(*FFN, default=fam.ffn_mult * hidden if fam.ffn_mult else None)  # None: MoE-only
    attn_bias = c.flag("attention_bias", default=fam.attention_bias)
    spec: dict[str, Any] = {
        "family": family,
        "vocab_size": c.integer(*VOCAB),
        "hidden_size": hidden,
        "num_layers": num_layers,
        "num_heads": heads,
        "num_kv_heads": _kv_heads(c),
        "head_dim": c.integer("head_dim", "kv_channels", default=None),
        "ffn_hidden_size": ffn,
        "mlp": _mlp_kind(c, fam),
        "norm": fam.norm,
        "qkv_bias": attn_bias if fam.qkv_bias is None else fam.qkv_bias,
        "attn_out_bias": attn_bias if fam.out_bias is None else fam.out_bias,
        "mlp_bias": c.flag("mlp_bias", default=fam.mlp_bias),
        "qk_norm": fam.qk_norm,
        "qk_norm_scope": fam.qk_norm_scope,
        "norm_placement": fam.norm_placement,
        "tie_embeddings": c.flag("tie_word_embeddings", default=fam.tie),
        "position_embedding": fam.positions,
        "parallel_residual": c.flag("use_parallel_residual", "parallel_attn", default=fam.parallel_residual),
        "attention_sinks": fam.attention_sinks,
        "embedding_norm": fam.embedding_norm,
        "mtp_layers": c.integer("num_nextn_predict_layers", default=0),
    }
    positions = c.integer(*POSITIONS, default=1024 if fam.positions == "learned" else None)
    if family == "bloom":  # no position table; record the training length (BLOOM: 2048)
        positions = c.integer("seq_length", default=2048)
    if positions is not None:
        spec["max_position_embeddings"] = positions
    if fam.mla or c.has("kv_lora_rank"):
        spec |= _mla(c)
        spec["num_kv_heads"] = None  # MLA up-projects full heads for k and v
    if not fam.hybrid:
        spec |= _window(c, fam, family, num_layers)
    elif c.has("sliding_window"):
        raise c.error("field sliding_window on a hybrid model's attention layers is not priced")
    spec |= _llama4_moe(c) if family == "llama4_text" else _moe(c, fam, ffn)
    spec |= _rope(c)
    if fam.hybrid:
        spec |= _hybrid(c)
    return spec


def _family_of(model_type: str | None) -> str:
    if model_type in FAMILIES:
        return model_type
    supported = ", ".join(sorted(FAMILIES))
    if model_type is None:
        raise ModelConfigError(
            f"config: no model_type; name the family (supported: {supported}; a Llama-style decoder is 'llama')"
        )
    raise ModelConfigError(
        f"{model_type} config: model_type {model_type!r} is not a supported family; autopar does not guess an "
        f"architecture from field names (supported: {supported})"
    )


def _refuse_unmodelled(config: Mapping[str, Any], model_type: str) -> None:
    read = HYBRID_CONFIG_FIELDS if model_type in FAMILIES and FAMILIES[model_type].hybrid else frozenset()
    found = [
        f"{key} ({why})" for key, why in UNMODELLED_FIELDS.items()
        if key not in read and config.get(key) not in (None, [], "", 0)
    ]
    if found:
        raise ModelConfigError(
            f"{model_type} config: field(s) {'; '.join(found)} change the architecture in a way autopar does not "
            "price yet; refused rather than priced as a plain transformer"
        )


def _towers(wrapper: Mapping[str, Any]) -> list[str]:
    """Notes naming the non-text towers of a multimodal wrapper (`vision_config`, `audio_config`, ...)."""
    notes = []
    for key, value in wrapper.items():
        if key.endswith("_config") and key != "text_config" and isinstance(value, Mapping):
            kind = value.get("model_type")
            notes.append(f"{key}{f' ({kind})' if isinstance(kind, str) else ''}: not priced, only the text model is")
    return notes


def from_hf_config(config: Mapping[str, Any], name: str | None = None) -> ModelSpec:
    """Build a `ModelSpec` from the dictionary of a HuggingFace `config.json`.

    `name` defaults to `_name_or_path`, then to `model_type`. Raises `ModelConfigError` (a
    `ValueError`) naming the field and model_type when the config cannot be read, and naming the
    model type and the supported families when it is not one of them.
    """
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"a config must be a JSON object, got {type(config).__name__}")
    notes: list[str] = []
    text = config.get("text_config")
    if isinstance(text, Mapping) and not any(k in config for k in HIDDEN):
        _refuse_unmodelled(config, str(config.get("model_type") or "untyped"))
        notes = _towers(config)
        config = {**text, "_name_or_path": config.get("_name_or_path")}
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ModelConfigError(f"config: model_type must be a string, got {model_type!r}")
    family = _family_of(model_type)
    _refuse_unmodelled(config, family)
    fam = FAMILIES[family]
    if fam.defaults:  # the configuration class's defaults where the config is silent (null = absent)
        config = {**fam.defaults, **{k: v for k, v in config.items() if v is not None}}
    c = ConfigFields(config, family)
    fields = _read(c, family)
    notes += [f"{key}: {why}" for key, why in fam.cost_free if config.get(key) not in (None, False)]
    if fam.hybrid:
        notes.append(
            "attention layers use no position encoding (transformers NemotronHAttention): priced as RoPE, "
            "whose rotation has no parameters or matmul FLOPs (its elementwise traffic is counted)"
        )
    fields["notes"] = tuple(notes)
    fields["name"] = name or config.get("_name_or_path") or model_type or "custom"
    no_dense_width = fields["ffn_hidden_size"] is None
    if no_dense_width:  # allowed when every layer is MoE; the field is then unused
        if not fields.get("num_experts"):
            c.integer(*FFN)  # raises, naming the field
        fields["ffn_hidden_size"] = fields["moe_ffn_hidden_size"]
    try:
        spec = ModelSpec(**fields)
    except ValidationError as exc:
        problems = "; ".join(
            ".".join(map(str, e["loc"])) + ": " * bool(e["loc"]) + str(e["msg"]).removeprefix("Value error, ")
            for e in exc.errors()
        )
        raise c.error(f"inconsistent shape: {problems}") from exc
    if no_dense_width and spec.dense_layer_count:
        c.integer(*FFN)  # raises: dense layers need their width
    return spec


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """Read a `config.json` (or the `config.json` inside a model directory) as a dictionary."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{p}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelConfigError(f"{p}: a config must be a JSON object, got {type(data).__name__}")
    return data


def load_hf_spec(path: str | Path, name: str | None = None) -> ModelSpec:
    """`from_hf_config(load_hf_config(path))`; `name` defaults to the config's `_name_or_path`."""
    return from_hf_config(load_hf_config(path), name)
