"""Kernel-level costs (cost_models.compute): GEMMs and attention from the kernel atlas, MoE imbalance,
launch floor, torchtitan's op-level SAC recompute share, eager vs fused elementwise kernels, ring
context parallelism's merges, and the embedding's dense gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cluster_specs.catalog import get_gpu
from cost_models.calibration import Calibration
from cost_models.compute import (
    Gemm,
    ShardGeometry,
    activation_function_bytes,
    attention_rate,
    attention_time,
    attention_times,
    backward_gemms,
    eager_norm_bytes,
    eager_rotary_bytes,
    elementwise_bytes,
    embedding_gradient_time,
    fp8_expert_quantize_bytes,
    gemm_passes,
    gemm_time,
    hbm_bandwidth,
    kernel_margin,
    kernel_provenance,
    layer_kernels,
    layer_time,
    moe_imbalance,
    moe_kernel_bytes,
    ring_merge_times,
    routed_rows,
    stack_kernels,
)
from cost_models.kernels.atlas import atlas_for
from cost_models.kernels.attention import TRITON_FLASH_SPEED
from model_specs.presets import get_model

H100 = get_gpu("H100-80GB")
H200 = get_gpu("H200-141GB")
CAL = Calibration()


def _tflops(gpu, m: int, n: int, k: int) -> float:  # type: ignore[no-untyped-def]
    g = Gemm(m, n, k)
    return g.flops / gemm_time(g, gpu, "bf16", 2, CAL) / 1e12


def test_gemm_time_is_the_atlas_time_over_the_efficiency_times_the_stack_stretch() -> None:
    """A GEMM in a step costs the atlas's GPU time (no call latency), divided by the rate multiplier
    of the precision and multiplied by its stack's compute stretch (FP8: and its FP8 factor)."""
    from dataclasses import replace

    from cost_models.calibration import Stack

    g = Gemm(4096, 4096, 4096)
    atlas = atlas_for(H200).gemm_table("bf16").seconds(4096, 4096, 4096, 1, 2)
    assert gemm_time(g, H200, "bf16", 2, CAL) == pytest.approx(atlas * CAL.stack("megatron").compute / CAL.gemm_efficiency)
    slow = replace(CAL, stacks={**CAL.stacks, "fsdp": Stack(compute=1.5, fp8_compute=2.0)}, gemm_efficiency=0.5)
    assert gemm_time(g, H200, "bf16", 2, slow, "fsdp") == pytest.approx(atlas * 1.5 / 0.5)
    fp8 = atlas_for(H200).gemm_table("fp8").seconds(4096, 4096, 4096, 1, 2)
    assert gemm_time(g, H200, "fp8", 2, slow, "fsdp") == pytest.approx(fp8 * 1.5 * 2.0)


def test_small_gemms_run_far_below_large_ones_on_the_measured_h200() -> None:
    """The H200's measured GEMMs (data/measurements/h200-2026-11): a 70B TP8 output projection at
    128 rows runs at a small fraction of a large GEMM's rate, as measured."""
    big = _tflops(H200, 8192, 8192, 8192)
    assert 600 < big < 800
    assert _tflops(H200, 128, 8192, 1024) < 0.5 * big
    assert _tflops(H200, 4096, 4096, 4096) > 0.8 * big


def test_the_backward_gemms_are_looked_up_by_their_own_shapes() -> None:
    """dX (m x k) = dY (m x n) @ W^T: a GEMM (m, k, n); dW (k x n) = X^T @ dY: a GEMM (k, n, m)."""
    dgrad, wgrad = backward_gemms(Gemm(128, 8192, 1024, 2))
    assert (dgrad.m, dgrad.n, dgrad.k, dgrad.count) == (128, 1024, 8192, 2)
    assert (wgrad.m, wgrad.n, wgrad.k, wgrad.count) == (1024, 8192, 128, 2)
    fwd, dg, wg = gemm_passes([Gemm(128, 8192, 1024)], H200, "bf16", 2, CAL)
    assert dg == pytest.approx(gemm_time(Gemm(128, 1024, 8192), H200, "bf16", 2, CAL))
    assert wg == pytest.approx(gemm_time(Gemm(1024, 8192, 128), H200, "bf16", 2, CAL))
    assert not math.isclose(fwd, wg, rel_tol=0.05)  # a thin GEMM and its weight gradient differ
    lt = layer_time(get_model("llama3-8b"), 0, ShardGeometry(1024.0, 1024, 1, 1, False, 1, 1), H200, "bf16", 2, CAL)
    assert lt.backward_weight > 0 and lt.gemm_dgrad is not None and lt.gemm_wgrad is not None


def test_gemm_time_is_elementwise_for_arrays() -> None:
    ms = np.array([256.0, 4096.0, 16384.0])
    arr = gemm_time(Gemm(ms, 4096, 4096), H100, "bf16", 2, CAL)
    one = [gemm_time(Gemm(float(m), 4096, 4096), H100, "bf16", 2, CAL) for m in ms]
    np.testing.assert_allclose(arr, one, rtol=1e-12)
    gemms = [Gemm(ms, 4096, 4096), Gemm(ms, 14336, 4096, 2.0)]
    batched = gemm_passes(gemms, H200, "bf16", 2, CAL)
    for i, m in enumerate(ms):
        single = gemm_passes([Gemm(float(m), 4096, 4096), Gemm(float(m), 14336, 4096, 2.0)], H200, "bf16", 2, CAL)
        np.testing.assert_allclose([b[i] for b in batched], single, rtol=1e-12)


def test_attention_runs_the_stacks_kernel_at_its_measured_rate() -> None:
    """FlashAttention-2 and the fused (cuDNN) kernel at the atlas's rates: on the H200 the fused kernel
    is faster, each as measured (data/measurements/h200-2026-11), and array geometries pick per entry."""
    flash = attention_rate(H200, CAL, True, 8192.0, 128, True, "fwd")
    fused = attention_rate(H200, CAL, False, 8192.0, 128, True, "fwd")
    assert flash == pytest.approx(328.6e12, rel=1e-3) and fused == pytest.approx(573.5e12, rel=1e-3)
    both = attention_rate(H200, CAL, np.array([True, False]), 8192.0, 128, True, "fwd")
    np.testing.assert_allclose(both, [flash, fused])
    model = get_model("llama3-8b")
    g_fused = ShardGeometry(tokens=8192.0, seq_len=8192, cp=1, tp=1, sp=False, ep=1, etp=1)
    g_flash = ShardGeometry(tokens=8192.0, seq_len=8192, cp=1, tp=1, sp=False, ep=1, etp=1, flash2=True)
    assert attention_time(model, 0, g_flash, H200, CAL) / attention_time(model, 0, g_fused, H200, CAL) == pytest.approx(fused / flash)
    fwd, bwd = attention_times(model, 0, g_flash, H200, CAL)
    # forward + backward at the measured combined rate: 3.5 x the forward's FLOPs in the measured time
    attn_flops = fwd * flash
    assert attn_flops * 3.5 / (fwd + bwd) == pytest.approx(288.27e12, rel=1e-3)


def test_triton_flash_attention_runs_at_its_published_share_of_flash2_and_is_not_measured() -> None:
    """FlashAttention in Triton (llm-foundry's attn_impl triton) is priced on FlashAttention-2's curves at
    `TRITON_FLASH_SPEED` of their rate, both passes, with and without context parallelism; its seconds
    never count as measured (the atlas holds no point of that kernel)."""
    model = get_model("llama3-8b")
    for cp in (1, 2):
        common = dict(tokens=8192.0 / cp, seq_len=8192, cp=cp, tp=1, sp=False, ep=1, etp=1)
        flash = ShardGeometry(**common, **stack_kernels("fsdp", "flash2"))
        triton = ShardGeometry(**common, **stack_kernels("fsdp", "triton_flash"))
        assert triton.flash2 and triton.attention_speed == TRITON_FLASH_SPEED == 0.5
        for t, f in zip(attention_times(model, 0, triton, H200, CAL), attention_times(model, 0, flash, H200, CAL), strict=True):
            assert t == pytest.approx(f / TRITON_FLASH_SPEED)
        split_t = kernel_provenance(model, 0, triton, H200, "bf16", 2, CAL)
        split_f = kernel_provenance(model, 0, flash, H200, "bf16", 2, CAL)
        attn_t, attn_f = sum(attention_times(model, 0, triton, H200, CAL)), sum(attention_times(model, 0, flash, H200, CAL))
        assert split_t.sum() - split_f.sum() == pytest.approx(attn_t - attn_f)
        if cp == 1:  # the H200 measured FlashAttention-2 at 8192: measured there, extrapolated for Triton's
            assert split_f[:2].sum() - split_t[:2].sum() == pytest.approx(attn_f)


def test_kernel_provenance_splits_the_time_and_weighs_the_margin() -> None:
    """The split of a layer's GEMM and attention time by provenance sums to their time; a GPU with
    no measurements is all datasheet and carries the widest margin."""
    model = get_model("llama3-8b")
    g = ShardGeometry(tokens=8192.0, seq_len=8192, cp=1, tp=1, sp=False, ep=1, etp=1, flash2=True)
    split = kernel_provenance(model, 0, g, H200, "bf16", 2, CAL)
    lt = layer_time(model, 0, g, H200, "bf16", 2, CAL)
    assert split.sum() == pytest.approx(lt.gemm_fwd + lt.gemm_dgrad + lt.gemm_wgrad + (1 + lt.attention_bwd_factor) * lt.attention_fwd)
    assert split[0] > 0  # the 8B shapes were measured on the H200
    l40s = kernel_provenance(model, 0, g, get_gpu("L40S"), "bf16", 2, CAL)
    assert l40s[3] == pytest.approx(l40s.sum())
    assert kernel_margin(l40s) > kernel_margin(split) > 0


def test_moe_imbalance_shrinks_with_routed_tokens_and_vanishes_without_ep() -> None:
    assert moe_imbalance(1000.0, 1) == 1.0
    small, large = moe_imbalance(1000.0, 64), moe_imbalance(1_000_000.0, 64)
    assert small > large > 1.0
    assert small == pytest.approx(1 + math.sqrt(2 * math.log(64) * (1 - 1 / 64) / 1000))


def test_host_launch_floor_binds_tiny_layers_only() -> None:
    model = get_model("llama3-8b")
    tiny = ShardGeometry(tokens=16.0, seq_len=16, cp=1, tp=8, sp=True, ep=1, etp=8)
    big = ShardGeometry(tokens=8192.0, seq_len=8192, cp=1, tp=1, sp=False, ep=1, etp=1)
    lt_tiny = layer_time(model, 0, tiny, H100, "bf16", 2, CAL)
    lt_big = layer_time(model, 0, big, H100, "bf16", 2, CAL)
    assert lt_tiny.forward == pytest.approx(lt_tiny.host_fwd)  # launches take longer than the kernels
    assert lt_big.forward > 10 * lt_big.host_fwd


def test_op_sac_recomputes_every_second_matmul_and_no_attention() -> None:
    model = get_model("llama3-8b")
    g = ShardGeometry(tokens=8192.0, seq_len=8192, cp=1, tp=1, sp=False, ep=1, etp=1)
    lt = layer_time(model, 0, g, H100, "bf16", 2, CAL)
    # Llama-3.1-8B: k (1024) + o (4096) + w3 (14336) over q, k, v, o, w1, w3, w2
    share = (1024 + 4096 + 14336) / (4096 + 1024 + 1024 + 4096 + 3 * 14336)
    assert lt.op_sac_gemm_share == pytest.approx(share)
    assert lt.op_sac_recompute == pytest.approx(share * lt.gemm_fwd + lt.elementwise_fwd)
    assert lt.selective_recompute < lt.op_sac_recompute < lt.forward


def test_routed_rows_follow_the_expert_tp_gather() -> None:
    """A rank's experts process its sequence shard's routed copies times the expert-TP degree (the
    all-gather over the expert-TP group); the activation function and the expert GEMMs use them."""
    model = get_model("mixtral-8x7b")  # 8 experts, top 2, one MoE layer per block
    folded = ShardGeometry(tokens=4096.0, seq_len=4096, cp=1, tp=4, sp=True, ep=8, etp=1)
    tp_experts = ShardGeometry(tokens=4096.0, seq_len=4096, cp=1, tp=4, sp=True, ep=2, etp=4)
    assert routed_rows(model, folded) == 4096 / 4 * 2
    assert routed_rows(model, tp_experts) == 4096 / 4 * 2 * 4
    f = model.moe_ffn_hidden_size
    # gated: read 2f, write f per row, the expert's f split over expert TP
    assert activation_function_bytes(model, 0, folded, 2) == pytest.approx(3 * f * 2048 * 2)
    assert activation_function_bytes(model, 0, tp_experts, 2) == pytest.approx(3 * f / 4 * 8192 * 2)


def test_fp8_experts_pay_their_quantize_kernels_and_bf16_and_dense_layers_do_not() -> None:
    """Transformer Engine's GroupedLinear quantizes each expert's input (forward) and grad output
    (backward) in kernels of their own: 4 bytes per element (read bf16, write row- and column-wise
    FP8). Mixtral (h 4096, f 14336, gated) at 2048 routed rows: forward h + f, backward h + 2f;
    and each pass pads the rows in and out (`Fp8Padding` / `Fp8Unpadding`: two h-wide 16-bit copies,
    read and write)."""
    model = get_model("mixtral-8x7b")
    g = ShardGeometry(tokens=4096.0, seq_len=4096, cp=1, tp=4, sp=True, ep=8, etp=1)
    h, f, rows = model.hidden_size, model.moe_ffn_hidden_size, 2048
    fwd, bwd = fp8_expert_quantize_bytes(model, 0, g)
    padding = 2 * (2 + 2) * rows * h
    assert fwd == pytest.approx(4 * rows * (h + f) + padding)
    assert bwd == pytest.approx(4 * rows * (h + 2 * f) + padding)
    fp8, bf16 = (layer_time(model, 0, g, H100, p, 2, CAL) for p in ("fp8", "bf16"))
    bandwidth = hbm_bandwidth(H100, CAL)
    assert fp8.quant_fwd == pytest.approx(fwd / bandwidth) and fp8.quant_bwd == pytest.approx(bwd / bandwidth)
    assert bf16.quant_fwd == bf16.quant_bwd == 0.0
    dense = get_model("llama3-8b")
    assert fp8_expert_quantize_bytes(dense, 0, g) == (0.0, 0.0)


def test_ring_merges_cost_every_step_after_the_first_and_grow_as_blocks_shorten() -> None:
    """Ring context parallelism merges the partial outputs (forward) and adds each step's dQ and
    dK / dV (backward) outside the attention kernel: `RING_MERGE_TE` (Transformer Engine, every
    partial output rescaled in the input dtype), `RING_MERGE_TORCH_EAGER` (torch's op-by-op fp32
    merger) or `RING_MERGE_TORCH_FUSED` (compiled) bytes over the rank's output (tokens x heads /
    tp x v_dim) and its K/V block (GQA's K/V heads), once and at each of the cp - 1 later steps.
    Nothing without CP or under all-gather attention. At a fixed sequence, more CP shortens each
    rank's block: its attention falls as 1 / cp, the merges do not, so their share grows."""
    model = get_model("llama3-8b")  # 32 heads, 8 K/V heads, head dim 128
    bandwidth = hbm_bandwidth(H100, CAL)
    seq, tp = 8192, 2
    for cp in (2, 4, 8):
        tokens = seq / cp
        out = tokens * 32 / tp * 128
        kv = tokens * 8 / tp * 256

        def geometry(cp: int = cp, tokens: float = tokens, **kw: bool) -> ShardGeometry:
            return ShardGeometry(tokens=tokens, seq_len=seq, cp=cp, tp=tp, sp=True, ep=1, etp=tp, **kw)

        fwd, bwd = ring_merge_times(model, 0, geometry(), H100, CAL)
        assert fwd == pytest.approx(cp * 6 * out / bandwidth)
        assert bwd == pytest.approx((cp - 1) * (6 * out + 6 * kv) / bandwidth)
        fwd_e, bwd_e = ring_merge_times(model, 0, geometry(torch_ring=True, eager=True), H100, CAL)
        assert fwd_e == pytest.approx((12 * out + (cp - 1) * (38 * out + 4 * kv)) / bandwidth)
        assert bwd_e == pytest.approx((6 * (out + kv) + (cp - 1) * (10 * out + 25 * kv)) / bandwidth)
        fwd_c, bwd_c = ring_merge_times(model, 0, geometry(torch_ring=True), H100, CAL)
        assert fwd_c == pytest.approx((12 * out + (cp - 1) * (10 * out + 4 * kv)) / bandwidth)
        assert bwd_c == pytest.approx((6 * (out + kv) + (cp - 1) * (10 * out + 18 * kv)) / bandwidth)
        lt = layer_time(model, 0, geometry(), H100, "bf16", 2, CAL)
        assert (lt.ring_fwd, lt.ring_bwd) == (fwd, bwd)
        assert lt.selective_recompute_of(("core_attn",)) == pytest.approx(lt.attention_fwd + fwd)
    shares = []
    for cp in (2, 4, 8):
        g = ShardGeometry(tokens=seq / cp, seq_len=seq, cp=cp, tp=tp, sp=True, ep=1, etp=tp)
        lt = layer_time(model, 0, g, H100, "bf16", 2, CAL)
        shares.append(lt.ring_fwd / lt.attention_fwd)
    assert shares[0] < shares[1] < shares[2]
    none = ShardGeometry(tokens=seq, seq_len=seq, cp=1, tp=tp, sp=True, ep=1, etp=tp)
    gathered = ShardGeometry(tokens=seq / 4, seq_len=seq, cp=4, tp=tp, sp=True, ep=1, etp=tp, cp_ring=False)
    assert ring_merge_times(model, 0, none, H100, CAL) == (0.0, 0.0)
    assert ring_merge_times(model, 0, gathered, H100, CAL) == (0.0, 0.0)
    ring4 = ShardGeometry(tokens=seq / 4, seq_len=seq, cp=4, tp=tp, sp=True, ep=1, etp=tp)
    arrays = ShardGeometry(tokens=np.array([seq, seq / 4]), seq_len=seq, cp=np.array([1, 4]), tp=tp, sp=True, ep=1, etp=tp)
    fwd_a, _ = ring_merge_times(model, 0, arrays, H100, CAL)  # the search prices geometries as arrays
    assert fwd_a[0] == 0.0 and fwd_a[1] == pytest.approx(ring_merge_times(model, 0, ring4, H100, CAL)[0])


def test_sorting_by_local_expert_costs_only_with_several_local_experts() -> None:
    """Permutation 2 (rows sorted by local expert and back) reads and writes every received row,
    twice per forward; with one expert per rank there is nothing to sort."""
    model = get_model("mixtral-8x7b")
    one = ShardGeometry(tokens=4096.0, seq_len=4096, cp=1, tp=1, sp=False, ep=8, etp=1)
    two = ShardGeometry(tokens=4096.0, seq_len=4096, cp=1, tp=1, sp=False, ep=4, etp=1)
    rows = 4096 * 2
    assert moe_kernel_bytes(model, two, 2) - moe_kernel_bytes(model, one, 2) == pytest.approx(
        2 * 2 * rows * model.hidden_size * 2
    )


def test_eager_kernels_move_the_upcasts_of_norms_and_rotary_and_the_unfused_swiglu() -> None:
    """Llama (RMSNorm, RoPE, SwiGLU, GQA) run op by op: the eager bytes exceed the fused ones by
    exactly the norms' float32 chain, rotary's upcast, the attention output copy, repeat_kv and the
    second activation kernel (`elementwise_bytes`)."""
    model = get_model("llama3-8b")
    tokens, a = 8192.0, 2
    fused = ShardGeometry(tokens=tokens, seq_len=8192, cp=1, tp=1, sp=False, ep=1, etp=1)
    eager = ShardGeometry(tokens=tokens, seq_len=8192, cp=1, tp=1, sp=False, ep=1, etp=1, eager=True)
    h, d, q, kv, f = model.hidden_size, model.qk_head_dim, model.num_heads, model.kv_heads, model.ffn_hidden_size
    assert eager_norm_bytes(2) == 36 and eager_rotary_bytes(2) == 20  # fused: 4 each (read + write bf16)
    extra_per_token = (
        2 * (eager_norm_bytes(a) - 2 * a) * h  # two norms
        + (eager_rotary_bytes(a) - 2 * a) * (q + kv) * d  # rotary on q and k
        + 2 * a * q * d  # attention output transposed back
        + 2 * a * (kv * d + q * d)  # repeat_kv of K and V
        + 2 * a * f  # silu and the product as two kernels: read 3f write 2f vs read 2f write f
    )
    diff = elementwise_bytes(model, 0, eager, a) - elementwise_bytes(model, 0, fused, a)
    assert diff == pytest.approx(extra_per_token * tokens)
    assert elementwise_bytes(model, 0, eager, a) > 2.5 * elementwise_bytes(model, 0, fused, a)
    assert layer_kernels(model, 0, eager) == layer_kernels(model, 0, fused) + 2 * 6 + 4 + 1 + 2 + 1


def test_eager_kernels_cost_nothing_more_for_layernorm_learned_positions_and_gelu() -> None:
    """GPT-3 (LayerNorm, learned positions, GELU, MHA): F.layer_norm and the GELU are one kernel each
    in eager PyTorch and there is no rotary, so only the attention output copy is added."""
    model = get_model("gpt3-175b")
    fused = ShardGeometry(tokens=2048.0, seq_len=2048, cp=1, tp=8, sp=True, ep=1, etp=1)
    eager = ShardGeometry(tokens=2048.0, seq_len=2048, cp=1, tp=8, sp=True, ep=1, etp=1, eager=True)
    diff = elementwise_bytes(model, 0, eager, 2) - elementwise_bytes(model, 0, fused, 2)
    assert diff == pytest.approx(2 * 2 * model.num_heads / 8 * model.v_dim * 2048)


def test_the_embedding_gradient_is_the_whole_table_every_micro_batch() -> None:
    """PyTorch's embedding backward zero-fills a dense gradient of the vocab / tp x hidden shard
    (2 bytes each in bf16); Megatron's DDP hook adds it to the float32 main_grad (read 2 + 4, write 4);
    tied embeddings with the head on the same rank add the head's zeros and their sum (8)."""
    hbm = hbm_bandwidth(H100, CAL)
    llama = get_model("llama3-8b")
    elements = llama.vocab_size / 4 * llama.hidden_size
    assert embedding_gradient_time(llama, 4, H100, "fsdp", 2, 4, True, CAL) == pytest.approx(2 * elements / hbm)
    megatron = embedding_gradient_time(llama, 4, H100, "megatron", 2, 4, True, CAL)
    assert megatron == pytest.approx((2 + 2 + 2 * 4) * elements / hbm)
    tied = llama.model_copy(update={"tie_embeddings": True})
    assert embedding_gradient_time(tied, 4, H100, "megatron", 2, 4, True, CAL) == pytest.approx(megatron + 8 * elements / hbm)
    assert embedding_gradient_time(tied, 4, H100, "megatron", 2, 4, False, CAL) == pytest.approx(megatron)


def test_the_embedding_gradient_costs_its_rank_and_not_a_frozen_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """On rank 0 (the embedding's) once per micro-batch; not at all on a LoRA base (no gradient)."""
    from cluster_specs.presets import get_cluster
    from cost_models import mesh_comm, stage_table
    from cost_models.layout import Layout
    from cost_models.stages import StagePartition
    from model_specs.spec import TrainingSpec

    model, cluster = get_model("llama3-8b"), get_cluster("dgx-h100")

    def compute(method: str, batch: int) -> np.ndarray:
        # a distinct global batch per call: the per-job memo (`comm_store`) keeps nothing across them
        training = TrainingSpec(seq_len=4096, global_batch=batch, method=method)
        lay = Layout(tp=2, pp=2, micro_batch=1).resolved(64, training)
        part = StagePartition.for_layout(model.num_layers, lay)
        return stage_table.build_table(model, training, cluster, 64, lay, part, CAL).compute

    full, lora = compute("full", 64), compute("lora", 64)
    monkeypatch.setattr(mesh_comm, "embedding_gradient_time", lambda *a: 0.0)
    full_free, lora_free = compute("full", 128), compute("lora", 128)
    grad = embedding_gradient_time(model, 2, cluster.gpu, "megatron", 2, 2, False, CAL)
    assert full[0] - full_free[0] == pytest.approx(grad, rel=1e-9)
    assert full[1] == pytest.approx(full_free[1], rel=1e-12)
    np.testing.assert_allclose(lora, lora_free, rtol=1e-12)
