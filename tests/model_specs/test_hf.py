"""HF config.json import: published parameter counts per family, field aliases, and errors.

Exact totals are HuggingFace `model.num_parameters()` of the named checkpoint (also what the Hub
shows from safetensors for bf16/fp16 checkpoints). The configs are the JSON files under
model_specs/data (copies of the checkpoints' config.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import model_specs
from model_specs.hf import FAMILIES, ModelConfigError, from_hf_config, load_hf_config, load_hf_spec
from model_specs.params import count_params, layer_params

DATA = Path(model_specs.__file__).parent / "data"


def config(name: str) -> dict:
    return load_hf_config(DATA / f"{name}.json")


def totals(cfg: dict) -> tuple[int, int]:
    c = count_params(from_hf_config(cfg))
    return c.total, c.active


# ---- published counts per family -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("preset", "total"),
    [
        ("gpt2", 124_439_808),  # openai-community/gpt2
        ("gpt-neox-20b", 20_554_567_680),  # EleutherAI/gpt-neox-20b
        ("bloom-560m", 559_214_592),  # bigscience/bloom-560m (includes word_embeddings_layernorm)
        ("qwen2-0.5b", 494_032_768),  # Qwen/Qwen2-0.5B (qkv bias, tied)
        ("mistral-7b", 7_241_732_096),  # mistralai/Mistral-7B-v0.1
    ],
)
def test_exact_dense_totals(preset, total):
    assert totals(config(preset)) == (total, total)


def test_qwen1_5_moe_a2_7b():
    total, active = totals(config("qwen1.5-moe-a2.7b"))
    assert total == 14_315_784_192  # "14.3B"; shared expert 5632 wide with a sigmoid gate
    assert active == 2_689_173_504  # "2.7B activated"


@pytest.mark.parametrize(("preset", "total", "active"), [("gpt-oss-20b", 20.91e9, 3.61e9), ("gpt-oss-120b", 116.83e9, 5.13e9)])
def test_gpt_oss(preset, total, active):
    # OpenAI's model card: 20.91B / 3.61B and 116.83B / 5.13B. Its "active" leaves out the input
    # embedding table (a lookup), so compare against active - embedding.
    spec = from_hf_config(config(preset))
    c = count_params(spec)
    assert abs(c.total - total) < 0.005e9
    assert abs(c.active - c.embedding - active) < 0.005e9
    assert spec.attention_sinks and spec.router_bias and spec.mlp_bias and spec.qkv_bias and spec.attn_out_bias
    assert spec.sliding_window == 128 and [spec.uses_sliding_window(i) for i in range(3)] == [True, False, True]


def test_gpt_oss_20b_exact():
    assert totals(config("gpt-oss-20b")) == (20_914_757_184, 4_187_440_704)


def test_nemotron_4_340b():
    spec = from_hf_config(config("nemotron-4-340b"))
    assert spec.mlp == "relu2" and spec.norm == "layernorm" and not spec.gated_mlp
    c = count_params(spec)
    # Nemotron-4 340B report: 9.4B embedding + 331.6B non-embedding parameters.
    assert c.total == 341_029_195_776
    assert abs(c.embedding + c.lm_head - 9.4e9) < 0.05e9 and abs(c.non_embedding - 331.6e9) < 0.05e9


def test_deepseek_v2_lite():
    spec = from_hf_config(config("deepseek-v2-lite"))
    assert spec.q_lora_rank is None and spec.num_shared_experts == 2 and not spec.router_score_correction_bias
    c = count_params(spec)
    assert c.total == 15_706_484_224  # "15.7B"
    assert abs(c.active - c.embedding - 2.4e9) < 0.1e9  # "2.4B activated" (without the input table)


def test_deepseek_v3_total_matches_hub_count_with_mtp_and_fp8_scales():
    """The Hub's 684,531,386,000 = 61 layers + embeddings (671,026,419,200) + the MTP module (one
    MoE layer, enorm, hnorm, eh_proj, its norm and its copies of embed/head) + FP8 block scales."""
    spec = from_hf_config(config("deepseek-v3"))
    c = count_params(spec)
    h = spec.hidden_size
    mtp = layer_params(spec, spec.num_layers - 1).total + 2 * h + 2 * h * h + h + c.embedding + c.lm_head
    scales = 41_540_496  # fp32 scale_inv per 128x128 block of every quantized linear (62 layers)
    assert spec.mtp_layers == 1
    assert c.total == 671_026_419_200
    assert c.total + mtp + scales == 684_531_386_000


# ---- family rules ---------------------------------------------------------------------------------
def test_family_flags():
    neox = from_hf_config(config("gpt-neox-20b"))
    assert neox.parallel_residual and neox.mlp == "gelu" and neox.qkv_bias and not neox.tie_embeddings
    gpt2 = from_hf_config(config("gpt2"))
    assert gpt2.position_embedding == "learned" and gpt2.max_position_embeddings == 1024 and gpt2.tie_embeddings
    bloom = from_hf_config(config("bloom-560m"))
    assert bloom.position_embedding == "alibi" and bloom.embedding_norm and bloom.ffn_hidden_size == 4096
    qwen2 = from_hf_config(config("qwen2-0.5b"))
    assert qwen2.qkv_bias and not qwen2.attn_out_bias and qwen2.sliding_window is None  # use_sliding_window false
    qwen3 = from_hf_config(config("qwen3-0.6b"))
    assert qwen3.qk_norm and qwen3.head_dim == 128 and not qwen3.qkv_bias
    mistral = from_hf_config(config("mistral-7b"))
    assert mistral.sliding_window == 4096 and mistral.uses_sliding_window(31)
    llama = from_hf_config(config("llama3-8b"))
    assert llama.family == "llama" and llama.mlp == "swiglu" and llama.attention_kind == "gqa"


def test_every_listed_family_is_supported():
    expected = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2",
                "deepseek_v3", "gpt_oss", "gpt2", "gpt_neox", "bloom", "nemotron", "phi3", "granite", "olmo2",
                "gemma", "gemma2", "gemma3_text", "llama4_text", "nemotron_h"}
    assert set(FAMILIES) == expected


def test_attention_and_mlp_bias_flags_follow_the_config():
    cfg = config("tiny") | {"attention_bias": True, "mlp_bias": True}
    spec = from_hf_config(cfg)
    assert spec.qkv_bias and spec.attn_out_bias and spec.mlp_bias


def test_gelu_maps_to_geglu_in_gated_families():
    assert from_hf_config(config("tiny") | {"hidden_act": "gelu_pytorch_tanh"}).mlp == "geglu"


def test_qwen_sliding_window_from_max_window_layers():
    cfg = config("qwen2-0.5b") | {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20}
    spec = from_hf_config(cfg)
    assert spec.sliding_window == 4096 and spec.sliding_window_layers == (20, 21, 22, 23)
    all_layers = from_hf_config(cfg | {"max_window_layers": 0})
    assert all_layers.sliding_window_layers is None and all_layers.sliding_window_every == 1


def test_layer_types_irregular_pattern():
    types = ["sliding_attention"] * 3 + ["full_attention"]
    spec = from_hf_config(config("tiny") | {"sliding_window": 64, "layer_types": types})
    assert spec.sliding_window_layers == (0, 1, 2)
    with pytest.raises(ModelConfigError, match="layer_types has 1 entries for 4 layers"):
        from_hf_config(config("tiny") | {"sliding_window": 64, "layer_types": ["full_attention"]})


def test_qwen_moe_layer_pattern():
    base = config("tiny-moe")
    assert from_hf_config(base).first_k_dense_layers == 1  # mlp_only_layers [0] is a dense prefix
    step2 = from_hf_config(base | {"mlp_only_layers": [], "decoder_sparse_step": 2})
    assert [step2.is_moe_layer(i) for i in range(4)] == [False, True, False, True]  # (i + 1) % 2 == 0
    holes = from_hf_config(base | {"mlp_only_layers": [2]})
    assert [holes.is_moe_layer(i) for i in range(4)] == [True, True, False, True]


def test_deepseek_moe_layer_freq_and_router_bias():
    cfg = config("tiny-mla")
    spec = from_hf_config(cfg | {"first_k_dense_replace": 0, "moe_layer_freq": 2})
    assert [spec.is_moe_layer(i) for i in range(4)] == [True, False, True, False]  # i % 2 == 0
    assert from_hf_config(cfg).router_score_correction_bias
    assert not from_hf_config(cfg | {"topk_method": "greedy"}).router_score_correction_bias


def test_mixtral_8x22b_instruct_vocab():
    # Mixtral-8x22B-Instruct-v0.1 / v0.3 have a 32768-token vocabulary (base v0.1: 32000).
    assert totals(config("mixtral-8x22b") | {"vocab_size": 32768})[0] == 140_630_071_296


# ---- aliases --------------------------------------------------------------------------------------
def test_gpt2_aliases_and_defaults():
    cfg = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "vocab_size": 100}
    spec = from_hf_config(cfg)
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.ffn_hidden_size) == (64, 2, 4, 256)
    assert from_hf_config(cfg | {"n_inner": 100}).ffn_hidden_size == 100
    assert from_hf_config(cfg | {"activation_function": "relu"}).mlp == "relu"


def test_generic_aliases():
    cfg = {
        "model_type": "llama",
        "n_embd": 64, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "ffn_hidden_size": 128, "padded_vocab_size": 100,
    }
    spec = from_hf_config(cfg)
    assert spec.family == "llama" and spec.name == "llama"
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.kv_heads, spec.ffn_hidden_size) == (
        64, 2, 4, 2, 128
    )
    mqa = {k: v for k, v in cfg.items() if k != "n_head_kv"} | {"multi_query": True}
    assert from_hf_config(mqa).attention_kind == "mqa"


@pytest.mark.parametrize("experts_key", ["num_local_experts", "num_experts", "n_routed_experts"])
@pytest.mark.parametrize("top_k_key", ["num_experts_per_tok", "top_k", "moe_topk", "experts_per_token"])
def test_moe_aliases(experts_key, top_k_key):
    cfg = {k: v for k, v in config("mixtral-8x7b").items() if k not in ("num_local_experts", "num_experts_per_tok")}
    spec = from_hf_config(cfg | {experts_key: 8, top_k_key: 2})
    assert spec.num_experts == 8 and spec.moe_top_k == 2 and spec.moe_ffn_hidden_size == 14336


def test_unknown_model_type_is_refused_even_with_llama_fields():
    cfg = config("llama3-8b") | {"model_type": "my_llama"}
    with pytest.raises(ModelConfigError, match=r"model_type 'my_llama' is not a supported family; autopar does not guess .*llama4_text"):
        from_hf_config(cfg)
    untyped = {k: v for k, v in cfg.items() if k != "model_type"}
    with pytest.raises(ModelConfigError, match=r"no model_type; name the family .*'llama'"):
        from_hf_config(untyped)


def test_text_config_of_multimodal_configs():
    cfg = {"model_type": "llava", "_name_or_path": "x/vlm", "text_config": config("tiny")}
    spec = from_hf_config(cfg)
    assert spec.name == "x/vlm" and spec.hidden_size == 128


def test_name_defaults():
    assert from_hf_config(config("llama3-8b")).name == "meta-llama/Llama-3.1-8B"
    assert from_hf_config(config("llama3-8b"), name="mine").name == "mine"
    no_name = {k: v for k, v in config("tiny").items() if k != "_name_or_path"}
    assert from_hf_config(no_name).name == "llama"


# ---- errors ---------------------------------------------------------------------------------------
def test_missing_hidden_size_names_field_and_model_type():
    cfg = {k: v for k, v in config("qwen2-0.5b").items() if k != "hidden_size"}
    with pytest.raises(ModelConfigError, match=r"qwen2 config: missing required field 'hidden_size' \(also looked for"):
        from_hf_config(cfg)


def test_bad_types():
    with pytest.raises(ModelConfigError, match="llama config: field 'hidden_size' must be an integer, got '4096'"):
        from_hf_config(config("llama3-8b") | {"hidden_size": "4096"})
    with pytest.raises(ModelConfigError, match="field 'num_hidden_layers' must be an integer, got True"):
        from_hf_config(config("llama3-8b") | {"num_hidden_layers": True})
    with pytest.raises(ModelConfigError, match="field 'tie_word_embeddings' must be true or false"):
        from_hf_config(config("llama3-8b") | {"tie_word_embeddings": "no"})
    with pytest.raises(ModelConfigError, match="model_type must be a string"):
        from_hf_config({"model_type": 3})
    with pytest.raises(ModelConfigError, match="must be a JSON object"):
        from_hf_config([1, 2])  # type: ignore[arg-type]
    assert from_hf_config(config("tiny") | {"hidden_size": 128.0}).hidden_size == 128


def test_unknown_family_without_llama_fields():
    with pytest.raises(ModelConfigError, match=r"model_type 't5' is not a supported family"):
        from_hf_config({"model_type": "t5", "d_model": 512, "num_layers": 6, "vocab_size": 32128})


def test_inconsistent_shapes_are_config_errors():
    with pytest.raises(ModelConfigError, match=r"llama config: inconsistent shape: num_heads \(32\) must be a multiple"):
        from_hf_config(config("llama3-8b") | {"num_key_value_heads": 5})
    with pytest.raises(ModelConfigError, match=r"mixtral config: inconsistent shape: moe_top_k \(9\)"):
        from_hf_config(config("mixtral-8x7b") | {"num_experts_per_tok": 9})
    assert issubclass(ModelConfigError, ValueError)


def test_missing_moe_and_mla_fields():
    with pytest.raises(ModelConfigError, match="deepseek_v3 config: missing required field 'kv_lora_rank'"):
        from_hf_config({k: v for k, v in config("deepseek-v3").items() if k != "kv_lora_rank"})
    with pytest.raises(ModelConfigError, match="qwen3_moe config: missing required field 'moe_intermediate_size'"):
        from_hf_config({k: v for k, v in config("qwen3-235b-a22b").items() if k != "moe_intermediate_size"})
    with pytest.raises(ModelConfigError, match="missing required field 'num_experts_per_tok'"):
        from_hf_config({k: v for k, v in config("mixtral-8x7b").items() if k != "num_experts_per_tok"})
    dense = {k: v for k, v in config("tiny").items() if k != "intermediate_size"}
    with pytest.raises(ModelConfigError, match="missing required field 'intermediate_size'"):
        from_hf_config(dense)


def test_moe_only_config_may_omit_dense_width():
    cfg = {k: v for k, v in config("qwen3-235b-a22b").items() if k != "intermediate_size"}
    assert from_hf_config(cfg).ffn_hidden_size == 1536
    with pytest.raises(ModelConfigError, match="missing required field 'intermediate_size'"):
        from_hf_config(cfg | {"mlp_only_layers": [3]})


def test_unsupported_activation():
    with pytest.raises(ModelConfigError, match="unsupported activation 'relu' for a gated MLP"):
        from_hf_config(config("tiny") | {"hidden_act": "relu"})


# ---- files ----------------------------------------------------------------------------------------
def test_load_from_file_and_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config("tiny")))
    assert load_hf_config(tmp_path) == load_hf_config(tmp_path / "config.json") == config("tiny")
    assert load_hf_spec(tmp_path).hidden_size == 128


def test_load_errors(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        load_hf_config(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ModelConfigError, match="must be a JSON object"):
        load_hf_config(tmp_path / "list.json")
    with pytest.raises(FileNotFoundError):
        load_hf_config(tmp_path / "missing.json")
