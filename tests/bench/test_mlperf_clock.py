"""bench.mlperf_clock: the MLPerf runs it reads, and GB200's clock fraction derived from them."""

from __future__ import annotations

import pytest

from bench import mlperf_clock
from cluster_specs.catalog import get_gpu
from cost_models.calibration import default_calibration


def test_runs_carry_their_measured_throughput() -> None:
    """Eos, 512 H100: global batch 1152 x 8192 tokens in a median 55.134 s step is 334.3 tokens/s/GPU;
    every run's layout covers its GPUs."""
    runs = mlperf_clock.load_runs()
    assert {r.gpu_family for r in runs} == {"H100-80GB", "H200-141GB", "GB200"}
    eos = next(r for r in runs if r.system == "eos-dfw_n64_ngc25.01_nemo")
    assert eos.measured_tokens_per_s_per_gpu == pytest.approx(334.3, abs=0.1)
    for r in runs:
        lay = r.layout()
        assert lay.tp * lay.pp * lay.cp * lay.dp == r.gpus, r.system


def test_catalog_clock_is_the_one_the_mlperf_runs_give() -> None:
    """The GB200 fraction in cluster_specs/data/gpus.yaml is what the bench derives (to 0.002), and at
    it the GB200 runs are predicted as well as the H100 runs (median measured / predicted within 1%).
    A change to the cost model that moves the derivation fails here until the catalog follows."""
    cal, runs = default_calibration(), mlperf_clock.load_runs()
    catalog = get_gpu("GB200").sustained_clock_fraction
    assert mlperf_clock.derive_clock_fraction(runs, cal) == pytest.approx(catalog, abs=2e-3)
    h100 = mlperf_clock.family_median(runs, "H100-80GB", cal)
    gb200 = mlperf_clock.family_median(runs, "GB200", cal)
    assert gb200 == pytest.approx(h100, rel=0.01)


def test_a_slower_clock_makes_the_model_pessimistic_on_gb200() -> None:
    """Only kernel time scales with the clock: lowering it raises measured / predicted, less than
    in proportion (communication and bubble do not slow down)."""
    cal = default_calibration()
    run = next(r for r in mlperf_clock.load_runs() if r.gpu_family == "GB200")
    fast, slow = (mlperf_clock.measured_over_predicted(run, cal, clock) for clock in (0.9, 0.8))
    assert 1.0 < slow / fast < 0.9 / 0.8


def test_main_reports_every_run_and_the_fractions(capsys) -> None:
    """--json: one row per run of the file, each family's median of the rows' ratios, the catalog's
    fraction as the preset and the derivation's as derived."""
    import json
    import statistics

    assert mlperf_clock.main(["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    runs = mlperf_clock.load_runs()
    assert [r["system"] for r in doc["runs"]] == [r.system for r in runs]
    for family, median in doc["medians"].items():
        ratios = [r["measured_over_predicted"] for r in doc["runs"] if r["gpu_family"] == family]
        assert median == pytest.approx(statistics.median(ratios))
    assert doc["preset_fraction"] == get_gpu("GB200").sustained_clock_fraction
    assert doc["derived_fraction"] == pytest.approx(doc["preset_fraction"], abs=2e-3)
