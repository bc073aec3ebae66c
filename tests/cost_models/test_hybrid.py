"""Hybrid Mamba-2 models in the cost models: one TP block per layer, Mamba heads and groups split
over TP, context parallelism refused, saved activations per framework, and pipeline stages that
weigh each layer by its own mixer's cost."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster_specs.presets import get_cluster
from cost_models.activations import ActivationContext, layer_activation_bytes, mamba_backward_transient_bytes
from cost_models.calibration import default_calibration
from cost_models.compute import (
    SSD_STATE_BYTES_BACKWARD,
    SSD_STATE_BYTES_FORWARD,
    ShardGeometry,
    hbm_bandwidth,
    ssd_times,
)
from cost_models.estimate import estimate
from cost_models.layout import Layout, validate_layout
from cost_models.mesh_comm import _tp_comm, mesh_comm
from cost_models.stage_table import layer_kinds
from cost_models.stages import StagePartition
from model_specs.presets import get_model
from model_specs.spec import ModelSpec, TrainingSpec

SMALL = ModelSpec(
    name="hybrid", family="nemotron_h", vocab_size=4096, hidden_size=1024, num_layers=8, num_heads=8, num_kv_heads=2,
    head_dim=128, ffn_hidden_size=4096, mlp="relu2", hybrid_pattern="MMMM----", mamba_num_heads=32,
    mamba_head_dim=64, mamba_state_size=128, mamba_groups=8,
)
TRAINING = TrainingSpec(seq_len=4096, global_batch=64)


def test_one_tp_block_per_hybrid_layer():
    """A hybrid layer's mixer is one column / row-parallel pair: one all-gather + reduce-scatter
    under SP per layer, half of an attention + MLP layer's."""
    cluster, cal = get_cluster("dgx-h100"), default_calibration()
    lay = Layout(tp=8, dp=1, sp=True).resolved(8, TRAINING)
    tp_per_layer = mesh_comm(SMALL, TRAINING, cluster, 8, lay, cal)[0][0]
    act = 4096 * 1024 * TRAINING.activation_bytes
    assert tp_per_layer == pytest.approx(_tp_comm(cluster, 8, cal, 8, True, act, 1, blocks=1))
    assert tp_per_layer == pytest.approx(_tp_comm(cluster, 8, cal, 8, True, act, 1) / 2)


@pytest.mark.parametrize(
    ("layout", "field", "message"),
    [
        (Layout(cp=2, dp=4), "cp", "context parallelism of hybrid Mamba models is not priced"),
        (Layout(tp=16, dp=1), "tp", "does not divide the 8 Mamba B/C groups"),
        (Layout(dp=8, recompute="op_sac", framework="fsdp"), "recompute", "op_sac is not priced for Mamba-2"),
    ],
)
def test_hybrid_layout_rules(layout: Layout, field: str, message: str):
    gpus = 16 if layout.tp == 16 else 8
    problems = validate_layout(SMALL, TRAINING, gpus, layout)
    assert any(v.field == field and message in v.message for v in problems), problems
    assert not validate_layout(SMALL, TRAINING, 8, Layout(tp=8, dp=1, sp=True))


def test_mamba_activations_per_framework():
    """Megatron's fused kernel keeps in_proj's output and the scan output, then the norm's input and
    rstd and out_proj's input; the eager runtime's checkpointed region keeps in_proj's output only
    (then out_proj's input). Both split over TP by heads."""
    t, h = 4096, SMALL.hidden_size
    proj, inner = SMALL.mamba_in_proj_width, SMALL.mamba_inner
    eager = ActivationContext(t, 1, 1, False, 1, 2, "fsdp")
    assert layer_activation_bytes(SMALL, 0, eager, "none") == t * (2 * h + 2 * h + 2 * proj + 2 * inner)
    mega = ActivationContext(t, 1, 8, True, 1, 2, "megatron")
    expected = t * (2 * h / 8 + 2 * h / 8 + (2 * proj + 4 * inner + 4 * 8 + 2 * inner) / 8)
    assert layer_activation_bytes(SMALL, 0, mega, "none") == pytest.approx(expected)
    assert layer_activation_bytes(SMALL, 0, mega, "full") == t * h * 2 / 8  # the layer input
    assert mamba_backward_transient_bytes(SMALL, mega) < mamba_backward_transient_bytes(SMALL, eager)


def test_pipeline_stages_weigh_layers_by_their_mixer():
    """Same layer count per stage, different mixers: a stage of Mamba layers and a stage of MLP
    layers cost what their layers cost (no uniform-layer assumption)."""
    assert len(set(layer_kinds(SMALL))) == 2
    lay = Layout(pp=2, dp=4, schedule="1f1b")
    est = estimate(SMALL, TRAINING, get_cluster("dgx-h100"), 8, lay, StagePartition((4, 4), 2))
    mamba_stage, mlp_stage = est.stage_times_s
    assert mamba_stage != pytest.approx(mlp_stage, rel=0.05)
    swapped = SMALL.model_copy(update={"hybrid_pattern": "----MMMM"})
    est2 = estimate(swapped, TRAINING, get_cluster("dgx-h100"), 8, lay, StagePartition((4, 4), 2))
    assert est2.memory[0].activations != pytest.approx(est.memory[0].activations)


def test_nemotron_h_56b_priced_on_its_published_layout():
    """dgxc-benchmarking's Nemotron-H 56B FP8 recipe (TP8, DP4, 32 H100s, micro-batch 1, seq 8192)
    fits and is priced, every Mamba layer split over the 8 TP ranks by heads."""
    spec = get_model("nemotron-h-56b")
    training = TrainingSpec(seq_len=8192, global_batch=96, precision="fp8")
    est = estimate(spec, training, get_cluster("dgx-h100"), 32,
                   Layout(tp=8, dp=4, sp=True, zero_stage=1, micro_batch=1, framework="megatron"))
    assert est.fits and est.memory[0].parameters == pytest.approx(2 * 56_324_350_464 / 8, rel=0.01)


def test_ssd_scan_moves_its_chunk_states_through_hbm():
    """The chunked scan's per-chunk states (H x P x N per Q tokens, heads split over TP) cost their
    HBM traffic: 12 bytes per element forward, 34 backward (`compute.SSD_STATE_BYTES_*`, from
    mamba_ssm's kernel sequence), on top of the scan's matmuls, which do not depend on HBM."""
    gpu, cal = get_cluster("dgx-h100").gpu, default_calibration()
    g = ShardGeometry(tokens=4096.0, seq_len=4096, cp=1, tp=2, sp=True, ep=1, etp=1)
    fwd, bwd = ssd_times(SMALL, 0, g, gpu, cal)
    fwd2, bwd2 = ssd_times(SMALL, 0, g, gpu, replace(cal, hbm_efficiency=2 * cal.hbm_efficiency))
    states = 4096 / SMALL.mamba_chunk_size * 32 * 64 * 128 / 2  # chunks x H/tp x P x N
    half_traffic = states / (2 * hbm_bandwidth(gpu, cal))
    assert fwd - fwd2 == pytest.approx(SSD_STATE_BYTES_FORWARD * half_traffic, rel=1e-9)
    assert bwd - bwd2 == pytest.approx(SSD_STATE_BYTES_BACKWARD * half_traffic, rel=1e-9)
    assert ssd_times(SMALL, 4, g, gpu, cal) == (0.0, 0.0)  # an MLP layer of the pattern
