"""ZeRO-3 parameter offload (ZeRO-Infinity's CPU tier, FSDP CPUOffload) and the model-loading peak
of host memory (`Layout.zero_init`)."""

import pytest

from cluster_specs.presets import get_cluster
from cost_models.estimate import estimate
from cost_models.layout import Layout, validate_layout
from cost_models.memory import host_state_bytes
from model_specs.params import count_params
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec

M = get_model("llama3-8b")
H100 = get_cluster("dgx-h100")
TR = TrainingSpec(seq_len=4096, global_batch=16)
BASE = {"zero_stage": 3, "framework": "deepspeed", "offload_optimizer": True, "recompute": "full"}


def test_offloaded_weight_shard_leaves_the_gpu_for_the_host() -> None:
    on_gpu = estimate(M, TR, H100, 8, Layout(**BASE))
    off = estimate(M, TR, H100, 8, Layout(**BASE, offload_params=True))
    psi = count_params(M).total
    assert off.memory[0].parameters == 0.0
    assert on_gpu.memory[0].parameters == pytest.approx(2 * psi / 8)
    assert off.memory[0].host_optimizer == pytest.approx(host_state_bytes(psi, 3, 8, TR, True, True))
    # 2 + 12 bytes per parameter and the float32 gradient partition the host optimizer reads
    assert off.offloaded_bytes_per_node == pytest.approx(8 * 18 * psi / 8, rel=1e-6)
    # 2 GB per pass over the 50 GB/s host link hides behind 4k tokens of compute per micro-batch
    assert off.step_s >= on_gpu.step_s


def test_the_host_link_bounds_short_micro_batches() -> None:
    """Llama-3-70B over 8 A100s at 512 tokens per micro-batch: each pass copies the rank's 17.6 GB
    weight shard over a 12.5 GB/s host link (PCIe Gen3 x16; 1.4 s), longer than the pass computes
    (its FSDP2 copy-out of the gathered 141 GB included): the step grows by the copies the compute
    cannot hide."""
    m, a100 = get_model("llama3-70b"), get_cluster("dgx-a100-80g")
    a100 = a100.model_copy(update={"host_to_device_bytes_per_s": 12.5e9})
    tr = TrainingSpec(seq_len=512, global_batch=16)
    fsdp = {**BASE, "framework": "fsdp"}
    on_gpu = estimate(m, tr, a100, 8, Layout(**fsdp))
    off = estimate(m, tr, a100, 8, Layout(**fsdp, offload_params=True))
    copy_s = 2 * count_params(m).total / 8 / a100.host_to_device_bytes_per_s
    assert off.step_s > on_gpu.step_s
    assert off.step_s >= 2 * 2 * copy_s  # two micro-batches, a copy per forward and per backward


def test_loading_without_sharded_init_materializes_the_model_per_process() -> None:
    """Without zero_init every one of a node's 8 processes builds the whole model in float32
    (DeepSpeed's estimator: 4 x params x GPUs per node); with it, about a layer each."""
    psi = count_params(M).total
    unsharded = estimate(M, TR, H100, 8, Layout(**BASE, zero_init=False))
    sharded = estimate(M, TR, H100, 8, Layout(**BASE))
    assert unsharded.loading_bytes_per_node == pytest.approx(4 * psi * 8, rel=1e-9)
    assert sharded.loading_bytes_per_node < unsharded.loading_bytes_per_node / 20
    assert unsharded.host_bytes_per_node == unsharded.loading_bytes_per_node  # larger than the offloaded state
    small = H100.model_copy(update={"host_memory_bytes": 128 * 2**30})
    assert not estimate(M, TR, small, 8, Layout(**BASE, zero_init=False)).fits
    assert estimate(M, TR, small, 8, Layout(**BASE)).fits
    # DeepSpeed shards the init under ZeRO-3 only: ZeRO-2 loads the whole model in every process
    z2 = estimate(M, TR, H100, 8, Layout(**{**BASE, "zero_stage": 2}))
    assert z2.loading_bytes_per_node == unsharded.loading_bytes_per_node


@pytest.mark.parametrize(("layout", "needle"), [
    ({**BASE, "zero_stage": 2, "offload_params": True}, "needs zero_stage 3"),
    ({**BASE, "framework": "megatron", "offload_params": True}, "optimizer states only"),
    ({**BASE, "framework": "fsdp", "offload_optimizer": False, "offload_params": True}, "set offload_optimizer too"),
])
def test_parameter_offload_rules(layout: dict, needle: str) -> None:
    problems = validate_layout(M, TR, 8, Layout(**layout))
    assert any(v.field == "offload_params" and needle in v.message for v in problems), problems


def test_the_search_offers_parameter_offload_when_nothing_else_fits() -> None:
    """Full fine-tuning of Llama-3-70B on one 8 x A100-80GB node: ZeRO-3 with the optimizer
    offloaded fits; the search also prices the parameter tier."""
    from planner.plan import SearchConstraints
    from planner.search import search

    plan = search(get_model("llama3-70b"), TrainingSpec(seq_len=4096, global_batch=16), get_cluster("dgx-a100-80g"), 8,
                  SearchConstraints(framework="deepspeed", zero_stage=3, top_k=50), refine=False)
    assert plan.best is not None and plan.best.layout.offload_optimizer
    assert any(c.layout.offload_params for c in [plan.best, *plan.alternatives])


def test_fsdp_replicate_holds_a_compute_copy_of_every_block() -> None:
    """ZeRO-0 under FSDP2 is `replicate`: its unsharded bf16 copy of each block lives beside the
    stored weights all step (fake-world trace: 0.41 GiB per Llama-3-8B layer); DeepSpeed's ZeRO-0
    holds the weights once."""
    lay = {"zero_stage": 0, "recompute": "full"}
    fsdp = estimate(M, TR, H100, 8, Layout(**lay, framework="fsdp"))
    ds = estimate(M, TR, H100, 8, Layout(**lay, framework="deepspeed"))
    assert fsdp.memory[0].parameters == pytest.approx(2 * ds.memory[0].parameters)
