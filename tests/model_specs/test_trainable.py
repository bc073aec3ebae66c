"""Trainable and frozen parameters under LoRA (Hu et al. 2021): r x (in + out) per adapted module."""

import pytest

from cost_models.flops import layer_matmuls
from model_specs.params import adapted_names, count_params, layer_linears, trainable_counts
from model_specs.presets import get_model
from model_specs.spec import LORA_MODULE_NAMES


@pytest.mark.parametrize("name", ["llama3-8b", "mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b", "gpt2"])
def test_linears_are_the_gemm_weights(name: str) -> None:
    """The linears of a layer hold exactly the GEMM weights FLOPs are counted from (routed experts
    all of them, not top-k)."""
    m = get_model(name)
    for i in {0, m.num_layers - 1}:
        mm = layer_matmuls(m, i)
        routed_all = mm.routed_active // m.moe_top_k * m.num_experts if m.is_moe_layer(i) else 0
        gate = m.hidden_size if m.is_moe_layer(i) and m.shared_expert_gate else 0
        expected = mm.attention + mm.dense_mlp + mm.router + mm.shared_experts - gate + routed_all
        assert sum(x.params for x in layer_linears(m, i)) == expected


def test_llama3_8b_rank16_all_linear_matches_peft() -> None:
    """PEFT's print_trainable_parameters for Llama-3-8B with r=16 on q,k,v,o,gate,up,down:
    "trainable params: 41,943,040"."""
    c = trainable_counts(get_model("llama3-8b"), "lora", LORA_MODULE_NAMES, 16)
    assert c.trainable == c.adapters == 41_943_040
    assert c.frozen == count_params(get_model("llama3-8b")).total == 8_030_261_248


def test_full_training_trains_everything() -> None:
    m = get_model("llama3-8b")
    c = trainable_counts(m, "full")
    assert (c.trainable, c.frozen, c.adapters) == (count_params(m).total, 0, 0)


def test_targets_are_matched_on_the_model() -> None:
    assert adapted_names(get_model("llama3-8b"), ("q_proj", "kv_b_proj")) == ("q_proj",)
    assert adapted_names(get_model("deepseek-v3"), LORA_MODULE_NAMES) == (
        "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    )
    assert adapted_names(get_model("gpt2"), ("gate_proj",)) == ()  # a non-gated MLP has up and down only
