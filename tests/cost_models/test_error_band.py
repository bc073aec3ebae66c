"""Error bands from the hold-out residuals (cost_models.error_band)."""

from __future__ import annotations

import pytest

from cost_models.error_band import MIN_ROWS, bands_from_ratios, error_band, gpu_generation, regime_keys
from model_specs.presets import get_model


def test_regimes_fall_back_from_specific_to_coarse() -> None:
    dense, moe = get_model("llama3-70b"), get_model("mixtral-8x7b")
    assert regime_keys(dense, "H100-80GB", 2048) == ["dense|hopper|>1024", "dense|hopper", "dense", "all"]
    assert regime_keys(moe, "GB200", 64)[0] == "moe|blackwell|<=64"
    assert gpu_generation("A100-40GB") == "ampere" and gpu_generation("cpu") == "other"
    ratios = [1.0 + i / 100 for i in range(MIN_ROWS)]
    bands = bands_from_ratios([(regime_keys(dense, "H100-80GB", 512), r) for r in ratios])
    # no MoE rows: an MoE job falls back to "all"; a dense Hopper job gets its own regime
    assert error_band(moe, "H100-80GB", 512, bands).regime == "all"  # type: ignore[union-attr]
    b = error_band(dense, "H100-80GB", 512, bands)
    assert b is not None and b.regime == "dense|hopper|<=1024" and b.rows == MIN_ROWS
    assert b.q10 == pytest.approx(1.007) and b.q90 == pytest.approx(1.063)
    out = b.as_dict(tokens_per_s_per_gpu=100.0, mfu=0.5, step_s=2.0)
    assert out["tokens_per_s_per_gpu_low"] == pytest.approx(100.7) and out["step_s_high"] == pytest.approx(2.0 / 1.007)


def test_too_few_rows_are_not_a_band() -> None:
    dense = get_model("llama3-8b")
    bands = bands_from_ratios([(["dense|hopper|<=64"], 1.0)] * (MIN_ROWS - 1))
    assert error_band(dense, "H100-80GB", 8, bands) is None


def test_stored_bands_cover_the_reference_jobs() -> None:
    b = error_band(get_model("llama3-405b"), "H100-80GB", 16384)
    assert b is not None and b.rows >= MIN_ROWS and b.q10 < 1.0 < b.q90
