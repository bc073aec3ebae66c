"""Search-space enumeration (planner.space): divisors by factorization, bounded inputs."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from model_specs.spec import MAX_GLOBAL_BATCH, TrainingSpec
from planner.space import divisors, factorize


@given(st.integers(min_value=1, max_value=10**7))
def test_divisors_match_their_definition(n: int) -> None:
    got = divisors(n)
    assert got == sorted(got) and got[0] == 1 and got[-1] == n
    assert all(n % d == 0 for d in got)
    assert len(got) == len({d for d in range(1, int(n**0.5) + 1) if n % d == 0} | {n // d for d in range(1, int(n**0.5) + 1) if n % d == 0})


def test_huge_numbers_factor_without_trial_division() -> None:
    # 2**62 - 1 = 3 x 715827883 x 2147483647: trial division would take 2**31 steps
    assert factorize(2**62 - 1) == {3: 1, 715827883: 1, 2147483647: 1}
    assert len(divisors(2**56)) == 57
    with pytest.raises(ValueError):
        divisors(0)


def test_global_batch_is_bounded_with_its_field_path() -> None:
    with pytest.raises(ValidationError) as exc:
        TrainingSpec(seq_len=4096, global_batch=2**56)
    assert exc.value.errors()[0]["loc"] == ("global_batch",)
    assert TrainingSpec(seq_len=4096, global_batch=MAX_GLOBAL_BATCH).global_batch == MAX_GLOBAL_BATCH


def test_combined_1f1b_is_offered_where_megatron_runs_it() -> None:
    """Megatron-Core's combined 1F1B: MoE, ep > 1, at least two micro-batches, interleaved when
    pipelined; every offered option validates as a Layout, and the search never keeps one with full
    recompute (Megatron refuses it)."""
    from cluster_specs.presets import get_cluster
    from cost_models.layout import validate_layout
    from model_specs.presets import get_model
    from planner.plan import SearchConstraints
    from planner.search import search
    from planner.space import Mesh, PipeOption, Setting, Stack, pipeline_options, to_layout

    model, training = get_model("mixtral-8x7b"), TrainingSpec(seq_len=4096, global_batch=128)
    c = SearchConstraints(framework="megatron")
    pipelined = Mesh(tp=1, pp=4, cp=1, dp=16, ep=8, etp=1, order="tp-cp-ep-dp-pp")
    paired = [o for o in pipeline_options(model, training, pipelined, 1, c) if o.a2a_overlap]
    assert paired and all(o.schedule == "interleaved_1f1b" for o in paired)
    for o in paired:
        lay = to_layout(pipelined, 1, o, Setting(1, 16, "selective", False), Stack("megatron"))
        assert lay.moe_a2a_overlap and validate_layout(model, training, 64, lay) == []
    flat = Mesh(tp=1, pp=1, cp=1, dp=64, ep=8, etp=1, order="tp-cp-ep-dp-pp")
    assert PipeOption(1, "1f1b", a2a_overlap=True) in pipeline_options(model, training, flat, 1, c)
    assert not any(o.a2a_overlap for o in pipeline_options(model, training, flat, 1, SearchConstraints(framework="fsdp")))
    no_ep = Mesh(tp=1, pp=1, cp=1, dp=64, ep=1, etp=1, order="tp-cp-ep-dp-pp")
    assert not any(o.a2a_overlap for o in pipeline_options(model, training, no_ep, 1, c))
    one_mb = TrainingSpec(seq_len=4096, global_batch=64)  # dp 64 x mb 1: one micro-batch
    assert not any(o.a2a_overlap for o in pipeline_options(model, one_mb, flat, 1, c))
    older = c.model_copy(update={"allow_moe_a2a_overlap": False})  # a Megatron-Core that predates it
    assert not any(o.a2a_overlap for o in pipeline_options(model, training, flat, 1, older))
    assert [o for o in pipeline_options(model, training, pipelined, 1, c) if not o.a2a_overlap] == \
        pipeline_options(model, training, pipelined, 1, older)

    big = TrainingSpec(seq_len=4096, global_batch=512)
    plan = search(model, big, get_cluster("dgx-h100"), 64, c.model_copy(update={"top_k": 20}))
    kept = [x.layout for x in [plan.best, *plan.alternatives] if x is not None]
    for lay in kept:  # meshes with and without ep share their shape: the options must not leak across
        assert validate_layout(model, big, 64, lay) == [], lay
        assert not (lay.moe_a2a_overlap and lay.recompute == "full")


def test_a_megatron_core_without_moe_parallel_folding_gets_its_own_expert_grid() -> None:
    """`moe_parallel_folding=False` (Megatron-Core 0.9): every mesh offered carves EP out of dp,
    keeps expert TP = TP and ep next to dp in the order, and its layouts validate with that grid;
    with folding the space is a superset (etp 1, EP over dp x cp x tp)."""
    from cluster_specs.presets import get_cluster
    from cost_models.layout import validate_layout
    from model_specs.presets import get_model
    from planner.plan import SearchConstraints
    from planner.space import PipeOption, Setting, Stack, meshes, to_layout

    model, cluster, training = get_model("mixtral-8x7b"), get_cluster("dgx-h100"), TrainingSpec(seq_len=4096, global_batch=256)
    folded = set(meshes(model, cluster, 64, SearchConstraints()))
    older = SearchConstraints(moe_parallel_folding=False)
    unfolded = list(meshes(model, cluster, 64, older))
    assert unfolded and all(not m.moe_parallel_folding for m in unfolded)
    assert all(m.etp == m.tp and m.dp % m.ep == 0 for m in unfolded)
    assert all("ep-dp" in m.order for m in unfolded if m.ep > 1)
    as_folded = {dataclasses.replace(m, moe_parallel_folding=True) for m in unfolded}
    assert as_folded < folded
    assert any(m.ep > m.dp for m in folded)  # folding alone lets EP reach into cp x tp
    for m in unfolded[:40]:
        lay = to_layout(m, 1, PipeOption(1, "1f1b"), Setting(1, m.dp, "none", False), Stack("megatron"))
        assert lay.moe_parallel_folding is False
        assert [v for v in validate_layout(model, training, 64, lay) if v.field in ("ep", "etp", "order")] == []


def test_max_zero_stage_bounds_the_settings_and_conflicts_with_a_higher_pin() -> None:
    """A stack without FSDP (`max_zero_stage=1`, Megatron-Core before 0.10) is offered ZeRO-0/1 only;
    pinning a higher stage than it runs is a validation error, not an empty search."""
    from cluster_specs.presets import get_cluster
    from planner.plan import SearchConstraints
    from planner.space import Mesh, settings

    mesh, cluster = Mesh(tp=1, pp=1, cp=1, dp=16, ep=1, etp=1, order="tp-cp-ep-dp-pp"), get_cluster("dgx-h100")
    assert {s.zero_stage for s in settings(mesh, cluster, SearchConstraints())} == {0, 1, 2, 3}
    assert {s.zero_stage for s in settings(mesh, cluster, SearchConstraints(max_zero_stage=1))} == {0, 1}
    with pytest.raises(ValidationError, match="exceeds max_zero_stage"):
        SearchConstraints(zero_stage=3, max_zero_stage=1)


def test_a_stack_before_megatron_lm_3_runs_tp_without_sequence_parallelism_or_selective_recompute() -> None:
    """`sequence_parallel=False` / `selective_recompute=False` (Megatron-LM before v3.0): every TP > 1
    mesh offered replicates norms and dropout (its layouts have sp false, and price more activation
    memory than the same layout with SP), and the settings recompute whole layers or nothing; a pinned
    selective recompute is a validation error, not an empty search. By default both are searched."""
    from cluster_specs.presets import get_cluster
    from cost_models.estimate import estimate
    from model_specs.presets import get_model
    from planner.plan import SearchConstraints
    from planner.space import PipeOption, Setting, Stack, meshes, settings, to_layout

    model, cluster, training = get_model("llama3-8b"), get_cluster("dgx-h100"), TrainingSpec(seq_len=4096, global_batch=64)
    old = SearchConstraints(sequence_parallel=False, selective_recompute=False)
    plain = [m for m in meshes(model, cluster, 8, old) if m.tp > 1]
    assert plain and not any(m.sp_ for m in plain)
    assert all(m.sp_ for m in meshes(model, cluster, 8, SearchConstraints()) if m.tp > 1)
    mesh = plain[0]
    lay = to_layout(mesh, 1, PipeOption(1, "1f1b"), Setting(1, mesh.dp, "none", False), Stack("megatron"))
    with_sp = to_layout(dataclasses.replace(mesh, sequence_parallel=True), 1, PipeOption(1, "1f1b"),
                        Setting(1, mesh.dp, "none", False), Stack("megatron"))
    assert lay.sp is False and with_sp.sp is True
    assert estimate(model, training, cluster, 8, lay).peak_bytes > estimate(model, training, cluster, 8, with_sp).peak_bytes
    assert {s.recompute for s in settings(mesh, cluster, old)} == {"none", "full"}
    assert {s.recompute for s in settings(mesh, cluster, SearchConstraints())} == {"none", "selective", "full"}
    with pytest.raises(ValidationError, match="needs a stack with selective recompute"):
        SearchConstraints(selective_recompute=False, recompute="selective")


def test_a_table_layout_is_the_resolved_layout() -> None:
    """`table_layout` gives, field for field and with the same fields set, what `to_layout` without
    validation and `Layout.resolved` give: over every mesh, micro-batch, pipeline option and the
    first setting of a MoE job on a Megatron and an FSDP stack; and it refuses a micro-batch that
    does not divide the global batch as `resolved` does."""
    from cluster_specs.presets import get_cluster
    from cost_models.layout import LayoutError
    from model_specs.presets import get_model
    from planner.plan import SearchConstraints
    from planner.space import (
        PipeOption,
        Setting,
        Stack,
        meshes,
        pipeline_options,
        settings,
        table_layout,
        to_layout,
    )

    model, cluster, training = get_model("mixtral-8x7b"), get_cluster("dgx-h100"), TrainingSpec(seq_len=4096, global_batch=256)
    checked = 0
    for framework in ("megatron", "fsdp"):
        c = SearchConstraints(framework=framework)
        stack = Stack.of(c)
        for mesh in list(meshes(model, cluster, 64, c))[::7]:
            grid = settings(mesh, cluster, c)
            for mb in (1, 2):
                if training.global_batch % (mb * mesh.dp):
                    continue
                for option in pipeline_options(model, training, mesh, mb, c):
                    want = to_layout(mesh, mb, option, grid[0], stack, validate=False).resolved(64, training)
                    got = table_layout(mesh, mb, option, grid[0], stack, 64, training)
                    assert list(got.__dict__.items()) == list(want.__dict__.items())
                    assert got.model_fields_set == want.model_fields_set
                    checked += 1
    assert checked > 50
    odd = next(m for m in meshes(model, cluster, 64, SearchConstraints()) if m.dp == 64)
    with pytest.raises(LayoutError, match="micro_batch"):
        table_layout(odd, 3, PipeOption(1, "1f1b"), Setting(1, 64, "none", False), Stack("megatron"), 64, training)
