import pytest

from cost_models.pipeline import bubble_fraction, in_flight_micro_batches


@pytest.mark.parametrize(("p", "m"), [(2, 8), (4, 16), (8, 64), (16, 16)])
def test_bubble_fraction_matches_formula(p: int, m: int) -> None:
    assert bubble_fraction("1f1b", p, 1, m) == pytest.approx((p - 1) / (m + p - 1))
    assert bubble_fraction("gpipe", p, 1, m) == pytest.approx((p - 1) / (m + p - 1))


def test_interleaving_divides_idle_slots_by_v() -> None:
    p, m, v = 8, 32, 4
    idle = (p - 1) / v
    assert bubble_fraction("interleaved_1f1b", p, v, m) == pytest.approx(idle / (m + idle))


def test_in_flight() -> None:
    assert in_flight_micro_batches("gpipe", 4, 1, 16, 0) == 16
    assert [in_flight_micro_batches("1f1b", 4, 1, 16, r) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight_micro_batches("1f1b", 4, 1, 2, 0) == 2  # fewer micro-batches than stages
    # Korthikanti et al. 2022: first stage holds p * (1 + (p-1)/(p v)) micro-batches' worth
    p, v = 8, 4
    assert in_flight_micro_batches("interleaved_1f1b", p, v, 64, 0) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert in_flight_micro_batches("1f1b", 1, 1, 64, 0) == 1
