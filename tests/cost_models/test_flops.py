"""Analytic FLOP identities (the ground truth against PyTorch's FlopCounterMode lives in
tests/runtime/test_flops.py)."""

import pytest

from cost_models.flops import attention_pairs, step_flops
from model_specs.params import count_params
from model_specs.spec import ModelSpec

LLAMA8B = ModelSpec(
    name="l", vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336
)
GPT = ModelSpec(
    name="g", vocab_size=51200, hidden_size=2048, num_layers=24, num_heads=16, ffn_hidden_size=8192, mlp="gelu",
    norm="layernorm",
)


def test_matmul_flops_are_6nt_over_gemm_weights() -> None:
    pc = count_params(LLAMA8B)
    norms = pc.final_norm + sum(layer.norms for layer in pc.layers)
    gemm_weights = pc.total - pc.embedding - norms
    f = step_flops(LLAMA8B, seq_len=8192, sequences=4)
    assert f.matmul_flops == pytest.approx(6 * gemm_weights * 8192 * 4, rel=1e-12)


def test_megatron_gpt_formula() -> None:
    # Narayanan et al. 2021 without recompute: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) per step
    b, s, layers, h, v = 8, 2048, GPT.num_layers, GPT.hidden_size, GPT.vocab_size
    expected = 72 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
    assert step_flops(GPT, s, b).model_flops == pytest.approx(expected, rel=1e-12)


def test_causal_halves_attention_and_recompute_adds_forward() -> None:
    s = 4096
    assert attention_pairs(LLAMA8B, 0, s, "causal") == s * (s + 1) / 2
    none = step_flops(LLAMA8B, s, 1)
    full = step_flops(LLAMA8B, s, 1, recompute="full")
    assert none.model_flops == full.model_flops  # model FLOPs ignore recompute
    assert full.hardware_flops > none.hardware_flops
    # full recompute re-runs the layers' forward: about one third more work (LM head excluded)
    assert full.hardware_flops / none.hardware_flops == pytest.approx(4 / 3, rel=0.05)


def test_sliding_window_pairs() -> None:
    m = LLAMA8B.model_copy(update={"sliding_window": 128})
    assert attention_pairs(m, 0, 1024, "causal") == 128 * 129 / 2 + (1024 - 128) * 128
    assert attention_pairs(m, 0, 64, "causal") == 64 * 65 / 2
