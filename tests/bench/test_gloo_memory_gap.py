"""bench.gloo_memory_gap measures the cases whose memory the layout test checks, and names a wrong
--only case instead of running nothing."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from bench import gloo_memory_gap as gap  # noqa: E402


def test_the_bench_runs_the_cases_the_memory_test_checks() -> None:
    from tests.runtime import test_parallel_layouts as layouts

    marks = [m for m in layouts.test_fake_world_memory_matches_real_gloo_run.pytestmark if m.name == "parametrize"]
    checked = set(marks[0].args[1])
    assert {c["name"] for c in gap._cases(None)} == checked


def test_an_unknown_case_is_named() -> None:
    with pytest.raises(SystemExit, match="no tracked case named nope"):
        gap._cases(["fsdp_dp4_zero3", "nope"])
    assert [c["name"] for c in gap._cases(["fsdp_dp4_zero3"])] == ["fsdp_dp4_zero3"]
