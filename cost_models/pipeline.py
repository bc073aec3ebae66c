"""Pipeline schedules: in-flight micro-batches (memory) and bubble (time).

Sources: GPipe (Huang et al. 2019); 1F1B / PipeDream-Flush and interleaved 1F1B (Narayanan et al.
2021, Sec. 2.2): with p stages, m micro-batches and v virtual stages per rank, the bubble is
(p - 1) / v micro-batch slots of one stage's forward+backward, i.e. a fraction (p-1)/(m+p-1) of
the step for v = 1. Activation memory (Korthikanti et al. 2022, Sec. 4.2.3): under 1F1B the first
stage holds p micro-batches; under interleaving it holds p * (1 + (p-1)/(p*v)) micro-batches' worth
of its layers.
"""

from __future__ import annotations


def in_flight_micro_batches(schedule: str, pp: int, vpp: int, micro_batches: int, rank: int) -> float:
    """Micro-batches' worth of this rank's activations alive at its peak (may be fractional under
    interleaving, where a rank holds chunks of different micro-batches)."""
    if pp == 1:
        return 1.0
    if schedule == "gpipe":
        return float(micro_batches)
    if schedule == "1f1b":
        return float(min(micro_batches, pp - rank))
    if schedule == "interleaved_1f1b":
        # Megatron's warm-up for rank r: 2*(p - r - 1) + (v - 1)*p chunk forwards, plus the one in
        # steady state; each chunk is 1/v of the rank's layers.
        chunks = 2 * (pp - rank - 1) + (vpp - 1) * pp + 1
        return min(chunks, micro_batches * vpp) / vpp
    raise ValueError(f"unknown schedule {schedule!r}")


def bubble_slots(schedule: str, pp: int, vpp: int) -> float:
    """Idle time of a pipeline step in units of one micro-batch's forward+backward on one stage."""
    if pp == 1:
        return 0.0
    if schedule == "interleaved_1f1b":
        return (pp - 1) / vpp
    return float(pp - 1)


def bubble_fraction(schedule: str, pp: int, vpp: int, micro_batches: int) -> float:
    """Share of the step the pipeline idles: (p-1)/(m+p-1) for GPipe and 1F1B; the interleaved
    schedule divides the idle slots by v."""
    idle = bubble_slots(schedule, pp, vpp)
    return idle / (micro_batches + idle)
