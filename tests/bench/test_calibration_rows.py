"""Row parsing of the published-runs CSV, and the memory-fit requirement on published layouts.

"No published layout that ran may be predicted not to fit": every usable row is priced with the
current calibration and must fit its GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.calibration_rows import (  # noqa: E402
    DEFAULT_CSV,
    CalibrationRow,
    Unusable,
    load_rows,
    narayanan_eq3_flops_per_token,
    our_model_flops_per_token,
)

pytestmark = pytest.mark.skipif(not DEFAULT_CSV.exists(), reason=f"calibration data not found at {DEFAULT_CSV}")


@pytest.fixture(scope="module")
def parsed() -> tuple[dict[int, CalibrationRow], dict[int, Unusable]]:
    rows, bad = load_rows()
    return {r.row_id: r for r in rows}, {u.row_id: u for u in bad}


def test_megatron_readme_row_1(parsed):
    rows, _ = parsed
    r = rows[1]
    lay = r.layout
    assert (lay.tp, lay.pp, lay.dp, lay.cp, lay.vpp) == (1, 1, 48, 1, 1)
    assert r.gpus == 48 and r.cluster_name == "dgx-h100"
    assert lay.framework == "megatron" and lay.zero_stage == 1 and lay.micro_batch == 1
    assert lay.recompute == "none" and lay.sp is False
    m = r.model
    assert (m.num_layers, m.hidden_size, m.num_heads, m.ffn_hidden_size, m.vocab_size) == (24, 2048, 16, 8192, 131072)
    assert m.mlp == "gelu" and m.norm == "layernorm" and m.position_embedding == "learned"
    assert r.training.seq_len == 4096 and r.training.global_batch == 192 and r.training.precision == "bf16"
    # 408.8 TFLOP/s of Megatron model FLOPs per GPU
    per_token = our_model_flops_per_token(m, 4096)
    assert r.measured_tokens_per_s_per_gpu == pytest.approx(408.8e12 / per_token)
    assert any("ffn_hidden blank" in a for a in r.assumptions)


def test_nemo_llama3_70b_with_context_parallel(parsed):
    rows, _ = parsed
    r = rows[509]
    lay = r.layout
    assert (lay.tp, lay.pp, lay.vpp, lay.dp, lay.cp) == (4, 4, 5, 2, 2)
    assert lay.micro_batch == 1 and lay.grad_accum == 64 and lay.sp is True
    assert r.training.precision == "fp8" and r.training.seq_len == 8192
    assert r.model.kv_heads == 8 and r.model.mlp == "swiglu" and r.model.norm == "rmsnorm"
    assert r.measured_tokens_per_s_per_gpu == 1524
    # NeMo's model TFLOP/s use our model-FLOPs convention (full attention, LM head included)
    assert r.flops_check == pytest.approx(1.0, abs=0.005)


def test_llmfoundry_mpt_row(parsed):
    rows, _ = parsed
    r = rows[96]
    lay = r.layout
    assert lay.framework == "fsdp" and lay.zero_stage == 3
    assert (lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.grad_accum) == (1, 1, 512, 8, 1)
    assert lay.recompute == "full"
    m = r.model
    assert m.position_embedding == "alibi" and m.tie_embeddings and m.vocab_size == 50368
    assert not (m.qkv_bias or m.mlp_bias) and m.ffn_hidden_size == 4 * m.hidden_size
    assert r.measured_tokens_per_s_per_gpu == 1007
    sharded = [rows[i] for i in rows if rows[i].source_id == "llmfoundry_mpt" and rows[i].layout.zero_stage == 2]
    assert len(sharded) == 6  # the SHARD_GRAD_OP rows


def test_narayanan_eq3_conversion(parsed):
    rows, _ = parsed
    r = rows[20]  # GPT 530B, 163 TFLOP/s counted with Eq. 3 (recompute included)
    assert (r.layout.tp, r.layout.pp, r.layout.dp) == (8, 35, 9)
    assert r.layout.recompute == "full" and r.layout.zero_stage == 0
    assert r.model.num_heads == 20480 // 128
    assert r.measured_tokens_per_s_per_gpu == pytest.approx(163e12 / narayanan_eq3_flops_per_token(r.model, 2048))
    # Eq. 3 counts the recompute forward: 4/3 of the model FLOPs, up to the LM-head term
    ratio = narayanan_eq3_flops_per_token(r.model, 2048) / our_model_flops_per_token(r.model, 2048)
    assert 1.25 < ratio < 1.34


def test_unusable_rows_have_reasons(parsed):
    rows, bad = parsed
    for rid in (10, 11, 46, 47, 787, 790, 498, 499):
        assert rid in bad and bad[rid].reason
    assert 36 in bad  # Korthikanti memory-only variant
    assert 62 in rows and not rows[62].has_throughput  # Mixtral 8x22B: layout only
    assert len(rows) + len(bad) == 486
    # the Llama 4 rows print no shape: refused with the reason, never guessed (the hybrid Mamba
    # Nemotron-H rows are priced from their preset: test_nemotron_h_rows_are_priced_with_the_hybrid_model)
    assert "no model shape" in bad[490].reason and 483 in rows


def test_dgxc_405b_uneven_pipeline_split(parsed):
    rows, _ = parsed
    r = rows[437]  # Llama 3.1 405B, TP8 PP8 VP8 CP2: 126 layers + embedding + loss = 128 slots
    lay = r.layout
    assert (lay.tp, lay.pp, lay.vpp, lay.cp) == (8, 8, 8, 2)
    assert lay.account_for_embedding_in_pipeline_split and lay.account_for_loss_in_pipeline_split
    assert r.cluster_name == "dgx-h100" and r.training.grad_dtype == "bf16"


def test_dgxc_moe_rows_fold_experts_and_split_unevenly(parsed):
    rows, _ = parsed
    dsv3 = rows[479]  # DeepSeek-V3 TP2 PP16 EP64 ETP1 on 1024 H100: 61 layers over 16 ranks
    assert dsv3.model.attention == "mla" and dsv3.model.num_experts == 256
    assert (dsv3.layout.tp, dsv3.layout.ep, dsv3.layout.etp) == (2, 64, 1)
    # the recipe's own split (pretrain_deepseek_v3.py): 64 // pp - 1 first, 64 // pp - 2 last, 4 between
    assert (dsv3.layout.decoder_first_pipeline_num_layers, dsv3.layout.decoder_last_pipeline_num_layers) == (3, 2)
    assert dsv3.model.num_layers == 3 + 14 * 4 + 2
    grok = rows[470]  # GB200 NVL72 rack
    assert grok.cluster_name == "gb200-nvl72" and grok.model.num_experts == 8 and grok.layout.etp == 4


def test_recipe_switches_from_the_pinned_recipe_code(parsed):
    """`RECIPE_SWITCHES`: settings the v25.05 DGX Cloud recipes fix in code, not in their READMEs."""
    rows, _ = parsed
    nemotron_h = [r for r in rows.values() if r.label.startswith("Nemotron-H")]
    assert len(nemotron_h) == 7 and all(r.layout.tp_comm_overlap is False for r in nemotron_h)
    assert all(any("MegatronCommOverlapCallback" in a for a in r.assumptions) for r in nemotron_h)
    h100, gb200 = rows[478], rows[480]  # DeepSeek-V3 on H100 (PP8) and GB200 (PP4)
    assert h100.layout.tp_comm_overlap is False and gb200.layout.tp_comm_overlap is False
    assert (h100.layout.recompute, h100.layout.recompute_modules) == ("selective", ("mla_up_proj",))
    assert (gb200.layout.recompute, gb200.layout.recompute_modules) == ("selective", ("core_attn",))
    assert h100.recompute_stated and gb200.recompute_stated  # the least-recompute search leaves them alone
    assert (h100.layout.decoder_first_pipeline_num_layers, h100.layout.decoder_last_pipeline_num_layers) == (7, 6)
    assert (gb200.layout.decoder_first_pipeline_num_layers, gb200.layout.decoder_last_pipeline_num_layers) == (15, 14)
    # other releases and workloads keep the loader's conventions
    assert rows[477].layout.tp_comm_overlap is None and rows[443].layout.tp_comm_overlap is None


def test_rows_of_a_megatron_core_before_0_10_are_priced_without_moe_parallel_folding(parsed):
    """`RecipeSwitches.megatron_core_before_0_10`: DGX Cloud v24.11 (NeMo 24.09, Megatron-Core 0.9) and the Megatron-Core
    MoE README (0.8 / 0.9) carve EP out of DP; the v25.05 recipes (Megatron-Core 0.12+) fold it."""
    rows, _ = parsed
    grok_2411 = [rows[i] for i in range(382, 400)]  # DGX Cloud v24.11.1 Grok-1, BF16 and FP8
    assert len(grok_2411) == 18 and all(r.layout.moe_parallel_folding is False for r in grok_2411)
    assert all(any("no MoE parallel folding" in a for a in r.assumptions) for r in grok_2411)
    assert rows[61].layout.moe_parallel_folding is False
    assert all(rows[i].layout.moe_parallel_folding for i in range(470, 483))  # Grok-1 / DeepSeek-V3 v25.05
    assert all(r.layout.moe_parallel_folding for r in rows.values() if not r.model.is_moe)
    # the same stacks have no FSDP and no optimizer offload: their rows are searched without them
    older = {r.row_id for r in rows.values() if r.megatron_core_before_0_10}
    assert older >= set(range(382, 400)) | {61, 1} and not older & set(range(400, 500))
    from bench.published_vs_plan import constraints_for

    c = constraints_for(rows[322])  # Llama 3.1 70B, v24.11
    assert (c.max_zero_stage, c.allow_offload, c.moe_parallel_folding) == (1, False, True)
    c = constraints_for(rows[422])  # the same model, v25.04
    assert (c.max_zero_stage, c.allow_offload) == (3, True)


def test_torchtitan_and_maxtext_rows(parsed):
    rows, _ = parsed
    tt = rows[64]
    assert tt.layout.framework == "fsdp" and tt.layout.zero_stage == 3 and tt.layout.recompute == "op_sac"
    assert tt.cluster_name == "grand-teton-h100" and tt.reported_memory_gib == 82.4
    assert rows[66].training.precision == "fp8"  # "BF16 + Float8 linears"
    # torchtitan without torch.compile runs its norms, rotary and SwiGLU op by op
    assert {i for i, r in rows.items() if r.layout.elementwise_kernels == "eager"} == {64, 67}
    assert rows[65].layout.elementwise_kernels == "fused"  # "FSDP + torch.compile"
    mt = rows[403]  # MaxText FSDP=128 x DP=4 on 512 GPUs
    assert mt.layout.framework == "fsdp" and mt.layout.dp_shard == 128 and mt.layout.recompute == "full"


def test_each_row_attends_with_the_kernel_its_stack_ran(parsed):
    """FlashAttention-2 for llm-foundry's large-scale table (`--attn_impl flash`), torchtitan (SDPA's
    flash backend) and the Nemotron-H recipe (NVTE_FUSED_ATTN=0); FlashAttention in Triton for
    llm-foundry's older tables (`--attn_impl` left at its default, triton); the fused kernel for MaxText
    (cudnn_flash_te), Megatron-DeepSpeed (2021) and every other Megatron row."""
    rows, _ = parsed
    flash2 = {i for i, r in rows.items() if r.layout.attention_kernel_ == "flash2"}
    sources = {rows[i].source_id for i in flash2}
    assert sources == {"llmfoundry_mpt", "torchtitan_2412", "dgxc_benchmarking"}
    foundry = [r for r in rows.values() if r.source_id == "llmfoundry_mpt"]
    large_scale = [r for r in foundry if r.layout.attention_kernel_ == "flash2"]
    assert len(large_scale) == 18 and all(r.gpus >= 128 and r.layout.attention_kernel_ == "flash2" for r in large_scale)
    triton = [r for r in foundry if r.layout.attention_kernel_ == "triton_flash"]
    assert len(triton) == len(foundry) - 18 and {r.cluster.gpu.name for r in triton} == {"H100-80GB", "A100-80GB", "A100-40GB"}
    assert all(any("attn_impl triton" in a for a in r.assumptions) for r in triton)
    assert {i for i in flash2 if rows[i].source_id == "dgxc_benchmarking"} == set(range(483, 490))  # Nemotron-H
    assert all(rows[i].layout.attention_kernel_ == "flash2" for i in range(64, 74))
    assert rows[403].layout.attention_kernel_ == "fused" and rows[403].layout.framework == "fsdp"  # MaxText
    deepspeed = [r for r in rows.values() if r.layout.framework == "deepspeed"]
    assert deepspeed and all(r.layout.attention_kernel_ == "fused" for r in deepspeed)
    from bench.published_vs_plan import constraints_for

    assert constraints_for(rows[70]).attention_kernel == "flash2" and constraints_for(rows[422]).attention_kernel == "fused"


def _not_fitting() -> list[int]:
    from bench.calibration_report import evaluate, not_fitting
    from cost_models.calibration import default_calibration

    rows, _ = load_rows()
    return sorted(r.row.row_id for r in not_fitting(evaluate(rows, default_calibration())))


def test_rows_whose_throughput_contradicts_their_step_time_are_not_scored(parsed):
    """Rows whose printed tokens/s/GPU contradicts their batch / step time / GPUs lose their
    throughput (kept for the fit check): the two the dataset itself marks as reporting a throughput
    inconsistent with the source's GBS. Rows whose notes flag another inconsistency (gradient
    accumulation as printed, 382/383/391/392) keep theirs: throughput and step time agree there."""
    import csv

    rows, _ = parsed
    notes = {int(r["row_id"]): r["notes"] for r in csv.DictReader(DEFAULT_CSV.open())}
    dropped = {i for i, r in rows.items() if r.measured_from.startswith("inconsistent source")}
    assert dropped == {i for i, n in notes.items() if "INCONSISTENT in source: reported" in n} == {472, 475}
    assert all(rows[i].has_throughput for i in (382, 383, 391, 392))
    assert all(rows[i].measured_tokens_per_s_per_gpu is None and not rows[i].has_throughput for i in dropped)
    assert rows[470].measured_tokens_per_s_per_gpu == pytest.approx(2236.7)  # the consistent neighbour keeps its figure


def test_every_published_layout_fits():
    """A layout that ran in public may never be predicted not to fit (issue requirement)."""
    assert _not_fitting() == []


def test_a_source_the_fit_does_not_name_is_a_family_of_its_own():
    """Rows of a source added to the CSV later (the published runs kept from us) form a family of
    their own, priced with the calibration fitted on every stored family (never on them); a stored
    family is priced with the calibration fitted without it (leave-one-family-out)."""
    import dataclasses

    from bench.fit_calibration import FAMILIES, family, lofo_calibration
    from cost_models.calibration import default_calibration

    rows, _ = load_rows()
    named = next(r for r in rows if r.source_id == "torchtitan_2412")
    unseen = dataclasses.replace(named, source_id="a_source_added_later")
    assert family(unseen) == "a_source_added_later" and "a_source_added_later" not in FAMILIES
    assert lofo_calibration(unseen).stacks == default_calibration().stacks
    held = lofo_calibration(named)
    assert "torchtitan" in held.source and held.stack("fsdp") != default_calibration().stack("fsdp")


def test_leave_one_family_out_error_under_target():
    """Median absolute error of tokens/s/GPU over every row, each priced by the calibration fitted
    without its source family (`bench.fit_calibration.lofo_calibration`)."""
    import statistics

    from bench.calibration_report import evaluate_row
    from bench.fit_calibration import lofo_calibration

    rows, _ = load_rows()
    results = [evaluate_row(r, lofo_calibration(r)) for r in rows if r.has_throughput]
    errors = [r.ape for r in results if r.ape is not None]
    assert len(errors) > 400
    assert statistics.median(errors) < 12.0  # percent


def test_torchtitan_measured_peak_memory():
    """torchtitan's measured peaks (`torch.cuda.max_memory_reserved`, so without the CUDA context)
    against the priced peak: op-level SAC rows and full-recompute CP rows."""
    import statistics

    from bench.calibration_report import evaluate
    from cost_models.calibration import default_calibration

    rows, _ = load_rows()
    cal = default_calibration()
    titan = [r for r in rows if r.source_id == "torchtitan_2412"]
    errors = []
    for res in evaluate(titan, cal):
        assert res.estimate is not None and res.estimate.fits
        reserved_gib = (res.estimate.peak_bytes - cal.cuda_context_bytes) / 2**30
        errors.append(100 * (reserved_gib / res.row.reported_memory_gib - 1))
    assert len(errors) == 10
    assert statistics.median(abs(e) for e in errors) < 3.0
    assert max(abs(e) for e in errors) < 7.0  # compiled runs fragment less than eager ones


def test_nemotron_h_rows_are_priced_with_the_hybrid_model(parsed):
    """dgxc-benchmarking's Nemotron-H 56B FP8 rows (483-489) name the model and its 118 layers: they
    are priced with the nemotron-h-56b preset (54 Mamba-2, 54 MLP, 10 attention layers), not refused."""
    from model_specs.params import count_params

    rows, bad = parsed
    assert not any(483 <= i <= 489 for i in bad)
    for i in range(483, 490):
        r = rows[i]
        assert r.model.hybrid_pattern is not None and r.model.hybrid_pattern.count("M") == 54
        assert count_params(r.model).total == 56_324_350_464
        assert (r.layout.tp, r.layout.pp, r.layout.cp) == (8, 1, 1) and r.training.precision == "fp8"
        assert r.measured_tokens_per_s_per_gpu and any("nemotron-h-56b preset" in a for a in r.assumptions)


def test_deepspeed_rows_run_the_release_current_when_their_source_appeared(parsed):
    """Narayanan et al. (arXiv 2104.04473) name no DeepSpeed release: the last one before April 2021
    is 0.3.13, whose ZeRO-3 gathers one parameter at a time (`cost_models.zero3_gathers`)."""
    rows, _ = parsed
    deepspeed = [r for r in rows.values() if r.layout.framework == "deepspeed"]
    assert len(deepspeed) == 6
    for r in deepspeed:
        assert r.layout.framework_version == "0.3.13"
        assert any("0.3.13 (2021-03-16)" in note for note in r.assumptions)
    assert all(r.layout.framework_version is None for r in rows.values() if r.layout.framework != "deepspeed")


@pytest.mark.parametrize(
    ("framework", "source", "version"),
    [
        ("DeepSpeed ZeRO-3", "Some paper (arXiv 2201.01234)", "0.5.8"),  # 0.5.9 is dated 2022-01-03
        ("DeepSpeed ZeRO-3", "Some paper (arXiv 2106.01234)", "0.3.16"),
        ("DeepSpeed 0.6.0", "Some paper (arXiv 2104.04473)", "0.6.0"),  # a named release wins
        ("DeepSpeed ZeRO-3", "a blog post", None),  # no date: today's release
        ("Megatron-LM", "Some paper (arXiv 2104.04473)", None),
    ],
)
def test_release_from_the_rows_published_facts(framework: str, source: str, version: str | None) -> None:
    from bench.calibration_rows import _Ctx, _framework_version

    fw = "deepspeed" if "deepspeed" in framework.lower() else "megatron"
    assert _framework_version(_Ctx({"framework": framework, "source": source}), fw) == version


def test_a_deepspeed_row_older_than_its_zero3_is_refused() -> None:
    from bench.calibration_rows import _Ctx, _framework_version, _Skip

    with pytest.raises(_Skip, match="before DeepSpeed's first ZeRO-3 release"):
        _framework_version(_Ctx({"framework": "DeepSpeed ZeRO-3", "source": "arXiv 2012.01234"}), "deepspeed")
