"""A tiny run of bench/api_load.py (load, then kill -9 and restart), so the bench cannot rot."""

from __future__ import annotations

import pytest

from bench.api_load import main


@pytest.mark.slow
def test_api_load_bench_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--clients", "4", "--requests", "6", "--crash-requests", "10", "--kill-after", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert '"lost": 0' in out and '"acknowledged_missing_after_restart": 0' in out
