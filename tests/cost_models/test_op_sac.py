"""torchtitan's op-level selective checkpointing (cost_models.op_sac) against its policy."""

from __future__ import annotations

import pytest

from cost_models import op_sac
from cost_models.activations import ActivationContext, layer_activation_bytes
from model_specs.presets import get_model


def test_llama_block_saves_q_v_w1_w2_and_the_attention_output() -> None:
    model = get_model("llama3-8b")
    names = [m.name for m in op_sac.block_matmuls(model, 0)]
    assert names == ["q", "k", "v", "o", "w1", "w3", "w2"]
    assert [m.name for m in op_sac.saved_matmuls(model, 0)] == ["q", "v", "w1", "w2"]
    # input 4096 + q 4096 + v 1024 + w1 14336 + w2 4096 + attention output 4096
    assert op_sac.saved_widths(model, 0, tp=1, replicated_divisor=1) == 31744


def test_moe_layer_counts_shared_experts_but_not_routed_ones() -> None:
    model = get_model("deepseek-v3")
    moe_index = model.first_k_dense_layers
    names = [m.name for m in op_sac.block_matmuls(model, moe_index)]
    assert names[:5] == ["q_a", "q_b", "kv_a", "kv_b", "o"] and names[5:] == ["w1", "w3", "w2"]
    assert 0 < op_sac.recomputed_macs_share(model, moe_index) < 1


def test_op_sac_keeps_less_than_no_recompute_and_more_than_full() -> None:
    model = get_model("llama3-8b")
    actx = ActivationContext(8192, 2, tp=1, sp=False, etp=1, act_bytes=2, framework="fsdp")
    none = layer_activation_bytes(model, 0, actx, "none")
    sac = layer_activation_bytes(model, 0, actx, "op_sac")
    full = layer_activation_bytes(model, 0, actx, "full")
    assert full < sac < none
    assert sac == pytest.approx(16384 * (31744 * 2 + 32 * 4), rel=1e-9)  # + log-sum-exp per head
