"""Presets: names, lookup, and the published parameter counts of the models they describe."""

from __future__ import annotations

import json

import pytest

from model_specs.params import count_params
from model_specs.presets import PRESETS, UnknownModelError, get_model, list_models

REQUIRED = [
    "llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3",
    "qwen3-235b-a22b", "tiny", "tiny-moe", "tiny-mla",
]


def test_required_presets_exist():
    assert set(REQUIRED) <= set(list_models())
    assert list_models() == sorted(list_models()) == list(PRESETS) and len(PRESETS) == len(list_models())


@pytest.mark.parametrize("name", list_models())
def test_every_preset_builds_and_is_named_after_its_file(name):
    spec = get_model(name)
    assert spec.name == name
    c = count_params(spec)
    assert 0 < c.active <= c.total


def test_lookup_is_case_insensitive_and_cached():
    assert get_model("Llama3-8B") is get_model("llama3-8b") is PRESETS["LLAMA3-8B"]
    assert get_model("llama-3.1-70b").name == "llama3-70b"  # alias


def test_unknown_name_lists_presets():
    with pytest.raises(UnknownModelError, match=r"unknown model 'llama9-1t': not a preset \(bloom-560m, .*tiny-mla"):
        get_model("llama9-1t")
    with pytest.raises(KeyError):
        PRESETS["nope"]
    with pytest.raises(KeyError) as err:  # UnknownModelError is a KeyError with a readable message
        get_model("nope")
    assert str(err.value).startswith("unknown model 'nope'")


def test_get_model_never_reads_a_path(tmp_path):
    """A name may come from a request: a path to a config.json on the server is not a preset."""
    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for ref in (str(tmp_path), str(tmp_path / "config.json")):
        with pytest.raises(UnknownModelError, match="not a preset"):
            get_model(ref)


def test_cli_reads_a_local_config_path(tmp_path):
    from autopar.cli import _model_ref

    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for ref in (str(tmp_path), str(tmp_path / "config.json")):
        assert _model_ref(ref)["hf_config"]["hidden_size"] == 64
    assert _model_ref("llama3-8b") == "llama3-8b"


# ---- published totals (HF num_parameters) -------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "total", "active"),
    [
        ("llama3-8b", 8_030_261_248, 8_030_261_248),
        ("llama3-70b", 70_553_706_496, 70_553_706_496),
        ("llama3-405b", 405_853_388_800, 405_853_388_800),
        ("mixtral-8x7b", 46_702_792_704, 12_879_925_248),
        ("mixtral-8x22b", 140_620_634_112, 39_152_031_744),  # base v0.1, vocab 32000 ("141B" / "39B")
    ],
)
def test_exact_counts(name, total, active):
    c = count_params(get_model(name))
    assert (c.total, c.active) == (total, active)


def test_gpt3_175b():
    spec = get_model("gpt3-175b")
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.vocab_size) == (96, 12288, 96, 50257)
    assert spec.ffn_hidden_size == 4 * 12288 and spec.mlp == "gelu" and spec.norm == "layernorm"
    assert spec.position_embedding == "learned" and spec.max_position_embeddings == 2048 and spec.tie_embeddings
    h, L = 12288, 96
    by_hand = L * (12 * h * h + 13 * h) + 50257 * h + 2048 * h + 2 * h
    assert count_params(spec).total == by_hand == 174_604_259_328  # "175B"


def test_deepseek_v3():
    spec = get_model("deepseek-v3")
    c = count_params(spec)
    print(f"DeepSeek-V3 (61 layers, no MTP): total {c.total:,} active {c.active:,}")
    assert spec.attention_kind == "mla" and spec.moe_layer_count == 58 and spec.mtp_layers == 1
    # 671B main model (technical report); exact, see test_hf for the reconciliation with the Hub count.
    assert c.total == 671_026_419_200
    # By hand: MLA attention, 3 dense layers, 58 MoE layers with 8 of 256 routed + 1 shared expert.
    h = 7168
    attn = h * 1536 + 1536 + 1536 * 128 * 192 + h * 576 + 512 + 512 * 128 * 256 + 128 * 128 * h
    expert = 3 * h * 2048
    moe_active = attn + 2 * h + 9 * expert + h * 256 + 256
    dense = attn + 2 * h + 3 * h * 18432
    active = 58 * moe_active + 3 * dense + 2 * 129280 * h + h
    assert c.active == active == 37_552_297_472
    # "37B activated": ours includes the input embedding table (0.93B); without it, 36.6B.
    assert abs(c.active - 37e9) / 37e9 < 0.015
    assert abs(c.active - c.embedding - 37e9) / 37e9 < 0.015


def test_qwen3_235b_a22b():
    spec = get_model("qwen3-235b-a22b")
    c = count_params(spec)
    assert spec.qk_norm and spec.moe_layer_count == 94 and spec.kv_heads == 4
    assert abs(c.total - 235.1e9) / 235.1e9 < 1e-3 and abs(c.active - 22.2e9) / 22.2e9 < 1e-3
    assert (c.total, c.active) == (235_093_634_560, 22_190_763_520)


def test_qwen3_30b_a3b():
    c = count_params(get_model("qwen3-30b-a3b"))
    assert abs(c.total - 30.5e9) < 0.05e9 and abs(c.active - 3.3e9) < 0.06e9


# ---- tiny models for CPU tests ------------------------------------------------------------------
def test_tiny():
    s = get_model("tiny")
    assert (s.num_layers, s.hidden_size, s.num_heads, s.kv_heads, s.ffn_hidden_size, s.vocab_size) == (
        4, 128, 8, 2, 384, 512
    )
    assert s.attention_kind == "gqa" and s.mlp == "swiglu" and not s.is_moe
    assert count_params(s).total == 885_888


def test_tiny_moe():
    s = get_model("tiny-moe")
    assert (s.num_layers, s.hidden_size, s.num_experts, s.moe_top_k, s.kv_heads) == (4, 128, 8, 2, 2)
    assert s.num_shared_experts == 1 and s.first_k_dense_layers == 1
    assert [s.is_moe_layer(i) for i in range(4)] == [False, True, True, True]
    c = count_params(s)
    assert (c.total, c.active) == (1_553_664, 890_112)


def test_tiny_mla():
    s = get_model("tiny-mla")
    assert s.attention_kind == "mla" and s.is_moe and s.first_k_dense_layers == 1 and s.num_shared_experts == 1
    assert s.qk_head_dim == 24 and s.v_dim == 16
    c = count_params(s)
    assert (c.total, c.active) == (1_147_416, 705_048)
