"""bench.finetune_runs: every published fine-tuning run is priced in its stack or says why it cannot be."""

from __future__ import annotations

import pytest

from bench import finetune_runs as fr


def test_every_row_is_priced_or_named_as_not_expressible() -> None:
    ids = [r["row_id"] for r in fr.read_rows()]
    assert set(fr.RECIPES) | set(fr.NOT_EXPRESSIBLE) == set(ids)
    assert not set(fr.RECIPES) & set(fr.NOT_EXPRESSIBLE)


def test_every_published_run_is_predicted_to_fit() -> None:
    rows = {r["row_id"]: r for r in fr.read_rows()}
    misfits = [rid for rid in fr.RECIPES if not fr.price_row(rows[rid]).est.fits]
    assert misfits == []


def test_memory_where_the_row_says_what_it_measured() -> None:
    """torchtune's flags table states active memory, one technique at a time: each row's step is priced
    within 20%, and the techniques lower the price in the order the table lowers the measurement."""
    rows = {r["row_id"]: r for r in fr.read_rows()}
    flags = ["F022", "F023", "F024", "F025", "F026", "F027", "F028"]
    priced = [fr.price_row(rows[rid]) for rid in flags]
    assert all(p.memory_kind == "active" for p in priced)
    assert all(p.memory_ratio == pytest.approx(1.0, abs=0.2) for p in priced), [p.memory_ratio for p in priced]
    predicted = [p.predicted_gib for p in priced]
    assert predicted == sorted(predicted, reverse=True)


def test_padded_rows_count_real_tokens() -> None:
    rows = {r["row_id"]: r for r in fr.read_rows()}
    p = fr.price_row(rows["F054"])
    mean = fr._mean_tokens(rows["F054"])
    assert mean == 210  # 4,198,051 tokens over 5000 steps of 4 samples (the run's own count, in the notes)
    assert p.time_est.tokens_per_step == 4 * mean and p.est.layout.micro_batch == 4


def test_the_h200_runs_are_priced_within_5_percent_of_their_memory() -> None:
    for run in fr.h200_runs():
        est = run["est"]
        allocated = (est.peak_memory.total - est.peak_memory.reserve) / fr.GIB
        assert allocated == pytest.approx(run["allocated_gib"], rel=0.05), run["run"]


def test_torchtune_drops_its_float32_logits_before_the_backward() -> None:
    """torchtune's model returns float32 logits and its recipe deletes them after the loss: its eager
    loss peaks 2 bytes per logit below HF's, whose output keeps the bf16 logits (F022 and F023: 2 x
    4096 x 128256 logits, 1.96 GiB)."""
    rows = {r["row_id"]: r for r in fr.read_rows()}
    p = fr.price_row(rows["F023"])
    assert p.layout.stack == "torchtune" and p.layout.cross_entropy_ == "eager"
    model, training, _, cluster, gpus, _, _ = fr.job_of(rows["F023"])
    framework_loop = fr.estimate(model, training, cluster, gpus, p.layout.model_copy(update={"stack": None}))
    assert framework_loop.peak_memory.logits - p.est.peak_memory.logits == pytest.approx(2 * 2 * 4096 * 128256, rel=1e-6)
