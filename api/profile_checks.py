"""A profile is checked against physics and against the plan it ran before it is stored
(`check_profile`, PUT /v1/runs/{id}/profile): a value no run of that plan on that hardware can
measure is refused (422) with its path and the bound, so it never reaches a cluster's fit.

Physics (the plan's `inputs`: its model, training, GPUs and their datasheet):
- a step does at least the plan's work: the fewest FLOPs its estimate counts for a step
  (`estimate.flops`: model, causal or hardware FLOPs), at no more than every GPU's peak at the
  training precision. A step time (`step_s`, every entry of `step_times_s`) below
  work / (GPUs x peak), or `tokens_per_s` / `mfu` above what that allows, is faster than the
  hardware. On a device whose peak is nominal (vendor `cpu`) the bound is
  `NOMINAL_PEAK_FACTOR` x that peak, as for the calibration's plausible range;
- a rank holds no more than its GPU's memory (`peak_memory_bytes_per_rank`; for a CPU device, the
  node's host memory), and there are no more ranks than the plan's GPUs;
- a pre-flight bus bandwidth within the bounds of any bandwidth (`cluster_specs.spec`).

The plan: `tokens_per_step` is its global batch x sequence length; a step more than
`MULTIPLIER_BOUNDS[1]` (1000) x slower than predicted is a unit error, not a measurement (the
bound the fit itself puts on a time multiplier, `cost_models.profile_calibration`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from api.errors import ApiError
from api.schemas import ProfileUpload
from cluster_specs.spec import MAX_BANDWIDTH_BYTES_PER_S, MIN_BANDWIDTH_BYTES_PER_S, ClusterSpec
from cost_models.profile_calibration import MULTIPLIER_BOUNDS, NOMINAL_PEAK_FACTOR


def _refuse(loc: Sequence[str | int], msg: str) -> ApiError:
    return ApiError(422, msg, ["body", *loc], "implausible_measurement")


def _least_work(estimate: dict[str, Any]) -> float | None:
    """The fewest FLOPs per step the plan's estimate counts (model, causal, hardware)."""
    flops = estimate.get("flops") or {}
    counts = [float(v) for k, v in flops.items() if k.endswith("_per_step") and isinstance(v, int | float) and v > 0]
    return min(counts) if counts else None


def check_profile(plan: dict[str, Any], profile: ProfileUpload) -> None:
    """Raise a 422 naming the first value of `profile` that the plan's hardware cannot produce."""
    inputs = plan.get("inputs") or {}
    best = plan.get("best") or {}
    estimate = best.get("estimate") or {}
    try:
        cluster = ClusterSpec(**inputs["cluster"])
        gpus = int(inputs["gpus"])
        training = inputs["training"]
        tokens = int(training["global_batch"]) * int(training["seq_len"])
        precision = str(training.get("precision", "bf16"))
    except (KeyError, TypeError, ValueError):
        return  # a plan stored without its inputs cannot be checked against (none is, since schema 1)
    gpu = cluster.gpu
    nominal = gpu.vendor == "cpu"
    ceiling = NOMINAL_PEAK_FACTOR if nominal else 1.0
    try:
        peak = gpu.peak(precision) * ceiling
    except KeyError:
        peak = None
    work = _least_work(estimate)
    fastest = work / (gpus * peak) if work and peak else None  # seconds per step at the hardware's limit
    limit = "the datasheet peak" if not nominal else f"{NOMINAL_PEAK_FACTOR:g} x the nominal peak"
    if fastest is not None:
        why = (f"faster than the hardware allows: plan's step does at least {work:.4g} FLOPs on {gpus} x {gpu.name} "
               f"at {limit} ({peak:.4g} FLOP/s at {precision}), so a step takes at least {fastest:.4g} s")
        if profile.step_s is not None and profile.step_s < fastest:
            raise _refuse(["step_s"], f"{profile.step_s:.4g} s is {why}")
        for i, t in enumerate(profile.step_times_s):
            if t < fastest:
                raise _refuse(["step_times_s", i], f"{t:.4g} s is {why}")
        if profile.tokens_per_s is not None and profile.tokens_per_s > tokens / fastest:
            raise _refuse(["tokens_per_s"], f"{profile.tokens_per_s:.4g} tokens/s is above {tokens / fastest:.4g}, "
                          f"the plan's {tokens} tokens per step in that time: {why}")
    if profile.mfu is not None and profile.mfu > ceiling:
        raise _refuse(["mfu"], f"MFU {profile.mfu:.4g} is above {ceiling:g}: no run beats {limit}")
    predicted = estimate.get("step_s")
    slowest_rel = MULTIPLIER_BOUNDS[1]
    slow = isinstance(predicted, int | float) and predicted > 0 and profile.step_s is not None
    if slow and profile.step_s > predicted * slowest_rel:  # type: ignore[operator]
        raise _refuse(["step_s"], f"{profile.step_s:.4g} s is more than {slowest_rel:g} x the plan's predicted "
                      f"{predicted:.4g} s: a unit error, not a measurement the calibration can use")
    if profile.tokens_per_step is not None and profile.tokens_per_step != tokens:
        raise _refuse(["tokens_per_step"], f"{profile.tokens_per_step:g} tokens per step: the plan runs "
                      f"{training['global_batch']} sequences of {training['seq_len']} tokens = {tokens}")
    _check_memory(profile, cluster, gpus)
    pre = profile.preflight
    if pre is not None:
        bw = pre.bus_bandwidth_bytes_per_s
        if bw and not MIN_BANDWIDTH_BYTES_PER_S <= bw <= MAX_BANDWIDTH_BYTES_PER_S:
            raise _refuse(["preflight", "bus_bandwidth_bytes_per_s"], f"{bw:g} bytes/s is outside "
                          f"[{MIN_BANDWIDTH_BYTES_PER_S:g}, {MAX_BANDWIDTH_BYTES_PER_S:g}], the bounds of any bandwidth")
        if pre.ranks > gpus:
            raise _refuse(["preflight", "ranks"], f"{pre.ranks} ranks: the plan has {gpus} GPUs")


def _check_memory(profile: ProfileUpload, cluster: ClusterSpec, gpus: int) -> None:
    peaks = profile.peak_memory_bytes_per_rank
    if len(peaks) > gpus:
        raise _refuse(["peak_memory_bytes_per_rank"], f"{len(peaks)} ranks: the plan runs {gpus}")
    if cluster.gpu.vendor == "cpu":
        capacity, what = cluster.host_memory_bytes, f"the node's host memory ({cluster.host_memory_bytes:,} bytes)"
    else:
        capacity, what = cluster.gpu.memory_bytes, f"a {cluster.gpu.name}'s memory ({cluster.gpu.memory_bytes:,} bytes)"
    for i, p in enumerate(peaks):
        if p is not None and p > capacity:
            raise _refuse(["peak_memory_bytes_per_rank", i], f"{p:,} bytes on one rank is above {what}")
