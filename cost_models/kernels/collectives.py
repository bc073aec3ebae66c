"""Measured NCCL collectives: how far below the alpha-beta model a buffer of a given size runs.

`cost_models.comm` prices a collective of S bytes over a group as placed with the alpha-beta model
of NCCL's tuning (S x volume / bus bandwidth + a latency per ring step,
`cluster_specs.topology.collective_latency_s`). Measured sweeps (nccl-tests or ML Engineering's
`all_reduce_bench.py`, both in the bus-bandwidth convention) say that between a few KiB and a few
hundred MiB real collectives run slower than that: protocol switches (LL, LL128, Simple), fewer
channels on small buffers, the network's own pipeline. A curve of one fabric span (inside one
NVLink domain, or across NICs) gives, at each measured size S,

    ratio(S) = measured time / alpha-beta time,

with the alpha-beta bandwidth set to the curve's own large-buffer bus bandwidth (so the ratio tends
to 1 for large buffers) and the latency model of the measured group (ranks, nodes); never below 1
(the alpha-beta time at the large-buffer bandwidth is a collective's best: where the latency model
overestimates a tiny buffer's, the model's time stands), so the alpha-beta time stays a lower bound
of the priced one (the planner's branch and bound relies on it). A collective
of the same span is priced at its alpha-beta time x ratio(S), interpolated linearly in log S and
held at the ends. Inside an NVLink domain only ring curves stand for the ring the model prices (an
NVLS all-reduce reduces in the switch, another algorithm); across NICs, whatever NCCL chose. The large-buffer bus bandwidth of a NIC-spanning curve over the NICs' line rate
is the scale-out efficiency (`nic_efficiency`): what the topology model's NIC-limited bandwidth
reaches in practice.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from cluster_specs.topology import NCCL_BASE_LATENCY_S
from cost_models.kernels import record as rec
from cost_models.kernels.schema import CollectivePoint

VOLUME = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}
"""Bus-bandwidth volume factor per collective (nccl-tests doc/PERFORMANCE.md): x (n - 1) / n."""

NVLINK_STEP_LATENCY_S = 1.9e-6
NETWORK_STEP_LATENCY_S = 4.0e-6
"""Per ring step latencies of the alpha-beta model the curves are referred to (NCCL tuning.cc
`hwLat`, LL128: NVLink 1.9 us, network 4.0 us; the presets' figures)."""


@dataclass(frozen=True)
class SizeCurve:
    """ratio(S) of one span (module doc): ascending log sizes and ratios."""

    span: str
    op: str
    algorithm: str
    ranks: int
    nodes: int
    log_bytes: tuple[float, ...]
    ratio: tuple[float, ...]
    large_busbw: float  # bytes/s at the largest measured buffer
    nic_efficiency: float | None  # large_busbw / (NICs x line rate), NIC-spanning curves only
    source: str

    def at(self, nbytes: float) -> float:
        """ratio at a buffer of `nbytes` (interpolated in log size, held at the ends)."""
        if rec.ACTIVE:
            rec.collective(self.op, self.span, self.ranks, self.nodes, nbytes)
        if nbytes <= 0:
            return 1.0
        x = math.log(nbytes)
        xs, ys = self.log_bytes, self.ratio
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, x)
        f = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + f * (ys[i] - ys[i - 1])

    def at_array(self, nbytes: np.ndarray) -> np.ndarray:
        """`at` elementwise (1 where nbytes <= 0)."""
        nb = np.asarray(nbytes, dtype=float)
        return np.where(nb > 0, self.at_positive(nb), 1.0)

    def at_positive(self, nbytes: np.ndarray) -> np.ndarray:
        """`at` elementwise where nbytes > 0 (the first ratio elsewhere: callers that zero those
        entries' times skip `at_array`'s mask). Memoized on the buffer sizes (the planner's tables
        repeat their volumes across layouts); the array returned is read-only."""
        nb = np.asarray(nbytes, dtype=float)
        if rec.ACTIVE:
            rec.collective(self.op, self.span, self.ranks, self.nodes, nb)
        key = (nb.shape, nb.tobytes())
        memo = self._memo
        out = memo.get(key)
        if out is None:
            xs, ys = self._arrays
            out = np.interp(np.log(np.maximum(nb, 1.0)), xs, ys)
            out.flags.writeable = False
            if len(memo) > 1 << 14:
                memo.clear()
            memo[key] = out
        return out

    @cached_property
    def _memo(self) -> dict[tuple, np.ndarray]:
        return {}

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.log_bytes), np.asarray(self.ratio)

    @property
    def sizes(self) -> tuple[float, float]:
        return math.exp(self.log_bytes[0]), math.exp(self.log_bytes[-1])


def ring_latency_s(op: str, ranks: int, nodes: int) -> float:
    """The alpha-beta latency of a ring collective over `ranks` GPUs on `nodes` nodes (NCCL's
    model as `cluster_specs.topology.collective_latency_s`, with `NVLINK_STEP_LATENCY_S` and
    `NETWORK_STEP_LATENCY_S`)."""
    steps = 2 * (ranks - 1) if op == "all_reduce" else ranks - 1
    inter = (2 * (nodes - 1) if op == "all_reduce" else nodes - 1) if nodes > 1 else 0
    return NCCL_BASE_LATENCY_S + (steps - inter) * NVLINK_STEP_LATENCY_S + inter * NETWORK_STEP_LATENCY_S


def curves_from_points(points: list[CollectivePoint]) -> list[SizeCurve]:
    """One curve per (op, span, ranks, nodes, algorithm) with at least three sizes; single-size
    points (large-buffer figures) only inform `nic_efficiency` of their span."""
    groups: dict[tuple[str, str, int, int, str, str], list[CollectivePoint]] = {}
    for p in points:
        groups.setdefault((p.op, p.span, p.ranks, p.nodes, p.algorithm, p.source), []).append(p)
    out = []
    for (op, span, ranks, nodes, _alg, source), pts in groups.items():
        pts = sorted(pts, key=lambda p: p.bytes)
        if len(pts) < 3:
            continue
        big = pts[-1]
        large = big.busbw_gb_per_s * 1e9
        factor = VOLUME[op] * (ranks - 1) / ranks
        lat = ring_latency_s(op, ranks, nodes)
        ratios = []
        for p in pts:
            measured = factor * p.bytes / (p.busbw_gb_per_s * 1e9)
            model = factor * p.bytes / large + lat
            ratios.append(max(1.0, measured / model))
        nic_eff = None
        if span == "nic" and big.nics_per_node and big.nic_gb_per_s:
            nic_eff = large / (big.nics_per_node * big.nic_gb_per_s * 1e9)
        out.append(SizeCurve(span, op, _alg, ranks, nodes, tuple(math.log(p.bytes) for p in pts), tuple(ratios),
                             large, nic_eff, source))
    return out
