"""Expert parallelism: routed experts sharded over the `ep` mesh, tokens exchanged all-to-all.

Each MoE layer keeps its router and shared experts replicated; the routed expert tensors
(`GroupedExperts.w1/w2/w3`, expert index first) become DTensors sharded on dim 0 over `ep`, so EP
rank j holds experts [j*E/ep, (j+1)*E/ep). Forward (Megatron-Core / torchtitan "all-to-all token
dispatcher"):

1. route locally and sort the (token, expert) pairs by expert (as the reference MoE does);
2. exchange per-expert counts with `all_to_all_single` (Python ints are needed to size the
   splits and the expert GEMMs);
3. send the token copies to the ranks owning their experts with
   `_functional_collectives.all_to_all_single_autograd` (its backward is the reverse all-to-all);
4. regroup the received tokens by local expert, run the local experts, undo the regrouping;
5. send the outputs back, weight them by the router and sum per token.

Gradient scaling: the expert weights on a rank receive gradient from the tokens of every rank of
its EP group; the expert-data-parallel reduction (FSDP over `edp`) must therefore divide by all
dp x cp ranks, not by `edp` (`set_gradient_divide_factor`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.nn import Parameter

from runtime.model import GroupedExperts, MoE, NotSupportedError, _activation, _is_symbolic

__all__ = ["ExpertParallelMoE", "LocalGroupedExperts", "apply_expert_parallel", "expert_params"]

_EXPERT_TENSORS = ("w1", "w2", "w3", "b1", "b2", "b3")


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.to_local() if isinstance(t, DTensor) else t


class LocalGroupedExperts(GroupedExperts):
    """`GroupedExperts` whose tensors are DTensor shards: computes with the local experts only."""

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        w1, w2, w3 = _local(self.w1), _local(self.w2), _local(self.w3)
        b1, b2, b3 = _local(self.b1), _local(self.b2), _local(self.b3)
        assert w1 is not None and w2 is not None
        outs = []
        for e, xe in enumerate(torch.split(x, counts, dim=0)):
            a = _activation(self.kind, F.linear(xe, w1[e], b1[e] if b1 is not None else None))
            if w3 is not None:
                a = a * F.linear(xe, w3[e], b3[e] if b3 is not None else None)
            outs.append(F.linear(a, w2[e], b2[e] if b2 is not None else None))
        if not outs:
            return x.new_zeros(0, w2.shape[1])
        return torch.cat(outs, dim=0)


class ExpertParallelMoE(MoE):
    """`MoE` whose routed experts live on the ranks of an EP group (see module doc)."""

    ep_mesh: DeviceMesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.ep_mesh.get_group()
        ep = self.ep_mesh.size()
        e_local = self.num_experts // ep
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        idx, w = self.route(flat)
        flat_idx = idx.reshape(-1)
        order = torch.argsort(flat_idx, stable=True)
        token_of = order // self.top_k
        if _is_symbolic(flat_idx):
            # Fake/meta tensors (memory tracing): balanced routing, every rank alike.
            counts = self.tokens_per_expert(flat_idx)
            me = self.ep_mesh.get_local_rank()
            recv_by_src = [counts[me * e_local : (me + 1) * e_local]] * ep
        else:
            counts_t = torch.bincount(flat_idx, minlength=self.num_experts)
            recv_t = torch.empty_like(counts_t)
            dist.all_to_all_single(recv_t, counts_t, group=group)
            counts = counts_t.tolist()
            flat_recv = recv_t.tolist()
            recv_by_src = [flat_recv[s * e_local : (s + 1) * e_local] for s in range(ep)]  # [source][local expert]
        send_splits = [sum(counts[j * e_local : (j + 1) * e_local]) for j in range(ep)]
        recv_splits = [sum(row) for row in recv_by_src]

        sent = flat[token_of]
        received = all_to_all_single_autograd(sent, recv_splits, send_splits, group)
        # Received rows are grouped by source rank, then by local expert: regroup by expert.
        starts, offset = [], 0
        for row in recv_by_src:
            starts.append([])
            for n in row:
                starts[-1].append(offset)
                offset += n
        pieces = [
            torch.arange(starts[s][e], starts[s][e] + recv_by_src[s][e], device=flat.device)
            for e in range(e_local)
            for s in range(ep)
        ]
        perm = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long, device=flat.device)
        local_counts = [sum(recv_by_src[s][e] for s in range(ep)) for e in range(e_local)]
        out_local = self.experts(received[perm], local_counts)
        back = torch.empty_like(out_local).index_copy(0, perm, out_local)
        returned = all_to_all_single_autograd(back, send_splits, recv_splits, group)
        routed = returned * w.reshape(-1)[order].unsqueeze(-1).to(returned.dtype)
        out = torch.zeros_like(flat).index_add(0, token_of, routed)
        return self.add_shared(flat, out).view(shape)


def expert_params(model: torch.nn.Module) -> list[Parameter]:
    """The routed-expert parameters of `model` (those expert parallelism shards)."""
    out = []
    for m in model.modules():
        if isinstance(m, GroupedExperts):
            out += [p for n, p in m.named_parameters(recurse=False)]
    return out


def apply_expert_parallel(model: torch.nn.Module, ep_mesh: DeviceMesh) -> None:
    """Shard the routed experts of every MoE layer over `ep_mesh` (dim 0) and swap in the
    all-to-all forward."""
    ep = ep_mesh.size()
    for m in model.modules():
        if isinstance(m, MoE):
            if m.num_experts % ep:
                raise NotSupportedError(f"ep={ep} does not divide the {m.num_experts} experts")
            m.__class__ = ExpertParallelMoE
            m.ep_mesh = ep_mesh
            ex = m.experts
            ex.__class__ = LocalGroupedExperts
            for name in _EXPERT_TENSORS:
                p = getattr(ex, name)
                if p is not None:
                    dt = distribute_tensor(p.detach(), ep_mesh, [Shard(0)])
                    setattr(ex, name, Parameter(dt, requires_grad=p.requires_grad))
