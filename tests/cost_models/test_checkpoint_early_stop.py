"""Full recompute under PyTorch's non-reentrant checkpoint skips each dense block's last GEMM, the
MLP's down projection (`compute.checkpoint_early_stop`); Megatron's recompute re-runs the block."""

from __future__ import annotations

import pytest

from cluster_specs.presets import get_cluster
from cost_models.calibration import default_calibration
from cost_models.compute import ShardGeometry, checkpoint_early_stop, gemm_time, layer_gemms, layer_time
from cost_models.estimate import estimate
from cost_models.layout import Layout
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec


def test_which_stacks_stop_early() -> None:
    assert checkpoint_early_stop("fsdp")  # torchtitan, this runtime: checkpoint_wrapper's default
    assert checkpoint_early_stop("fsdp", stack="torchtune")
    assert not checkpoint_early_stop("fsdp", fsdp_flat_params=True)  # llm-foundry's FSDP1
    assert not checkpoint_early_stop("fsdp", stack="hf")
    assert not checkpoint_early_stop("megatron") and not checkpoint_early_stop("deepspeed")


def test_full_recompute_is_the_forward_less_the_down_projection() -> None:
    model, cluster, cal = get_model("llama3-8b"), get_cluster("dgx-h100"), default_calibration()
    for framework, stops in (("fsdp", True), ("megatron", False)):
        g = ShardGeometry.of(Layout(framework=framework, micro_batch=1), 1, 8192)
        lt = layer_time(model, 0, g, cluster.gpu, "bf16", 2, cal)
        down = gemm_time(layer_gemms(model, 0, g)[-1], cluster.gpu, "bf16", 2, cal, g.framework)
        assert layer_gemms(model, 0, g)[-1].k == model.ffn_hidden_size  # the down projection: (tokens, h, f)
        expected = lt.forward - down if stops else lt.forward
        assert float(lt.full_recompute) == pytest.approx(float(expected), rel=1e-12)


def test_a_step_under_full_recompute_counts_it() -> None:
    model, cluster = get_model("llama3-8b"), get_cluster("dgx-h100")
    training = TrainingSpec(seq_len=8192, global_batch=8)
    lay = Layout(framework="fsdp", dp=1, micro_batch=1, recompute="full")
    ours = estimate(model, training, cluster, 1, lay)
    theirs = estimate(model, training, cluster, 1, lay.model_copy(update={"fsdp_flat_params": True}))
    assert 0 < ours.time.recompute < theirs.time.recompute
