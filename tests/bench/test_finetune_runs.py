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
    assert mean is not None and 300 < mean < 768
    assert p.time_est.tokens_per_step == 4 * mean and p.est.layout.micro_batch == 4


def test_the_h200_runs_are_priced_within_5_percent_of_their_memory() -> None:
    for run in fr.h200_runs():
        est = run["est"]
        allocated = (est.peak_memory.total - est.peak_memory.reserve) / fr.GIB
        assert allocated == pytest.approx(run["allocated_gib"], rel=0.05), run["run"]
