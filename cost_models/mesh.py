"""Rank order: the stride of every parallel dimension in the global rank numbering.

The order string lists dimensions from fastest- to slowest-varying (Megatron-Core's
`tp-cp-ep-dp-pp`: TP ranks are consecutive, PP ranks furthest apart). Ranks are numbered node-major
on the cluster (rank r sits on node r // gpus_per_node), so a small stride keeps a group inside a
node. Expert parallelism is carved out of dp x cp: an EP group is `ep` consecutive ranks of the
flattened (cp, dp) sub-grid, in the order those two appear.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.layout import Layout


@dataclass(frozen=True)
class MeshStrides:
    tp: int
    cp: int
    dp: int
    pp: int
    ep: int
    dp_cp: int  # stride of the combined data x context group (gradient reduction of dense weights)
    expert_dp: int  # stride of the expert-data-parallel group


def mesh_strides(layout: Layout) -> MeshStrides:
    sizes = {"tp": layout.tp, "cp": layout.cp, "dp": layout.dp_, "pp": layout.pp}
    dense_order = [d for d in layout.order.split("-") if d != "ep"]
    strides: dict[str, int] = {}
    acc = 1
    for d in dense_order:
        strides[d] = acc
        acc *= sizes[d]
    # The (cp, dp) sub-grid is contiguous when cp and dp are adjacent in the order; its innermost
    # stride is that of whichever of the two comes first.
    inner = "cp" if dense_order.index("cp") < dense_order.index("dp") else "dp"
    if sizes[inner] == 1:
        inner = "dp" if inner == "cp" else "cp"
    sub_stride = strides[inner]
    return MeshStrides(
        tp=strides["tp"],
        cp=strides["cp"],
        dp=strides["dp"],
        pp=strides["pp"],
        ep=sub_stride,
        dp_cp=sub_stride,
        expert_dp=sub_stride * layout.ep,
    )
