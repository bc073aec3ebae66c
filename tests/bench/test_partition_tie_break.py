"""bench.partition_tie_break: phase 2 stopped at the headroom gap against phase 2 run to its limit."""

from __future__ import annotations

import pytest

from bench import partition_tie_break as bench
from planner import partition


def test_the_gap_costs_at_most_the_gap_and_no_recompute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "JOBS", (bench.Job("llama3-70b", "dgx-h100", 64, 8192, 128),))
    rows = bench.rows(top=2)
    assert rows, "the job has pipelined layouts among its fastest"
    gap_gib = partition.HEADROOM_GAP_BYTES / 2**30
    for r in rows:
        assert r["peak_gib_gap"] <= r["peak_gib_full"] + gap_gib
        assert r["recompute_layers_gap"] == r["recompute_layers_full"]
        assert r["slowest_rank_s"] > 0


def test_main_prints_the_summary(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench, "JOBS", (bench.Job("llama3-70b", "dgx-h100", 64, 8192, 128),))
    assert bench.main(["--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "headroom lost at most" in out and "llama3-70b / 64 x dgx-h100" in out
