"""Search-space enumeration (planner.space): divisors by factorization, bounded inputs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from model_specs.spec import MAX_GLOBAL_BATCH, TrainingSpec
from planner.space import divisors, factorize


@given(st.integers(min_value=1, max_value=10**7))
def test_divisors_match_their_definition(n: int) -> None:
    got = divisors(n)
    assert got == sorted(got) and got[0] == 1 and got[-1] == n
    assert all(n % d == 0 for d in got)
    assert len(got) == len({d for d in range(1, int(n**0.5) + 1) if n % d == 0} | {n // d for d in range(1, int(n**0.5) + 1) if n % d == 0})


def test_huge_numbers_factor_without_trial_division() -> None:
    # 2**62 - 1 = 3 x 715827883 x 2147483647: trial division would take 2**31 steps
    assert factorize(2**62 - 1) == {3: 1, 715827883: 1, 2147483647: 1}
    assert len(divisors(2**56)) == 57
    with pytest.raises(ValueError):
        divisors(0)


def test_global_batch_is_bounded_with_its_field_path() -> None:
    with pytest.raises(ValidationError) as exc:
        TrainingSpec(seq_len=4096, global_batch=2**56)
    assert exc.value.errors()[0]["loc"] == ("global_batch",)
    assert TrainingSpec(seq_len=4096, global_batch=MAX_GLOBAL_BATCH).global_batch == MAX_GLOBAL_BATCH
