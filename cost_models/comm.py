"""Collective communication time over a group of ranks as placed on the topology.

NCCL bus-bandwidth convention (nccl-tests PERFORMANCE.md): for n ranks, bus bandwidth B and a
buffer of S bytes (the full, gathered/reduced size)
    all-reduce                    2 (n-1)/n * S / B
    all-gather, reduce-scatter      (n-1)/n * S / B
plus NCCL's latency term (`cluster_specs.topology.collective_latency_s`: a base per collective and
a per-step latency for each ring step, network steps at the network's figure).

B is the bottleneck bus bandwidth of the group as placed (`cluster_specs.topology`), multiplied by
the calibrated fraction NCCL achieves on that tier. Two patterns are not rings and are priced from
the per-GPU links instead:

- send/recv (pipeline boundaries, ring attention's K/V blocks): one GPU sends to one peer. Inside an
  NVLink domain it gets the domain's bandwidth; across domains it gets *its own* share of its
  node's NICs (`GroupLink.nic_share_bytes_per_s`, from `ClusterSpec.nic_bandwidth_per_gpu_bytes_per_s`),
  not the k NICs a ring of k ranks per domain drives together.
- all-to-all (MoE dispatch and combine; S = bytes one rank sends, itself included): each rank
  sends S/n to every peer. Of it, (n - k)/n leaves the NVLink domain through the rank's own NIC
  share and (k - 1)/n stays on NVLink (k ranks of the group per domain, PXN moving cross-rail
  traffic over NVLink first). Both run at once and NVLink is the faster on every preset, so the
  NIC part sets the time: (n - k)/n * S / N, N one rank's NIC share. That share is not B / k: a
  ring's B is capped by the NVLink rate of the k ranks it crosses (H800: 160 GB/s for 8 ranks, 20
  GB/s each, against 50 GB/s of NIC each), an all-to-all's traffic is not. DeepEP measures 43-58
  GB/s of RDMA per H800 GPU (50 GB/s NIC) at EP 16-64 (DeepEP README, normal kernels). A group
  inside one domain is (n-1)/n * S / B. A deduplicating dispatcher (DeepEP) sends a token once per
  remote domain it needs (`remote_domains_per_token`) and fans it out over NVLink there
  (`dedup_dispatch_time`).

Measured size curves. A ring collective (all-reduce, all-gather, reduce-scatter) of S bytes takes its
alpha-beta time above times the ratio the kernel atlas measured for buffers of S bytes on the same
span (inside one NVLink domain, or across NICs: `cost_models.kernels.collectives`, `size_ratio`):
between a few KiB and a few hundred MiB NCCL runs well below its large-buffer bus bandwidth (1.3-2x
the alpha-beta time at 8-64 MiB on 8 A100 over NVLink, 1.6-2.5x across 4 B200 nodes). The large-buffer
scale-out efficiency is the atlas's measured one (`Calibration.inter_bus_efficiency`). Send/recv and
all-to-all have no measured curve and keep the alpha-beta model.

Channels. Every collective occupies one *channel* of a rank: the NVLink / PCIe domain (`INTRA`) when
its group stays inside one domain, the scale-out NICs (`INTER`) when it leaves it. Collectives on
one channel queue on it; collectives on different channels run side by side
(`cost_models.step_time`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from cluster_specs.spec import ClusterSpec
from cluster_specs.topology import GroupLink, collective_latency_s, strided_group_link
from cost_models.calibration import Calibration
from cost_models.interning import KeptMemo
from cost_models.kernels.atlas import atlas_for
from cost_models.kernels.collectives import SizeCurve

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"]

INTRA, INTER, HOST = 0, 1, 2
"""Channel indices: the NVLink / PCIe domain, the scale-out NICs, the GPU's link to host memory
(activation offload: `Layout.activation_offload_layers`)."""
CHANNELS = 3

_VOLUME = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}
_LATENCY_KIND = {
    "all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
    "all_to_all": "all_to_all", "p2p": "send_recv",
}  # fmt: skip


@dataclass(frozen=True)
class Group:
    """A communication group as placed: its size and the link it gets."""

    size: int
    link: GroupLink
    curve: SizeCurve | None = None  # the atlas's size curve of the group's span (`size_ratio`)

    @classmethod
    def strided(cls, cluster: ClusterSpec, size: int, stride: int, world: int | None = None) -> Group:
        """The slowest group of `size` ranks at `stride` in a job of `world` ranks (one period of
        the layout when the groups do not tile the job evenly). Cached per cluster object (`KeptMemo`)."""
        key = (id(cluster), size, stride, world)
        hit = _GROUPS.get(key)
        if hit is not None:
            return hit
        if world is not None and world % (size * stride):
            world = None
        link = strided_group_link(cluster, size, stride, world)
        curve, _ = atlas_for(cluster.gpu).collective_curve("nvlink" if link.domains <= 1 else "nic")
        return _GROUPS.put(key, cluster, cls(size, link, curve))

    @property
    def channel(self) -> int:
        """`INTRA` when the group stays inside one NVLink domain (or is one rank), else `INTER`."""
        return INTRA if self.link.domains <= 1 else INTER


_GROUPS: KeptMemo[Group] = KeptMemo(1 << 16)


def effective_bandwidth(link: GroupLink, cal: Calibration) -> float:
    eff = cal.intra_bus_efficiency if link.domains <= 1 else cal.inter_bus_efficiency
    return link.bus_bandwidth_bytes_per_s * eff


def nic_share(link: GroupLink, cal: Calibration) -> float:
    """Bytes/s one rank sends out of its domain by itself: its NIC share at the calibrated scale-out
    efficiency (`GroupLink.nic_share_bytes_per_s`; module doc)."""
    return link.nic_share_bytes_per_s * cal.inter_bus_efficiency


def latency(kind: Collective, link: GroupLink) -> float:
    """NCCL's latency term for one collective of `kind` over the group (ring algorithm)."""
    return collective_latency_s(link, _LATENCY_KIND[kind])  # type: ignore[arg-type]


def collective_cost(kind: Collective, group: Group, cal: Calibration) -> tuple[float, float]:
    """(seconds per byte of buffer, fixed latency seconds) of a collective over `group`: the time
    of a buffer of S bytes is S * first + second (0 for a group of one). See the module doc for
    what S is for each kind."""
    n = group.size
    if n <= 1:
        return 0.0, 0.0
    link = group.link
    bw = effective_bandwidth(link, cal)
    lat = latency(kind, link)
    if kind == "p2p":
        if link.domains > 1:  # the sender's own NIC share (module doc)
            bw = nic_share(link, cal)
        return 1.0 / bw, lat
    if kind == "all_to_all":
        if link.domains <= 1:
            return (n - 1) / n / bw, lat
        k = max(link.ranks_per_domain, 1)
        return (n - k) / n / nic_share(link, cal), lat  # the rank's own NIC share carries what leaves the domain
    return _VOLUME[kind] * (n - 1) / n / bw, lat


def remote_domains_per_token(num_experts: int, top_k: int, domains: int, groups: int = 0, group_topk: int = 0) -> float:
    """Expected NVLink domains other than its own that one token's top_k experts live in, with the
    experts spread evenly over the EP group's `domains`: hypergeometric, (D - 1) x (1 - P(a given
    domain holds none of the choices)). Group-limited routing (DeepSeek-V3: 8 groups, a token
    reaches 4; `ModelSpec.moe_router_groups`) draws `group_topk` of `groups` groups instead of
    `top_k` of the experts, when the groups do not straddle domains (groups a multiple of D)."""
    if domains <= 1:
        return 0.0
    if groups and group_topk and groups % domains == 0:
        units, picks = groups, group_topk
    else:
        units, picks = num_experts, top_k
    per_domain = units // domains
    miss = math.comb(units - per_domain, picks) / math.comb(units, picks) if units - per_domain >= picks else 0.0
    return (domains - 1) * (1.0 - miss)


def dedup_dispatch_time(copy_bytes: float, top_k: int, remote_copies: float, group: Group, cal: Calibration) -> float:
    """Seconds of one deduplicating MoE dispatch (or combine) over `group` (DeepEP; Megatron-Core's
    flex dispatcher): a token crosses to each remote domain it needs once, through the sender's own
    NIC share, and NVLink fans it out to the experts there; inside one domain it is an ordinary
    all-to-all of its top_k copies. `copy_bytes`: one hidden-size copy of all tokens this rank routes."""
    if group.size <= 1 or copy_bytes <= 0:
        return 0.0
    link = group.link
    if link.domains <= 1:
        return collective_time("all_to_all", top_k * copy_bytes, group, cal)
    return remote_copies * copy_bytes / nic_share(link, cal) + latency("all_to_all", link)


RING_KINDS = frozenset({"all_reduce", "all_gather", "reduce_scatter"})
"""Collectives the atlas's size curves (ring all-reduce sweeps) stand for."""


def size_ratio(kind: str, nbytes: float | np.ndarray, group: Group) -> float | np.ndarray:
    """Measured time over alpha-beta time of a `kind` collective of `nbytes` over `group` (module
    doc): the atlas's curve of the group's span, 1 for send/recv, all-to-all and groups of one."""
    if kind not in RING_KINDS or group.size <= 1 or group.curve is None:
        return 1.0
    if isinstance(nbytes, np.ndarray):
        return group.curve.at_array(nbytes)
    return group.curve.at(float(nbytes))


def collective_time(kind: Collective, nbytes: float, group: Group, cal: Calibration, sizes: bool = True) -> float:
    """Seconds for one collective of `nbytes` (see the module doc) over `group`: the alpha-beta
    time x the measured size ratio (`size_ratio`; `sizes` False: the alpha-beta time alone, a lower
    bound of it, affine in the bytes)."""
    if group.size <= 1 or nbytes <= 0:
        return 0.0
    per_byte, lat = collective_cost(kind, group, cal)
    t = nbytes * per_byte + lat
    return t * float(size_ratio(kind, nbytes, group)) if sizes else t
