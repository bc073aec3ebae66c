"""count_params against hand arithmetic, piece by piece (the published totals live in test_hf/test_presets)."""

from __future__ import annotations

from model_specs.params import (
    attention_params,
    count_params,
    layer_params,
    mlp_params,
    norm_params,
    router_params,
    shared_experts_params,
)
from model_specs.spec import ModelSpec

H, V, F, L = 128, 512, 384, 4
BASE = dict(vocab_size=V, hidden_size=H, num_layers=L, num_heads=8, ffn_hidden_size=F)


def spec(**kw) -> ModelSpec:
    return ModelSpec(**{**BASE, **kw})


def test_dense_llama_style_by_hand():
    s = spec(num_kv_heads=2)  # head_dim 16, kv width 32
    attn = H * H + 2 * H * 32 + H * H
    mlp = 3 * H * F
    layer = attn + mlp + 2 * H
    c = count_params(s)
    assert attention_params(s) == attn and mlp_params(s, F) == mlp
    assert c.embedding == V * H and c.lm_head == V * H and c.final_norm == H
    assert c.total == c.active == 2 * V * H + H + L * layer
    assert c.non_embedding == H + L * layer


def test_tied_embeddings_drop_the_head():
    assert count_params(spec(tie_embeddings=True)).total == count_params(spec()).total - V * H


def test_gpt2_style_pieces():
    s = spec(mlp="gelu", norm="layernorm", qkv_bias=True, attn_out_bias=True, mlp_bias=True,
             position_embedding="learned", max_position_embeddings=64, tie_embeddings=True)
    assert attention_params(s) == 4 * H * H + 3 * H + H
    assert mlp_params(s, F) == 2 * H * F + F + H
    assert norm_params(s, H) == 2 * H
    c = count_params(s)
    assert c.embedding == V * H + 64 * H and c.lm_head == 0
    assert layer_params(s, 0).norms == 4 * H


def test_bloom_embedding_norm_counts_with_the_embedding():
    s = spec(norm="layernorm", embedding_norm=True, position_embedding="alibi")
    assert count_params(s).embedding == V * H + 2 * H


def test_gated_mlp_with_biases_gpt_oss_style():
    assert mlp_params(spec(mlp_bias=True), F) == 3 * H * F + 2 * F + H


def test_relu2_mlp_has_two_matrices():
    assert mlp_params(spec(mlp="relu2"), F) == 2 * H * F


def test_qk_norm_sinks_and_qkv_bias():
    plain = attention_params(spec(num_kv_heads=2))
    assert attention_params(spec(num_kv_heads=2, qk_norm=True)) == plain + 2 * 16
    assert attention_params(spec(num_kv_heads=2, attention_sinks=True)) == plain + 8
    assert attention_params(spec(num_kv_heads=2, qkv_bias=True)) == plain + H + 2 * 32


def test_head_dim_decoupled_from_hidden():
    s = spec(num_kv_heads=2, head_dim=32)  # q width 256 != hidden 128, as in Qwen3/Gemma
    assert attention_params(s) == H * 256 + 2 * H * 64 + 256 * H


def test_parallel_residual_and_window_do_not_change_counts():
    assert count_params(spec(parallel_residual=True, sliding_window=32)).total == count_params(spec()).total


MLA = dict(attention="mla", q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)


def test_mla_by_hand():
    s = spec(**MLA)
    q = H * 64 + 64 + 64 * 8 * 24  # q_a, q_a_layernorm, q_b
    kv = H * (32 + 8) + 32 + 32 * 8 * (16 + 16)  # kv_a_proj_with_mqa, kv_a_layernorm, kv_b
    o = 8 * 16 * H
    assert attention_params(s) == q + kv + o
    direct = spec(**{**MLA, "q_lora_rank": None})
    assert attention_params(direct) == H * 8 * 24 + kv + o
    biased = spec(**MLA, qkv_bias=True, attn_out_bias=True)  # DeepSeek attention_bias
    assert attention_params(biased) == q + kv + o + 64 + 32 + 8 + H


MOE = dict(num_experts=8, moe_top_k=2, moe_ffn_hidden_size=64)


def test_moe_layers_total_and_active():
    s = spec(**MOE, first_k_dense_layers=1, num_shared_experts=1, shared_expert_ffn_hidden_size=96,
             shared_expert_gate=True, router_bias=True, router_score_correction_bias=True)
    expert = 3 * H * 64
    assert router_params(s) == H * 8 + 8 + 8
    assert shared_experts_params(s) == 3 * H * 96 + H
    dense, moe = layer_params(s, 0), layer_params(s, 1)
    assert dense.routed_experts == 0 and dense.dense_mlp == 3 * H * F and dense.router == 0
    assert moe.dense_mlp == 0 and moe.routed_experts == 8 * expert and moe.routed_active == 2 * expert
    assert moe.total - moe.active == 6 * expert
    assert moe.non_expert == moe.total - 8 * expert
    c = count_params(s)
    assert c.total - c.active == 3 * 6 * expert
    assert c.total == c.embedding + c.lm_head + c.final_norm + dense.total + 3 * moe.total


def test_shared_expert_width_defaults_to_expert_width():
    s = spec(**MOE, num_shared_experts=2)  # DeepSeek: n_shared_experts x moe_intermediate_size
    assert shared_experts_params(s) == 2 * 3 * H * 64


def test_dense_model_has_no_expert_split():
    layer = layer_params(spec(), 0)
    assert layer.router == layer.shared_experts == layer.routed_experts == layer.routed_active == 0
    assert layer.non_expert == layer.total == layer.active
