"""ModelSpec validation and derived shape; TrainingSpec bytes per parameter and batch derivation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from model_specs.spec import ModelSpec, TrainingSpec

BASE = dict(vocab_size=512, hidden_size=128, num_layers=4, num_heads=8, ffn_hidden_size=384)
MOE = dict(BASE, num_experts=8, moe_top_k=2, moe_ffn_hidden_size=64)
MLA = dict(
    BASE, attention="mla", q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16
)


def spec(**kw) -> ModelSpec:
    return ModelSpec(**{**BASE, **kw})


# ---- validation ---------------------------------------------------------------------------------
def test_heads_must_be_a_multiple_of_kv_heads():
    with pytest.raises(ValidationError, match=r"num_heads \(8\) must be a multiple of num_kv_heads \(3\)"):
        spec(num_kv_heads=3)


@pytest.mark.parametrize("missing", ["kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"])
def test_mla_needs_its_ranks(missing):
    with pytest.raises(ValidationError, match=f"{missing} is required when attention is 'mla'"):
        ModelSpec(**{**MLA, missing: None})


def test_mla_without_q_lora_is_allowed():
    assert ModelSpec(**{**MLA, "q_lora_rank": None}).attention_kind == "mla"


@pytest.mark.parametrize("top_k", [0, 9])
def test_top_k_must_be_within_experts(top_k):
    with pytest.raises(ValidationError, match=rf"moe_top_k \({top_k}\) must be in 1..num_experts \(8\)"):
        ModelSpec(**{**MOE, "moe_top_k": top_k})


def test_moe_needs_expert_width():
    with pytest.raises(ValidationError, match="moe_ffn_hidden_size is required"):
        ModelSpec(**{**MOE, "moe_ffn_hidden_size": None})


def test_moe_fields_need_experts():
    with pytest.raises(ValidationError, match="need num_experts > 0"):
        spec(moe_top_k=2)
    with pytest.raises(ValidationError, match="need num_experts > 0"):
        spec(num_shared_experts=1)


def test_moe_layer_pattern_must_select_a_layer():
    with pytest.raises(ValidationError, match="first_k_dense_layers must be below num_layers"):
        ModelSpec(**{**MOE, "first_k_dense_layers": 4})
    with pytest.raises(ValidationError, match=r"moe_layer_offset \(2\) must be below moe_layer_freq \(2\)"):
        ModelSpec(**{**MOE, "moe_layer_freq": 2, "moe_layer_offset": 2})
    with pytest.raises(ValidationError, match="selects no layer"):
        ModelSpec(**{**MOE, "dense_layers": (0, 1, 2, 3)})


def test_layer_indices_must_exist():
    with pytest.raises(ValidationError, match=r"dense_layers \[4\] outside 0..3"):
        ModelSpec(**{**MOE, "dense_layers": (4,)})
    with pytest.raises(ValidationError, match=r"sliding_window_layers \[-1\] outside 0..3"):
        spec(sliding_window=16, sliding_window_layers=(-1,))
    with pytest.raises(ValidationError, match="sliding_window_layers needs sliding_window"):
        spec(sliding_window_layers=(0,))


def test_sizes_must_be_positive_and_fields_known():
    with pytest.raises(ValidationError):
        spec(hidden_size=0)
    with pytest.raises(ValidationError):
        spec(hiden_size=128)  # extra="forbid" catches typos


def test_spec_is_frozen_and_hashable():
    s = spec()
    with pytest.raises(ValidationError):
        s.hidden_size = 256
    assert hash(s) == hash(spec()) and s == spec()


# ---- derived shape ------------------------------------------------------------------------------
def test_attention_kinds_and_head_dims():
    assert spec().attention_kind == "mha" and spec().kv_heads == 8
    assert spec(num_kv_heads=2).attention_kind == "gqa"
    assert spec(num_kv_heads=1).attention_kind == "mqa"
    assert spec().qk_head_dim == spec().v_dim == 16
    assert spec(head_dim=32).qk_head_dim == 32
    mla = ModelSpec(**MLA)
    assert mla.attention_kind == "mla" and mla.qk_head_dim == 24 and mla.v_dim == 16


def test_gated_mlp():
    assert spec().gated_mlp and spec(mlp="geglu").gated_mlp
    assert not any(spec(mlp=m).gated_mlp for m in ("gelu", "relu", "relu2", "silu"))


def test_moe_layer_patterns():
    assert [ModelSpec(**MOE).is_moe_layer(i) for i in range(4)] == [True] * 4
    assert not spec().is_moe_layer(0) and spec().moe_layer_count == 0 and spec().dense_layer_count == 4
    deepseek = ModelSpec(**{**MOE, "first_k_dense_layers": 1})
    assert deepseek.moe_layer_count == 3 and deepseek.dense_layer_count == 1
    every_other = ModelSpec(**{**MOE, "moe_layer_freq": 2})  # DeepSeek moe_layer_freq=2: layers 0, 2
    assert [every_other.is_moe_layer(i) for i in range(4)] == [True, False, True, False]
    qwen_step = ModelSpec(**{**MOE, "moe_layer_freq": 2, "moe_layer_offset": 1})  # decoder_sparse_step=2
    assert [qwen_step.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    holes = ModelSpec(**{**MOE, "dense_layers": (2,)})
    assert [holes.is_moe_layer(i) for i in range(4)] == [True, True, False, True]


def test_sliding_window_layers():
    assert not spec().uses_sliding_window(0)
    assert all(spec(sliding_window=64).uses_sliding_window(i) for i in range(4))
    alternating = spec(sliding_window=64, sliding_window_every=2)
    assert [alternating.uses_sliding_window(i) for i in range(4)] == [True, False, True, False]
    listed = spec(sliding_window=64, sliding_window_layers=(2, 3))
    assert [listed.uses_sliding_window(i) for i in range(4)] == [False, False, True, True]


# ---- TrainingSpec -------------------------------------------------------------------------------
def test_bf16_adamw_is_16_bytes_per_param():
    t = TrainingSpec(seq_len=4096, global_batch=8)
    assert (t.param_bytes, t.grad_bytes, t.optimizer_bytes) == (2, 2, 12)
    assert t.bytes_per_param == 16


def test_fp32_grads_add_two_bytes():
    assert TrainingSpec(seq_len=4096, global_batch=8, grad_dtype="fp32").bytes_per_param == 18


def test_other_precisions_and_optimizers():
    assert TrainingSpec(seq_len=8, global_batch=1, precision="fp8").bytes_per_param == 16
    assert TrainingSpec(seq_len=8, global_batch=1, precision="fp16").activation_bytes == 2
    fp32 = TrainingSpec(seq_len=8, global_batch=1, precision="fp32")
    assert fp32.bytes_per_param == 4 + 4 + 8 and fp32.activation_bytes == 4
    assert TrainingSpec(seq_len=8, global_batch=1, optimizer="sgd").bytes_per_param == 2 + 2 + 4


def test_global_batch_tokens_derives_sequences():
    t = TrainingSpec(seq_len=4096, global_batch_tokens=4 * 1024 * 1024)
    assert t.global_batch == 1024 and t.tokens_per_step == 4 * 1024 * 1024
    assert TrainingSpec(seq_len=4096, global_batch=1024, global_batch_tokens=4 * 1024 * 1024).global_batch == 1024
    assert TrainingSpec(seq_len=2048, global_batch=16).tokens_per_step == 32768


def test_global_batch_errors():
    with pytest.raises(ValidationError, match=r"global_batch_tokens \(5000\) is not a multiple of seq_len \(4096\)"):
        TrainingSpec(seq_len=4096, global_batch_tokens=5000)
    with pytest.raises(ValidationError, match=r"global_batch \(3\) disagrees with global_batch_tokens / seq_len \(2\)"):
        TrainingSpec(seq_len=4096, global_batch=3, global_batch_tokens=8192)
    with pytest.raises(ValidationError, match="global_batch .* is required"):
        TrainingSpec(seq_len=4096)
    with pytest.raises(ValidationError):
        TrainingSpec(seq_len=0, global_batch=1)


# ---- hybrid Mamba-2 models (hybrid_pattern) --------------------------------------------------------

_HYBRID = dict(
    vocab_size=512, hidden_size=64, num_layers=4, num_heads=4, ffn_hidden_size=128, mlp="relu2",
    hybrid_pattern="M*-M", mamba_num_heads=8, mamba_head_dim=16, mamba_state_size=16, mamba_groups=2,
)


def test_hybrid_pattern_names_one_mixer_per_layer():
    spec = ModelSpec(**_HYBRID)
    assert [spec.layer_mixer(i) for i in range(4)] == ["mamba", "attention", "mlp", "mamba"]
    assert [spec.has_attention(i) for i in range(4)] == [False, True, False, False]
    assert [spec.has_ffn(i) for i in range(4)] == [False, False, True, False]
    assert spec.norms_per_layer == 1 and spec.tp_blocks_per_layer == 1 and spec.dense_layer_count == 1
    assert spec.mamba_inner == 128 and spec.mamba_conv_dim == 128 + 2 * 2 * 16 and spec.mamba_in_proj_width == 128 + 192 + 8
    assert ModelSpec(**{**_HYBRID, "hybrid_pattern": None, "mamba_num_heads": None, "mamba_head_dim": None,
                        "mamba_state_size": None}).layer_mixer(0) == "transformer"


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"hybrid_pattern": "M*-"}, "3 symbols for 4 layers"),
        ({"hybrid_pattern": "M*-X"}, r"unknown symbol\(s\) \['X'\]"),
        ({"mamba_state_size": None}, "Mamba layers \\(M\\) need mamba_state_size"),
        ({"mamba_groups": 3}, "multiple of mamba_groups"),
        ({"hybrid_pattern": "M*-E"}, "MoE layers \\(E\\)"),
        ({"sliding_window": 16}, "no MLA, no sliding window"),
        ({"hybrid_pattern": None}, "need a hybrid_pattern"),
    ],
)
def test_hybrid_pattern_is_validated(update, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec(**{**_HYBRID, **update})
