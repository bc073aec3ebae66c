"""The pipeline memory rules that rest on the order of torch 2.13's schedules, checked against the
action lists torch itself generates (no process group needed)."""

from __future__ import annotations

import pytest
from torch.distributed.pipelining.schedules import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    OVERLAP_F_B,
    ScheduleDualPipeV,
)

from cost_models.pipeline import dualpipev_loss_meets_first_chunk, in_flight_micro_batches


def _rank0_actions(pp: int, micro_batches: int) -> list:
    schedule = object.__new__(ScheduleDualPipeV)  # the order only needs these two fields
    schedule.pp_group_size, schedule._n_microbatches = pp, micro_batches
    flat = []
    for a in schedule._calculate_single_rank_operations(0):
        flat += list(a.sub_actions) if a.computation_type == OVERLAP_F_B else [a]
    return flat


def _loss_backwards(pp: int, micro_batches: int) -> list[tuple[int, bool]]:
    """(chunks alive, whether chunk 0 has had a backward) at each loss backward on rank 0, which
    holds chunk 0 and the last chunk 2p - 1. A forward adds a chunk; a full or first-chunk input
    backward frees it; otherwise the weight pass does."""
    alive, first_done, out = 0, False, []
    last = 2 * pp - 1
    for a in _rank0_actions(pp, micro_batches):
        kind, stage = a.computation_type, a.stage_index
        if kind == FORWARD:
            alive += 1
        elif kind in (FULL_BACKWARD, BACKWARD_INPUT):
            if stage == last:
                out.append((alive, first_done))
            if stage == 0:
                first_done = True
            if kind == FULL_BACKWARD or stage == 0:
                alive -= 1
        elif kind == BACKWARD_WEIGHT and stage != 0:
            alive -= 1
    return out


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_dualpipev_loss_meets_the_first_chunks_gradients_only_above_2p_micro_batches(pp: int) -> None:
    """`pipeline.dualpipev_loss_meets_first_chunk` (the head rank's memory relief at 2p micro-batches)
    and the 2p + 1 chunks of `in_flight_micro_batches`, from torch's own DualPipeV order."""
    for m in (2 * pp, 2 * pp + 1, 4 * pp):
        states = _loss_backwards(pp, m)
        peak = max(alive for alive, _ in states)
        assert peak == 2 * pp + 1 == 2 * in_flight_micro_batches("dualpipev", pp, 2, m, 0)
        meets = any(alive == peak and first for alive, first in states)
        assert meets == dualpipev_loss_meets_first_chunk(pp, m), (pp, m)
