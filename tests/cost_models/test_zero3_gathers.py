"""DeepSpeed's ZeRO-3 by release (`cost_models.zero3_gathers`): before v0.5.5 one collective per
parameter tensor, each after a device sync, over a list of world-size slices; from v0.5.5 on, and in
every plan (today's release), one gather per layer, prefetched behind compute. Two-layer GPTs
(LayerNorm, biases, learned positions, tied embeddings), one of hidden 512 and one of GPT-3's
width, counted and priced by hand on two DGX A100 nodes."""

from __future__ import annotations

import pytest

from cluster_specs.presets import get_cluster
from cost_models.calibration import Calibration
from cost_models.comm import Group, collective_time
from cost_models.compute import hbm_bandwidth
from cost_models.estimate import estimate
from cost_models.layout import Layout, validate_layout
from cost_models.stage_data import Sharding
from cost_models.stage_table import build_table
from cost_models.stages import StagePartition
from cost_models.step_time import data_parallel_times
from cost_models.zero3_gathers import (
    MODULE,
    PER_PARAMETER,
    Tensors,
    edge_tensors,
    gather_mode,
    host_seconds,
    layer_tensors,
)
from model_specs.params import count_params
from model_specs.spec import ModelSpec, TrainingSpec

GPT = ModelSpec(
    name="tiny-gpt", num_layers=2, hidden_size=512, num_heads=8, ffn_hidden_size=2048, vocab_size=1000,
    norm="layernorm", position_embedding="learned", max_position_embeddings=1024, qkv_bias=True,
    attn_out_bias=True, mlp_bias=True, tie_embeddings=True, mlp="gelu",
)
WIDE = GPT.model_copy(update={"name": "wide-gpt", "hidden_size": 12288, "num_heads": 96, "ffn_hidden_size": 49152,
                              "vocab_size": 51200, "max_position_embeddings": 2048})
A100 = get_cluster("dgx-a100-80g")
GPUS = 16  # two nodes
TR = TrainingSpec(seq_len=2048, global_batch=16)
Z3 = {"zero_stage": 3, "framework": "deepspeed", "recompute": "full"}


def test_gather_mode_by_release() -> None:
    assert gather_mode("deepspeed", "0.3.13") == PER_PARAMETER
    assert gather_mode("deepspeed", "0.5.4") == PER_PARAMETER
    assert gather_mode("deepspeed", "0.5.5") == MODULE  # PR #1188: no sync before each gather
    assert gather_mode("deepspeed", "v0.6.0") == MODULE
    assert gather_mode("deepspeed", None) == MODULE  # today's release
    assert gather_mode("fsdp", None) == MODULE


def test_tensors_of_a_tiny_gpt_counted_by_hand() -> None:
    # weights: fused qkv 512 x 1536 = 786 432, o 262 144, fc1 and fc2 1 048 576 elements each, all
    # >= 100 000 (the persistence threshold): 4 gathered. Reduced: those 4, 4 biases (qkv, o, fc1,
    # fc2), 2 LayerNorms x (weight, bias) = 12
    assert layer_tensors(GPT, 0)[:2] == (4, 12)
    # ends: token table 512 000 and position table 524 288 elements gathered; + the final LayerNorm
    assert edge_tensors(GPT) == Tensors(gathered=2, reduced=4)
    # under tensor parallelism 8, qkv (98 304 per rank) and o (32 768) stay gathered (persistent);
    # fc1 and fc2 (131 072 each) are gathered per pass
    assert layer_tensors(GPT, 0, tp=8)[:2] == (2, 12)


def test_reuse_distance_keeps_what_the_backward_needs_next() -> None:
    """After the recompute a weight stays gathered when twice the elements of the layer's weights
    after it are under 10^9: every weight of the small layer (fc2 + fc1 twice = 4.2M elements before
    qkv's backward); of GPT-3's layer only fc2 (fc1 is 2 x 604M elements from its backward)."""
    assert layer_tensors(GPT, 0).kept == 4
    assert layer_tensors(WIDE, 0) == Tensors(gathered=4, reduced=12, kept=1)


def _times(version: str | None):
    cal = Calibration()  # the priors: bus efficiency 1, 6 us per host operation
    lay = Layout(**Z3, framework_version=version).resolved(GPUS, TR)
    table = build_table(WIDE, TR, A100, GPUS, lay, StagePartition.for_layout(WIDE.num_layers, lay), cal)
    return data_parallel_times(table, (Sharding(3, GPUS),), cal), table, cal


GROUP = Group.strided(A100, GPUS, 1, GPUS)


def test_per_parameter_gathers_priced_by_hand() -> None:
    """0.3.13, GPT-3's width: per micro-batch the forward gathers 2 layers x 4 tensors + the 2
    tables, the backward the layers' 8 and reduce-scatters 2 x 12 + 4 gradients, the recompute the
    layers' 8 but the 2 fc2 its backward finds kept; each collective its alpha-beta time over the
    16 ranks plus 2 x 16 host operations, none hidden, and each layer's gathered tensors zero-filled
    and copied out on the compute stream."""
    dp, table, cal = _times("0.3.13")
    host = 2 * GPUS * cal.kernel_launch_s
    assert host_seconds(GPUS, cal.kernel_launch_s) == pytest.approx(host)
    layer_bytes = table.class_weight_bytes[0][0]
    layer_grad_bytes = table.class_trainable[0][0] * TR.grad_bytes
    pc = count_params(WIDE)
    ends = (pc.embedding + pc.final_norm) * TR.param_bytes
    ends_grad = (pc.embedding + pc.final_norm) * TR.grad_bytes

    def n_of(kind: str, nbytes: float, n: int) -> float:
        return n * (collective_time(kind, nbytes / n, GROUP, cal) + host)

    layer_gathers = n_of("all_gather", layer_bytes, 4)
    forward = 2 * layer_gathers + n_of("all_gather", ends, 2)
    backward = 2 * (layer_gathers + n_of("reduce_scatter", layer_grad_bytes, 12)) + n_of("reduce_scatter", ends_grad, 4)
    assert dp.exposed_f[0, 0] == pytest.approx(forward, rel=1e-9)
    assert dp.exposed_b[0, 0] == pytest.approx(backward, rel=1e-9)
    # the recompute's gathers, each zero-filled and copied out (3 HBM bytes per gathered byte)
    fill = 3 * layer_bytes / hbm_bandwidth(A100.gpu, cal, "deepspeed")
    assert dp.exposed_r[0, 0] == pytest.approx(2 * (layer_gathers + fill) * 3 / 4, rel=1e-9)
    assert dp.kernels_f[0, 0] == pytest.approx(2 * fill, rel=1e-9)


def test_todays_release_gathers_once_per_layer_behind_compute() -> None:
    """None (today's release, what a plan runs): one gather per layer and pass, the part the
    previous layer's forward (70% of it, DeepSpeed's overlap) cannot hide exposed, the first layer's
    and the tables' exposed whole; the recompute reuses the backward's gather. Less than 0.3.13's."""
    old, _, _ = _times("0.3.13")
    new, table, cal = _times(None)
    assert new.exposed_r[0, 0] == 0.0
    one_layer = collective_time("all_gather", table.class_weight_bytes[0][0], GROUP, cal)
    hidden = cal.overlap("deepspeed").zero3 * table.class_forward[0]
    ends = table.weight_bytes[0][0] - 2 * table.class_weight_bytes[0][0]
    expected = 2 * max(one_layer - hidden, 0.0) + one_layer + collective_time("all_gather", ends, GROUP, cal)
    assert new.exposed_f[0, 0] == pytest.approx(expected, rel=1e-9)
    assert new.exposed_f[0, 0] < old.exposed_f[0, 0] and new.exposed_b[0, 0] < old.exposed_b[0, 0]


def test_the_release_moves_the_step_only_under_zero3_deepspeed() -> None:
    tr = TrainingSpec(seq_len=1024, global_batch=16)
    old = estimate(GPT, tr, A100, GPUS, Layout(**Z3, framework_version="0.3.13"))
    new = estimate(GPT, tr, A100, GPUS, Layout(**Z3))
    assert old.time.dp_comm > new.time.dp_comm and old.step_s > new.step_s
    zero1 = dict(Z3, zero_stage=1)
    a = estimate(GPT, tr, A100, GPUS, Layout(**zero1, framework_version="0.3.13"))
    b = estimate(GPT, tr, A100, GPUS, Layout(**zero1))
    assert a.step_s == pytest.approx(b.step_s)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"framework": "megatron", "framework_version": "0.3.13"}, "deepspeed only"),
        ({"framework": "deepspeed", "framework_version": "latest"}, "not a release number"),
    ],
)
def test_framework_version_rules(fields: dict, message: str) -> None:
    violations = validate_layout(GPT, TR, GPUS, Layout(**fields))
    found = [v for v in violations if v.field == "framework_version"]
    assert found and message in found[0].message



@pytest.mark.parametrize(
    ("fields", "field", "feature"),
    [
        ({"zero_stage": 3, "framework_version": "0.3.11"}, "zero_stage", "ZeRO-3 (PR #834"),
        ({**Z3, "framework_version": "0.3.13", "offload_optimizer": True, "offload_device": "nvme"}, "offload_device",
         "ZeRO-Infinity"),
        ({**Z3, "framework_version": "0.9.5", "zero_quantized_weights": True}, "zero_hpz_partition_size", "ZeRO++"),
    ],
)
def test_an_older_release_lacks_later_features(fields: dict, field: str, feature: str) -> None:
    lay = Layout(**{"framework": "deepspeed", **fields})
    found = [v for v in validate_layout(GPT, TR, GPUS, lay) if v.field == field]
    assert found and feature in found[0].message and fields["framework_version"] in found[0].message
    today = lay.model_copy(update={"framework_version": None})
    assert not [v for v in validate_layout(GPT, TR, GPUS, today) if v.field == field]
