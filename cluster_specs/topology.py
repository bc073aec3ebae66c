"""Where a group of ranks sits on the cluster, and the bus bandwidth a collective over it gets.

Ranks are numbered node-major: rank r is GPU r % G of node r // G and lies in NVLink domain r // D
(G = `gpus_per_node`, D = the job's placement domain, `ClusterSpec.placement_domain`: the domain
size, or the scheduler's segment when the job spans domains; GB200 NVL72: G = 4, D = 72 for a job
of one rack, 64 (segments of 16 trays) for a larger one). Bandwidths are bytes/s in
one direction, in the NCCL bus-bandwidth convention (nccl-tests doc/PERFORMANCE.md): an all-reduce
of S bytes over n ranks takes 2(n-1)/n * S / B, an all-gather (n-1)/n * S / B.

Bandwidth model, with every group of the same mesh dimension running at the same time:

1. ``intra_domain``: the group is inside one NVLink domain (or PCIe / shared-memory node). Switched
   fabrics give any subset the domain's achievable bus bandwidth (`intra_node.bus_bandwidth_...`).
   A full mesh (`xgmi_mesh`, `nvlink_mesh`) gives a k-GPU subset only k-1 of each GPU's D-1 links:
   B * (k-1) / (D-1). MI300X: 47.7 GB/s measured at k = 2 against 313 / 7 = 44.7 modelled (ML
   Engineering, network/README.md, "Peer-to-peer bandwidth").
2. ``inter_node``: the group spans domains. NCCL's rings leave a node once per channel, one NIC per
   channel, so k ranks of the group in a domain drive k NICs' worth. The concurrent groups own the
   other GPUs, so each GPU gets its share of its node's NICs, nics * nic_bandwidth / G
   (`ClusterSpec.nic_bandwidth_per_gpu_bytes_per_s`: one NIC on a DGX). The bus bandwidth is the
   minimum over domains of k * share, capped by the intra-domain bandwidth of those k ranks (a
   ring crosses them at the same rate). DP over one GPU per node: one NIC; 16 ranks on 2 DGX
   nodes: min(intra, 8 NICs).
3. ``inter_leaf``: the group's nodes hang under different leaf switches; the bandwidth is divided
   by the leaf-to-spine oversubscription. This is the bisection bound, right for all-to-all and for
   many concurrent rings colliding under ECMP; one lone ring crosses the spine twice and could see
   more. Cross-rail traffic in a rail-optimized fabric does not count as crossing: NCCL's PXN
   (default since NCCL 2.12) first moves data over NVLink to the GPU on the destination's rail.

``group_link`` applies this model to a networkx graph of the cluster (`build_topology_graph`);
``strided_group_link`` is the closed form for the planner's hot path: the slowest group of a mesh
dimension (ranks ``start + stride*i``), cached, and tested to agree with the graph.

Latency (alpha): per-step figures come from the preset (NCCL src/graph/tuning.cc `hwLat`, LL128:
NVLink 1.9 us, PCIe 2.5 us, network 4.0 us) and `collective_latency_s` combines them the way NCCL's
tuning model does: ring base + (steps - inter_steps) * a_intra + inter_steps * a_inter; tree
base + 2 * ((k-1) * a_intra + log2(domains) * a_inter), with NCCL's tree/ring step ratios.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

import networkx as nx

from cluster_specs.spec import ClusterSpec

Tier = Literal["local", "intra_domain", "inter_node", "inter_leaf"]
TIERS: tuple[Tier, ...] = ("local", "intra_domain", "inter_node", "inter_leaf")
"""Tiers from nearest to farthest."""
_MESH = frozenset({"xgmi_mesh", "nvlink_mesh"})

NCCL_BASE_LATENCY_S = 14.0e-6
"""Per-collective base latency: NCCL tuning.cc `baseLat`, LL128 protocol (ring and tree)."""
_TREE_STEP_RATIO = (1.25 / 1.9, 8.5 / 4.0)
"""NCCL `hwLat` LL128 tree / ring per-step latency: (NVLink, network)."""


@dataclass(frozen=True, slots=True)
class GroupLink:
    """What a collective over one group of ranks sees, as placed (units: bytes/s, seconds)."""

    bus_bandwidth_bytes_per_s: float  # NCCL bus bandwidth, one direction; inf for a single rank
    latency_s: float  # per ring step on the slowest tier the group uses
    tier: Tier
    size: int
    ranks_per_domain: int  # fewest ranks of the group in any domain it touches
    domains: int  # NVLink domains touched (NCCL's "nodes")
    nodes: int  # servers / trays touched
    intra_latency_s: float
    inter_latency_s: float
    nic_share_bytes_per_s: float = math.inf
    """Scale-out bandwidth one rank owns (its share of its node's NICs, divided by the spine's
    oversubscription when the group crosses leaves): the rate of traffic a rank sends out of its
    domain by itself (send/recv, all-to-all), which a ring's `bus_bandwidth_bytes_per_s` (capped by
    the NVLink rate of the k ranks it crosses) does not give. inf inside one domain."""


def _local(cluster: ClusterSpec) -> GroupLink:
    lat = cluster.intra_node.latency_s
    return GroupLink(math.inf, 0.0, "local", 1, 1, 1, 1, lat, lat)


def _rails(local: int, gpus_per_node: int, nics: int) -> range:
    """NICs (rails) GPU `local` of a node uses: nics / G each, or one shared by G / nics GPUs."""
    if nics >= gpus_per_node:
        per = nics // gpus_per_node
        return range(local * per, (local + 1) * per)
    first = local * nics // gpus_per_node
    return range(first, first + 1)


# --------------------------------------------------------------------------------------- graph


def build_topology_graph(cluster: ClusterSpec, num_gpus: int) -> nx.Graph:
    """A graph of `num_gpus` ranks placed node-major on `cluster`.

    Nodes (name, attributes):
    - ``("gpu", r)``: kind="gpu", node, domain, local.
    - ``("switch", d)``: kind=the intra fabric (NVSwitch, PCIe switch, shared memory) of domain d;
      a mesh fabric has GPU-GPU edges instead, each worth bus_bandwidth / (D - 1).
    - ``("nic", n, i)``: kind="nic", rail i of node n, gpus_per_nic (GPUs of a full node sharing it).
    - ``("leaf", unit, rail)`` (rail-optimized: one leaf per rail per unit of `nodes_per_leaf` nodes)
      or ``("leaf", unit)``: kind="leaf", unit, rail, downlink_bytes_per_s (a full unit's NICs).
    - ``("spine",)``: the spine layer; leaf uplinks carry downlink / oversubscription.
    Edges carry bandwidth_bytes_per_s (one direction) and latency_s.
    """
    if num_gpus < 1:
        raise ValueError("num_gpus must be >= 1")
    g_per_node, dom, net = cluster.gpus_per_node, cluster.placement_domain(num_gpus), cluster.inter_node
    n_nodes = -(-num_gpus // g_per_node)
    if net.kind == "none" and n_nodes > 1:
        raise ValueError(f"{cluster.name} has no network between nodes: at most {g_per_node} ranks")
    graph = nx.Graph(cluster=cluster, num_gpus=num_gpus)
    for r in range(num_gpus):
        graph.add_node(("gpu", r), kind="gpu", node=r // g_per_node, domain=r // dom, local=r % g_per_node)

    intra = cluster.intra_node
    for d in range(-(-num_gpus // dom)):
        members = [("gpu", r) for r in range(d * dom, min((d + 1) * dom, num_gpus))]
        if intra.kind in _MESH:
            link = intra.bus_bandwidth_bytes_per_s / max(dom - 1, 1)
            for i, u in enumerate(members):
                for v in members[i + 1 :]:
                    graph.add_edge(u, v, bandwidth_bytes_per_s=link, latency_s=intra.latency_s, kind="mesh")
        else:
            switch = ("switch", d)
            graph.add_node(switch, kind=intra.kind, domain=d)
            for u in members:
                graph.add_edge(
                    u,
                    switch,
                    bandwidth_bytes_per_s=intra.bus_bandwidth_bytes_per_s,
                    latency_s=intra.latency_s,
                    kind="fabric",
                )

    if net.kind == "none":
        return graph
    bw, nics = net.nic_bandwidth_bytes_per_s, net.nics_per_node
    gpus_per_nic = max(g_per_node // nics, 1)
    down = net.nodes_per_leaf * bw * (1 if net.rail_optimized else nics)
    for n in range(n_nodes):
        unit = n // net.nodes_per_leaf
        for i in range(nics):
            leaf = ("leaf", unit, i) if net.rail_optimized else ("leaf", unit)
            if leaf not in graph:
                rail = i if net.rail_optimized else None
                graph.add_node(leaf, kind="leaf", unit=unit, rail=rail, downlink_bytes_per_s=down)
                graph.add_edge(
                    leaf,
                    ("spine",),
                    bandwidth_bytes_per_s=down / net.oversubscription,
                    latency_s=net.latency_s,
                    kind="uplink",
                )
            nic = ("nic", n, i)
            graph.add_node(nic, kind="nic", node=n, rail=i, gpus_per_nic=gpus_per_nic)
            graph.add_edge(nic, leaf, bandwidth_bytes_per_s=bw, latency_s=net.latency_s, kind="network")
        for local in range(g_per_node):
            r = n * g_per_node + local
            if r < num_gpus:
                for i in _rails(local, g_per_node, nics):
                    graph.add_edge(
                        ("gpu", r), ("nic", n, i), bandwidth_bytes_per_s=bw, latency_s=0.0, kind="pcie"
                    )
    graph.nodes[("spine",)]["kind"] = "spine"
    return graph


def _intra_bandwidth(graph: nx.Graph, members: list[tuple]) -> float:
    """Bus bandwidth of a collective over `members` (>= 2 GPUs of one domain) on its fabric."""
    best = math.inf
    group = set(members)
    for u in members:
        mesh = 0.0
        for v, edge in graph[u].items():
            if edge["kind"] == "fabric":
                best = min(best, edge["bandwidth_bytes_per_s"])
            elif edge["kind"] == "mesh" and v in group:
                mesh += edge["bandwidth_bytes_per_s"]
        if mesh:
            best = min(best, mesh)
    return best


def _nic_share(graph: nx.Graph, gpu: tuple) -> float:
    """Scale-out bandwidth one GPU owns when every GPU of its node uses its NICs."""
    return sum(
        edge["bandwidth_bytes_per_s"] / graph.nodes[nic]["gpus_per_nic"]
        for nic, edge in graph[gpu].items()
        if edge["kind"] == "pcie"
    )


def _spine_oversubscription(graph: nx.Graph, gpus: list[tuple]) -> float | None:
    """None if the group's traffic stays under its leaves (one unit), else the worst leaf's
    downlink / uplink ratio. Rails do not matter (PXN, module docs), units do."""
    leaves = {
        leaf
        for gpu in gpus
        for nic, e in graph[gpu].items()
        if e["kind"] == "pcie"
        for leaf in graph[nic]
        if graph.nodes[leaf]["kind"] == "leaf"
    }
    if len({graph.nodes[leaf]["unit"] for leaf in leaves}) <= 1:
        return None
    return max(
        graph.nodes[leaf]["downlink_bytes_per_s"] / graph[leaf][("spine",)]["bandwidth_bytes_per_s"]
        for leaf in leaves
    )


def group_link(graph_or_cluster: nx.Graph | ClusterSpec, ranks) -> GroupLink:
    """Bottleneck bus bandwidth and latency of a collective over `ranks`, as placed (module docs)."""
    ranks = list(ranks)
    if isinstance(graph_or_cluster, ClusterSpec):
        cluster = graph_or_cluster
        per_node = cluster.gpus_per_node
        graph = build_topology_graph(cluster, (max(ranks) // per_node + 1) * per_node)
    else:
        graph = graph_or_cluster
        cluster = graph.graph["cluster"]
    ranks = sorted(set(ranks))
    if not ranks or ranks[0] < 0 or ranks[-1] >= graph.graph["num_gpus"]:
        raise ValueError(f"ranks must be in [0, {graph.graph['num_gpus']}), got {ranks[:3]}...{ranks[-3:]}")
    if len(ranks) == 1:
        return _local(cluster)

    by_domain: dict[int, list[tuple]] = {}
    for r in ranks:
        by_domain.setdefault(graph.nodes[("gpu", r)]["domain"], []).append(("gpu", r))
    caps = [_intra_bandwidth(graph, m) for m in by_domain.values() if len(m) >= 2]
    intra_bw = min(caps, default=math.inf)
    a_intra, a_inter = cluster.intra_node.latency_s, cluster.inter_node.latency_s
    nodes = len({graph.nodes[("gpu", r)]["node"] for r in ranks})
    k = min(len(m) for m in by_domain.values())
    if len(by_domain) == 1:
        return GroupLink(intra_bw, a_intra, "intra_domain", len(ranks), k, 1, nodes, a_intra, a_inter)
    if cluster.inter_node.kind == "none":
        raise ValueError(f"{cluster.name}: ranks span nodes but the cluster has no network")
    bw = min(intra_bw, min(sum(_nic_share(graph, gpu) for gpu in m) for m in by_domain.values()))
    share = min(_nic_share(graph, ("gpu", r)) for r in ranks)
    oversub = _spine_oversubscription(graph, [("gpu", r) for r in ranks])
    tier: Tier = "inter_node" if oversub is None else "inter_leaf"
    if oversub is not None:
        bw /= oversub
        share /= oversub
    return GroupLink(bw, max(a_intra, a_inter), tier, len(ranks), k, len(by_domain), nodes, a_intra, a_inter, share)


# ------------------------------------------------------------------------------------ fast path


@dataclass(frozen=True, eq=False, slots=True)
class _Params:
    """The numbers `strided_group_link` needs; hashed by identity (one object per cluster object)."""

    cluster: ClusterSpec
    gpus_per_node: int
    domain_size: int
    mesh: bool
    intra_bw: float
    nic_share: float
    nodes_per_leaf: int
    oversubscription: float
    has_network: bool
    a_intra: float
    a_inter: float


_PARAMS: dict[int, _Params] = {}
_BY_DOMAIN: dict[tuple[int, int], _Params] = {}


def _with_domain(p: _Params, domain: int) -> _Params:
    """`p` with the job's placement domain (`ClusterSpec.placement_domain`), one object per pair."""
    if domain == p.domain_size:
        return p
    key = (id(p), domain)
    q = _BY_DOMAIN.get(key)
    if q is None or q.cluster is not p.cluster:
        if len(_BY_DOMAIN) > 4096:
            _BY_DOMAIN.clear()
        q = _BY_DOMAIN[key] = replace(p, domain_size=domain)
    return q


def _params(cluster: ClusterSpec) -> _Params:
    p = _PARAMS.get(id(cluster))
    if p is not None and p.cluster is cluster:  # the entry keeps the cluster alive, so ids are not reused
        return p
    if len(_PARAMS) > 4096:
        _PARAMS.clear()
    net = cluster.inter_node
    p = _Params(
        cluster,
        cluster.gpus_per_node,
        cluster.domain_size,
        cluster.intra_node.kind in _MESH,
        cluster.intra_node.bus_bandwidth_bytes_per_s,
        cluster.nic_bandwidth_per_gpu_bytes_per_s,
        net.nodes_per_leaf,
        net.oversubscription,
        net.kind != "none",
        cluster.intra_node.latency_s,
        net.latency_s,
    )
    _PARAMS[id(cluster)] = p
    return p


def strided_group_link(cluster: ClusterSpec, size: int, stride: int, world: int | None = None) -> GroupLink:
    """The slowest group of one mesh dimension, priced like `group_link`; cached.

    A dimension of `size` ranks at `stride` (node-major numbering) has the groups
    ``{base + o + stride * i : i < size}``, o < stride, base a multiple of stride * size. They run
    at the same time and the slowest sets the pace, so the worst group is returned: with domains of
    72 or dimensions that are not powers of two, groups starting at other ranks straddle domain or
    leaf boundaries that the group at rank 0 does not. `world` is the job's size (a multiple of
    stride * size); None prices one period of the layout, where every alignment of a group against
    domains and leaf units occurs, i.e. a job as large as the cluster's structure repeats.
    Cost after the first call: a dict lookup and an LRU hit (~0.2 us).
    """
    p = _params(cluster)
    if cluster.placement_segment_nodes is not None:
        p = _with_domain(p, cluster.placement_domain(world))
    return _strided(p, size, stride, world)


_MAX_SPAN = 1 << 16
"""Cap on the ranks examined on a cache miss. A period longer than this (odd group sizes against
72-GPU domains and leaf units) is truncated: only its first alignments are priced."""


@lru_cache(maxsize=1 << 16)
def _strided(p: _Params, size: int, stride: int, world: int | None) -> GroupLink:
    if size < 1 or stride < 1:
        raise ValueError(f"size and stride must be >= 1, got {size}, {stride}")
    if size == 1:
        return _local(p.cluster)
    block = stride * size
    if world is not None and (world < block or world % block):
        raise ValueError(f"world ({world}) must be a multiple of stride * size ({block})")
    if not p.has_network:  # one node: the job cannot be larger than it
        world = world or p.domain_size // block * block
        if not world or world > p.domain_size:
            raise ValueError(f"{p.cluster.name}: ranks span nodes but the cluster has no network")
    period = math.lcm(block, p.domain_size, p.gpus_per_node * p.nodes_per_leaf)
    span = min(period, world or period, max(block, _MAX_SPAN // block * block))
    groups = (_one_group(p, base + o, size, stride) for base in range(0, span, block) for o in range(stride))
    return min(groups, key=slowness)


def slowness(link: GroupLink) -> tuple[float, float, int]:
    """Sort key, slowest first: lower bandwidth, then higher latency, then the farther tier."""
    return (link.bus_bandwidth_bytes_per_s, -link.latency_s, -TIERS.index(link.tier))


def _one_group(p: _Params, first: int, size: int, stride: int) -> GroupLink:
    """The closed form of `group_link` for ranks first + stride * i."""
    g, d = p.gpus_per_node, p.domain_size
    last = first + stride * (size - 1)
    nodes = last // g - first // g + 1 if stride <= g else size

    def intra(k: int) -> float:
        return p.intra_bw * (k - 1) / (d - 1) if p.mesh else p.intra_bw

    if first // d == last // d:
        return GroupLink(intra(size), p.a_intra, "intra_domain", size, size, 1, nodes, p.a_intra, p.a_inter)
    counts = (
        [1] * size if stride >= d else list(Counter(r // d for r in range(first, last + 1, stride)).values())
    )
    k = min(counts)
    bw = min(min((intra(c) for c in counts if c >= 2), default=math.inf), k * p.nic_share)
    share = p.nic_share
    spans = first // g // p.nodes_per_leaf != last // g // p.nodes_per_leaf
    if spans:
        bw /= p.oversubscription
        share /= p.oversubscription
    tier: Tier = "inter_leaf" if spans else "inter_node"
    return GroupLink(bw, max(p.a_intra, p.a_inter), tier, size, k, len(counts), nodes, p.a_intra, p.a_inter, share)


# -------------------------------------------------------------------------------------- latency

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]


def collective_latency_s(
    link: GroupLink, collective: Collective = "all_reduce", algorithm: Literal["ring", "tree"] = "ring"
) -> float:
    """Latency term of one collective over `link`'s group, after NCCL's tuning model (module docs).

    Ring steps: all-reduce 2(n-1), all-gather / reduce-scatter / all-to-all n-1 (one exchange per
    peer), send/recv 1; of them 2(m-1) resp. m-1 cross the network for m domains (all-to-all:
    n - ranks_per_domain). Tree (all-reduce only): 2 * ((k-1) intra + ceil(log2 m) inter steps).
    """
    n, m, k = link.size, link.domains, link.ranks_per_domain
    if n <= 1:
        return 0.0
    a, b = link.intra_latency_s, link.inter_latency_s
    if algorithm == "tree":
        if collective != "all_reduce":
            raise ValueError("NCCL's tree algorithm only runs all-reduce")
        a, b = a * _TREE_STEP_RATIO[0], b * _TREE_STEP_RATIO[1]
        return NCCL_BASE_LATENCY_S + 2 * ((k - 1) * a + math.ceil(math.log2(m)) * b)
    steps, inter = {
        "all_reduce": (2 * (n - 1), 2 * (m - 1)),
        "all_gather": (n - 1, m - 1),
        "reduce_scatter": (n - 1, m - 1),
        "all_to_all": (n - 1, n - k if m > 1 else 0),
        "send_recv": (1, 1 if m > 1 else 0),
    }[collective]
    return NCCL_BASE_LATENCY_S + (steps - inter) * a + inter * b
