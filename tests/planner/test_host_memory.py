"""Host RAM is a constraint like GPU memory: offloaded optimizer states of every rank of a node
must fit in the node's host memory, or the layout is rejected with the bytes."""

from __future__ import annotations

import pytest

from cluster_specs.presets import get_cluster
from cost_models.estimate import price, pricing_context
from cost_models.layout import Layout
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.plan import SearchConstraints
from planner.search import HOST_MEMORY_REASON, search

GIB = 2**30
TRAINING = TrainingSpec(seq_len=4096, global_batch=64)


def test_offloaded_optimizer_fills_the_node_host_memory() -> None:
    """Llama-3-70B, ZeRO-3 over 8 A100-80GB with optimizer offload: each rank keeps 12 bytes of Adam
    state and the 4-byte float32 gradient partition per parameter of its 1/8 shard in host RAM, so
    the node holds 16 x 70.6e9 = 1051 GiB (the issue's 789 GiB counts the Adam states alone)."""
    model, cluster = get_model("llama3-70b"), get_cluster("dgx-a100-80g")
    layout = Layout(dp=8, zero_stage=3, micro_batch=1, recompute="full", offload_optimizer=True)
    est = price(pricing_context(model, TRAINING, cluster, 8, layout))
    params = 70_553_706_496
    assert est.host_bytes_per_node == pytest.approx(16 * params, rel=1e-6)
    assert est.host_fits and est.fits  # 2 TiB DGX A100
    small = cluster.model_copy(update={"host_memory_bytes": 64 * GIB})
    est64 = price(pricing_context(model, TRAINING, small, 8, layout))
    assert not est64.host_fits and not est64.fits
    assert est64.peak_bytes == est.peak_bytes  # the GPU side is unchanged


def test_search_rejects_offload_beyond_host_memory_with_the_bytes() -> None:
    model = get_model("llama3-70b")
    small = get_cluster("dgx-a100-80g").model_copy(update={"host_memory_bytes": 64 * GIB})
    c = SearchConstraints(zero_stage=3, recompute="full")
    plan = search(model, TRAINING, small, 8, c, refine=False)
    reasons = {r.reason: r for r in plan.rejections}
    assert HOST_MEMORY_REASON in reasons
    example = reasons[HOST_MEMORY_REASON].example
    assert "GiB of host RAM per node (8 ranks)" in example and "bytes over the 60.8 GiB usable" in example
    for cand in ([plan.best] if plan.best else []) + plan.alternatives:
        assert not cand.layout.offload_optimizer


def test_evaluation_prints_the_host_memory_verdict() -> None:
    import io

    from rich.console import Console

    from autopar.render import print_evaluation
    from cost_models.report import estimate_dict

    model = get_model("llama3-70b")
    small = get_cluster("dgx-a100-80g").model_copy(update={"host_memory_bytes": 64 * GIB})
    layout = Layout(dp=8, zero_stage=3, micro_batch=1, recompute="full", offload_optimizer=True)
    result = estimate_dict(model, small.name, price(pricing_context(model, TRAINING, small, 8, layout)))
    assert result["host_memory"]["fits"] is False and not result["fits"]
    out = io.StringIO()
    print_evaluation(result, Console(file=out, width=200))
    assert ("Host memory: 1051.3 GiB per node of 64.0 GiB (offloaded state of the node's 8 ranks; the loading peak, "
            "25.5 GiB, is lower): does not fit, 1,060,139,827,200 bytes") in out.getvalue()


def test_search_and_estimate_agree_on_the_loading_peak() -> None:
    """DeepSpeed ZeRO-1 loads the whole model in every process (4 bytes x 8.03e9 x 8 ranks = 239.3
    GiB): a 64 GiB node refuses it in the search exactly as `Estimate.fits` does; ZeRO-3 builds the
    model sharded (deepspeed.zero.Init) and fits."""
    from cluster_specs.presets import cluster_from_dict

    model = get_model("llama3-8b")
    small = cluster_from_dict({"preset": "dgx-h100", "host_memory": "64 GiB"})
    training = TrainingSpec(seq_len=4096, global_batch=32)
    pinned = search(model, training, small, 8, SearchConstraints(framework="deepspeed", zero_stage=1), refine=False)
    assert pinned.best is None
    example = {r.reason: r.example for r in pinned.rejections}[HOST_MEMORY_REASON]
    assert "needs 239.3 GiB of host RAM per node (8 ranks)" in example
    est = price(pricing_context(model, training, small, 8, Layout(dp=8, zero_stage=1, framework="deepspeed")))
    assert est.loading_bytes_per_node == 4 * 8_030_261_248 * 8 and not est.fits
    free = search(model, training, small, 8, SearchConstraints(framework="deepspeed"), refine=False)
    assert free.best is not None and free.best.layout.zero_stage == 3 and free.best.estimate["fits"]
