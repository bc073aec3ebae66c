"""ZeRO++ (Wang et al. 2023) priced from its volumes: qwZ halves the weight all-gathers (int8 for
16 bits), hpZ moves the backward's gathers inside a node (a secondary 16-bit shard per GPU), qgZ
quarters the gradient reduce-scatter (int4); together 3 Psi of cross-node traffic per pass becomes
0.75 Psi, the paper's "4x less". And what the three cost: the secondary shard's memory and the
quantization kernels on the compute stream."""

from __future__ import annotations

import numpy as np
import pytest

from cluster_specs.presets import get_cluster
from cost_models import step_time
from cost_models.calibration import default_calibration
from cost_models.comm import INTER
from cost_models.compute import hbm_bandwidth
from cost_models.estimate import estimate
from cost_models.layout import Layout, validate_layout
from cost_models.stage_data import Sharding
from cost_models.stage_table import build_table
from cost_models.stages import StagePartition
from cost_models.step_time import data_parallel_times
from model_specs.params import count_params
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec

M = get_model("llama3-8b")
A100 = get_cluster("dgx-a100-80g")
TR = TrainingSpec(seq_len=4096, global_batch=32)
GPUS = 16  # two nodes
Z3 = {"zero_stage": 3, "framework": "deepspeed", "recompute": "full"}


def _inter_node_seconds(*shardings: Sharding) -> np.ndarray:
    """Per micro-batch seconds on the scale-out channel (forward + backward) of each sharding."""
    cal = default_calibration()
    lay = Layout(**Z3).resolved(GPUS, TR)
    table = build_table(M, TR, A100, GPUS, lay, StagePartition.for_layout(M.num_layers, lay), cal)
    dp = data_parallel_times(table, shardings, cal)
    return (dp.traffic_f[:, INTER, 0] + dp.traffic_b[:, INTER, 0])


def test_zeropp_moves_a_quarter_of_zero3s_cross_node_volume() -> None:
    plain, qwz, hpz, qgz, all3 = _inter_node_seconds(
        Sharding(3, 16), Sharding(3, 16, qwz=True), Sharding(3, 16, hpz=8),
        Sharding(3, 16, qgz=True), Sharding(3, 16, hpz=8, qwz=True, qgz=True),
    )
    # plain ZeRO-3: forward gather, backward gather, reduce-scatter, Psi x 2 bytes each (the seeds'
    # "48 x M / N bits per node per step", S. Bekman, is these 6 bytes per parameter spread over N nodes)
    assert qwz / plain == pytest.approx((1 + 1 + 2) / 6, rel=0.02)  # both gathers in int8
    assert hpz / plain == pytest.approx((2 + 0 + 2) / 6, rel=0.02)  # backward gathers stay in the node
    assert qgz / plain == pytest.approx((2 + 2 + 0.5) / 6, rel=0.02)
    assert all3 / plain == pytest.approx(0.75 / 3, rel=0.02)  # the paper's 3M -> 0.75M


def test_hpz_costs_a_secondary_shard_and_saves_time_without_infiniband() -> None:
    psi = count_params(M).total
    plain = estimate(M, TR, A100, GPUS, Layout(**Z3))
    hpz = estimate(M, TR, A100, GPUS, Layout(**Z3, zero_hpz_partition_size=8))
    extra = hpz.peak_memory.parameters - plain.peak_memory.parameters
    assert extra == pytest.approx(2 * psi / 8, rel=0.01)  # a 16-bit shard over the node's 8 GPUs
    ethernet = get_cluster("gcp-a2-ultragpu-8g")
    slow_plain = estimate(M, TR, ethernet, GPUS, Layout(**Z3))
    slow_hpz = estimate(M, TR, ethernet, GPUS, Layout(**Z3, zero_hpz_partition_size=8))
    assert slow_hpz.step_s < 0.8 * slow_plain.step_s


def test_quantization_kernels_are_not_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """qwZ's dequantize kernel (3 HBM bytes per gathered element) runs on the compute stream once per
    layer and forward: the forward's compute-stream kernels are exactly those of every layer, and
    the halved gathers expose less (measured against the same pricing with the kernel's bytes set
    to 0)."""
    cal = default_calibration()
    tr = TrainingSpec(seq_len=4096, global_batch=8)
    lay = Layout(**Z3).resolved(8, tr)
    table = build_table(M, tr, A100, 8, lay, StagePartition.for_layout(M.num_layers, lay), cal)
    shardings = (Sharding(3, 8), Sharding(3, 8, qwz=True))
    dp = data_parallel_times(table, shardings, cal)
    monkeypatch.setattr(step_time, "QWZ_HBM_BYTES_PER_ELEMENT", 0.0)
    free = data_parallel_times(table, shardings, cal)
    layer_elements = count_params(M).layers[0].total
    hbm = hbm_bandwidth(A100.gpu, cal, lay.framework)
    kernels = dp.kernels_f[1, 0] - free.kernels_f[1, 0]
    assert kernels == pytest.approx(M.num_layers * 3 * layer_elements / hbm, rel=0.01)
    assert dp.kernels_f[0, 0] == 0.0  # DeepSpeed without qwZ: no kernels of its own
    assert dp.exposed_f[1, 0] == free.exposed_f[1, 0] < dp.exposed_f[0, 0]  # the halved gathers expose less



@pytest.mark.parametrize(
    ("layout", "field"),
    [
        ({**Z3, "framework": "fsdp", "zero_hpz_partition_size": 8}, "zero_hpz_partition_size"),
        ({**Z3, "zero_stage": 2, "zero_quantized_weights": True}, "zero_quantized_weights"),
        ({**Z3, "zero_hpz_partition_size": 3}, "zero_hpz_partition_size"),
        ({**Z3, "zero_hpz_partition_size": 16}, "zero_hpz_partition_size"),
        ({**Z3, "dp_shard": 8}, "dp_shard"),  # DeepSpeed has no hybrid sharding: hpZ is its way
    ],
)
def test_zeropp_rules(layout: dict, field: str) -> None:
    problems = validate_layout(M, TR, GPUS, Layout(**layout))
    assert field in {p.field for p in problems}, problems
