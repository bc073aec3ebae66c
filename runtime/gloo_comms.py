"""FSDP2's gradient reduce-scatter on gloo, in place: an all-reduce of FSDP's own reduce-scatter
input, then this rank's chunk copied out. NCCL runs keep torch's reduce-scatter.

Why. gloo has no reduce-scatter: `ProcessGroupGloo::reduce_scatter_tensor_coalesced` (which
`_reduce_scatter_base` calls) clones the whole input, all-reduces the clone and copies this rank's
chunk of it into the output when the returned work is waited on (torch/csrc/distributed/c10d/
ProcessGroupGloo.cpp at pytorch/pytorch c194358a8ee425df52e5d940e34ba878d82d433c, read for this
module). So a CPU rank holds one more unsharded gradient of the unit being reduced, which neither
the fake process group (`runtime.fake_world`) nor the cost model's NCCL-priced buffers contain.
Worse, the inner all-reduce work also holds the clone, and the gloo worker thread that ran it drops
its reference (`workInProgress_[i].reset()` in `runLoop`) only after completing the work's future,
then waits for the GIL to free the tensor: whether the clone is gone before the caller goes on is a
race. Measured (tests/runtime/test_parallel_layouts.py's tied-embedding ZeRO-3 case, 4 gloo ranks,
rank 0, the live-storage tracker of `runtime.memory`): the 646 KiB clone of a layer's gradients,
freed by the worker thread after the next unit's all-gather had refilled its 646 KiB of unsharded
parameters, raised the step's peak by 146.3 KiB in 1 run of 5 (4 of 8 with a logging tracker,
which slows the caller) and not in the others: `python -m bench.gloo_memory_gap --runs 5`.

All-reducing FSDP's reduce-scatter input in place needs no clone (gloo's all-reduce works on the
caller's buffer), and FSDP keeps that buffer until its next reduce-scatter anyway, so a late
release by the worker thread frees nothing early or late. The reduction is the same sum; `AVG`
(FSDP2's default for fp32 / bf16 gradients) divides this rank's chunk by the group size after it,
as gloo's own emulation divides its chunk of the summed clone (gloo's all-reduce has no AVG).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

__all__ = ["InPlaceReduceScatter", "use_in_place_reduce_scatter"]


class InPlaceReduceScatter(ReduceScatter):
    """FSDP2 `ReduceScatter` comm: all-reduce (SUM) `input_tensor` in place, copy this rank's
    chunk to `output_tensor` and divide it by the group size for AVG (module doc)."""

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> dist.Work | None:
        if async_op or op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            # not issued by FSDP2 on a CPU mesh (it reduces synchronously with SUM or AVG, and
            # PREMUL_SUM only with a divide factor, where the runtime forces SUM on gloo)
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        dist.all_reduce(input_tensor, op=dist.ReduceOp.SUM, group=group)
        n = group.size()
        output_tensor.copy_(input_tensor.view(n, -1)[group.rank()].view_as(output_tensor))
        if op == dist.ReduceOp.AVG:
            output_tensor.div_(n)
        return None


def use_in_place_reduce_scatter(module: Any, mesh: Any) -> None:
    """Give FSDP2 `module` (what `fully_shard` returned: a module, or a list of modules sharing one
    FSDP state) sharded over `mesh` the in-place reduce-scatter when that mesh's sharding group
    (its last dimension) runs on gloo; NCCL and the fake process group keep torch's."""
    if mesh is None or mesh.size(mesh.ndim - 1) == 1:
        return
    if dist.get_backend(mesh.get_group(mesh.ndim - 1)) != "gloo":
        return
    first = module[0] if isinstance(module, list) else module
    first.set_custom_reduce_scatter(InPlaceReduceScatter())
