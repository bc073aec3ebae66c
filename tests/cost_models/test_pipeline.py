import pytest

from cost_models.pipeline import bubble_fraction, in_flight_micro_batches, zero_bubble_rounds_ok


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


def test_zero_bubble_keeps_a_third_of_the_idle_slots() -> None:
    """ZB1P (Qi et al. 2024): (p - 1)(F + B - W) with F = B = W is a third of 1F1B's (p - 1)(F + B + W);
    interleaving divides it by v as well."""
    p, m = 8, 32
    for v in (1, 2, 4):
        idle = (p - 1) / v / 3
        assert bubble_fraction("zero_bubble", p, v, m) == pytest.approx(idle / (m + idle))
    assert bubble_fraction("zero_bubble", 1, 1, m) == 0.0


def test_zero_bubble_holds_what_1f1b_holds() -> None:
    assert [in_flight_micro_batches("zero_bubble", 4, 1, 16, r) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight_micro_batches("zero_bubble", 8, 4, 64, 0) == in_flight_micro_batches("interleaved_1f1b", 8, 4, 64, 0)


@pytest.mark.parametrize(("pp", "m", "ok"), [(4, 8, True), (4, 6, True), (4, 10, True), (4, 9, False), (4, 2, True)])
def test_zero_bubble_rounds(pp: int, m: int, ok: bool) -> None:
    """torch's ScheduleInterleavedZeroBubble: m in max(1, m // pp) rounds, m a multiple of them."""
    assert zero_bubble_rounds_ok(pp, m) is ok
