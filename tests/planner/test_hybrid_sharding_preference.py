"""The seeds' advice for small multi-node jobs, reached by the cost model rather than by a rule:
without InfiniBand, FSDP should shard inside the node and replicate across nodes (HYBRID_SHARD), and
DeepSpeed ZeRO-3 should keep the backward's gathers inside the node (ZeRO++ hpZ with
`zero_hpz_partition_size` = GPUs per node); with InfiniBand, plain sharding over every rank is as
good or better. Llama-3-8B on two nodes of 8 A100-80GB."""

from __future__ import annotations

import pytest

from cluster_specs.presets import get_cluster
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.plan import SearchConstraints
from planner.search import search

M = get_model("llama3-8b")
TR = TrainingSpec(seq_len=4096, global_batch=64)


def _best(cluster: str, framework: str):
    plan = search(M, TR, get_cluster(cluster), 16, SearchConstraints(framework=framework, zero_stage=3, tp=1, pp=1))
    assert plan.best is not None
    return plan.best


@pytest.mark.parametrize("framework", ["fsdp", "deepspeed"])
def test_without_infiniband_the_shard_stays_in_the_node(framework: str) -> None:
    lay = _best("gcp-a2-ultragpu-8g", framework).layout
    if framework == "fsdp":
        assert lay.dp_shard == 8 and lay.dp == 16  # HYBRID_SHARD: 2 replicas of an 8-GPU shard group
    else:
        assert lay.zero_hpz_partition_size == 8 and lay.dp_shard == 16  # hpZ over the node


def test_with_infiniband_sharding_over_every_rank_is_not_penalised() -> None:
    """FSDP over all 16 ranks prices within 1% of HYBRID_SHARD with InfiniBand (without it, 1.7-2.9x
    slower). Which of the two the plan recommends is then a tie, broken by headroom and moving parts
    within a share of the error band (`planner.search.TIE_SHARE_OF_BAND`), so it is not asserted."""
    from cost_models.estimate import estimate
    from cost_models.layout import Layout

    for cluster, lo, hi in (("dgx-a100-80g", 0.99, 1.01), ("gcp-a2-ultragpu-8g", 1.5, None)):
        for mb in (1, 2):
            full, hybrid = (
                estimate(M, TR, get_cluster(cluster), 16, Layout(framework="fsdp", zero_stage=3, dp_shard=s, micro_batch=mb))
                for s in (16, 8)
            )
            ratio = full.step_s / hybrid.step_s
            assert ratio >= lo and (hi is None or ratio <= hi), (cluster, mb, ratio)


def test_with_infiniband_deepspeed_gathers_over_every_rank() -> None:
    lay = _best("dgx-a100-80g", "deepspeed").layout
    assert lay.dp_shard == 16 and lay.zero_hpz_partition_size == 1
