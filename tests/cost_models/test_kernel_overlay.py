"""A measured kernel profile layered over the shipped atlas (cost_models.kernels.overlay) and the
record of which atlas entries a pricing looks up (cost_models.kernels.record, kernel_needs)."""

from __future__ import annotations

from typing import Any

import pytest

from cluster_specs.catalog import get_gpu
from cluster_specs.presets import get_cluster
from cost_models.kernel_needs import needed_entries
from cost_models.kernels import gemm as g
from cost_models.kernels.atlas import atlas_files, atlas_for
from cost_models.kernels.overlay import merge, profiled_cluster, profiled_gpu
from cost_models.kernels.record import recording
from cost_models.kernels.schema import parse_atlas
from cost_models.layout import Layout
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec


def profile(gpu: str, gemm: list[dict[str, Any]], **more: Any) -> Any:
    return parse_atlas({
        "format": "autopar-kernel-atlas/1", "gpu": gpu,
        "provenance": {"device": "test device", "measured_at": "2026-11-28T08:00:00+00:00"},
        "sources": {"p": {"citation": "a measurement of this test", "method": "queued"}},
        "gemm": gemm, **more,
    })


def test_a_profiled_shape_is_priced_at_its_measurement_and_measured() -> None:
    h200 = get_gpu("H200-141GB")
    doc = profile("H200-141GB", [{"m": 3000, "n": 5000, "k": 7000, "seconds": 2e-3, "source": "p"}])
    shipped = atlas_for(h200).gemm_table("bf16")
    layered = atlas_for(profiled_gpu(h200, doc)).gemm_table("bf16")
    assert layered.seconds(3000, 5000, 7000, 1, 2) == pytest.approx(2e-3, rel=1e-9)
    assert layered.provenance(3000, 5000, 7000) == g.MEASURED
    assert shipped.seconds(3000, 5000, 7000, 1, 2) != pytest.approx(2e-3, rel=0.05)
    # the shipped H200 points stay where the profile measured nothing
    point = next(p for p in atlas_files()["H200-141GB"].gemm if p.dtype == "bf16")
    assert layered.seconds(point.m, point.n, point.k, 1, 2) == pytest.approx(
        shipped.seconds(point.m, point.n, point.k, 1, 2), rel=0.05)
    # and the plain GPU is priced as before (its own cache entry)
    assert atlas_for(h200).gemm_table("bf16") is shipped


def test_the_profile_replaces_the_shipped_point_of_the_same_key() -> None:
    base = atlas_files()["H200-141GB"]
    p = next(x for x in base.gemm if x.dtype == "bf16")
    doc = profile("H200-141GB", [{"m": p.m, "n": p.n, "k": p.k, "seconds": 1.0, "source": "p"}])
    merged = merge(base, doc)
    same = [x for x in merged.gemm if (x.m, x.n, x.k, x.dtype) == (p.m, p.n, p.k, "bf16")]
    assert [x.seconds for x in same] == [1.0] and same[0].source == "profile:p"
    assert len(merged.gemm) == len(base.gemm) - sum(
        (x.m, x.n, x.k, x.dtype) == (p.m, p.n, p.k, "bf16") for x in base.gemm) + 1
    assert merged.provenance == doc.provenance and len(merged.attention) == len(base.attention)


def test_a_profile_of_another_gpu_is_refused_by_name() -> None:
    doc = profile("cpu", [{"m": 64, "n": 64, "k": 64, "seconds": 1e-5, "source": "p"}])
    with pytest.raises(ValueError, match="gpu: the kernel profile measured cpu, the cluster's GPU is H100-80GB"):
        profiled_cluster(get_cluster("dgx-h100"), doc)


def test_the_lookups_of_a_pricing_are_recorded_whatever_was_priced_before() -> None:
    model, cluster = get_model("llama3-8b"), get_cluster("dgx-h100")
    training = TrainingSpec(seq_len=4096, global_batch=32)
    layout = Layout(tp=2, dp=8, micro_batch=1, grad_accum=4, zero_stage=1)
    first = needed_entries(model, training, cluster, 16, layout)
    again = needed_entries(model, training, cluster, 16, layout)  # every cache warm now
    assert first == again and len(first) > 0
    # the forward, input-gradient and weight-gradient GEMMs of the TP-split QKV projection
    tokens, h = 4096, model.hidden_size
    qkv = (model.num_heads + 2 * model.num_kv_heads) * (h // model.num_heads) // 2  # 3,072 at TP2
    assert {(tokens, qkv, h, "bf16"), (tokens, h, qkv, "bf16"), (h, qkv, tokens, "bf16")} <= first.gemm
    assert ("cudnn", 128, 4096, True, "fwd") in first.attention
    assert {op for op, *_ in first.collectives} >= {"all_reduce"}


def test_nothing_is_recorded_outside_a_recording() -> None:
    table = atlas_for(get_gpu("H100-80GB")).gemm_table("bf16")
    with recording() as rec:
        pass
    table.seconds(128, 256, 512, 1, 2)
    assert len(rec) == 0
    with recording() as rec:
        table.seconds(128, 256, 512, 1, 2)
    assert rec.gemm == {(128, 256, 512, "bf16")}


def test_a_cluster_file_cannot_name_a_kernel_profile() -> None:
    """The digest is set by autopar (overlay.profiled_gpu), never read from input: an unknown one
    would otherwise reach the atlas as a profile this process never loaded."""
    from pydantic import ValidationError

    from cluster_specs.spec import GPUSpec

    fields = get_gpu("H100-80GB").model_dump()
    with pytest.raises(ValidationError, match="kernel_profile"):
        GPUSpec(**{**fields, "kernel_profile": "0123456789abcdef"})
    assert "kernel_profile" not in fields  # excluded from every dump
