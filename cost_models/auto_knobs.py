"""`"auto"` knobs of an evaluation: the user pins what they will run, the rest is chosen.

"I will run TP8 PP8; which micro-batch and recompute?" A job's layout may say `"auto"` for any of
`AUTO_KNOBS`; every combination of their values (below) is priced with the pinned rest and the
fastest that fits wins. The result names the choice, how many combinations were priced, how many
fit, and the runner-up, so the user sees why.

Values tried per knob:
- micro_batch: every divisor of the per-replica batch (global batch / dp), up to `MAX_MICRO_BATCH`;
- recompute: none, selective, full (and op_sac under framework fsdp);
- zero_stage: 0, 1, 2, 3;
- vpp: 1 and every v >= 2 with pp x v dividing the layers (with pp > 1);
- schedule: gpipe or 1f1b at vpp 1, interleaved_1f1b above, zero_bubble at any vpp, zbv and
  dualpipev at vpp 2 (framework fsdp; the others are refused by validation and not counted as fits);
- offload_optimizer: off, on (with ZeRO >= 1).
A job's `"partition": "auto"` is not a knob here: `cost_models.jobs` re-cuts the chosen layout
with the planner's CP-SAT partitioner afterwards (`choose(near_even_cut=True)` prices the
combinations on the near-even cut where the layers do not divide the chunks).
At most `MAX_COMBINATIONS` combinations are priced: more is refused with the count, so that a
request never holds a worker for long (pin some knobs instead).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration
from cost_models.estimate import Estimate, estimate
from cost_models.layout import Layout, LayoutError
from cost_models.pipeline import TORCH_ONLY_SCHEDULES
from cost_models.stages import StagePartition, even_partition
from model_specs.spec import ModelSpec, TrainingSpec

AUTO_KNOBS = ("micro_batch", "recompute", "zero_stage", "vpp", "schedule", "offload_optimizer")
MAX_MICRO_BATCH = 64
MAX_COMBINATIONS = 512


class AutoError(ValueError):
    """No combination of the auto knobs can be priced, or too many would be."""


@dataclass(frozen=True)
class AutoChoice:
    layout: Layout
    estimate: Estimate
    report: dict[str, Any]


def split_auto(layout: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the layout without its "auto" entries, the auto knob names). Raises `AutoError` naming a
    field that cannot be "auto"."""
    auto = [k for k, v in layout.items() if v == "auto"]
    bad = [k for k in auto if k not in AUTO_KNOBS]
    if bad:
        raise AutoError(f"layout.{bad[0]}: 'auto' is supported for {', '.join(AUTO_KNOBS)}")
    return {k: v for k, v in layout.items() if v != "auto"}, auto


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _values(knob: str, base: Layout, model: ModelSpec, training: TrainingSpec, gpus: int) -> list[Any]:
    if knob == "micro_batch":
        dp = base.model_copy(update={"micro_batch": 1, "grad_accum": None}).resolved(gpus, training).dp_
        return _divisors(training.global_batch // dp, MAX_MICRO_BATCH)
    if knob == "recompute":
        modes = ["none", "selective", "full"]
        return [*modes, "op_sac"] if base.framework == "fsdp" else modes
    if knob == "zero_stage":
        return [0, 1, 2, 3]
    if knob == "vpp":
        if base.pp == 1:
            return [1]
        return [1] + [v for v in range(2, model.num_layers // base.pp + 1) if model.num_layers % (base.pp * v) == 0]
    if knob == "schedule":
        if base.pp == 1:
            return [None]
        return [None, "gpipe", "1f1b", "interleaved_1f1b", *(TORCH_ONLY_SCHEDULES if base.framework == "fsdp" else ())]
    if knob == "offload_optimizer":
        return [False, True]
    raise AutoError(f"layout.{knob}: not an auto knob")


def _near_even(model: ModelSpec, training: TrainingSpec, gpus: int, layout: Layout) -> StagePartition | None:
    lay = layout.resolved(gpus, training)
    chunks = lay.pp * lay.vpp
    if lay.pp == 1 or lay.uneven_split or model.num_layers % chunks == 0 or chunks > model.num_layers:
        return None
    return StagePartition.explicit(even_partition(model.num_layers, chunks), lay)


def choose(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    layout: dict[str, Any],
    auto: list[str],
    calibration: Calibration | None = None,
    near_even_cut: bool = False,
) -> AutoChoice:
    """The fastest fitting layout over the auto knobs' values with the rest of `layout` pinned.
    `near_even_cut` (a job whose partition is "auto", re-cut afterwards): where pp x vpp chunks do
    not divide the layers and no Megatron split option is set, price the near-even cut
    (`stages.even_partition`: the remainder on the middle chunks) instead of refusing the layout."""
    base = Layout(**layout)
    values = [_values(k, base, model, training, gpus) for k in auto]
    combos = 1
    for v in values:
        combos *= len(v)
    if combos > MAX_COMBINATIONS:
        raise AutoError(
            f"layout: {combos} combinations of {', '.join(auto)} to price (at most {MAX_COMBINATIONS}); pin some of them"
        )
    priced: list[tuple[float, Layout, Estimate]] = []
    invalid = over = 0
    first_invalid = ""
    for combo in itertools.product(*values):
        update = dict(zip(auto, combo, strict=True))
        try:
            lay = Layout(**{**layout, **update})
            cut = _near_even(model, training, gpus, lay) if near_even_cut else None
            est = estimate(model, training, cluster, gpus, lay, cut, calibration=calibration)
        except (LayoutError, ValueError) as exc:
            invalid += 1
            first_invalid = first_invalid or str(exc)
            continue
        if not est.fits:
            over += 1
            continue
        priced.append((est.step_s, lay, est))
    if not priced:
        raise AutoError(
            f"layout: none of the {combos} combinations of {', '.join(auto)} fits and is valid "
            f"({invalid} invalid, {over} over the GPU memory)" + (f"; first invalid: {first_invalid}" if first_invalid else "")
        )
    priced.sort(key=lambda x: x[0])
    step, lay, est = priced[0]
    chosen = {k: getattr(lay, k) for k in auto}
    report: dict[str, Any] = {
        "knobs": list(auto),
        "chosen": chosen,
        "combinations": combos,
        "fitting": len(priced),
        "invalid": invalid,
        "over_memory": over,
        "why": f"fastest of {len(priced)} fitting combinations ({invalid} invalid, {over} over the GPU memory)",
    }
    if len(priced) > 1:
        runner_step, runner, _ = priced[1]
        report["runner_up"] = {k: getattr(runner, k) for k in auto}
        report["runner_up_slower_pct"] = 100.0 * (runner_step / step - 1.0)
    return AutoChoice(lay, est, report)
