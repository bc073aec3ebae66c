"""Pipeline schedules: in-flight micro-batches (memory) and bubble (time).

Sources: GPipe (Huang et al. 2019); 1F1B / PipeDream-Flush and interleaved 1F1B (Narayanan et al.
2021, Sec. 2.2): with p stages, m micro-batches and v virtual stages per rank, the bubble is
(p - 1) / v micro-batch slots of one stage's forward+backward, i.e. a fraction (p-1)/(m+p-1) of
the step for v = 1. Activation memory (Korthikanti et al. 2022, Sec. 4.2.3): under 1F1B the first
stage holds p micro-batches; under interleaving it holds p * (1 + (p-1)/(p*v)) micro-batches' worth
of its layers.

Zero bubble (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR; the ZB1P / ZB-H1 schedule
that `torch.distributed.pipelining.ScheduleInterleavedZeroBubble` implements, interleaved when a
rank holds v chunks): the backward is split into the input gradient B and the weight gradient W,
and the W passes fill the idle slots, so a stage's bubble is (p - 1)(F + B - W) instead of 1F1B's
(p - 1)(F + B + W) (DeepSeek-V3's table writes the same as (PP - 1)(F + B_full - 2W)), divided by v
when interleaved. Its peak activation memory is 1F1B's: ZB-H1 is built to hold at most p
micro-batches (the paper's Sec. 3.1), the interleaved variant the interleaved count.
"""

from __future__ import annotations


def in_flight_micro_batches(schedule: str, pp: int, vpp: int, micro_batches: int, rank: int) -> float:
    """Micro-batches' worth of this rank's activations alive at its peak (may be fractional under
    interleaving, where a rank holds chunks of different micro-batches)."""
    if pp == 1:
        return 1.0
    if schedule == "gpipe":
        return float(micro_batches)
    if schedule == "1f1b" or (schedule == "zero_bubble" and vpp == 1):
        return float(min(micro_batches, pp - rank))
    if schedule in ("interleaved_1f1b", "zero_bubble"):
        # Megatron's warm-up for rank r: 2*(p - r - 1) + (v - 1)*p chunk forwards, plus the one in
        # steady state; each chunk is 1/v of the rank's layers.
        chunks = 2 * (pp - rank - 1) + (vpp - 1) * pp + 1
        return min(chunks, micro_batches * vpp) / vpp
    raise ValueError(f"unknown schedule {schedule!r}")


ZB_WEIGHT_SHARE = 0.5
"""W's share of a backward pass without recompute: the weight-gradient GEMMs are as large as the
input-gradient ones (T_B = T_W, the ZB paper's own analysis and its Table 1 profile, within 10%
for GPT layers); attention's backward, which has no weights, makes the true share a little lower."""


def bubble_slots(schedule: str, pp: int, vpp: int) -> float:
    """Idle time of a pipeline step in units of one micro-batch's forward+backward on one stage
    (zero bubble: with F = B = W, (F + B - W) / (F + B + W) = 1/3 of 1F1B's)."""
    if pp == 1:
        return 0.0
    if schedule == "zero_bubble":
        return (pp - 1) / vpp / 3
    if schedule == "interleaved_1f1b":
        return (pp - 1) / vpp
    return float(pp - 1)


def bubble_fraction(schedule: str, pp: int, vpp: int, micro_batches: int) -> float:
    """Share of the step the pipeline idles: (p-1)/(m+p-1) for GPipe and 1F1B; the interleaved
    schedule divides the idle slots by v; zero bubble keeps a third of them (F = B = W)."""
    idle = bubble_slots(schedule, pp, vpp)
    return idle / (micro_batches + idle)


def zero_bubble_rounds_ok(pp: int, micro_batches: int) -> bool:
    """torch's ScheduleInterleavedZeroBubble runs the micro-batches in max(1, m // pp) rounds and
    refuses a count that is not a multiple of the rounds."""
    rounds = max(1, micro_batches // pp)
    return micro_batches % rounds == 0


ZERO_BUBBLE_ZERO3 = (
    "zero_bubble with ZeRO-3: FSDP2 reshards a layer when its input-gradient pass ends, before the "
    "weight-gradient pass, whose gradients are then lost (measured on torch 2.13, "
    "tests/runtime/test_parallel_layouts.py; torchtitan keeps weights unsharded under pipelining): use zero_stage 2"
)
"""Why zero bubble is not run with ZeRO-3: `layout.framework_violations` and the search's knob grid say the same."""
