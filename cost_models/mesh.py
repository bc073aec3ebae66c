"""Rank order: the stride of every parallel dimension in the global rank numbering.

The order string lists dimensions from fastest- to slowest-varying (Megatron-Core's
`tp-cp-ep-dp-pp`: TP ranks are consecutive, PP ranks furthest apart). Ranks are numbered node-major
on the cluster (rank r sits on node r // gpus_per_node), so a small stride keeps a group inside a
node. Expert parallelism is carved out of the non-pipeline ranks: expert layers see them as
etp x ep x expert-dp, expert-TP fastest (Megatron-Core's `tp-ep-dp-pp` expert order: MoE parallel
folding, Megatron-Core 0.10's `expert_decoder_rank_generator` in parallel_state.py). Without folding
(`moe_parallel_folding=False`, Megatron-Core 0.9 and older) expert parallelism is the fastest-varying
part of the data-parallel dimension (0.9's RankGenerator splits `dp` into `ep` x `dp / ep`, ep next to
dp in the order) and expert TP is TP: an EP group strides over TP x CP (x PP when pp precedes dp).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np

Scalars = float | np.ndarray
"""A number, or an array of them (one per shard geometry priced together)."""

class MeshLike(Protocol):
    """What placement needs of a layout: degrees and rank order (a resolved `Layout`, or the
    planner's lighter `Mesh`)."""

    @property
    def tp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def dp_(self) -> int: ...
    @property
    def etp_(self) -> int: ...
    @property
    def sp_(self) -> bool: ...
    @property
    def micro_batch(self) -> int: ...
    @property
    def order(self) -> str: ...
    @property
    def moe_parallel_folding(self) -> bool: ...


@dataclass(frozen=True)
class MeshStrides:
    tp: int
    cp: int
    dp: int
    pp: int
    ep: int
    dp_cp: int  # stride of the combined data x context group (gradient reduction of dense weights)
    expert_dp: int  # stride of the expert-data-parallel group


def mesh_strides(layout: MeshLike) -> MeshStrides:
    """Rank stride of every group of `layout` (cached on its degrees and order)."""
    return _mesh_strides(
        layout.tp, layout.cp, layout.dp_, layout.pp, layout.ep, layout.etp_, layout.order, layout.moe_parallel_folding
    )


@lru_cache(maxsize=1 << 14)
def _mesh_strides(
    tp: int, cp: int, dp: int, pp: int, ep: int, etp: int, order: str, folded: bool = True
) -> MeshStrides:
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    dense_order = [d for d in order.split("-") if d != "ep"]
    strides: dict[str, int] = {}
    acc = 1
    for d in dense_order:
        strides[d] = acc
        acc *= sizes[d]
    # Expert layers re-split the non-pipeline ranks (tp x cp x dp of one stage) as etp x ep x edp,
    # in that order (Megatron-Core's expert rank order tp-ep-dp). Position q in that flattened
    # sub-grid maps to a global rank; `inner` non-pp ranks come before pp in the order.
    inner = 1
    for d in dense_order:
        if d == "pp":
            break
        inner *= sizes[d]

    def global_stride(q_stride: int) -> int:
        return q_stride if q_stride < inner else q_stride * (pp if inner < tp * cp * dp else 1)

    # dense data x context group: the (cp, dp) ranks, innermost of the two first
    first = "cp" if dense_order.index("cp") < dense_order.index("dp") else "dp"
    if sizes[first] == 1:
        first = "dp" if first == "cp" else "cp"
    if folded:
        ep_stride, expert_dp_stride = global_stride(etp), global_stride(etp * ep)
    else:
        # EP is dp's fastest part. The expert-data-parallel group is the CP ranks and the dp / ep
        # ranks past EP; its widest stride sets its channel (the CP ranks' own when dp = ep)
        ep_stride = strides["dp"]
        expert_dp_stride = strides["dp"] * ep if dp > ep else strides["cp"]
    return MeshStrides(
        tp=strides["tp"],
        cp=strides["cp"],
        dp=strides["dp"],
        pp=strides["pp"],
        ep=ep_stride,
        dp_cp=strides[first],
        expert_dp=expert_dp_stride,
    )
