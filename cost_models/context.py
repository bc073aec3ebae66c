"""`PricingContext`: the inputs of one estimate, resolved once and shared by the cost modules."""

from __future__ import annotations

from dataclasses import dataclass

from cluster_specs.spec import ClusterSpec
from cost_models.layout import Layout
from cost_models.stages import StagePartition
from model_specs.spec import ModelSpec, TrainingSpec


@dataclass(frozen=True)
class PricingContext:
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    gpus: int
    layout: Layout  # resolved (Layout.resolved): dp, grad_accum, dp_shard, etp, sp, schedule filled
    partition: StagePartition

    @property
    def micro_batches(self) -> int:
        return self.layout.grad_accum_
