"""The planner's CP-SAT pipeline cut as a `cost_models.jobs.Partitioner`, for evaluations whose
partition is "auto" (`autopar evaluate --partition auto`, the API's /v1/evaluate). OR-Tools is
imported on the first call only, so the CLI and the service start without it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster_specs.spec import ClusterSpec
    from cost_models.calibration import Calibration
    from cost_models.layout import Layout
    from cost_models.stages import StagePartition
    from model_specs.spec import ModelSpec, TrainingSpec


def cp_sat_partitioner(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    layout: Layout,
    calibration: Calibration | None = None,
    *,
    capacity_bytes: float | None = None,
) -> StagePartition | None:
    """`planner.partition.optimize_partition`: the fastest cut whose every rank fits in
    `capacity_bytes`, or None when none does (or pp == 1)."""
    from planner.partition import optimize_partition

    return optimize_partition(model, training, cluster, gpus, layout, calibration, capacity_bytes=capacity_bytes)
