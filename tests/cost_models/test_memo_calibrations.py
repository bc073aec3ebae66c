"""Pricing memos never hand one calibration's prices to another: layouts priced under calibration
A, then B, then A again in one process cost what they cost in a fresh one, also when a memo
overflows and starts over in the middle of a pricing (`step_time._PER_PAIR`, whose prices key
`step_time._SECONDS` by identity: the leave-one-family-out refits of `bench.fit_calibration` once
landed elsewhere than the same refit alone, llm-foundry's fsdp compute 1.1214 against 1.1266)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster_specs.presets import get_cluster
from cost_models import compute, mesh_comm, stage_table, step_time
from cost_models.calibration import Calibration, default_calibration
from cost_models.estimate import estimate
from cost_models.layout import Layout
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec

MODEL, CLUSTER, GPUS = "llama3-8b", "dgx-h100", 64
TRAINING = TrainingSpec(seq_len=4096, global_batch=256)
LAYOUTS = [
    Layout(zero_stage=3, micro_batch=1, framework="fsdp"),
    Layout(zero_stage=1, micro_batch=2, framework="fsdp", dp_shard=8),
    Layout(zero_stage=3, micro_batch=1, framework="deepspeed"),
]


def other(cal: Calibration, k: int) -> Calibration:
    """`cal` with slower collectives and another overlap (each k a new object, new prices)."""
    f = 1.0 + 0.2 * k
    overlaps = {n: replace(o, zero3=o.zero3 / f, bus_efficiency=o.bus_efficiency / f) for n, o in cal.overlaps.items()}
    return replace(cal, intra_bus_efficiency=cal.intra_bus_efficiency / f,
                   inter_bus_efficiency=cal.inter_bus_efficiency / f, overlaps=overlaps, source=f"other {k}")


def forget() -> None:
    """Every pricing memo a layout's collectives go through, as in a fresh process."""
    for memo in (step_time._PER_PAIR, step_time._SECONDS, step_time._DP_GRIDS, step_time._DP_WEIGHTS, step_time._DP_VOLUMES,
                 stage_table._GEOMETRIES, stage_table._TABLE_PARTS, stage_table._STATE_BYTES, mesh_comm._COMM_STORES, compute._GEMM_SECONDS):
        memo.clear()


def steps(cal: Calibration, full_memo: bool = False) -> list[float]:
    """Step seconds of every layout; `full_memo`: with `_PER_PAIR` one entry short of its bound
    before each, so that it starts over between the collectives of one table."""
    model, cluster = get_model(MODEL), get_cluster(CLUSTER)
    out = []
    for lay in LAYOUTS:
        if full_memo:
            step_time._PER_PAIR.clear()
            for i in range(step_time._PER_PAIR.limit - 1):
                step_time._PER_PAIR.put(("padding", i), None, ())
        out.append(estimate(model, TRAINING, cluster, GPUS, lay.resolved(GPUS, TRAINING), calibration=cal).step_s)
    return out


@pytest.mark.parametrize("full_memo", [False, True])
def test_prices_under_a_b_a_equal_fresh_prices(full_memo: bool) -> None:
    a = default_calibration()
    calibrations = [a, *(other(a, k) for k in (1, 2, 3))]
    fresh = []
    for cal in calibrations:
        forget()
        fresh.append(steps(cal))
    assert len({tuple(s) for s in fresh}) == len(calibrations)  # each calibration prices differently
    forget()
    for _ in range(2):
        for cal, want in zip(calibrations, fresh, strict=True):
            assert steps(cal, full_memo) == want, cal.source
    # a calibration built after another was dropped (its id may be reused)
    for k in (4, 5):
        forget()
        want = steps(other(a, k))
        assert steps(other(a, k), full_memo) == want
    forget()


def test_collective_seconds_stay_with_the_price_they_were_computed_for() -> None:
    """`_PER_PAIR` starting over between a table's prices and their seconds leaves seconds whose
    price is gone from it: each entry holds its own price, so that no later price (another
    calibration's) at the same address reads them."""
    forget()
    a = default_calibration()
    steps(a, full_memo=True)
    live = {id(v) for v in step_time._PER_PAIR.values()}
    assert any(key[0] not in live for key in step_time._SECONDS)  # the memo did start over mid-table
    for key, kept, _ in step_time._SECONDS.items():
        assert id(kept) == key[0]
    b = other(a, 1)
    forget()
    want = steps(b)
    forget()
    steps(a, full_memo=True)
    assert steps(b) == want
    forget()
