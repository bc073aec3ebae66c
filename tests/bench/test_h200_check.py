"""bench.h200_check's single-GPU H200 runs, priced as they ran (data/measurements/h200-2026-11)."""

from __future__ import annotations

from bench.h200_check import HF_FULL16, run_errors


def test_hf_full16_is_priced_in_the_hf_stack_with_float32_weights_under_autocast() -> None:
    """HF transformers' full fine-tune of a 16-layer Llama-3-8B in float32 under bf16 autocast
    (`hf_peer.py`): peak allocated within 5% of the measured 118.7 GiB. Its step is priced 13.1% above
    the measured 3.937 s (the issue's target is 10%; the runtime's own fp32-under-autocast run on the same
    GPU is 7.3% above): bounded at 15% so that a change of the pricing shows here."""
    _, layout, training = HF_FULL16
    assert layout["stack"] == "hf" and training["master_weights"] is True
    row = next(r for r in run_errors() if r["run"] == "hf_full16")
    assert abs(row["memory_error"]) < 0.05, row
    assert 0.0 < row["step_error"] < 0.15, row
