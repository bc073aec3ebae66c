"""Rank order: the stride of every parallel dimension in the global rank numbering.

The order string lists dimensions from fastest- to slowest-varying (Megatron-Core's
`tp-cp-ep-dp-pp`: TP ranks are consecutive, PP ranks furthest apart). Ranks are numbered node-major
on the cluster (rank r sits on node r // gpus_per_node), so a small stride keeps a group inside a
node. Expert parallelism is carved out of the non-pipeline ranks: expert layers see them as
etp x ep x expert-dp, expert-TP fastest (Megatron-Core's `tp-ep-dp-pp` expert order).
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
    return _mesh_strides(layout.tp, layout.cp, layout.dp_, layout.pp, layout.ep, layout.etp_, layout.order)


@lru_cache(maxsize=1 << 14)
def _mesh_strides(tp: int, cp: int, dp: int, pp: int, ep: int, etp: int, order: str) -> MeshStrides:
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
    return MeshStrides(
        tp=strides["tp"],
        cp=strides["cp"],
        dp=strides["dp"],
        pp=strides["pp"],
        ep=global_stride(etp),
        dp_cp=strides[first],
        expert_dp=global_stride(etp * ep),
    )
