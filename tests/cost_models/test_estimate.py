"""Directional properties of the estimate that any correct cost model must have."""

import pytest

from cluster_specs.presets import get_cluster
from cost_models.estimate import estimate
from cost_models.layout import Layout, LayoutError
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec

MODEL = get_model("llama3-70b")
CLUSTER = get_cluster("dgx-h100")
TRAIN = TrainingSpec(seq_len=4096, global_batch=256)


def est(**kw: object):
    return estimate(MODEL, TRAIN, CLUSTER, 256, Layout(**kw))


def test_recompute_trades_time_for_memory() -> None:
    none, sel, full = (est(tp=8, pp=4, recompute=r) for r in ("none", "selective", "full"))
    assert none.peak_memory.activations > sel.peak_memory.activations > full.peak_memory.activations
    assert none.step_s < sel.step_s < full.step_s
    assert full.time.recompute > sel.time.recompute > 0 == none.time.recompute


def test_zero_stages_shrink_model_states() -> None:
    states = []
    for z in range(4):
        m = est(tp=8, zero_stage=z).peak_memory
        states.append(m.parameters + m.gradients + m.optimizer)
    assert states == sorted(states, reverse=True)


def test_more_micro_batches_shrink_the_bubble() -> None:
    small = estimate(MODEL, TrainingSpec(seq_len=4096, global_batch=64), CLUSTER, 256, Layout(tp=8, pp=8))
    large = estimate(MODEL, TrainingSpec(seq_len=4096, global_batch=1024), CLUSTER, 256, Layout(tp=8, pp=8))
    assert small.bubble_fraction == pytest.approx(7 / (16 + 7))
    assert large.bubble_fraction < small.bubble_fraction


def test_interleaving_cuts_the_bubble_but_holds_more_activations() -> None:
    plain = est(tp=8, pp=4)
    inter = est(tp=8, pp=4, vpp=5)
    assert inter.time.bubble < plain.time.bubble
    assert inter.memory[0].activations > plain.memory[0].activations


def test_tp_across_nodes_is_slower_than_inside() -> None:
    inside = est(tp=8, pp=2)
    across = est(tp=8, pp=2, order="pp-tp-cp-ep-dp")  # TP ranks strided across nodes
    assert across.time.tp_comm > inside.time.tp_comm


def test_offload_moves_optimizer_to_host() -> None:
    on = est(tp=8, zero_stage=1, offload_optimizer=True)
    off = est(tp=8, zero_stage=1)
    # on the host: the Adam states (12 bytes per parameter) and the float32 gradient partition (4)
    assert on.peak_memory.optimizer == 0 and on.peak_memory.host_optimizer == pytest.approx(off.peak_memory.optimizer * 16 / 12)
    assert on.time.optimizer > off.time.optimizer


def test_mfu_is_model_flops_over_peak() -> None:
    e = est(tp=8, pp=2)
    assert e.mfu == pytest.approx(e.flops.model_flops / (e.step_s * 256 * 989.4e12))
    assert 0 < e.mfu < 1


def test_invalid_layout_raises_with_every_violation() -> None:
    with pytest.raises(LayoutError) as info:
        est(tp=16, vpp=2)
    fields = {v.field for v in info.value.violations}
    assert {"vpp"} <= fields


def test_activation_offload_moves_saved_activations_to_the_host_link() -> None:
    from cluster_specs.presets import get_cluster
    from cost_models.layout import Layout
    from model_specs.presets import get_model
    from model_specs.spec import TrainingSpec

    model, cluster = get_model("llama3-70b"), get_cluster("dgx-h100")
    training = TrainingSpec(seq_len=8192, global_batch=128)
    base = estimate(model, training, cluster, 64, Layout(tp=8, pp=4))
    few = estimate(model, training, cluster, 64, Layout(tp=8, pp=4, activation_offload_layers=4))
    many = estimate(model, training, cluster, 64, Layout(tp=8, pp=4, activation_offload_layers=16))
    assert base.peak_bytes > few.peak_bytes > many.peak_bytes
    assert base.peak_memory.host_optimizer == 0 < few.peak_memory.host_optimizer < many.peak_memory.host_optimizer
    # what leaves the GPU arrives in host memory; two layers stay as copy-out / prefetch staging
    moved = base.memory[0].activations - many.memory[0].activations
    staging = many.memory[0].host_optimizer - moved
    assert 0 < staging < 0.05 * base.memory[0].activations
    # 16 of 20 layers per stage over a 50 GB/s host link: the copies outlast the compute they hide behind
    assert few.step_s == pytest.approx(base.step_s, rel=1e-9) and many.step_s > base.step_s


def test_zero_bubble_fills_the_bubble_with_weight_gradients() -> None:
    """Same work as 1F1B; the other ranks' idle time shrinks by twice their weight-gradient share W
    (cost_models.pipeline.ZB_WEIGHT_SHARE of the backward compute). More memory than 1F1B: torch's
    ZB1P warms every rank up with p forwards and keeps weight-output gradients between the two
    backward passes (`pipeline.split_backward_peaks`, measured on fake-world traces)."""
    from cost_models.pipeline import ZB_WEIGHT_SHARE

    kw = dict(tp=8, pp=4, zero_stage=1, framework="fsdp")
    plain, zb = est(**kw), est(schedule="zero_bubble", **kw)
    assert zb.time.compute == pytest.approx(plain.time.compute)
    assert zb.peak_bytes > plain.peak_bytes
    assert zb.memory[-1].activations > 2 * plain.memory[-1].activations  # the last rank: p - r = 1 in 1F1B
    assert 0 < zb.time.bubble < plain.time.bubble
    # the pipeline ranks are (nearly) equal here: the bubble loses 2 W per other rank and slot
    m = TRAIN.global_batch // (256 // (8 * 4))  # micro-batches of one micro-sequence per dp rank
    backward = plain.time.compute / m * (2 / 3)  # 6N: the backward is about 2/3 of a micro-batch's compute
    saved = (4 - 1) * 2 * ZB_WEIGHT_SHARE * backward
    assert plain.time.bubble - zb.time.bubble == pytest.approx(saved, rel=0.15)


def test_the_lm_heads_logit_gradient_waits_for_its_weight_pass() -> None:
    """Under a split backward the head rank keeps each pending micro-batch's logit gradient (the LM
    head GEMM's output gradient: tokens x vocab / tp in bf16) until the weight pass; 1F1B does not."""
    from cost_models.calibration import default_calibration
    from cost_models.estimate import pricing_context
    from cost_models.stage_table import build_table

    kw = dict(tp=8, pp=4, zero_stage=1, framework="fsdp", schedule="zero_bubble")
    ctx = pricing_context(MODEL, TRAIN, CLUSTER, 256, Layout(**kw))
    t = build_table(MODEL, TRAIN, CLUSTER, 256, ctx.layout, ctx.partition, default_calibration())
    layer_only = t.pending_wgrad[1] / ctx.partition.chunk_layers[1] * ctx.partition.chunk_layers[-1]
    logits_grad = TRAIN.seq_len * MODEL.vocab_size / 8 * 2
    assert t.pending_wgrad[-1] - layer_only == pytest.approx(logits_grad, rel=1e-6)


def test_zero_bubble_is_torch_pipelinings_and_not_with_zero3() -> None:
    with pytest.raises(LayoutError, match="framework fsdp"):
        est(tp=8, pp=4, schedule="zero_bubble")  # megatron
    with pytest.raises(LayoutError, match="zero_stage 2"):
        est(tp=8, pp=4, schedule="zero_bubble", zero_stage=3, framework="fsdp")
    with pytest.raises(LayoutError, match="rounds"):
        estimate(MODEL, TrainingSpec(seq_len=4096, global_batch=9 * 8), CLUSTER, 256,
                 Layout(tp=8, pp=4, schedule="zero_bubble", framework="fsdp"))


def test_dualpipev_at_2p_micro_batches_does_not_price_the_loss_transient_with_the_first_chunks_gradients() -> None:
    """At torch's minimum 2p micro-batches the head rank's loss transient never meets chunk 0's
    gradients at 2p + 1 chunks (`pipeline.dualpipev_loss_meets_first_chunk`): its logits cost less
    than with 2p + 1 micro-batches, by at most the transient's excess over the retained logits."""
    model, cluster = get_model("llama3-8b"), get_cluster("dgx-h100")
    lay = dict(tp=4, pp=4, vpp=2, dp=8, zero_stage=1, recompute="selective", schedule="dualpipev", framework="fsdp")
    at_2p = estimate(model, TrainingSpec(seq_len=8192, global_batch=64), cluster, 128, Layout(**lay))
    above = estimate(model, TrainingSpec(seq_len=8192, global_batch=72), cluster, 128, Layout(**lay))
    assert (at_2p.layout.grad_accum_, above.layout.grad_accum_) == (8, 9)
    assert 0 < at_2p.memory[0].logits < above.memory[0].logits
    assert above.memory[0].logits - at_2p.memory[0].logits < 0.5 * above.memory[0].logits
    assert at_2p.memory[0].activations == above.memory[0].activations
    assert all(m.logits == 0 for m in at_2p.memory[1:])


def test_a_weight_pass_leaves_one_chunks_compute_dtype_gradients_under_fsdp() -> None:
    """torch's ZB-V (a weight pass per chunk) under FSDP2 keeps one chunk's bf16 weight gradients
    beside the float32 accumulated ones; DualPipeV over the same chunks runs full backwards in its
    steady state and does not: the gradients differ by exactly one chunk's bf16 copy on every rank."""
    model, cluster = get_model("llama3-8b"), get_cluster("dgx-h100")
    training = TrainingSpec(seq_len=8192, global_batch=64)
    lay = dict(tp=4, pp=4, vpp=2, dp=8, zero_stage=1, recompute="selective", framework="fsdp")
    zbv = estimate(model, training, cluster, 128, Layout(**lay, schedule="zbv"))
    dpv = estimate(model, training, cluster, 128, Layout(**lay, schedule="dualpipev"))
    layer_params = 4096 * (4096 + 2 * 1024 + 4096) / 4 + 3 * 4096 * 14336 / 4 + 2 * 4096  # TP4 shard, norms
    for z, d in zip(zbv.memory, dpv.memory, strict=True):
        assert z.gradients - d.gradients == pytest.approx(2 * layer_params * 4, rel=0.01)  # 4 layers, bf16


def test_multi_token_prediction_is_priced_beside_the_head() -> None:
    """DeepSeek-V3's MTP module (one transformer block of the last layer's kind, its input
    projection, one more pass of the shared output head, and the dense gradient of the rank's copy
    of the embedding table) runs on the rank holding the LM head: that rank gets exactly those
    seconds and more memory; no other rank changes."""
    from cost_models.calibration import default_calibration
    from cost_models.compute import (
        ShardGeometry,
        embedding_gradient_time,
        layer_time,
        lm_head_times,
        mtp_projection_times,
    )
    from cost_models.stage_table import build_table
    from cost_models.stages import StagePartition

    with_mtp = get_model("deepseek-v3")
    assert with_mtp.mtp_layers == 1  # config.json's num_nextn_predict_layers
    without = with_mtp.model_copy(update={"mtp_layers": 0})
    cluster, train, cal = get_cluster("dgx-h800"), TrainingSpec(seq_len=4096, global_batch=1024), default_calibration()
    lay = Layout(tp=8, pp=8, ep=8, micro_batch=1).resolved(512, train)
    part = StagePartition.for_layout(with_mtp.num_layers, lay)
    a, b = (build_table(m, train, cluster, 512, lay, part, cal) for m in (without, with_mtp))
    g = ShardGeometry.of(lay, 1, train.seq_len)
    last = layer_time(with_mtp, with_mtp.num_layers - 1, g, cluster.gpu, train.precision, 2, cal)
    head, proj = lm_head_times(with_mtp, g, cluster.gpu, "bf16", 2, cal), mtp_projection_times(with_mtp, g, cluster.gpu, "bf16", 2, cal)
    added = b.compute - a.compute
    assert added[:-1] == pytest.approx([0.0] * 7, abs=1e-15)
    copy_grad = embedding_gradient_time(with_mtp, 8, cluster.gpu, "megatron", train.param_bytes, train.grad_bytes, False, cal)
    assert copy_grad > 0
    assert added[-1] == pytest.approx(last.forward + last.backward + sum(head) + sum(proj) + copy_grad, rel=1e-12)
    assert (b.layers - a.layers).tolist() == [0.0] * 7 + [1.0] and (b.moe_layers - a.moe_layers)[-1] == 1.0
    # weights on the head rank: the block, the projection and norms, and a copy of the embedding
    # table (Megatron-Core keeps one in the MTP stage when it is not the first)
    from model_specs.params import count_params

    h, pc = with_mtp.hidden_size, count_params(with_mtp)
    assert (b.dense_params - a.dense_params)[:-1].tolist() == [0.0] * 7
    # one more decoder layer on the last stage: the block's own weights
    deeper = without.model_copy(update={"num_layers": without.num_layers + 1})
    cut = StagePartition((*part.chunk_layers[:-1], part.chunk_layers[-1] + 1), part.pp, part.vpp)
    c = build_table(deeper, train, cluster, 512, lay, cut, cal)
    block = float(c.dense_params[-1] - a.dense_params[-1])
    assert float(b.dense_params[-1] - a.dense_params[-1]) == pytest.approx(block + 2 * h * h / 8 + 3 * pc.final_norm + pc.embedding / 8, rel=1e-12)
    assert float(b.expert_params[-1] - a.expert_params[-1]) == pytest.approx(float(c.expert_params[-1] - a.expert_params[-1]), rel=1e-12)
    ea, eb = (estimate(m, train, cluster, 512, lay) for m in (without, with_mtp))
    assert eb.stage_times_s[:-1] == pytest.approx(ea.stage_times_s[:-1], rel=1e-12)
    assert eb.stage_times_s[-1] > ea.stage_times_s[-1] + added[-1] * 0.999
    assert eb.memory[-1].total > ea.memory[-1].total and eb.memory[0].total == pytest.approx(ea.memory[0].total)
    assert eb.step_s > ea.step_s


def test_a_frozen_base_trains_no_mtp_module() -> None:
    """LoRA / QLoRA run the decoder and its head (Transformers, PEFT): DeepSeek-V3's MTP module
    costs nothing there, so the preset prices as the same model without it."""
    with_mtp = get_model("deepseek-v3")
    without = with_mtp.model_copy(update={"mtp_layers": 0})
    cluster = get_cluster("dgx-h800")
    train = TrainingSpec(seq_len=4096, global_batch=256, method="lora")
    lay = Layout(tp=8, pp=8, ep=8, micro_batch=1)
    a, b = (estimate(m, train, cluster, 512, lay) for m in (without, with_mtp))
    assert b.step_s == pytest.approx(a.step_s, rel=1e-12) and b.peak_bytes == a.peak_bytes
