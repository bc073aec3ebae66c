"""The atlas entries pricing one layout looks up: what `autopar profile` measures for a plan.

`needed_entries` prices the layout (`cost_models.estimate.estimate`, and the kernel provenance a
plan reports, `cost_models.report.kernels_dict`) while `cost_models.kernels.record` collects every
lookup the atlas answers, so the list is the pricing's own, never one kept by hand. The pricing
runs on a copy of the cluster under a name of its own: the cost model's caches keyed on the
cluster (the per-geometry layer times, the placed groups) then cannot answer from an earlier
pricing of the same job without asking the atlas.
"""

from __future__ import annotations

import itertools

from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration, default_calibration
from cost_models.kernels.record import Lookups, recording
from cost_models.layout import Layout
from cost_models.stages import StagePartition
from model_specs.spec import ModelSpec, TrainingSpec

_FRESH = itertools.count()


def needed_entries(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: int, layout: Layout,
    partition: StagePartition | None = None, calibration: Calibration | None = None,
) -> Lookups:
    """The distinct GEMM, attention and collective lookups of pricing `layout` (module doc)."""
    from cost_models.estimate import estimate
    from cost_models.report import kernels_dict

    cal = calibration or default_calibration()
    fresh = cluster.model_copy(update={"name": f"{cluster.name}#needs{next(_FRESH)}"})
    with recording() as rec:
        estimate(model, training, fresh, gpus, layout, partition, calibration=cal)
        kernels_dict(model, training, fresh, layout, cal)
    return rec
