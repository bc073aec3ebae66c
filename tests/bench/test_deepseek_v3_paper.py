"""DeepSeek-V3's own layout against the technical report's 180K H800 GPU-hours per trillion tokens
(`bench.deepseek_v3_paper`): the schedule the report runs (DualPipe, priced as DualPipeV with its
F&B pairs) lands within 15% of the report's step, and the same degrees under Megatron's 1F1B fit."""

import pytest

from bench.deepseek_v3_paper import paper_step_s, price


def test_paper_step_from_gpu_hours() -> None:
    # 15,360 x 4,096 tokens x 6.48e-4 GPU-seconds per token / 2,048 GPUs
    assert paper_step_s() == pytest.approx(19.906, rel=1e-3)


def test_dualpipev_prices_the_report_within_15_percent() -> None:
    r = price("fsdp-dualpipev")
    assert r["step_s"] == pytest.approx(paper_step_s(), rel=0.15)
    assert r["time"]["breakdown"]["ep_comm_s"] == 0.0  # hidden behind the paired compute


def test_the_paper_degrees_fit_under_megatron() -> None:
    assert price("megatron-1f1b")["fits"]
