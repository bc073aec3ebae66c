"""Collective costs over the topology (cost_models.comm): NCCL bus-bandwidth volumes, channels,
p2p at a GPU's own NIC share, all-to-all across NVLink domains."""

from __future__ import annotations

import pytest

from cluster_specs.presets import get_cluster
from cost_models.calibration import Calibration
from cost_models.comm import INTER, INTRA, Group, collective_cost, collective_time

CAL = Calibration()


def test_ring_volumes_follow_the_nccl_convention() -> None:
    cl = get_cluster("dgx-h100")
    g = Group.strided(cl, 8, 1, 64)  # one node
    assert g.channel == INTRA
    ag, _ = collective_cost("all_gather", g, CAL)
    ar, _ = collective_cost("all_reduce", g, CAL)
    assert ar == pytest.approx(2 * ag)
    assert ag == pytest.approx(7 / 8 / (g.link.bus_bandwidth_bytes_per_s * CAL.intra_bus_efficiency))


def test_groups_leaving_the_domain_use_the_nics() -> None:
    cl = get_cluster("dgx-h100")
    across = Group.strided(cl, 8, 8, 64)  # one GPU per node
    assert across.channel == INTER
    inside = Group.strided(cl, 8, 1, 64)
    assert collective_time("all_gather", 1e9, across, CAL) > 5 * collective_time("all_gather", 1e9, inside, CAL)


def test_p2p_across_nodes_gets_one_gpus_nic_share_not_the_nodes() -> None:
    cl = get_cluster("dgx-h100")
    g = Group.strided(cl, 2, 8, 64)  # pipeline neighbours on two nodes
    per_byte, _ = collective_cost("p2p", g, CAL)
    nic_share = cl.nic_bandwidth_per_gpu_bytes_per_s
    assert 1 / per_byte <= nic_share * CAL.inter_bus_efficiency * 1.0001


def test_all_to_all_leaving_the_domain_is_bound_by_the_nic_share() -> None:
    cl = get_cluster("dgx-h100")
    inside = Group.strided(cl, 8, 1, 64)
    spanning = Group.strided(cl, 16, 1, 64)  # two nodes, 8 ranks each
    t_in = collective_time("all_to_all", 1e9, inside, CAL)
    t_out = collective_time("all_to_all", 1e9, spanning, CAL)
    # half of what each rank sends leaves the node through the rank's own NIC share
    k = spanning.link.ranks_per_domain
    assert k == 8
    share = cl.nic_bandwidth_per_gpu_bytes_per_s * CAL.inter_bus_efficiency
    assert t_out == pytest.approx(0.5 * 1e9 / share + collective_cost("all_to_all", spanning, CAL)[1], rel=1e-9)
    assert t_out > 3 * t_in


def test_all_to_all_nic_share_is_not_the_ring_bandwidth_split_over_the_domain() -> None:
    """H800: NVLink caps a ring crossing 8 ranks at 160 GB/s (20 GB/s a rank), but each rank's own
    NIC carries 50 GB/s of what it sends off the node (DeepEP measures 43-58 GB/s of RDMA per H800
    GPU). Before the fix the all-to-all ran at the ring's 20 GB/s: 2.1x too slow."""
    cl = get_cluster("dgx-h800")
    ep64 = Group.strided(cl, 64, 1, 2048)
    assert ep64.link.bus_bandwidth_bytes_per_s / ep64.link.ranks_per_domain < cl.nic_bandwidth_per_gpu_bytes_per_s / 2
    assert ep64.link.nic_share_bytes_per_s == pytest.approx(cl.nic_bandwidth_per_gpu_bytes_per_s)
    per_byte, _ = collective_cost("all_to_all", ep64, CAL)
    assert per_byte == pytest.approx((64 - 8) / 64 / (cl.nic_bandwidth_per_gpu_bytes_per_s * CAL.inter_bus_efficiency))
    p2p, _ = collective_cost("p2p", Group.strided(cl, 2, 8, 16), CAL)
    assert p2p == pytest.approx(1 / (cl.nic_bandwidth_per_gpu_bytes_per_s * CAL.inter_bus_efficiency))


def test_remote_domains_per_token_with_and_without_group_limited_routing() -> None:
    from cost_models.comm import remote_domains_per_token

    # DeepSeek-V3: 8 groups = 8 nodes, a token reaches 4 groups: 3.5 remote nodes on average
    assert remote_domains_per_token(256, 8, 8, groups=8, group_topk=4) == pytest.approx(4 * 7 / 8)
    # without the limit its 8 experts land on ~4.6 of the other 7 nodes: 7 x (1 - C(224, 8) / C(256, 8))
    free = remote_domains_per_token(256, 8, 8)
    assert 4.55 < free < 4.7
    assert remote_domains_per_token(256, 8, 1) == 0.0


def test_deduplicating_dispatch_sends_fewer_bytes_across_nodes() -> None:
    from cost_models.comm import dedup_dispatch_time, remote_domains_per_token

    cl = get_cluster("dgx-h800")
    g = Group.strided(cl, 64, 1, 2048)  # EP64 over 8 nodes
    copy = 4096 * 7168 * 2.0  # one bf16 copy of 4096 tokens
    plain = collective_time("all_to_all", 8 * copy, g, CAL)
    dedup = dedup_dispatch_time(copy, 8, remote_domains_per_token(256, 8, g.link.domains, 8, 4), g, CAL)
    assert dedup < 0.55 * plain  # 3.5 node crossings instead of 7 copies
    inside = Group.strided(cl, 8, 1, 2048)
    assert dedup_dispatch_time(copy, 8, 0.0, inside, CAL) == pytest.approx(collective_time("all_to_all", 8 * copy, inside, CAL))
