"""How a ZeRO-3 release gathers parameters and reduces gradients: the granularity of its collectives.

The step-time model (`cost_models.step_time.data_parallel_times`) prices a layer's ZeRO-3 traffic
as one all-gather of the layer's weights per pass and one reduce-scatter of its gradients,
prefetched behind the previous layer's compute: what FSDP2, Megatron FSDP and today's DeepSpeed do
(DeepSpeed since v0.6.0: `AllGatherCoalescedHandle`, a sub-module's parameters gathered as one
flat buffer, reduce-scatters batched, CUDA events instead of device syncs; PR #1453, commit
4912e0ad, "batching allgather calls to amortize fixed overhead", "more fine grained
synchronization for communication that allows blocking on less work").

DeepSpeed's first ZeRO-3 releases did otherwise (`PER_PARAMETER`), read at tag v0.3.13
(2021-03-16, commit 12a53b43), `deepspeed/runtime/zero/`:

- one `torch.distributed.all_gather` per parameter tensor: `PartitionedParameterCoordinator.
  fetch_sub_module` hands a sub-module's parameters to `Init._all_gather(async_op=True)`, which
  calls `_allgather_param` once per parameter;
- each preceded by `torch.cuda.synchronize()` (`_allgather_param`), and each fetch ends with
  `_synchronize_communication` (the handles' waits, `comm_stream.synchronize()`, a device-wide
  `torch.cuda.synchronize()`): no gather runs beside compute. The prefetch issues the same calls,
  so it hides nothing either; DeepSpeed's own PR #1188 (commit c0eeb69d, first in v0.5.5,
  2021-11-02) says so: "the async version is not async at all, because each all_gather calls
  torch.cuda.synchronize() to guarantee previous communication op to be completed";
- one `torch.distributed.reduce_scatter` per trained parameter tensor
  (`Init._reduce_scatter_gradients`, reached from `reduce_ipg_grads` whenever the
  `reduce_bucket_size` bucket fills): the bucket batches the launches, not the collectives;
- each call hands PyTorch a list of world-size tensors: DeepSpeed builds it slice by slice
  (`flat_tensor.narrow(...)` for every rank in `_allgather_param` and `_reduce_scatter_gradient`),
  and PyTorch's NCCL process group of that time flattens it: `ProcessGroupNCCL::allgather` copies
  each of the world-size outputs out of its flat buffer after the collective (one `copy_` and one
  `recordStream` per rank), `reduce_scatter` copies each input in before it
  (pytorch/pytorch torch/lib/c10d/ProcessGroupNCCL.cpp, PyTorch 1.8; PR #1188 again: "the
  `torch.distributed.all_gather` will do implicit memcpy at the end of each `ncclAllgather`").
  So every collective costs the host two operations per rank of the group (`HOST_OPS_PER_RANK`),
  each priced as one kernel launch from the training loop (`Calibration.kernel_launch_s`), and the
  device waits for them (the next gather's synchronize);
- parameters under `stage3_param_persistence_threshold` elements (default 100 000) are never
  partitioned for the forward and backward (`persistent_parameters`): only larger tensors are
  gathered per sub-module; every trained tensor's gradient is reduce-scattered;
- under full recompute the checkpointed forward runs the sub-modules' forward hooks again, which
  fetch their parameters again. After a sub-module's forward its parameters are released unless
  their reuse distance, the elements of the sub-modules the trace uses before its next use
  (`PrefetchCoordinator.get_reuse_distance_in_numel`), is under `stage3_max_reuse_distance`
  (`MAX_REUSE_DISTANCE`). From the recompute to the backward, the sub-modules after a weight in
  the layer run twice (their recompute, then their backward in reverse order): a weight is kept for
  its backward when twice the elements of the layer's weights after it are under the limit (the
  layer's last weight always; GPT 174.6B's fc2 alone: its fc1 is 2 x 604M elements from its
  backward). So under full recompute a weight tensor is gathered in the forward and in the
  recompute, and again in the backward unless kept (`Tensors.kept`); without recompute, in the
  forward and the backward.

v0.5.5 (PR #1188) gathered a fetch's parameters back to back and synchronized once per sub-module
(`_allgather_params_coalesced`); v0.6.0 coalesced and overlapped them. Releases from v0.5.5 on are
priced with today's behaviour (no published row runs v0.5.5-v0.5.10).

NCCL's all-gather and reduce-scatter of that time have only the ring algorithm (src/graph/tuning.cc
of 2021, `ncclTopoTuneModel`: "if (coll != ncclFuncAllReduce && a != NCCL_ALGO_RING) continue"):
each per-parameter collective pays the ring's latency over every rank, one step per rank
(`cost_models.comm`'s alpha-beta model, `cluster_specs.topology.collective_latency_s`).

Which release a layout runs is its input (`Layout.framework_version`; None: today's release, what
a plan the user asks for runs).
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

from model_specs.params import count_params, layer_linears
from model_specs.spec import ModelSpec

GatherMode = Literal["module", "per_parameter"]

MODULE: GatherMode = "module"
PER_PARAMETER: GatherMode = "per_parameter"

DEEPSPEED_BATCHED_SINCE = (0, 5, 5)
"""The first DeepSpeed release without a device sync before every parameter's gather (PR #1188,
commit c0eeb69d, 2021-10-31; tag v0.5.5, 2021-11-02). Releases before it gather `PER_PARAMETER`."""

DEEPSPEED_FEATURES: dict[str, tuple[tuple[int, int, int], str]] = {
    "zero3": ((0, 3, 12), "ZeRO-3 (PR #834, commit 599258f9; v0.3.12, 2021-03-12)"),
    "nvme_offload": ((0, 3, 15), "NVMe offload, ZeRO-Infinity (PR #976, commit 0d4a54a0; v0.3.15, 2021-04-19)"),
    "zeropp": ((0, 10, 0), "ZeRO++ hpZ / qwZ / qgZ (PR #3784, commit d18aa2c7; v0.10.0, 2023-07-17)"),
}
"""The first DeepSpeed release with each ZeRO feature a layout can name, and where it came in (tags
and commits read in microsoft/DeepSpeed)."""


def deepspeed_has(feature: str, version: str | None) -> bool:
    """Whether DeepSpeed `version` (None: today's) has `feature` (`DEEPSPEED_FEATURES`)."""
    return version is None or parse_version(version) >= DEEPSPEED_FEATURES[feature][0]


PERSISTENCE_THRESHOLD = 100_000
"""Elements under which a parameter stays gathered (`stage3_param_persistence_threshold` default,
deepspeed/runtime/zero/constants.py at v0.3.13)."""

MAX_REUSE_DISTANCE = 1_000_000_000
"""Elements (`stage3_max_reuse_distance` default, deepspeed/runtime/zero/constants.py at v0.3.13):
a sub-module's parameters stay gathered after its forward when it is used again within this many
parameter elements of the trace (module doc)."""

HOST_OPS_PER_RANK = 2
"""Host operations per rank of the group in one per-parameter collective (module doc): DeepSpeed's
slice of the flat buffer and ProcessGroupNCCL's copy of it (out of an all-gather, into a
reduce-scatter)."""

GATHER_HBM_BYTES_PER_BYTE = 3.0
"""HBM bytes per gathered weight byte of a per-parameter gather besides NCCL's own traffic: the
`torch.zeros` of the gathered tensor `_allgather_param` allocates (a write), and ProcessGroupNCCL's
copy of the flat output into the world-size slices (a read and a write; module doc)."""

REDUCE_HBM_BYTES_PER_BYTE = 2.0
"""HBM bytes per reduced gradient byte of a per-parameter reduce-scatter: ProcessGroupNCCL's copy
of the world-size input slices into its flat input (a read and a write; module doc)."""

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?$")


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a release name such as "0.3.13" or "v0.5"; ValueError naming the
    text otherwise."""
    m = _VERSION.match(text.strip())
    if not m:
        raise ValueError(f"framework_version {text!r} is not a release number such as 0.3.13")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def gather_mode(framework: str, version: str | None) -> GatherMode:
    """How a ZeRO-3 release gathers (module doc): `PER_PARAMETER` for DeepSpeed before
    `DEEPSPEED_BATCHED_SINCE`, `MODULE` for every other release and framework (None: today's)."""
    if framework == "deepspeed" and version is not None and parse_version(version) < DEEPSPEED_BATCHED_SINCE:
        return PER_PARAMETER
    return MODULE


class Tensors(NamedTuple):
    """Parameter tensors of one layer (or of the model's ends) under per-parameter ZeRO-3, dense and
    routed-expert ones apart (they gather over different groups): those gathered for each pass (at
    least `PERSISTENCE_THRESHOLD` elements on the rank) and those whose gradient is reduce-scattered
    (every trained tensor)."""

    gathered: int
    reduced: int
    gathered_expert: int = 0
    reduced_expert: int = 0
    kept: int = 0  # dense gathered tensors still gathered from the recompute for their backward
    # (counted over the dense weights: an MoE layer's routed experts are never counted kept, and
    # left out of the reuse distances)


def _norm_tensors(model: ModelSpec) -> int:
    """Tensors of one norm: LayerNorm's weight and bias, RMSNorm's weight."""
    return 2 if model.norm == "layernorm" else 1


def layer_tensors(model: ModelSpec, index: int, tp: int = 1) -> Tensors:
    """Parameter tensors of layer `index` (module doc), its weights divided over `tp`. The weights
    are `model_specs.params.layer_linears` with the attention's q, k and v as one tensor (Megatron's
    `query_key_value`, the GPT module DeepSpeed's ZeRO-3 of that time was published with), a bias
    per biased linear, and the layer's norms."""
    linears = layer_linears(model, index)
    weights: list[int] = []  # in the order the forward runs them, q, k and v as one
    experts: list[int] = []
    qkv_at = -1
    for lin in linears:
        per = lin.in_features * lin.out_features // (1 if lin.split == "replicated" else tp)
        if lin.name in ("q_proj", "k_proj", "v_proj"):
            if qkv_at < 0:
                qkv_at = len(weights)
                weights.append(0)
            weights[qkv_at] += per
        else:
            (experts if lin.expert else weights).extend([per] * lin.count)
    mlp = ("gate_proj", "up_proj", "down_proj")
    biases = int(qkv_at >= 0 and model.qkv_bias) + int(model.attn_out_bias and any(lin.name == "o_proj" for lin in linears))
    expert_biases = 0
    if model.mlp_bias:
        biases += sum(lin.count for lin in linears if lin.name in mlp and not lin.expert)
        expert_biases = sum(lin.count for lin in linears if lin.name in mlp and lin.expert)
    norms = model.norms_per_layer * _norm_tensors(model)
    gathered = [w for w in weights if w >= PERSISTENCE_THRESHOLD]
    kept = sum(1 for i in range(len(gathered)) if 2 * sum(gathered[i + 1:]) < MAX_REUSE_DISTANCE)
    return Tensors(
        len(gathered), len(weights) + biases + norms,
        sum(1 for w in experts if w >= PERSISTENCE_THRESHOLD), len(experts) + expert_biases, kept,
    )


def edge_tensors(model: ModelSpec, tp: int = 1) -> Tensors:
    """Parameter tensors outside the layers: the token table (and a learned position table), an
    untied LM head, the final norm (module doc)."""
    pc = count_params(model)
    tables = [model.vocab_size * model.hidden_size // tp]
    if model.position_embedding == "learned":
        tables.append(model.max_position_embeddings * model.hidden_size)
    if pc.lm_head:
        tables.append(pc.lm_head // tp)
    gathered = sum(1 for n in tables if n >= PERSISTENCE_THRESHOLD)
    return Tensors(gathered, len(tables) + _norm_tensors(model))


def host_seconds(ranks: int, kernel_launch_s: float) -> float:
    """Host seconds one per-parameter collective over `ranks` ranks costs beside NCCL's own time
    (`HOST_OPS_PER_RANK` operations per rank, each a kernel launch from the loop; module doc)."""
    return HOST_OPS_PER_RANK * ranks * kernel_launch_s
