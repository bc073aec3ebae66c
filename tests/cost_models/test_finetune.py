"""LoRA and QLoRA priced from first principles (`cost_models.finetune`): frozen base weights have
no gradients and no optimizer states, their backward computes input gradients only, data-parallel
reductions carry the adapters, ZeRO-3 still gathers the (quantized) base."""

import pytest

from cluster_specs.presets import get_cluster
from cost_models.estimate import estimate
from cost_models.flops import step_flops
from cost_models.layout import Layout, validate_layout
from model_specs.params import count_params, layer_linears, trainable_counts
from model_specs.presets import get_model
from model_specs.spec import LORA_MODULE_NAMES, TrainingSpec

GIB = 2**30
L70 = get_model("llama3-70b")
A100 = get_cluster("dgx-a100-80g")


def training(method: str, **kw) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch=16, method=method, **kw)


def test_lora_70b_on_8_a100_fits_with_zero3_in_less_than_half_the_memory() -> None:
    """The issue's check: LoRA rank 16 on all linear layers of Llama-3-70B, ZeRO-3 over 8 A100-80GB,
    fits and needs less than half of what full fine-tuning needs at the same layout."""
    lay = Layout(zero_stage=3, framework="fsdp", recompute="full", micro_batch=1)
    full = estimate(L70, training("full"), A100, 8, lay)
    lora = estimate(L70, training("lora", lora_rank=16), A100, 8, lay)
    assert not full.fits  # 12 bytes x 70.6e9 / 8 of optimizer states alone: 98.6 GiB
    assert lora.fits and lora.peak_bytes < 0.5 * full.peak_bytes


def test_frozen_base_has_no_gradients_or_optimizer_states() -> None:
    """ZeRO-0 without sharding: gradients and optimizer states are those of the adapters exactly
    (2 and 12 bytes per adapter element), the weights the whole base plus the adapters. (DeepSpeed:
    its gradients live through the whole step, where FSDP's peak may come before they exist.)"""
    m = get_model("llama3-8b")
    tr = TrainingSpec(seq_len=2048, global_batch=8, method="lora", lora_rank=16)
    est = estimate(m, tr, get_cluster("dgx-h100"), 8, Layout(zero_stage=0, framework="deepspeed"))
    mem = est.memory[0]
    adapters = trainable_counts(m, "lora", LORA_MODULE_NAMES, 16).adapters
    assert mem.gradients == pytest.approx(2 * adapters)
    assert mem.optimizer == pytest.approx(12 * adapters)
    assert mem.parameters == pytest.approx(2 * (count_params(m).total + adapters))


def test_qlora_stores_linear_weights_at_nf4_with_double_quantization() -> None:
    """QLoRA Sec. 3: 4 bits per weight plus 8/64 + 32/(64 x 256) = 0.127 bits of constants; the
    embedding, norms and LM head stay 16-bit."""
    m = get_model("llama3-8b")
    tr = TrainingSpec(seq_len=2048, global_batch=8, method="qlora", lora_rank=16)
    assert tr.quantized_weight_bytes * 8 == pytest.approx(4.127, abs=5e-4)
    est = estimate(m, tr, get_cluster("dgx-h100"), 1, Layout(zero_stage=0, framework="deepspeed"))
    pc = count_params(m)
    linear = sum(x.params for i in range(m.num_layers) for x in layer_linears(m, i))
    adapters = trainable_counts(m, "qlora", LORA_MODULE_NAMES, 16).adapters
    expected = tr.quantized_weight_bytes * linear + 2 * (pc.total - linear) + 2 * adapters
    assert est.memory[0].parameters == pytest.approx(expected)
    int8 = TrainingSpec(seq_len=2048, global_batch=8, method="qlora", quant_format="int8")
    assert estimate(m, int8, get_cluster("dgx-h100"), 1, Layout(zero_stage=0, framework="deepspeed")).memory[0].parameters > expected


def test_frozen_weights_skip_their_weight_gradients() -> None:
    """Model FLOPs of LoRA: the weight GEMMs run forward and input-gradient (2x), the adapters 6
    FLOPs per element and token; the difference to full training is one forward of the GEMMs."""
    m = get_model("llama3-8b")
    full = step_flops(m, 4096, 4)
    lora = step_flops(m, 4096, 4, frozen_base=True, adapter_params_per_token=1000.0)
    matmul_fwd = full.matmul_flops / 3
    assert full.model_flops - lora.model_flops == pytest.approx(matmul_fwd - 6 * 4096 * 4 * 1000.0)


def test_lora_step_is_faster_but_not_by_the_flops_ratio() -> None:
    """Same layout: LoRA saves the weight-gradient GEMMs (a third of the GEMM work) but adds
    memory-bound adapter kernels, so its compute lands between 2/3 and 1 of full training's."""
    lay = Layout(zero_stage=3, framework="fsdp", recompute="full", micro_batch=1)
    full = estimate(L70, training("full"), A100, 8, lay)
    lora = estimate(L70, training("lora"), A100, 8, lay)
    ratio = lora.time.compute / full.time.compute
    assert 2 / 3 < ratio < 0.95


def test_data_parallel_reduction_carries_only_the_adapters() -> None:
    """ZeRO-0 over 64 GPUs: full training all-reduces 2 bytes per parameter once per step; LoRA only
    the adapters' (0.5% of them), and its optimizer step touches only the adapters."""
    from cost_models.calibration import default_calibration
    from cost_models.estimate import pricing_context
    from cost_models.stage_data import Sharding
    from cost_models.stage_table import build_table
    from cost_models.step_time import data_parallel_times

    m = get_model("llama3-8b")
    h100 = get_cluster("dgx-h100")
    cal = default_calibration()
    reduce_s = {}
    for method in ("full", "lora"):
        ctx = pricing_context(m, TrainingSpec(seq_len=4096, global_batch=64, method=method), h100, 64,
                              Layout(zero_stage=0, framework="fsdp", micro_batch=1))
        t = build_table(ctx.model, ctx.training, ctx.cluster, ctx.gpus, ctx.layout, ctx.partition, cal)
        dp = data_parallel_times(t, (Sharding(0, 64),), cal)
        reduce_s[method] = (float(dp.reduce.sum()), float(dp.optimizer[..., 0].sum()))
    assert reduce_s["lora"][0] < 0.05 * reduce_s["full"][0]
    assert reduce_s["lora"][1] < 0.01 * reduce_s["full"][1]


def test_zero3_still_gathers_the_frozen_base() -> None:
    """FSDP shards and gathers every parameter, frozen or not: ZeRO-3 LoRA moves the base each
    micro-batch, QLoRA a quarter of its bytes."""
    m = get_model("llama3-8b")
    h100 = get_cluster("dgx-h100")
    lay = Layout(zero_stage=3, framework="fsdp", micro_batch=1)
    tr = {"seq_len": 1024, "global_batch": 64}
    lora = estimate(m, TrainingSpec(**tr, method="lora"), h100, 64, lay)
    qlora = estimate(m, TrainingSpec(**tr, method="qlora"), h100, 64, lay)
    z0 = estimate(m, TrainingSpec(**tr, method="lora"), h100, 64, Layout(zero_stage=0, framework="fsdp", micro_batch=1))
    assert lora.memory[0].parameters < z0.memory[0].parameters / 32
    assert qlora.memory[0].parameters < 0.5 * lora.memory[0].parameters


def test_qlora_cannot_be_tensor_or_pipeline_parallel_or_megatron() -> None:
    tr = TrainingSpec(seq_len=2048, global_batch=8, method="qlora")
    m = get_model("llama3-8b")
    fields = {v.field for v in validate_layout(m, tr, 8, Layout(tp=2, pp=2, framework="megatron"))}
    assert {"tp", "pp", "framework"} <= fields
    assert not validate_layout(m, tr, 8, Layout(framework="fsdp", zero_stage=3))


def test_a_target_list_the_model_lacks_is_refused_under_training() -> None:
    tr = TrainingSpec(seq_len=2048, global_batch=8, method="lora", lora_targets=("kv_b_proj",))
    (v,) = validate_layout(get_model("llama3-8b"), tr, 8, Layout(framework="fsdp"))
    assert v.path == ("training", "lora_targets") and "q_proj, k_proj" in v.message


@pytest.mark.parametrize("bad", [
    {"method": "full", "lora_rank": 8},
    {"method": "lora", "quant_format": "nf4"},
    {"method": "qlora", "precision": "fp8"},
    {"method": "lora", "lora_targets": ()},
    {"method": "lora", "lora_targets": ("q_proj", "q_proj")},
    {"method": "lora", "lora_rank": 0},
])
def test_inconsistent_method_fields_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        TrainingSpec(seq_len=128, global_batch=1, **bad)
