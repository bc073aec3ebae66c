"""Collective communication time over a group of ranks as placed on the topology.

NCCL bus-bandwidth convention (nccl-tests PERFORMANCE.md): for n ranks, bus bandwidth B and a
buffer of S bytes (the full, gathered/reduced size)
    all-reduce                    2 (n-1)/n * S / B
    all-gather, reduce-scatter      (n-1)/n * S / B
    all-to-all                      (n-1)/n * S / B   (S = bytes one rank sends, itself included)
    send/recv (p2p)                          S / B
plus a latency term: alpha per step, with (n_domain - 1) ring steps inside an NVLink domain and
ceil(log2(domains)) tree steps across domains (doubled for all-reduce).
B is the bottleneck bus bandwidth of the group as placed (`cluster_specs.topology`), multiplied by
the calibrated fraction NCCL achieves on that tier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from cluster_specs.spec import ClusterSpec
from cluster_specs.topology import GroupLink, strided_group_link
from cost_models.calibration import Calibration

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"]

_VOLUME = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0}


@dataclass(frozen=True)
class Group:
    """A communication group as placed: its size and the link it gets."""

    size: int
    link: GroupLink

    @classmethod
    def strided(cls, cluster: ClusterSpec, size: int, stride: int, world: int | None = None) -> Group:
        """The slowest group of `size` ranks at `stride` in a job of `world` ranks (one period of
        the layout when the groups do not tile the job evenly). Cached per cluster object."""
        key = (id(cluster), size, stride, world)
        hit = _GROUPS.get(key)
        if hit is not None and hit[0] is cluster:  # the entry keeps the cluster alive: ids are not reused
            return hit[1]
        if world is not None and world % (size * stride):
            world = None
        group = cls(size, strided_group_link(cluster, size, stride, world))
        if len(_GROUPS) > 1 << 16:
            _GROUPS.clear()
        _GROUPS[key] = (cluster, group)
        return group


_GROUPS: dict[tuple[int, int, int, int | None], tuple[ClusterSpec, Group]] = {}


def effective_bandwidth(link: GroupLink, cal: Calibration) -> float:
    eff = cal.intra_bus_efficiency if link.domains <= 1 else cal.inter_bus_efficiency
    return link.bus_bandwidth_bytes_per_s * eff


def latency(kind: Collective, link: GroupLink) -> float:
    steps = max(link.ranks_per_domain - 1, 0) + (math.ceil(math.log2(link.domains)) if link.domains > 1 else 0)
    if kind == "all_reduce":
        steps *= 2
    if kind == "p2p":
        steps = 1
    return link.latency_s * steps


def collective_cost(kind: Collective, group: Group, cal: Calibration) -> tuple[float, float]:
    """(seconds per byte of buffer, fixed latency seconds) of a collective over `group`: the time
    of a buffer of S bytes is S * first + second (0 for a group of one)."""
    n = group.size
    if n <= 1:
        return 0.0, 0.0
    bw = effective_bandwidth(group.link, cal)
    if kind == "p2p":
        return 1.0 / bw, latency(kind, group.link)
    return _VOLUME[kind] * (n - 1) / n / bw, latency(kind, group.link)


def collective_time(kind: Collective, nbytes: float, group: Group, cal: Calibration) -> float:
    """Seconds for one collective of `nbytes` (full buffer size, see module doc) over `group`."""
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    bw = effective_bandwidth(group.link, cal)
    if kind == "p2p":
        return nbytes / bw + latency(kind, group.link)
    return _VOLUME[kind] * (n - 1) / n * nbytes / bw + latency(kind, group.link)
