import numpy as np
import pytest

from cost_models.pipeline import (
    bubble_fraction,
    in_flight_micro_batches,
    interleaving_group,
    zero_bubble_rounds_ok,
)


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


def test_torch_zero_bubble_warms_every_rank_up_with_p_forwards() -> None:
    """torch's ZB1P is not the paper's ZB-H1 (1F1B's p - r): every rank runs p forwards first, and
    rank r >= 1 keeps up to r + 1 micro-batches' weight-output gradients between its two passes
    (fake-world traces of torch 2.13's schedule, docs/verification-notes.md)."""
    from cost_models.pipeline import split_backward_peaks

    assert [in_flight_micro_batches("zero_bubble", 4, 1, 16, r) for r in range(4)] == [4, 4, 4, 4]
    assert [split_backward_peaks("zero_bubble", 4, 1, 16, r) for r in range(4)] == [[(4, 0)], [(4, 2)], [(4, 3)], [(4, 4)]]
    assert split_backward_peaks("1f1b", 4, 1, 16, 2) == [(2, 0.0)]
    # interleaved (v = 2, m = 8): warm-up (v - 1) x p + (p - 1 - r) forwards, the first r weight passes
    # deferred: 4 micro-batches of activations on every rank, r + 1 chunks pending (rank 0: its first
    # chunk has no input gradient, so only its second chunk's are)
    assert [split_backward_peaks("zero_bubble", 4, 2, 8, r) for r in range(4)] == [
        [(4.0, 0.5)], [(4.0, 1.0)], [(4.0, 1.5)], [(4.0, 2.0)]
    ]


def test_zbv_cool_down_piles_up_pending_gradients_on_later_ranks() -> None:
    """ZB-V's cool-down: rank r runs r input passes on each chunk before a weight pass: (p + r)
    chunks of activations and 2r + 1 chunks pending (chunks are half a micro-batch of the rank)."""
    from cost_models.pipeline import split_backward_peaks

    p, m = 4, 8
    assert split_backward_peaks("zbv", p, 2, m, 3) == [(4.0, 0.5), (3.5, 3.5)]
    assert split_backward_peaks("zbv", p, 2, m, 0) == [(4.0, 0.5), (2.0, 0.5)]
    assert split_backward_peaks("zbv", p, 2, 3, 0) == [(2.0, 0.5)]  # m < 2p - 1: no cool-down pile-up


@pytest.mark.parametrize(("pp", "m", "ok"), [(4, 8, True), (4, 6, True), (4, 10, True), (4, 9, False), (4, 2, True)])
def test_zero_bubble_rounds(pp: int, m: int, ok: bool) -> None:
    """torch's ScheduleInterleavedZeroBubble: m in max(1, m // pp) rounds, m a multiple of them."""
    assert zero_bubble_rounds_ok(pp, m) is ok


def test_looped_bfs_has_interleavings_bubble_and_gpipes_memory() -> None:
    """Breadth-first (Lamy-Poirier 2022; torch's ScheduleLoopedBFS): every forward of a rank's
    chunks, then every backward."""
    p, m, v = 4, 16, 2
    assert bubble_fraction("looped_bfs", p, v, m) == bubble_fraction("interleaved_1f1b", p, v, m)
    assert [in_flight_micro_batches("looped_bfs", p, v, m, r) for r in range(p)] == [m] * p


def test_v_shape_places_two_chunks_per_rank_as_a_v() -> None:
    from cost_models.pipeline import chunk_rank

    assert [chunk_rank(c, 4, v_shape=True) for c in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [chunk_rank(c, 4) for c in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_v_shape_schedules_bubble_and_memory() -> None:
    """ZB-V: zero bubble and 1F1B's p micro-batches, on every rank (Qi et al. 2024, Sec. 6; the Sea AI Lab
    table). DualPipeV: (PP/2 - 1)(F&B + B - 3W) over PP = 2p chunks, i.e. (p - 1)(F + 2B - 3W) at
    chunk times, a third of a rank's micro-batch per idle slot at F = B_input = W; PP + 1 = 2p + 1
    chunks of activations (DeepSeek's DualPipe README)."""
    p, m = 8, 32
    assert bubble_fraction("zbv", p, 2, m) == 0.0
    idle = (p - 1) / 3
    assert bubble_fraction("dualpipev", p, 2, m) == pytest.approx(idle / (m + idle))
    assert [in_flight_micro_batches("zbv", p, 2, m, r) for r in range(p)] == [p] * p
    assert [in_flight_micro_batches("dualpipev", p, 2, m, r) for r in range(p)] == [p + 0.5] * p
    assert in_flight_micro_batches("zbv", p, 2, 3, 0) == 2  # min(2p, m + 1 + r, 2m) = 4 chunks alive


def test_megatron_interleaving_group_is_the_smallest_it_accepts() -> None:
    # forward_backward_pipelining_with_interleaving: pp <= N <= m, and m % N is 0 or >= pp
    assert interleaving_group("megatron", 16, 128) == 16
    assert interleaving_group("megatron", 16, 120) == 20  # 120 % 16 = 8 < 16; 17..19 leave 1, 12, 6
    assert interleaving_group("megatron", 4, 6) == 6
    assert interleaving_group("megatron", 4, 3) is None  # fewer micro-batches than stages
    for p, m in [(4, 10), (8, 60), (16, 120), (3, 7)]:
        n = interleaving_group("megatron", p, m)
        assert n is not None and p <= n <= m and (m % n == 0 or m % n >= p)
        assert all(m % k and m % k < p for k in range(p, n))


def test_torch_interleaving_group_is_a_round() -> None:
    # ScheduleInterleaved1F1B: max(1, m // pp) rounds of m / rounds micro-batches
    assert interleaving_group("fsdp", 4, 10) == 5
    assert interleaving_group("fsdp", 4, 3) is None  # one round that waits on the last stage: not priced
    assert interleaving_group("fsdp", 16, 120) is None  # 7 rounds do not divide 120
    assert interleaving_group("deepspeed", 4, 8) is None


def test_a_larger_group_and_combined_1f1b_warm_up_more_chunks() -> None:
    p, v, m = 16, 2, 120
    divisible = in_flight_micro_batches("interleaved_1f1b", p, v, 128, 0)
    grouped = in_flight_micro_batches("interleaved_1f1b", p, v, m, 0)  # Megatron's N = 20
    paired = in_flight_micro_batches("interleaved_1f1b", p, v, m, 0, paired=True)
    # rank 0: 2(p - 1) + (v - 1) N + 1 chunk forwards, one more when paired; a chunk is 1/v of the rank
    assert (divisible, grouped, paired) == ((30 + 16 + 1) / 2, (30 + 20 + 1) / 2, (30 + 20 + 2) / 2)
    assert in_flight_micro_batches("interleaved_1f1b", p, v, m, p - 1) == (20 + 1) / 2
    assert in_flight_micro_batches("interleaved_1f1b", 4, v, 10, 0, framework="fsdp") == (6 + 5 + 1) / 2  # torch: 2 rounds of 5


@pytest.mark.parametrize(
    ("schedule", "vpp"),
    [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 5), ("looped_bfs", 3),
     ("zero_bubble", 1), ("zero_bubble", 2), ("zbv", 2), ("dualpipev", 2)],
)
def test_the_bubble_and_the_ranks_idle_time_agree(schedule: str, vpp: int) -> None:
    """Two hand-kept copies of each schedule's bubble: `bubble_slots` (reported) and `rank_idle`
    (the step time). With F = 1, B = 2 (W = 1 of it) a micro-batch is 3 units on every rank."""
    from cost_models.pipeline import bubble_slots, rank_idle

    per_mb, backward, weight = (np.array([x]) for x in (3.0, 2.0, 1.0))
    for pp in (2, 4, 8):
        idle = float(rank_idle(schedule, per_mb, backward, weight, vpp)[0])
        assert bubble_slots(schedule, pp, vpp) == pytest.approx((pp - 1) * idle / 3, rel=1e-12)
