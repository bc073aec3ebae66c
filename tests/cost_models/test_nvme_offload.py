"""ZeRO-Infinity's NVMe tier and the CPU optimizer step: where offloaded states live (host RAM,
or the node's NVMe behind pinned staging buffers), what each tier costs per step (host link, CPU
Adam bounded by DRAM bandwidth and cores, NVMe read/write bandwidth), and the capacity checks."""

from __future__ import annotations

import pytest

from cluster_specs.presets import cluster_from_dict, get_cluster
from cost_models.estimate import estimate
from cost_models.layout import Layout, validate_layout
from cost_models.memory import (
    HOST_GRAD_BYTES,
    NVME_OPTIMIZER_BUFFER_COUNT,
    NVME_PARAM_BUFFER_COUNT,
    NVME_PARAM_BUFFER_ELEMENTS,
    NVME_SUB_GROUP_ELEMENTS,
)
from cost_models.step_time import CPU_ADAM_PARAMS_PER_CORE_S, host_adam_seconds_per_param
from model_specs.params import count_params
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.plan import SearchConstraints
from planner.search import HOST_MEMORY_REASON, NVME_REASON, search

M70 = get_model("llama3-70b")
A100 = get_cluster("dgx-a100-80g")
TR = TrainingSpec(seq_len=4096, global_batch=16)
INFINITY = {"zero_stage": 3, "framework": "deepspeed", "recompute": "full", "offload_optimizer": True, "offload_params": True}


def test_nvme_holds_the_states_and_host_ram_only_the_staging_buffers() -> None:
    psi = count_params(M70).total
    cpu = estimate(M70, TR, A100, 8, Layout(**INFINITY))
    nvme = estimate(M70, TR, A100, 8, Layout(**INFINITY, offload_device="nvme"))
    # per rank: 16-bit weight shard + 12 bytes of Adam state + the float32 gradient partition
    per_param = TR.param_bytes + TR.optimizer_bytes + HOST_GRAD_BYTES
    assert cpu.offloaded_bytes_per_node == pytest.approx(per_param * psi, rel=1e-6)
    assert nvme.nvme_bytes_per_node == pytest.approx(per_param * psi, rel=1e-6)
    pinned = NVME_PARAM_BUFFER_COUNT * NVME_PARAM_BUFFER_ELEMENTS * TR.param_bytes + NVME_OPTIMIZER_BUFFER_COUNT * NVME_SUB_GROUP_ELEMENTS * 4
    assert nvme.offloaded_bytes_per_node == pytest.approx(8 * pinned, rel=1e-6)
    assert nvme.peak_bytes == cpu.peak_bytes  # the GPU side is the same
    assert nvme.nvme_fits and nvme.fits
    # the drives are slower than DRAM: the step pays for it
    assert nvme.step_s > cpu.step_s
    assert nvme.time.optimizer > cpu.time.optimizer


def test_nvme_capacity_is_checked() -> None:
    small = cluster_from_dict({"preset": "dgx-a100-80g", "nvme": "1 TB"})
    est = estimate(M70, TR, small, 8, Layout(**INFINITY, offload_device="nvme"))
    assert est.nvme_bytes_per_node > small.nvme_bytes
    assert not est.nvme_fits and not est.fits
    none = cluster_from_dict({"preset": "dgx-a100-80g", "nvme": "0 B", "nvme_read": "0 B/s", "nvme_write": "0 B/s"})
    assert not estimate(M70, TR, none, 8, Layout(**INFINITY, offload_device="nvme")).fits


def test_cpu_adam_is_bounded_by_dram_and_by_cores() -> None:
    few = A100.model_copy(update={"cpu_cores": 8})
    wide = A100.model_copy(update={"cpu_cores": 4096})  # more cores than DRAM can feed
    # the DGX A100's 128 cores are the limit at 15e6 parameters/s each
    assert host_adam_seconds_per_param(A100, TR) == pytest.approx(1 / (128 * CPU_ADAM_PARAMS_PER_CORE_S))
    assert host_adam_seconds_per_param(few, TR) == pytest.approx(1 / (8 * CPU_ADAM_PARAMS_PER_CORE_S))
    # DRAM-bound: 30 bytes per parameter (AdamW, bf16) at 70% of the node's 409.6 GB/s
    assert host_adam_seconds_per_param(wide, TR) == pytest.approx(30 / (0.7 * 409.6e9))
    many = A100
    lay = Layout(**{**INFINITY, "offload_params": False})
    assert estimate(M70, TR, few, 8, lay).time.optimizer > 3 * estimate(M70, TR, many, 8, lay).time.optimizer


@pytest.mark.parametrize(
    ("layout", "field"),
    [
        ({"zero_stage": 2, "framework": "deepspeed", "offload_optimizer": True, "offload_device": "nvme"}, "offload_device"),
        ({"zero_stage": 3, "framework": "fsdp", "offload_optimizer": True, "offload_params": True, "offload_device": "nvme"}, "offload_device"),
        ({"zero_stage": 3, "framework": "deepspeed", "offload_device": "nvme"}, "offload_device"),
    ],
)
def test_nvme_rules(layout: dict, field: str) -> None:
    assert field in {p.field for p in validate_layout(M70, TR, 8, Layout(**layout))}


def test_the_search_reaches_for_nvme_when_host_ram_is_short() -> None:
    """Llama-3-70B full fine-tune on one DGX A100 whose nodes have 256 GiB of host RAM: every CPU
    offload needs over a terabyte per node, so DeepSpeed's best plan puts the states on NVMe."""
    small_host = cluster_from_dict({"preset": "dgx-a100-80g", "host_memory": "256 GiB"})
    plan = search(M70, TR, small_host, 8, SearchConstraints(framework="deepspeed"))
    assert plan.best is not None
    lay = plan.best.layout
    assert lay.offload_device == "nvme" and lay.offload_optimizer
    assert plan.best.estimate["host_memory"]["bytes_per_node"] <= small_host.host_memory_bytes
    assert plan.best.estimate["nvme"]["bytes_per_node"] > small_host.host_memory_bytes
    # and with too little NVMe, the same job is refused with the NVMe bytes in the reason
    tiny = cluster_from_dict({"preset": "dgx-a100-80g", "host_memory": "256 GiB", "nvme": "500 GB"})
    refused = search(M70, TR, tiny, 8, SearchConstraints(framework="deepspeed"))
    assert refused.best is None
    assert any(r.reason == NVME_REASON and "GiB of NVMe per node" in r.example for r in refused.rejections)
    # each node resource is blamed for its own refusals only: host RAM's examples are over host RAM
    host = [r for r in refused.rejections if r.reason == HOST_MEMORY_REASON]
    assert host and all("GiB of host RAM" in r.example and ", -" not in r.example for r in host)
