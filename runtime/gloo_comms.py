"""FSDP2's collectives on gloo without gloo's own copies: the gradient reduce-scatter as an all-reduce
of FSDP's own reduce-scatter input with this rank's chunk copied out, the parameter all-gather as
sends and receives straight into FSDP's all-gather output. NCCL runs keep torch's collectives.

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

gloo's all-gather (`_allgather_base` -> `AsyncAllgatherWork`, same file) gathers into a flat
tensor of the whole output, allocated on the worker thread (out of the live-storage tracker's
sight: host memory only), then copies it into the caller's output, whose chunks the work holds
until the worker thread drops it as above. FSDP2 frees its all-gather output after the copy-out
by dropping it, so the same race decides whether a unit's gathered buffer outlives the next
unit's: the 1F1B ZeRO-3 full-recompute case (pp2_dp2_1f1b_zero3_full) on stage 0 held real -
fake +16.5 / +329.8 / +16.5 KiB over 3 jobs with the reduce-scatter fixed, the 737 KiB gathered
layer freed by the worker thread after the next one was allocated. Point-to-point sends and
receives are no worker's work: gloo returns their work objects to the caller alone
(`ProcessGroupGloo::send` / `recv`), so FSDP's buffer is freed when FSDP lets it go.

On the host this is memory too: the 0.55 B one-layer job of `bench.runtime_startup` (Llama-3's
128k vocabulary, 2 ranks, 3 steps) peaked at 8.44 GiB RSS per rank, 7.92 allocated, against the
plan's 7.00; with these comms 7.26 RSS and 6.94 allocated, the fake-world trace's figure.

All-reducing FSDP's reduce-scatter input in place needs no clone (gloo's all-reduce works on the
caller's buffer). That buffer is FSDP's own and lives past the reduce-scatter; the worker thread
may still release it late (seen for the last unit's, at the end of the backward, below the
step's peak in every case measured). The reduction is the same sum; for `AVG` (FSDP2's default
for fp32 / bf16 gradients; gloo's all-reduce has none) this rank's chunk is divided by the group
size after it (tests/runtime/test_gloo_comms.py checks both against torch's collectives).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

__all__ = ["InPlaceReduceScatter", "PointToPointAllGather", "use_in_place_collectives"]


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


class PointToPointAllGather(AllGather):
    """FSDP2 `AllGather` comm: this rank's shard sent to every other rank of the group and theirs
    received into their chunks of `output_tensor` (module doc); the same bytes as gloo's ring."""

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        if async_op:  # FSDP2 then waits on the returned work later: torch's all-gather
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=True)
        n, rank = group.size(), group.rank()
        chunks = output_tensor.view(n, -1)
        shard = input_tensor.reshape(-1)
        if shard.data_ptr() != chunks[rank].data_ptr():  # FSDP2 copies its input into place already
            chunks[rank].copy_(shard)
        works = []
        for step in range(1, n):
            works.append(dist.isend(chunks[rank], group=group, group_dst=(rank + step) % n))
            works.append(dist.irecv(chunks[(rank - step) % n], group=group, group_src=(rank - step) % n))
        for w in works:
            if w is not None:
                w.wait()
        return None


def use_in_place_collectives(module: Any, mesh: Any) -> None:
    """Give FSDP2 `module` (what `fully_shard` returned: a module, or a list of modules sharing one
    FSDP state) sharded over `mesh` the collectives above when that mesh's sharding group (its
    last dimension) runs on gloo; NCCL and the fake process group keep torch's."""
    if mesh is None or mesh.size(mesh.ndim - 1) == 1:
        return
    if dist.get_backend(mesh.get_group(mesh.ndim - 1)) != "gloo":
        return
    first = module[0] if isinstance(module, list) else module
    first.set_custom_reduce_scatter(InPlaceReduceScatter())
    first.set_custom_all_gather(PointToPointAllGather())
