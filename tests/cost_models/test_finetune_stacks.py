"""Fine-tuning stacks and their techniques priced from their code (cost_models.stacks), the frozen
base counted once, and the H200 LoRA runs of data/measurements/h200-2026-11."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster_specs.presets import get_cluster
from cost_models import stacks
from cost_models.activations import ActivationContext, adapter_saved_bytes
from cost_models.calibration import default_calibration
from cost_models.compute import hbm_bandwidth
from cost_models.estimate import estimate
from cost_models.layout import Layout, validate_layout
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.plan import Plan

GIB = 2**30
H200 = Path(__file__).resolve().parents[2] / "data" / "measurements" / "h200-2026-11"


def _hf(**kw: object) -> Layout:
    return Layout(framework="fsdp", stack="hf", zero_stage=0, elementwise_kernels="eager", norm_kernel="eager_fp32", **kw)  # type: ignore[arg-type]


def test_the_frozen_base_is_counted_once_at_every_zero_stage_on_one_gpu() -> None:
    """Llama-3-8B LoRA on one H200 stored 29.99 GiB of parameters at ZeRO 0 (the bf16 base twice);
    QLoRA of Llama-3-70B on one L40S 168.6 GiB at ZeRO 0 against 37.2 at ZeRO 1."""
    lora = TrainingSpec(seq_len=4096, global_batch=16, method="lora")
    est = estimate(get_model("llama3-8b"), lora, get_cluster("dgx-h200"), 1, Layout(framework="fsdp", zero_stage=0, recompute="full"))
    base = 2 * 8.03e9 / GIB
    assert base < est.memory[0].parameters / GIB < base + 0.2  # the base once, and the adapters' bf16 copy
    qlora = TrainingSpec(seq_len=512, global_batch=16, method="qlora", lora_rank=64)
    m, l40s = get_model("llama3-70b"), get_cluster("l40s-pcie-8")
    for stack in (None, "hf"):
        params = [estimate(m, qlora, l40s, 1, Layout(framework="fsdp", zero_stage=z, stack=stack, recompute="full")).memory[0].parameters
                  for z in (0, 1, 3)]
        assert max(params) - min(params) < 2 * GIB  # at most the adapters' compute-dtype copy apart
        assert max(params) < 41 * GIB


def test_the_runtimes_h200_lora_run_is_priced_within_5_percent() -> None:
    plan = Plan.model_validate_json((H200 / "plan_lora_16L.json").read_text())
    assert plan.best is not None
    inp = plan.inputs
    est = estimate(inp.model, inp.training, inp.cluster, inp.gpus, plan.best.layout)
    measured = max(json.loads((H200 / "runs.json").read_text())["prof_lora16"]["peak_memory_bytes_per_rank"])
    allocated = est.peak_memory.total - est.peak_memory.reserve
    assert allocated == pytest.approx(measured, rel=0.05)


def test_hf_peft_lora_on_the_h200_is_priced_within_5_percent() -> None:
    """hf_peer.py: Llama-3-8B, PEFT LoRA r16 all-linear, bf16 base, SDPA, mb 1, seq 4096, no checkpointing."""
    hf = json.loads((H200 / "runs.json").read_text())["hf_lora"]
    tr = TrainingSpec(seq_len=4096, global_batch=16, method="lora", lora_rank=16)
    est = estimate(get_model("llama3-8b"), tr, get_cluster("dgx-h200"), 1, _hf(micro_batch=1))
    assert est.peak_memory.total - est.peak_memory.reserve == pytest.approx(hf["max_allocated"], rel=0.05)


def test_peft_keeps_a_float32_input_per_adapted_module_and_torchtune_one_shared_input() -> None:
    """Measured on CPU with PEFT 0.21.2: each adapted module keeps 4 x (in + r) bytes per token."""
    tr = TrainingSpec(seq_len=128, global_batch=1, method="lora", lora_rank=8)
    peft_bytes, copies = stacks.adapter_input_bytes(tr, "hf")
    ctx = ActivationContext(128, 1, 1, False, 1, 2, "fsdp", adapted=tr.lora_modules, adapter_input_bytes=peft_bytes,
                            adapter_copies=copies, adapter_rank=8)
    assert adapter_saved_bytes(ctx, ("q_proj", "k_proj", "v_proj"), 256) == 128 * 3 * 4 * (256 + 8)
    tt_bytes, tt_copies = stacks.adapter_input_bytes(tr, "torchtune")
    tt = ActivationContext(128, 1, 1, False, 1, 2, "fsdp", adapted=tr.lora_modules, adapter_input_bytes=tt_bytes,
                           adapter_copies=tt_copies, adapter_rank=8)
    assert adapter_saved_bytes(tt, ("q_proj", "k_proj", "v_proj"), 256) == 128 * (2 * 256 + 3 * 2 * 8)
    frozen_only = ActivationContext(128, 1, 1, False, 1, 2, "fsdp", adapted=("q_proj",))
    assert adapter_saved_bytes(frozen_only, ("gate_proj", "up_proj"), 256) == 0.0  # frozen linears keep nothing


def test_trained_bytes_follow_each_stacks_dtypes() -> None:
    full, lora = TrainingSpec(seq_len=128, global_batch=1), TrainingSpec(seq_len=128, global_batch=1, method="lora")
    assert stacks.trainable_bytes(full, None).total == 16  # the framework loops' mixed-precision Adam
    assert stacks.trainable_bytes(lora, "hf").total == 16  # PEFT's float32 adapters
    assert stacks.trainable_bytes(full, "torchtune").total == 8  # bf16 weights and moments, no master
    fp32 = TrainingSpec(seq_len=128, global_batch=1, master_weights=True)
    assert stacks.trainable_bytes(fp32, "hf").total == 18  # + autocast's bf16 copy
    int8 = stacks.trainable_bytes(full, "torchtune", "int8")
    assert int8.optimizer == pytest.approx(2 * (1 + 4 / 256)) and not int8.paged
    assert stacks.trainable_bytes(full, "torchtune", "int4").optimizer == pytest.approx(2 * (0.5 + 4 / 128))
    assert stacks.trainable_bytes(full, "torchtune", "int8_paged").paged


def test_autocast_casts_and_accumulation_move_the_bytes_of_their_kernels() -> None:
    """torch autocast's casts of float32 GEMM weights (read 4, write 2; the gradient back: read 2,
    write 4) and autograd's in-place accumulation (3 passes from the second micro-batch on)."""
    fp32 = TrainingSpec(seq_len=128, global_batch=8, master_weights=True)
    bf16 = TrainingSpec(seq_len=128, global_batch=8)
    lora = TrainingSpec(seq_len=128, global_batch=8, method="lora", master_weights=True)
    assert stacks.autocast_weights(fp32, "hf") and stacks.cast_bytes(fp32, "hf") == (6.0, 6.0)
    assert stacks.cast_bytes(bf16, "hf") == (0.0, 0.0)  # loaded in bf16: nothing to cast
    assert stacks.cast_bytes(lora, "hf") == (0.0, 0.0)  # a frozen base is not trained in float32
    assert stacks.cast_bytes(fp32, None) == (0.0, 0.0)  # the framework loops price their own casts
    assert not stacks.autocast_weights(TrainingSpec(seq_len=128, global_batch=8, precision="fp32", master_weights=True), "hf")
    assert stacks.accumulation_bytes(fp32, "hf", "full", 8) == pytest.approx(3 * 4 * 7 / 8)
    assert stacks.accumulation_bytes(bf16, "hf", "full", 8) == pytest.approx(3 * 2 * 7 / 8)
    assert stacks.accumulation_bytes(fp32, "hf", "full", 1) == 0.0
    assert stacks.accumulation_bytes(fp32, None, "full", 8) == 0.0


def test_float32_weights_under_autocast_are_priced_from_their_mechanism() -> None:
    """A 2-layer Llama-3-8B on one H200, 4 micro-batches of 1 x 1024 in the hf stack, loaded in float32
    vs bf16, by hand: N = 1,486,901,248 parameters, G = 2 x 218,103,808 layer linears + 128,256 x 4,096
    LM head = 961,544,192 GEMM weights. Memory: 4 N + 2 G of weights and cached casts (2 N in bf16),
    4 N of gradients, 8 N of AdamW states. Time: per micro-batch 6 + 6 bytes of casts per GEMM weight
    and, averaged, 3 x 3/4 x (4 - 2) bytes more of accumulation per parameter; the fused AdamW step
    moves 28 against 14 bytes per parameter; full recompute casts the layers' weights again (6 bytes)."""
    m = get_model("llama3-8b").model_copy(update={"num_layers": 2})
    h200 = get_cluster("dgx-h200")
    n, g, layer = 1_486_901_248, 2 * 218_103_808 + 128_256 * 4_096, 218_103_808
    hbm = hbm_bandwidth(h200.gpu, default_calibration(), "fsdp")

    def priced(master: bool, recompute: str = "none"):  # type: ignore[no-untyped-def]
        tr = TrainingSpec(seq_len=1024, global_batch=4, master_weights=master)
        return estimate(m, tr, h200, 1, _hf(micro_batch=1, recompute=recompute))

    fp32, bf16 = priced(True), priced(False)
    assert fp32.memory[0].parameters == 4 * n + 2 * g and bf16.memory[0].parameters == 2 * n
    assert fp32.memory[0].gradients == 4 * n and fp32.memory[0].optimizer == 8 * n
    assert (fp32.time.compute - bf16.time.compute) * hbm == pytest.approx(4 * 12 * g + 3 * 3 * 2 * n, rel=1e-9)
    assert (fp32.time.optimizer - bf16.time.optimizer) * hbm == pytest.approx((28 - 14) * n, rel=1e-9)
    fp32_full, bf16_full = priced(True, "full"), priced(False, "full")
    full = (fp32_full.time.compute + fp32_full.time.recompute) - (bf16_full.time.compute + bf16_full.time.recompute)
    assert (full - (fp32.time.compute - bf16.time.compute)) * hbm == pytest.approx(4 * 6 * 2 * layer, rel=1e-9)


def test_the_runtime_on_one_replica_is_priced_as_it_runs_at_every_zero_stage() -> None:
    """The runtime builds no FSDP mesh at dp x cp = 1 and trains float32 weights under bf16 autocast
    (`stacks.UNWRAPPED`), so the 2-layer Llama-3-8B of the test above, in framework fsdp without a stack,
    on one H200, is priced at ZeRO 0-3 alike and as the hf stack prices a float32 model: by hand,
    4 N + 2 G of weights and cached casts, 4 N of gradients, 8 N of AdamW states, the same compute
    (casts and accumulation), and torch's foreach AdamW step over float32 tensors: (2 x 8 + 4 + 2 x 4)
    x 20 / 7 = 80 bytes per parameter against the fused 28. On two GPUs FSDP shards and casts them:
    ZeRO-1 stores the bf16 working weights (2 N) and its step moves 2 x 12 + 2 + 2 bytes over half of them."""
    m = get_model("llama3-8b").model_copy(update={"num_layers": 2})
    h200 = get_cluster("dgx-h200")
    n, g = 1_486_901_248, 2 * 218_103_808 + 128_256 * 4_096
    hbm = hbm_bandwidth(h200.gpu, default_calibration(), "fsdp")
    kernels = dict(elementwise_kernels="eager", norm_kernel="eager_fp32", micro_batch=1)
    tr = TrainingSpec(seq_len=1024, global_batch=4)
    hf = estimate(m, tr.model_copy(update={"master_weights": True}), h200, 1, _hf(micro_batch=1))
    for zero in (0, 1, 3):
        est = estimate(m, tr, h200, 1, Layout(framework="fsdp", zero_stage=zero, **kernels))  # type: ignore[arg-type]
        mem = est.memory[0]
        assert (mem.parameters, mem.gradients, mem.optimizer, mem.comm_buffers) == (4 * n + 2 * g, 4 * n, 8 * n, 0)
        assert est.time.compute == pytest.approx(hf.time.compute, rel=1e-12)
        assert est.time.optimizer * hbm == pytest.approx(80 * n, rel=1e-9)
    assert hf.time.optimizer * hbm == pytest.approx(28 * n, rel=1e-9)
    two = estimate(m, tr.model_copy(update={"global_batch": 8}), h200, 2, Layout(framework="fsdp", zero_stage=1, **kernels))  # type: ignore[arg-type]
    assert two.memory[0].parameters == 2 * n and two.time.optimizer * hbm == pytest.approx(28 * n / 2, rel=1e-9)
    assert stacks.weights_owner("fsdp", None, 1, 2) is None and stacks.weights_owner("megatron", None, 1, 1) is None


def test_each_technique_saves_the_memory_it_should() -> None:
    """torchtune's flags table, one technique at a time: Llama-3.2-3B shape on one A100, batch 2 x 4096."""
    m = get_model("llama3-8b").model_copy(update={"num_layers": 8})
    tr = TrainingSpec(seq_len=4096, global_batch=2)
    a100 = get_cluster("dgx-a100-80g")
    base = dict(framework="fsdp", stack="torchtune", zero_stage=0, micro_batch=2)

    def mem(**kw: object) -> dict[str, float]:
        return estimate(m, tr, a100, 1, Layout(**{**base, **kw})).peak_memory.as_dict()  # type: ignore[arg-type]

    eager, chunked = mem(cross_entropy="eager"), mem()
    assert chunked["logits_bytes"] < 0.25 * eager["logits_bytes"]
    ac = mem(recompute="full")
    assert ac["activations_bytes"] < 0.2 * chunked["activations_bytes"]
    oib = mem(recompute="full", optimizer_in_backward=True)
    assert oib["gradients_bytes"] < 0.1 * max(ac["gradients_bytes"], 1)
    off = mem(recompute="full", offload_activations=True)
    assert off["activations_bytes"] <= ac["activations_bytes"] and off["host_optimizer_bytes"] > 0
    int8 = mem(recompute="full", optimizer_state="int8")
    assert int8["optimizer_bytes"] == pytest.approx(ac["optimizer_bytes"] * (1 + 4 / 256) / 2)
    paged = mem(recompute="full", optimizer_state="int8_paged")
    assert paged["optimizer_bytes"] == 0 and paged["host_optimizer_bytes"] > 0


def test_dora_costs_more_than_lora_and_trainable_embeddings_train_the_tables() -> None:
    m, cl = get_model("llama3-8b"), get_cluster("l40s-pcie-8")
    lora = TrainingSpec(seq_len=768, global_batch=4, method="lora", lora_targets=["q_proj", "v_proj"], lora_rank=32)
    dora = lora.model_copy(update={"dora": True})
    a, b = estimate(m, lora, cl, 1, _hf(micro_batch=4)), estimate(m, dora, cl, 1, _hf(micro_batch=4))
    assert b.step_s > a.step_s and b.peak_memory.activations > a.peak_memory.activations
    emb = lora.model_copy(update={"trainable_embeddings": True})
    c = estimate(m, emb, cl, 1, _hf(micro_batch=4))
    tables = 2 * 128256 * 4096  # embedding and LM head, trained in float32 beside PEFT's adapters
    assert c.peak_memory.optimizer - a.peak_memory.optimizer == pytest.approx(8 * tables, rel=0.01)


def test_a_stacks_loop_replaces_the_framework_overhead() -> None:
    m, cl = get_model("llama3-8b"), get_cluster("l40s-pcie-8")
    tr = TrainingSpec(seq_len=256, global_batch=8, method="lora")
    hf = estimate(m, tr, cl, 1, _hf(micro_batch=1))
    o = hf.time.overhead
    from cost_models.calibration import default_calibration

    cal = default_calibration()
    assert o == pytest.approx(cal.stack_overhead("hf").step_s + 8 * cal.stack_overhead("hf").micro_batch_s)


@pytest.mark.parametrize(
    ("layout", "field"),
    [
        (dict(stack="torchtune", tp=2), "tp"),
        (dict(stack="hf", framework="megatron"), "framework"),
        (dict(stack="hf", optimizer_in_backward=True, framework="fsdp"), "optimizer_in_backward"),
        (dict(stack="torchtune", framework="fsdp", offload_activations=True), "offload_activations"),
        (dict(optimizer_state="int8"), "optimizer_state"),
        (dict(framework="fsdp", cross_entropy="chunked"), "cross_entropy"),
    ],
)
def test_what_a_stack_cannot_run_is_refused_with_its_reason(layout: dict, field: str) -> None:
    tr = TrainingSpec(seq_len=1024, global_batch=8, method="lora")
    problems = validate_layout(get_model("llama3-8b"), tr, 2, Layout(**layout))
    assert field in {v.field for v in problems}, problems


def test_the_explanation_says_how_a_one_replica_plan_runs() -> None:
    from planner.explain import unwrapped_sentences

    full = Plan.model_validate_json((H200 / "plan_full_none.json").read_text())
    (line,) = unwrapped_sentences(full)
    assert "ZeRO-1 shards nothing" in line and "float32 weights" in line and "bf16 autocast" in line
    lora = Plan.model_validate_json((H200 / "plan_lora_16L.json").read_text())
    assert "float32 adapters" in unwrapped_sentences(lora)[0]
    assert lora.best is not None
    two = lora.model_copy(update={"best": lora.best.model_copy(update={"layout": lora.best.layout.model_copy(update={"dp": 2})})})
    assert unwrapped_sentences(two) == []


def test_a_stacks_own_stretch_replaces_its_frameworks_in_every_kernel_time() -> None:
    """`StackOverhead.compute` (fitted by bench.finetune_runs --fit; None: the framework's `Stack.compute`)
    multiplies a stack layout's kernel times in place of the framework's, and nothing else's."""
    from dataclasses import replace

    from cost_models.calibration import StackOverhead

    cal = default_calibration()
    fsdp = cal.stack("fsdp").compute
    own = replace(cal, stack_overheads={**cal.stack_overheads, "hf": StackOverhead(kernel_launch_s=1.5e-5, compute=2 * fsdp)})
    assert stacks.stack_calibration(own, "hf").stack("fsdp").compute == 2 * fsdp
    assert stacks.stack_calibration(cal, "hf").stack("fsdp").compute == fsdp  # the prior: borrowed
    assert stacks.stack_calibration(own, "torchtune").stack("fsdp").compute == fsdp
    m, h200 = get_model("llama3-8b").model_copy(update={"num_layers": 2}), get_cluster("dgx-h200")
    tr = TrainingSpec(seq_len=4096, global_batch=4, master_weights=True)
    borrowed, doubled = (estimate(m, tr, h200, 1, _hf(micro_batch=1), calibration=c) for c in (cal, own))
    # GEMMs, attention and the memory-bound kernels (casts and accumulation among them) all stretch twice
    # as much; only the launches' exposed latency does not (`Stack.latency_exposed`, 0 in the fit)
    assert doubled.time.compute == pytest.approx(2 * borrowed.time.compute, rel=1e-3)
    assert doubled.time.optimizer == pytest.approx(2 * borrowed.time.optimizer, rel=1e-9)
    runtime = Layout(framework="fsdp", zero_stage=1, micro_batch=1)
    assert estimate(m, tr, h200, 1, runtime, calibration=own).step_s == estimate(m, tr, h200, 1, runtime, calibration=cal).step_s
