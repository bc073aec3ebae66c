"""Issue requirement: for published layouts, our best plan is predicted at least as fast, and the
published layout itself is feasible in our model (checked here on a small, fast sample; the full
table is `python -m bench.published_vs_plan`)."""

import pytest

from bench.calibration_rows import load_rows
from bench.published_vs_plan import compare
from cost_models.calibration import default_calibration

SAMPLE = (12, 151, 502, 513)  # Narayanan 2021 GPT-1.7B, MPT-1b on A100-40GB, NeMo Llama-2-7B, NeMo CP=2


@pytest.fixture(scope="module")
def rows():
    parsed, _ = load_rows()
    return {r.row_id: r for r in parsed}


@pytest.mark.parametrize("row_id", SAMPLE)
def test_best_plan_at_least_published(rows, row_id: int) -> None:
    result = compare(rows[row_id], default_calibration())
    assert result["published_fits"]
    assert result["best_at_least_published"], result


def test_rows_are_searched_without_combined_1f1b_their_stack_lacked(rows) -> None:
    """Every CSV row predates Megatron-Core's combined 1F1B (`COMBINED_1F1B_SOURCES` is empty): the
    DGX Cloud DeepSeek-V3 row (v25.05 recipes, May 2025) is searched as a user of that stack would search it."""
    from bench.published_vs_plan import COMBINED_1F1B_SOURCES, constraints_for

    row = rows[478]
    assert row.source_id not in COMBINED_1F1B_SOURCES
    assert constraints_for(row).allow_moe_a2a_overlap is False


def test_mla_rows_are_searched_without_context_parallelism_their_stack_lacked(rows) -> None:
    """Megatron-Core split MLA over context-parallel ranks only from v0.14 (September 2025): the DGX
    Cloud DeepSeek-V3 rows (May 2025) are searched with cp = 1; a GQA model of the same source keeps
    context parallelism in its search."""
    from bench.published_vs_plan import MLA_CONTEXT_PARALLEL_SOURCES, constraints_for

    deepseek, llama = rows[479], rows[446]
    assert deepseek.model.attention == "mla" and deepseek.source_id not in MLA_CONTEXT_PARALLEL_SOURCES
    assert constraints_for(deepseek).cp == 1
    assert llama.source_id == deepseek.source_id and llama.model.attention != "mla"
    assert constraints_for(llama).cp is None


def test_rows_of_a_megatron_core_before_0_10_are_searched_within_its_stack(rows) -> None:
    """DGX Cloud v24.11's Grok-1 (Megatron-Core 0.9) on 2,048 H100: its search offers neither FSDP, nor
    optimizer offload, nor MoE parallel folding, and the plan it recommends has none of them."""
    from bench.published_vs_plan import constraints_for

    c = constraints_for(rows[385])  # 8-layer proxy on 64 H100, TP4 CP2 EP8
    assert (c.max_zero_stage, c.allow_offload, c.moe_parallel_folding) == (1, False, False)
    result = compare(rows[385], default_calibration())
    assert "zero=2" not in result["recommended_layout"] and "zero=3" not in result["recommended_layout"]
    assert "offload" not in result["recommended_layout"]


def test_rows_above_split_the_promise_into_search_and_model() -> None:
    """Rows above 1.25 are grouped by source and model (proxies with their full model), and each
    group's ratio is split into best / published layout and published layout / measured."""
    from bench.published_vs_plan import rows_above

    def row(i, model, best, published, measured):
        return {"row_id": i, "source": "s", "model": model, "best_tokens_per_s_per_gpu": best,
                "published_tokens_per_s_per_gpu": published, "measured_tokens_per_s_per_gpu": measured,
                "best_over_measured": best / measured}

    out = [row(1, "M (proxy, 2 layers)", 150, 120, 100), row(2, "M", 140, 100, 100), row(3, "N", 110, 100, 100)]
    (group,) = rows_above(out)
    assert group["model"] == "M" and group["rows"] == [1, 2]
    assert group["best_over_measured"] == pytest.approx(1.45)
    assert group["published_over_measured"] == pytest.approx(1.1)
    assert group["best_over_published"] == pytest.approx((1.25 + 1.4) / 2)


def test_the_ratio_uses_the_plan_autopar_would_recommend(rows) -> None:
    """DGX Cloud Llama 2 70B on 256 H100 at FP8: the fastest layout without headroom needs more than
    95% of HBM; `autopar plan` keeps its default 5% free, and so does the plan behind
    `best_over_measured`."""
    result = compare(rows[408], default_calibration())
    assert result["recommended_tokens_per_s_per_gpu"] < result["best_tokens_per_s_per_gpu"]
    assert result["best_over_measured"] == pytest.approx(
        result["recommended_tokens_per_s_per_gpu"] / result["measured_tokens_per_s_per_gpu"])
    assert result["recommended_layout"].startswith("dp=")  # the layout behind that figure, as `describe` writes it


def test_rows_of_megatron_lm_before_3_are_searched_without_sp_selective_recompute_or_cp(rows) -> None:
    """Narayanan et al. 2021 (Megatron-LM and Megatron-DeepSpeed of 2021) had no sequence parallelism,
    no selective recompute and no context parallelism: their rows are searched without them, and the
    plan recommended for GPT-1.7B recomputes whole layers or nothing; Korthikanti et al. 2022, which
    introduced the first two, keeps them."""
    from bench.published_vs_plan import constraints_for

    for rid in (12, 16, 24):  # Table 1 GPT-1.7B and 39B; Table 2 DeepSpeed ZeRO-3 GPT-175B
        c = constraints_for(rows[rid])
        assert rows[rid].before_megatron_lm_3 and (c.sequence_parallel, c.selective_recompute, c.cp) == (False, False, 1)
    korthikanti = constraints_for(rows[34])
    assert (korthikanti.sequence_parallel, korthikanti.selective_recompute, korthikanti.cp) == (True, True, None)
    result = compare(rows[12], default_calibration())
    assert "recompute=selective" not in result["recommended_layout"]
