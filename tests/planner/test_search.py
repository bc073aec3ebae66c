"""The search: consistent with `estimate`, exact against brute force, honest when nothing fits."""

import math

import pytest

from cluster_specs.presets import get_cluster
from cost_models.estimate import estimate
from cost_models.layout import validate_layout
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.plan import Plan, SearchConstraints
from planner.search import search
from planner.space import PipeOption, Stack, meshes, micro_batches, pipeline_options, settings, to_layout


def test_best_matches_evaluate() -> None:
    model, cluster = get_model("llama3-8b"), get_cluster("dgx-h100")
    training = TrainingSpec(seq_len=8192, global_batch=64)
    plan = search(model, training, cluster, 16, refine=False)
    assert plan.best is not None
    est = estimate(model, training, cluster, 16, plan.best.layout)
    assert est.step_s == pytest.approx(plan.best.estimate["step_s"], rel=1e-12)
    assert est.peak_bytes == plan.best.estimate["memory"]["peak_bytes"]
    assert est.fits
    steps = [c.estimate["step_s"] for c in [plan.best, *plan.alternatives]]
    # the best is the fastest, or a simpler layout within the tie window (planner.search.TIE_SHARE_OF_BAND)
    assert steps[1:] == sorted(steps[1:])
    assert steps[0] == min(steps) or any("Chosen over a layout predicted" in w for w in plan.why)
    assert steps[0] <= min(steps) * 1.06


def brute_force_best(model, training, cluster, gpus, c: SearchConstraints) -> float:
    usable = cluster.gpu.memory_bytes * (1 - c.memory_headroom)
    best = math.inf
    for mesh in meshes(model, cluster, gpus, c):
        if mesh.tp > cluster.domain_size:
            continue
        for mb in micro_batches(training, mesh.dp, c):
            for option in pipeline_options(model, training, mesh, mb, c):
                for s in settings(mesh, cluster, c):
                    layout = to_layout(mesh, mb, option, s, Stack.of(c))
                    if validate_layout(model, training, gpus, layout):
                        continue
                    est = estimate(model, training, cluster, gpus, layout)
                    if est.peak_bytes <= usable:
                        best = min(best, est.step_s)
    return best


@pytest.mark.parametrize(
    ("model_name", "cluster_name", "gpus", "seq", "batch"),
    [("tiny", "local-cpu", 8, 256, 16), ("tiny-moe", "dgx-h100", 8, 512, 16)],
)
def test_branch_and_bound_finds_the_brute_force_optimum(model_name, cluster_name, gpus, seq, batch) -> None:
    model, cluster = get_model(model_name), get_cluster(cluster_name)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    c = SearchConstraints(top_k=3)
    plan = search(model, training, cluster, gpus, c, refine=False)
    assert plan.best is not None
    assert plan.best.estimate["step_s"] == pytest.approx(brute_force_best(model, training, cluster, gpus, c), rel=1e-9)
    s = plan.stats
    assert s.generated == s.invalid + s.pruned + s.priced


def test_the_stacks_kernels_price_every_layout() -> None:
    """A user whose stack runs PyTorch ops one by one (torchtitan without torch.compile) gets plans
    priced that way: every reported layout carries the eager kernels, evaluates to the same price,
    is slower than the fused plan, and the branch and bound still finds the brute-force optimum."""
    model, cluster = get_model("llama3-8b"), get_cluster("dgx-h100")
    training = TrainingSpec(seq_len=8192, global_batch=64)
    fused = search(model, training, cluster, 16, SearchConstraints(framework="fsdp"), refine=False)
    c = SearchConstraints(framework="fsdp", elementwise_kernels="eager", norm_kernel="eager_fp32")
    eager = search(model, training, cluster, 16, c, refine=False)
    assert fused.best is not None and eager.best is not None
    for cand in [eager.best, *eager.alternatives]:
        assert (cand.layout.elementwise_kernels, cand.layout.norm_kernel) == ("eager", "eager_fp32")
    est = estimate(model, training, cluster, 16, eager.best.layout)
    assert est.step_s == pytest.approx(eager.best.estimate["step_s"], rel=1e-12)
    assert eager.best.estimate["step_s"] > fused.best.estimate["step_s"]
    tiny, local = get_model("tiny"), get_cluster("local-cpu")
    small = TrainingSpec(seq_len=256, global_batch=16)
    c = SearchConstraints(top_k=3, elementwise_kernels="eager")
    plan = search(tiny, small, local, 8, c, refine=False)
    assert plan.best is not None
    assert plan.best.estimate["step_s"] == pytest.approx(brute_force_best(tiny, small, local, 8, c), rel=1e-9)


def test_impossible_job_explains_the_closest_miss() -> None:
    model, cluster = get_model("llama3-405b"), get_cluster("rtx4090-pcie-8")
    plan = search(model, TrainingSpec(seq_len=4096, global_batch=64), cluster, 8)
    assert plan.best is None
    assert plan.closest_miss is not None
    assert plan.closest_miss.over_by_bytes > 0
    assert plan.closest_miss.peak_bytes - plan.closest_miss.usable_bytes == plan.closest_miss.over_by_bytes
    assert "No layout fits" in plan.why[1]
    assert any(r.reason.startswith("memory:") for r in plan.rejections)
    Plan.model_validate_json(plan.model_dump_json())  # serializable round trip


def test_tp_beyond_the_nvlink_domain_is_rejected_by_reason() -> None:
    model, cluster = get_model("llama3-8b"), get_cluster("dgx-h100")
    plan = search(model, TrainingSpec(seq_len=4096, global_batch=32), cluster, 32, refine=False)
    reasons = {r.reason for r in plan.rejections}
    assert "tp: tp=16 crosses the NVLink domain (8 GPUs)" in reasons
    assert plan.best is not None and plan.best.layout.tp <= 8


def test_pinned_degrees_are_respected() -> None:
    model, cluster = get_model("llama3-70b"), get_cluster("dgx-h100")
    c = SearchConstraints(tp=8, pp=4, zero_stage=1)
    plan = search(model, TrainingSpec(seq_len=4096, global_batch=256), cluster, 256, c, refine=False)
    assert plan.best is not None
    for cand in [plan.best, *plan.alternatives]:
        assert (cand.layout.tp, cand.layout.pp, cand.layout.zero_stage) == (8, 4, 1)


def test_placement_reports_groups_on_topology() -> None:
    model, cluster = get_model("llama3-70b"), get_cluster("dgx-h100")
    c = SearchConstraints(tp=8, pp=4)
    plan = search(model, TrainingSpec(seq_len=4096, global_batch=256), cluster, 256, c, refine=False)
    assert plan.best is not None and plan.best.placement is not None
    groups = {g.dim: g for g in plan.best.placement.groups}
    assert groups["tp"].tier == "intra_domain"
    assert groups["tp"].first_group_ranks == list(range(8))


def test_deepspeed_plans_only_what_deepspeed_runs() -> None:
    model, cluster = get_model("llama3-70b"), get_cluster("dgx-h100")
    training = TrainingSpec(seq_len=8192, global_batch=128)
    plan = search(model, training, cluster, 64, SearchConstraints(framework="deepspeed", top_k=8), refine=False)
    assert plan.best is not None
    for cand in [plan.best, *plan.alternatives, *plan.pareto]:
        lay = cand.layout
        assert lay.cp == 1 and lay.vpp == 1
        assert lay.pp == 1 or lay.zero_stage <= 1
        assert lay.framework_version is None  # a plan (and its export) runs today's DeepSpeed (zero3_gathers)


def test_an_older_deepspeed_is_searched_without_what_it_lacked() -> None:
    """DeepSpeed 0.3.13 (the Narayanan et al. 2021 rows' release): no ZeRO++ (0.10.0), no NVMe
    offload (0.3.15); its layouts name the release, so they are priced as it gathers."""
    model, cluster = get_model("llama3-8b"), get_cluster("dgx-a100-80g")
    c = SearchConstraints(framework="deepspeed", framework_version="0.3.13", zero_stage=3, allow_quantized_comm=True)
    mesh = next(m for m in meshes(model, cluster, 16, c) if m.dp == 16)
    old = settings(mesh, cluster, c)
    new = settings(mesh, cluster, c.model_copy(update={"framework_version": None}))
    assert all(s.hpz == 1 and not s.quantized_weights and not s.quantized_gradients and not s.offload_nvme for s in old)
    assert any(s.hpz > 1 for s in new) and any(s.quantized_weights for s in new) and any(s.offload_nvme for s in new)
    assert to_layout(mesh, 1, PipeOption(1, "1f1b"), old[0], Stack.of(c)).framework_version == "0.3.13"


def test_model_notes_lead_the_explanation() -> None:
    """A multimodal checkpoint is planned as its text model, and the plan says so first."""
    from pathlib import Path

    import model_specs
    from model_specs.hf import load_hf_spec

    model = load_hf_spec(Path(model_specs.__file__).parent / "data" / "gemma-3-27b-pt.json")
    plan = search(model, TrainingSpec(seq_len=4096, global_batch=64), get_cluster("dgx-h100"), 16, refine=False)
    assert plan.why[0].startswith("Model google/gemma-3-27b-pt: vision_config (siglip_vision_model): not priced")
    searched = next(i for i, line in enumerate(plan.why) if line.startswith("Searched"))
    assert all(line.startswith("Model ") for line in plan.why[:searched]) and plan.best is not None


def test_a_search_without_sequence_parallelism_or_selective_recompute_offers_neither() -> None:
    """A stack before Megatron-LM v3.0 (`SearchConstraints.sequence_parallel` / `selective_recompute`
    false): every layout the search returns runs TP without SP and recomputes whole layers or nothing,
    and each is priced as `estimate` prices it (the search's bound and tables see the same geometry)."""
    from cluster_specs.presets import get_cluster
    from cost_models.estimate import estimate
    from model_specs.presets import get_model
    from model_specs.spec import TrainingSpec
    from planner.plan import SearchConstraints
    from planner.search import search

    model, cluster, training = get_model("llama3-8b"), get_cluster("dgx-h100"), TrainingSpec(seq_len=4096, global_batch=64)
    c = SearchConstraints(sequence_parallel=False, selective_recompute=False, tp=2, top_k=5)
    plan = search(model, training, cluster, 16, c, refine=False)
    layouts = [x.layout for x in [plan.best, *plan.alternatives]]
    assert layouts and all(lay.tp == 2 and lay.sp is False and lay.recompute in ("none", "full") for lay in layouts)
    for x in [plan.best, *plan.alternatives]:
        priced = estimate(model, training, cluster, 16, x.layout)
        assert x.estimate["step_s"] == pytest.approx(priced.step_s, rel=1e-9)


def test_the_collector_is_paused_during_a_search_and_resumed_after(monkeypatch) -> None:
    """`search.cyclic_gc_paused`: the cyclic collector is off inside (and inside nested or
    overlapping pauses), back on after the last, and left off when it was off before."""
    import gc

    import planner.search as search_module

    assert gc.isenabled()
    with search_module.cyclic_gc_paused():
        assert not gc.isenabled()
        with search_module.cyclic_gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    seen = []
    real = search_module._search

    def spy(*args):
        seen.append(gc.isenabled())
        return real(*args)

    monkeypatch.setattr(search_module, "_search", spy)
    plan = search(get_model("llama3-8b"), TrainingSpec(seq_len=4096, global_batch=32), get_cluster("dgx-h100"), 8, refine=False)
    assert seen == [False] and gc.isenabled() and plan.best is not None
    gc.disable()
    try:
        with search_module.cyclic_gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
