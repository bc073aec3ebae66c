"""bench.reference_jobs: the published figures it derives, and the table it prints."""

from __future__ import annotations

import json

import pytest

from bench import reference_jobs


def test_published_figures_are_derived_from_the_sources_numbers() -> None:
    """GPT-3: 140 TFLOP/s per GPU under Narayanan's Eq. 3 is their 31.5 s per step (a 1536 x 2048
    batch on 1024 A100); DeepSeek-V3: 180K GPU hours per trillion tokens is 1,543 tokens/s/GPU."""
    step_s = reference_jobs.GPT3_STEP_S
    assert step_s == pytest.approx(31.5, abs=0.05)
    gpt3 = next(j for j in reference_jobs.JOBS if j.model == "gpt3-175b")
    assert gpt3.published_tokens_per_s_per_gpu == pytest.approx(97.6, abs=0.1)
    deepseek = reference_jobs.DEEPSEEK_V3_TOKENS_PER_S_PER_GPU
    assert deepseek == pytest.approx(1543.2, abs=0.1)


def test_every_reference_job_gets_a_plan_with_its_band_and_the_published_ratio(capsys) -> None:
    assert reference_jobs.main(["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["job"] for r in rows] == [j.name for j in reference_jobs.JOBS]
    for r in rows:
        assert r["plan"] is not None, r["job"]
        assert r["mfu_low"] < r["mfu_high"]
        published = r["published_tokens_per_s_per_gpu"] or r["published_mfu"]
        predicted = r["tokens_per_s_per_gpu"] if r["published_tokens_per_s_per_gpu"] else r["mfu"]
        assert r["predicted_over_published"] == pytest.approx(predicted / published)
