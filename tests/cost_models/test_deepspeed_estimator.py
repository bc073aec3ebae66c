"""Our model states beside DeepSpeed's memory estimators, for the seeds' example: a 2,851M-parameter
model (t5-3b, largest layer 32M parameters) on one node of 8 GPUs (the fine-tuning guide quotes
`estimate_zero2_model_states_mem_needs_all_live` and `estimate_zero3_model_states_mem_needs_all_live`
with their default `additional_buffer_factor` 1.5; "GB" there is GiB).

Every difference has a named cause (`EXPLAINED`):
- buffer factor: DeepSpeed multiplies every CPU figure by 1.5; we count bytes;
- fp32 gradient partition: DeepSpeed's optimizer reads a float32 gradient partition: ZeRO-2 keeps it
  beside the 16-bit gradients (+4 bytes per parameter / N), ZeRO-3 holds the partition in float32
  instead of 16 bits (+2 / N); offloaded, it lives on the host, where we count it too
  (`memory.HOST_GRAD_BYTES`: 4 psi per node);
- full fp16 gradients: the ZeRO-2 estimator counts an unpartitioned 16-bit gradient (2 psi) where we
  count its reduce-scattered partition (2 psi / N);
- offloaded gradients: with the optimizer offloaded DeepSpeed moves the gradient partitions to the
  host, where we keep them on the GPU (2 psi / N more on the GPU, as much less on the host);
- gathered layers: ZeRO-3 holds 4 bytes x the largest layer in DeepSpeed's estimate, two gathered
  16-bit layers and one layer's 16-bit gradient in ours (6 bytes x the largest layer).
"""

import pytest

from cost_models.memory import host_state_bytes, loading_bytes_per_node, model_state_bytes
from model_specs.spec import TrainingSpec

GIB = 2**30
PSI, LARGEST, N = 2_851_598_336, 32_899_072, 8  # t5-3b: parameters, its shared 32128 x 1024 embedding
TRAINING = TrainingSpec(seq_len=512, global_batch=8)

# (stage, offload_param, offload_optimizer, zero_init): (DeepSpeed per CPU, per GPU), GiB, as printed
DEEPSPEED = {
    (2, False, True, False): (127.48, 5.31),
    (2, False, False, False): (127.48, 15.93),
    (3, True, True, True): (71.71, 0.12),
    (3, True, True, False): (127.48, 0.12),
    (3, False, True, True): (63.74, 0.79),
    (3, False, True, False): (127.48, 0.79),
    (3, False, False, True): (1.47, 6.10),
    (3, False, False, False): (127.48, 6.10),
}


def ours(stage: int, offload_param: bool, offload_opt: bool, zero_init: bool) -> tuple[float, float]:
    """(host bytes per node, GPU bytes per rank) of model states by our formulas: ZeRO states
    (`model_state_bytes`), ZeRO-3's gathered layers (two 16-bit layers and one layer's gradient, as
    `stage_table.price_memory` prices FSDP), and the node's host peak: the larger of the offloaded
    states of its 8 ranks and the model-loading peak (`loading_bytes_per_node`; DeepSpeed has
    sharded init under ZeRO-3 only)."""
    gpu = sum(model_state_bytes(PSI, stage, N, TRAINING, offload_opt, offload_param).values())
    if stage == 3:
        gpu += (2 * TRAINING.param_bytes + TRAINING.grad_bytes) * LARGEST
    host = N * host_state_bytes(PSI, stage, N, TRAINING, offload_opt, offload_param)
    loading = loading_bytes_per_node(PSI, LARGEST, zero_init and stage == 3, N)
    return max(host, loading), gpu


def deepspeed_formula(stage: int, offload_param: bool, offload_opt: bool, zero_init: bool) -> tuple[float, float]:
    """DeepSpeed's estimators as their source writes them (deepspeed.runtime.zero.stage_1_and_2 and
    stage3), buffer factor 1.5, one node: (CPU bytes, GPU bytes)."""
    f = 1.5
    if stage == 2:
        if offload_opt:
            return PSI * max(4 * N, 16) * f, 2 * PSI
        return PSI * 4 * N * f, 4 * PSI + 16 * PSI / N
    layer = 4 * LARGEST
    if offload_opt and offload_param:
        return PSI * (18 if zero_init else max(4 * N, 18)) * f, layer
    if offload_opt:
        return PSI * (16 if zero_init else max(4 * N, 16)) * f, layer + 2 * PSI / N
    return (LARGEST if zero_init else PSI) * 4 * N * f, layer + 18 * PSI / N


@pytest.mark.parametrize("option", sorted(DEEPSPEED))
def test_the_formulas_reproduce_deepspeeds_printed_table(option: tuple) -> None:
    cpu, gpu = deepspeed_formula(*option)
    assert (round(cpu / GIB, 2), round(gpu / GIB, 2)) == pytest.approx(DEEPSPEED[option], abs=0.011)


@pytest.mark.parametrize("option", sorted(DEEPSPEED))
def test_every_difference_is_explained(option: tuple) -> None:
    """Ours, corrected by the named differences, equals DeepSpeed's estimate exactly."""
    stage, offload_param, offload_opt, zero_init = option
    cpu, gpu = ours(*option)
    ds_cpu, ds_gpu = deepspeed_formula(*option)
    fp32_grad = 4 * PSI / N  # DeepSpeed's float32 gradient partition
    if stage == 2:
        gpu += 2 * PSI - 2 * PSI / N  # full fp16 gradients in DeepSpeed's ZeRO-2 estimate
    else:
        gpu += 4 * LARGEST - 6 * LARGEST  # gathered-layer buffers
    if offload_opt:
        gpu -= 2 * PSI / N  # gradient partition offloaded with the optimizer
        if stage == 2:
            gpu -= 2 * PSI - 2 * PSI / N  # DeepSpeed's offloaded ZeRO-2 estimate has no GPU gradient at all
    else:
        gpu += fp32_grad if stage == 2 else fp32_grad - 2 * PSI / N
    assert cpu * 1.5 == pytest.approx(ds_cpu, rel=1e-9)
    assert gpu == pytest.approx(ds_gpu, rel=1e-9)


def test_our_table() -> None:
    """The figures we print for the seeds' example (GiB), for the closing note and docs."""
    table = {opt: tuple(round(x / GIB, 2) for x in ours(*opt)) for opt in DEEPSPEED}
    assert table[(3, False, False, True)] == (0.98, 5.5)  # DeepSpeed: 1.47 CPU, 6.10 GPU
    assert table[(3, True, True, True)] == (47.8, 0.85)  # 71.71, 0.12
    assert table[(3, False, True, True)] == (42.49, 1.51)  # 63.74, 0.79
    assert table[(2, False, True, False)] == (84.98, 5.98)  # 127.48, 5.31
    assert table[(2, False, False, False)] == (84.98, 9.96)  # 127.48, 15.93
