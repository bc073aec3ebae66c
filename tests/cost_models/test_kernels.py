"""The kernel atlas (cost_models.kernels): its file format, the H200's measured points reproduced,
interpolation and extrapolation with their provenance, die siblings and datasheet GPUs, attention
fallbacks and the collectives' size curves."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from cluster_specs.catalog import get_gpu
from cost_models.kernels import atlas as A
from cost_models.kernels.collectives import curves_from_points
from cost_models.kernels.gemm import DATASHEET, EXTRAPOLATED, INTERPOLATED, MEASURED
from cost_models.kernels.schema import AtlasError, parse_atlas, read_atlas_file

REPO = Path(__file__).resolve().parents[2]
MEASURED_RATES = REPO / "data" / "measurements" / "h200-2026-11" / "kernel_rates.json"
H200 = get_gpu("H200-141GB")


def test_every_shipped_atlas_file_validates_and_names_a_catalog_gpu() -> None:
    files = A.atlas_files()
    assert {"H200-141GB", "H100-80GB", "A100-80GB", "B200", "GB200"} <= set(files)
    for doc in files.values():
        assert doc.format == "autopar-kernel-atlas/1"
        assert all(p.source in doc.sources for p in (*doc.gemm, *doc.attention, *doc.memory, *doc.collectives))


def test_a_bad_profile_file_is_refused_naming_the_field(tmp_path: Path) -> None:
    good = {"format": "autopar-kernel-atlas/1", "gpu": "H100-80GB", "sources": {"me": {"citation": "my own run of x", "method": "queued"}},
            "gemm": [{"m": 1024, "n": 1024, "k": 1024, "tflops": 500.0, "source": "me"}]}
    assert parse_atlas(good).gemm[0].time_s == pytest.approx(2 * 1024**3 / 500e12)
    with pytest.raises(AtlasError, match=r"gemm\.0\.m"):
        parse_atlas({**good, "gemm": [{"m": -1, "n": 1024, "k": 1024, "tflops": 500.0, "source": "me"}]})
    with pytest.raises(AtlasError, match="not in sources"):
        parse_atlas({**good, "gemm": [{"m": 1, "n": 1, "k": 1, "tflops": 1.0, "source": "elsewhere"}]})
    with pytest.raises(AtlasError, match="exactly one of seconds, tflops"):
        parse_atlas({**good, "gemm": [{"m": 1, "n": 1, "k": 1, "source": "me"}]})
    path = tmp_path / "profile.json"
    path.write_text("{not json")
    with pytest.raises(AtlasError, match="profile.json"):
        read_atlas_file(path)


def test_the_h200_atlas_reproduces_every_measured_point() -> None:
    """Shapes measured once: exactly (the correction is interpolated through every point); shapes
    measured twice (8B MLP = Mixtral expert shapes, two sweeps): the mean of the two GPU times in
    log (the call latency apart), so within half their spread of each; attention at every measured
    length."""
    raw = json.loads(MEASURED_RATES.read_text())
    table = A.atlas_for(H200).gemm_table("bf16")
    by_shape: dict[tuple, list[float]] = {}
    for g in raw["gemm"]:
        by_shape.setdefault((g["m"], g["n"], g["k"]), []).append(g["s"])
    for (m, n, k), times in by_shape.items():
        atlas = table.seconds(m, n, k, 1, 2.0, latency_exposed=1.0)
        if len(times) == 1:
            assert atlas == pytest.approx(times[0], rel=1e-6)
        else:
            lat = table.params.latency_s
            assert atlas == pytest.approx(lat + math.exp(np.mean(np.log(np.array(times) - lat))), rel=1e-6)
        assert int(table.provenance(m, n, k)) == MEASURED
    for row in raw["sdpa"]:
        if row["backend"] in ("flash", "cudnn"):
            kernel = ("flash2",) if row["backend"] == "flash" else ("cudnn",)
            rate, code = A.atlas_for(H200).attention_rate(kernel, float(row["seq"]), 128, True, "fwd")
            assert float(rate) == pytest.approx(row["fwd_tflops"] * 1e12, rel=1e-9) and int(code) == MEASURED


def test_between_points_is_interpolated_and_beyond_them_extrapolated() -> None:
    table = A.atlas_for(H200).gemm_table("bf16")
    assert int(table.provenance(3000, 4096, 4096)) == INTERPOLATED  # between 2048 and 4096 rows of a measured line
    assert int(table.provenance(32, 4096, 4096)) == EXTRAPOLATED  # below the smallest measured row count
    assert int(table.provenance(4096, 131072, 512)) == EXTRAPOLATED  # far from every measured (n, k)
    lo, mid, hi = (table.seconds(m, 4096, 4096, 1, 2.0) for m in (2048, 3000, 4096))
    assert lo < mid < hi
    ms = np.array([32.0, 3000.0, 8192.0])
    arr = table.seconds(ms, 4096.0, 4096.0, 1.0, 2.0)
    np.testing.assert_allclose(arr, [table.seconds(float(m), 4096, 4096, 1, 2.0) for m in ms], rtol=1e-12)


def test_gpus_without_measurements_of_their_own() -> None:
    """A die sibling prices with the measured die's kernels at the ratio of peak x clock (the 500 W
    H100's 0.922 clock); a GPU without any is priced from its datasheet peak at the measured GPUs'
    median share, every lookup flagged so."""
    h100, teton = A.atlas_for(get_gpu("H100-80GB")), A.atlas_for(get_gpu("H100-96GB-HBM2e-500W"))
    assert teton.source == "H100-80GB"
    t_h100 = h100.gemm_table("bf16").seconds(8192, 8192, 8192, 1, 2.0)
    assert teton.gemm_table("bf16").seconds(8192, 8192, 8192, 1, 2.0) == pytest.approx(t_h100 / 0.922, rel=1e-6)
    assert int(teton.gemm_table("bf16").provenance(8192, 8192, 8192)) == EXTRAPOLATED
    l40s = get_gpu("L40S")
    table = A.atlas_for(l40s).gemm_table("bf16")
    assert table.floor == DATASHEET and table.params.rate == pytest.approx(l40s.peak("bf16") * A.datasheet_share()["16"])
    assert int(table.provenance(4096, 4096, 4096)) == DATASHEET


def test_best_of_search_figures_are_read_below_their_best() -> None:
    """ML Engineering's maximum achievable matmul figures are the best of a search over shapes: the
    reference GPU (the H200, measured both ways) puts its shape model's large-tile rate below its
    best-of-search figure, and single-figure GPUs are read that much slower."""
    reg = A._registry()
    assert 0.85 < reg.discount < 1.0
    h100 = A.atlas_for(get_gpu("H100-80GB")).gemm_table("bf16")
    assert h100.params.rate == pytest.approx(794.5e12 * reg.discount, rel=1e-3)


def test_fused_attention_falls_back_to_the_nearest_measured_gpu() -> None:
    """B200 measured FlashAttention-4 (forward + backward in a step) and no cuDNN: its fused kernel
    is that, for both passes; GB200 (no attention measured) borrows the Blackwell measurement scaled by
    the two GPUs' GEMM rates, flagged extrapolated."""
    b200 = A.atlas_for(get_gpu("B200"))
    f, code = b200.attention_rate(("cudnn", "fa3", "fa4"), 8192.0, 128, True, "fwd")
    b, _ = b200.attention_rate(("cudnn", "fa3", "fa4"), 8192.0, 128, True, "bwd")
    assert float(f) == pytest.approx(834e12) and float(b) == pytest.approx(834e12) and int(code) == MEASURED
    gb200 = A.atlas_for(get_gpu("GB200"))
    g, gcode = gb200.attention_rate(("cudnn", "fa3", "fa4"), 8192.0, 128, True, "fwd")
    ratio = gb200.gemm["16"].params.rate * gb200.gemm["16"].scale / b200.gemm["16"].params.rate  # GB200's clock too
    assert float(g) == pytest.approx(834e12 * ratio) and int(gcode) == EXTRAPOLATED


def test_collective_size_curves_never_price_below_the_alpha_beta_model() -> None:
    doc = A.atlas_files()["B200"]
    curves = curves_from_points(list(doc.collectives))
    nic = next(c for c in curves if c.span == "nic")
    assert min(nic.ratio) >= 1.0 and nic.ratio[-1] == pytest.approx(1.0)
    assert nic.at(64 * 2**20) > 1.3  # a 64 MiB all-reduce across 4 nodes runs well below the large-buffer rate
    assert nic.nic_efficiency == pytest.approx(381.80 / 400)
    np.testing.assert_allclose(nic.at_array(np.array([64 * 2**20, 2**34])), [nic.at(64 * 2**20), nic.at(2**34)])
