"""Placement: which physical GPUs form each parallel group, and the bandwidth each group gets.

Ranks are numbered node-major (rank r is GPU r % gpus_per_node of node r // gpus_per_node) and the
layout's rank order gives every dimension a stride (`cost_models.mesh`). A group is then the ranks
`start + stride * i`; its bottleneck bus bandwidth and latency come from the topology
(`cluster_specs.topology.strided_group_link`, which agrees with the networkx graph).
"""

from __future__ import annotations

from cluster_specs.spec import ClusterSpec
from cluster_specs.topology import strided_group_link
from cost_models.layout import Layout
from cost_models.mesh import mesh_strides
from planner.plan import PlacedGroup, Placement


def place(cluster: ClusterSpec, gpus: int, layout: Layout) -> Placement:
    """Groups of a resolved layout, each with the ranks of the group that contains rank 0."""
    st = mesh_strides(layout)
    dims: list[tuple[str, int, int]] = [
        ("tp", layout.tp, st.tp),
        ("cp", layout.cp, st.cp),
        ("ep", layout.ep, st.ep),
        ("dp", layout.dp_, st.dp),
        ("pp", layout.pp, st.pp),
    ]
    if layout.dp_shard_ < layout.dp_:
        dims.append(("dp_shard", layout.dp_shard_ * layout.cp, st.dp_cp))
    if layout.ep > 1:
        dims.append(("expert_dp", layout.expert_dp, st.expert_dp))
    groups = []
    for name, size, stride in dims:
        if size <= 1:
            continue
        link = strided_group_link(cluster, size, stride)
        groups.append(
            PlacedGroup(
                dim=name,
                size=size,
                stride=stride,
                first_group_ranks=[stride * i for i in range(min(size, 64))],
                tier=link.tier,
                bus_bandwidth_bytes_per_s=link.bus_bandwidth_bytes_per_s,
                latency_s=link.latency_s,
            )
        )
    return Placement(
        order=layout.order,
        nodes=-(-gpus // cluster.gpus_per_node),
        gpus_per_node=cluster.gpus_per_node,
        groups=groups,
    )
