"""Topology graph, bottleneck bus bandwidth of placed groups, strided fast path, latency."""

import math

import pytest

from cluster_specs.presets import cluster_from_dict, get_cluster
from cluster_specs.topology import (
    NCCL_BASE_LATENCY_S,
    build_topology_graph,
    collective_latency_s,
    group_link,
    slowness,
    strided_group_link,
)

H100 = get_cluster("dgx-h100")


def oversubscribed(ratio=2.0, nodes_per_leaf=2, rail_optimized=True):
    return cluster_from_dict(
        {
            "gpu": "h100",
            "gpus_per_node": 8,
            "intra_node": {"kind": "nvswitch", "bus_bandwidth": "368 GB/s", "latency": "1.9 us"},
            "inter_node": {
                "kind": "infiniband",
                "nics_per_node": 8,
                "nic_bandwidth": "400 Gb/s",
                "rail_optimized": rail_optimized,
                "oversubscription": ratio,
                "nodes_per_leaf": nodes_per_leaf,
                "latency": "4 us",
            },
        },
        name=f"oversub-{ratio}-{nodes_per_leaf}-{rail_optimized}",
    )


def test_graph_structure():
    g = build_topology_graph(H100, 64)  # 8 nodes, 1 scalable unit
    kinds = [d["kind"] for _, d in g.nodes(data=True)]
    assert kinds.count("gpu") == 64 and kinds.count("nvswitch") == 8 and kinds.count("nic") == 64
    assert kinds.count("leaf") == 8 and kinds.count("spine") == 1  # one leaf per rail
    assert g[("gpu", 9)][("switch", 1)]["bandwidth_bytes_per_s"] == pytest.approx(368e9)
    assert g[("gpu", 9)][("nic", 1, 1)]["bandwidth_bytes_per_s"] == pytest.approx(50e9)
    assert g.has_edge(("nic", 1, 1), ("leaf", 0, 1))
    assert all("latency_s" in d and "bandwidth_bytes_per_s" in d for *_, d in g.edges(data=True))
    flat = build_topology_graph(oversubscribed(rail_optimized=False), 64)
    assert sum(d["kind"] == "leaf" for _, d in flat.nodes(data=True)) == 4  # one per 2-node unit


def test_mesh_and_shared_nics_graph():
    g = build_topology_graph(get_cluster("mi300x-8"), 8)
    assert g.number_of_edges() >= 28 and g[("gpu", 0)][("gpu", 7)]["kind"] == "mesh"
    l40s = build_topology_graph(get_cluster("l40s-pcie-8"), 16)
    assert l40s.degree(("nic", 0, 0)) == 4 + 1  # 4 GPUs and its leaf


def test_tp8_inside_a_node_gets_intra_bandwidth():
    link = group_link(H100, range(8, 16))
    assert link.tier == "intra_domain" and link.bus_bandwidth_bytes_per_s == pytest.approx(368e9)
    assert link.latency_s == pytest.approx(1.9e-6)


def test_dp_one_gpu_per_node_gets_one_nic():
    link = group_link(H100, range(3, 8 * 16, 8))
    assert link.tier == "inter_node" and link.ranks_per_domain == 1 and link.domains == 16
    assert link.bus_bandwidth_bytes_per_s == pytest.approx(50e9)
    assert link.latency_s == pytest.approx(4e-6)


def test_16_gpus_on_2_nodes():
    link = group_link(H100, range(16))
    assert link.bus_bandwidth_bytes_per_s == pytest.approx(min(368e9, 8 * 50e9))
    a100 = group_link(get_cluster("dgx-a100-80g"), range(16))  # 8 x 25 GB/s < 235 GB/s
    assert a100.bus_bandwidth_bytes_per_s == pytest.approx(200e9)
    two_per_node = group_link(H100, [r for n in range(4) for r in (8 * n, 8 * n + 1)])
    assert two_per_node.bus_bandwidth_bytes_per_s == pytest.approx(100e9)


def test_nvl72_stays_in_nvlink():
    gb = get_cluster("gb200-nvl72")
    link = group_link(gb, range(72))
    assert link.tier == "intra_domain" and link.nodes == 18
    assert link.bus_bandwidth_bytes_per_s == pytest.approx(740e9)
    across = group_link(gb, range(0, 144, 72))  # one GPU in each of 2 racks
    assert across.tier == "inter_node" and across.bus_bandwidth_bytes_per_s == pytest.approx(50e9)


def test_spanning_leaves_with_oversubscription_halves():
    c = oversubscribed(2.0, nodes_per_leaf=2)
    inside = group_link(c, range(0, 16, 8))  # nodes 0 and 1: one unit
    across = group_link(c, range(0, 32, 8))  # nodes 0..3: two units
    assert inside.tier == "inter_node" and inside.bus_bandwidth_bytes_per_s == pytest.approx(50e9)
    assert across.tier == "inter_leaf" and across.bus_bandwidth_bytes_per_s == pytest.approx(25e9)
    flat = group_link(oversubscribed(2.0, nodes_per_leaf=2, rail_optimized=False), range(0, 32, 8))
    assert flat.bus_bandwidth_bytes_per_s == pytest.approx(25e9)
    nonblocking = group_link(H100, range(0, 8 * 64, 8))  # 64 nodes span 2 units of 32, ratio 1
    assert nonblocking.tier == "inter_leaf" and nonblocking.bus_bandwidth_bytes_per_s == pytest.approx(50e9)


def test_cross_rail_does_not_cross_spine():
    # ranks on different local GPUs (rails) of 2 nodes in one unit: PXN keeps it rail-aligned
    link = group_link(oversubscribed(2.0, nodes_per_leaf=2), [0, 9])
    assert link.tier == "inter_node" and link.bus_bandwidth_bytes_per_s == pytest.approx(50e9)


def test_mesh_subsets_and_pcie_nics():
    mi = get_cluster("mi300x-8")
    assert group_link(mi, range(8)).bus_bandwidth_bytes_per_s == pytest.approx(313e9)
    assert group_link(mi, [0, 1]).bus_bandwidth_bytes_per_s == pytest.approx(313e9 / 7)
    l40s = get_cluster("l40s-pcie-8")
    assert group_link(l40s, range(0, 32, 8)).bus_bandwidth_bytes_per_s == pytest.approx(25e9 / 4)
    assert group_link(l40s, range(16)).bus_bandwidth_bytes_per_s == pytest.approx(20e9)  # PCIe-bound


def test_single_rank_and_errors():
    assert group_link(H100, [5]).tier == "local"
    assert math.isinf(strided_group_link(H100, 1, 8).bus_bandwidth_bytes_per_s)
    cpu = get_cluster("local-cpu")
    assert group_link(cpu, range(64)).tier == "intra_domain"
    with pytest.raises(ValueError, match="no network"):
        build_topology_graph(cpu, 65)
    with pytest.raises(ValueError, match="no network"):
        strided_group_link(cpu, 2, 64)
    with pytest.raises(ValueError):
        group_link(build_topology_graph(H100, 8), [0, 8])


FAST_PATH = {  # preset -> job size for the comparison (several domains and, where cheap, leaf units)
    "dgx-h100": 256,
    "dgx-a100-40g": 320,  # 2 units of 20 nodes
    "gb200-nvl72": 512,  # 8 racks, one segment of 16 trays (64 GPUs) in each
    "gb200-whole": 288,  # racks filled whole: 4 NVLink domains of 72
    "mi300x-8": 128,
    "l40s-pcie-8": 256,  # 2 units of 16 nodes, non-rail-optimized
    "local-cpu": 64,
    "oversub": 128,  # 4 units of 4 nodes, ratio 2
}


def dimension_groups(world, size, stride):
    block = stride * size
    return [
        range(base + o, base + o + block, stride) for base in range(0, world, block) for o in range(stride)
    ]


@pytest.mark.parametrize("cluster", FAST_PATH)
def test_strided_fast_path_matches_graph(cluster):
    if cluster == "oversub":
        c = oversubscribed(2.0, nodes_per_leaf=4)
    elif cluster == "gb200-whole":
        c = get_cluster("gb200-nvl72").model_copy(update={"placement_segment_nodes": None})
    else:
        c = get_cluster(cluster)
    world = FAST_PATH[cluster]
    graph = build_topology_graph(c, world)
    checked = 0
    for size in (2, 3, 4, 8, 16, 24, 32, 64, 72):
        for stride in (1, 2, 3, 4, 8, 16, 32, 36, 64):
            if world % (size * stride):
                continue
            fast = strided_group_link(c, size, stride, world=world)
            slow = min(
                (group_link(graph, ranks) for ranks in dimension_groups(world, size, stride)),
                key=slowness,
            )
            got = (fast.tier, fast.ranks_per_domain, fast.domains, fast.nodes)
            assert got == (slow.tier, slow.ranks_per_domain, slow.domains, slow.nodes), (size, stride)
            assert fast.bus_bandwidth_bytes_per_s == pytest.approx(slow.bus_bandwidth_bytes_per_s), (
                size,
                stride,
            )
            assert fast.latency_s == pytest.approx(slow.latency_s)
            checked += 1
    assert checked >= 15


def test_strided_prices_the_worst_group():
    # a scheduler that fills racks whole (no segments): 72-GPU domains in rank order
    gb = get_cluster("gb200-nvl72").model_copy(update={"placement_segment_nodes": None})
    # TP=64 at stride 1: the group at rank 0 fits in rack 0, the one at 64 straddles racks 0 and 1
    assert group_link(gb, range(64)).tier == "intra_domain"
    worst = strided_group_link(gb, 64, 1, world=576)
    assert worst.tier == "inter_node" and worst.ranks_per_domain == 8
    assert worst.bus_bandwidth_bytes_per_s == pytest.approx(8 * 50e9)
    assert strided_group_link(gb, 64, 1) == worst  # world=None: one period of the layout
    # 12 nodes of a DGX H100 pod under one leaf: a 96-rank dimension never crosses the spine
    assert strided_group_link(H100, 12, 8, world=96).tier == "inter_node"
    with pytest.raises(ValueError, match="multiple"):
        strided_group_link(H100, 12, 8, world=100)


def test_segment_placement_keeps_groups_inside_racks():
    """GB200 NVL72 jobs larger than a rack are placed in Slurm segments of 16 trays (64 GPUs), one
    per rack: a 64-rank group or an 8-rank expert group at stride 4 never straddles two racks,
    where filling racks whole (72 GPUs in rank order) makes the group at rank 64 straddle."""
    gb = get_cluster("gb200-nvl72")
    assert gb.placement_segment_nodes == 16
    assert [gb.placement_domain(w) for w in (8, 72, 128, 576, None)] == [72, 72, 64, 64, 64]
    assert gb.placement_domain(96) == 48  # 24 trays: the largest segment up to 16 dividing them is 12
    whole = gb.model_copy(update={"placement_segment_nodes": None})
    for size, stride, world in ((64, 1, 576), (8, 4, 128), (32, 1, 128)):
        assert strided_group_link(gb, size, stride, world=world).tier == "intra_domain", (size, stride)
        assert strided_group_link(whole, size, stride, world=world).tier == "inter_node", (size, stride)
    # the graph places the job the same way
    graph = build_topology_graph(gb, 128)
    assert {graph.nodes[("gpu", r)]["domain"] for r in range(64, 128)} == {1}
    with pytest.raises(ValueError, match="exceeds the NVLink domain"):
        type(gb).model_validate({**gb.model_dump(), "placement_segment_nodes": 19})


def test_strided_is_cached():
    assert strided_group_link(H100, 8, 8) is strided_group_link(H100, 8, 8)


def test_latency_model():
    tp8 = strided_group_link(H100, 8, 1)
    # NCCL LL128 ring: 14 us + 14 steps x 1.9 us = 40.6 us (8xH200 measured 40 us at 32 KiB)
    assert collective_latency_s(tp8, "all_reduce") == pytest.approx(NCCL_BASE_LATENCY_S + 14 * 1.9e-6)
    assert collective_latency_s(tp8, "all_gather") == pytest.approx(NCCL_BASE_LATENCY_S + 7 * 1.9e-6)
    dp = strided_group_link(H100, 64, 8)  # 64 nodes
    ring = collective_latency_s(dp, "all_reduce", "ring")
    tree = collective_latency_s(dp, "all_reduce", "tree")
    assert ring == pytest.approx(NCCL_BASE_LATENCY_S + 126 * 4e-6)
    assert tree < ring / 3  # log2 vs linear in the number of nodes
    assert collective_latency_s(strided_group_link(H100, 2, 8), "send_recv") == pytest.approx(
        NCCL_BASE_LATENCY_S + 4e-6
    )
    assert collective_latency_s(strided_group_link(H100, 1, 1)) == 0.0
    with pytest.raises(ValueError, match="tree"):
        collective_latency_s(dp, "all_gather", "tree")
