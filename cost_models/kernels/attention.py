"""Attention kernel rates of one GPU, by kernel, head dimension, sequence length, mask and pass.

A curve is one (kernel, head dim, causal, pass) of a GPU: FLOP/s at measured sequence lengths
(queries = keys; the benchmarks fill the GPU with batch x heads). Between measured lengths the rate
is interpolated linearly in (log length, log rate); beyond them it is held at the nearest end, and
below the shortest it falls with the share of 128 x 128 tiles that hold scored pairs
(`tile_efficiency`: short sequences waste part of each tile, causal ones also the diagonal).

Passes: ``fwd``; ``bwd`` (2.5x the forward FLOPs for equal q / k / v head sizes); ``fwd_bwd``
(3.5x). Where a GPU measured forward and forward + backward at the same lengths, its backward
curve is derived from them: t_bwd = 3.5 F / r_fwd_bwd - F / r_fwd. Where it measured only forward
+ backward, that rate stands for both passes (their sum is then exact); where it measured only the
forward, the forward rate stands for the backward (`EXTRAPOLATED`).

A curve with one point (a figure a paper states for one shape) takes its shape over sequence
length from the same kernel's best-measured curve on another GPU, anchored at that point.

Missing data, in order of preference (each query's provenance says which was used, as
`cost_models.kernels.gemm`'s codes): the other mask (rate x the tile-efficiency ratio), the
nearest measured head dimension, and where the GPU has no curve of the kernel at all, the kernel's
curve on a GPU of the same tensor-core class (`GPUSpec.warpgroup_mma`), else any, scaled by the
ratio of the two GPUs' large-GEMM rates (`EXTRAPOLATED`, or `DATASHEET` for a GPU without atlas).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_models.kernels.gemm import EXTRAPOLATED, INTERPOLATED, MEASURED
from cost_models.kernels.schema import AttentionPoint

Scalars = Any

FLOPS_PER_FORWARD = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
"""FLOPs of a pass over the forward's (`cost_models.flops.flash_backward_factor` for d_qk == d_v)."""

BLOCK = 128.0
"""Tile edge (queries and keys) of the FlashAttention-2/3 and cuDNN kernels."""

TRITON_FLASH_SPEED = 0.5
"""Rate of FlashAttention written in Triton (`Layout.attention_kernel` "triton_flash": flash-attn's
`flash_attn/flash_attn_triton.py` at commit eff9fe6b, which llm-foundry copies as
`llmfoundry/models/layers/flash_attn_triton.py` and compiles with the pre-MLIR Triton of 2022 for its
`attn_impl: triton`, the default of its benchmark scripts until January 2024) relative to
FlashAttention-2's rate on the same GPU, shape and pass. No atlas measures it; it is derived from two
published statements: that file's docstring ("Overall Triton forward + backward is slightly slower
than CUDA forward + backward", the CUDA kernel being FlashAttention 1) and the FlashAttention-2 paper
(T. Dao, arXiv 2307.08691, abstract: "around 2x speedup compared to FlashAttention"). On Hopper
neither kernel uses warpgroup MMA (the 2022 Triton predates sm_90 support; FlashAttention-2 issues
Ampere's mma.sync), so the ratio is taken over from the A100, where both statements were measured.
Not fitted. Against llm-foundry's rows of 16k-65k tokens (attention most of the step) the A100 rows
come out at a median 2-4% fast and the H100 rows 7-17% slow (median 11%): on Hopper the ratio may be
nearer 0.6. Its times are `EXTRAPOLATED` (`cost_models.compute.kernel_provenance`)."""


def tile_efficiency(seq: Scalars, causal: bool) -> Scalars:
    """Share of the 128 x 128 (query, key) tiles of one self-attention call over `seq` positions
    that holds scored pairs (causal: the lower triangle, diagonal tiles computed whole)."""
    s = np.asarray(seq, dtype=float)
    t = np.ceil(s / BLOCK)
    out = s * (s + 1) / 2 / (t * (t + 1) / 2 * BLOCK * BLOCK) if causal else s * s / (t * t * BLOCK * BLOCK)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class Curve:
    """One measured curve (module doc): ascending log lengths and log FLOP/s."""

    kernel: str
    head_dim: int
    causal: bool
    pass_: str
    log_s: np.ndarray
    log_rate: np.ndarray

    def rate(self, seq: Scalars) -> tuple[Scalars, Scalars]:
        """(FLOP/s, provenance) at `seq` (module doc)."""
        ls = np.log(np.asarray(seq, dtype=float))
        r = np.exp(np.interp(ls, self.log_s, self.log_rate))
        lo = float(np.exp(self.log_s[0]))
        short = ls < self.log_s[0] - 1e-9
        r = np.where(short, r * tile_efficiency(np.minimum(np.exp(ls), lo), self.causal)
                     / tile_efficiency(lo, self.causal), r)
        on_point = np.min(np.abs(ls[..., None] - self.log_s), axis=-1) < 1e-3
        outside = short | (ls > self.log_s[-1] + 1e-9)
        code = np.where(on_point, MEASURED, np.where(outside, EXTRAPOLATED, INTERPOLATED))
        return r, code


def _curve(kernel: str, d: int, causal: bool, pass_: str, seqs: Iterable[float], rates: Iterable[float]) -> Curve:
    s = np.array(list(seqs), dtype=float)
    r = np.array(list(rates), dtype=float)
    order = np.argsort(s)
    return Curve(kernel, d, causal, pass_, np.log(s[order]), np.log(r[order]))


def curves_from_points(points: Iterable[AttentionPoint]) -> dict[tuple[str, int, bool, str], Curve]:
    """The GPU's curves keyed (kernel, head dim, causal, pass), with backward curves derived from
    forward and forward + backward pairs (module doc); several figures at one length are averaged
    (geometric mean)."""
    groups: dict[tuple[str, int, bool, str], dict[int, list[float]]] = {}
    for p in points:
        groups.setdefault((p.kernel, p.head_dim, p.causal, p.pass_), {}).setdefault(p.seq_len, []).append(p.tflops * 1e12)
    out: dict[tuple[str, int, bool, str], Curve] = {}
    for key, by_s in groups.items():
        out[key] = _curve(*key, by_s, [math.exp(np.mean(np.log(v))) for v in by_s.values()])
    for (kernel, d, causal, pass_), by_s in groups.items():
        if pass_ != "fwd_bwd" or (kernel, d, causal, "bwd") in out:
            continue
        fwd = groups.get((kernel, d, causal, "fwd"), {})
        common = sorted(set(fwd) & set(by_s))
        derived = []
        for s in common:
            r_f = math.exp(np.mean(np.log(fwd[s])))
            r_fb = math.exp(np.mean(np.log(by_s[s])))
            t_bwd = FLOPS_PER_FORWARD["fwd_bwd"] / r_fb - 1.0 / r_f
            if t_bwd > 0:
                derived.append((s, FLOPS_PER_FORWARD["bwd"] / t_bwd))
        if derived:
            out[(kernel, d, causal, "bwd")] = _curve(kernel, d, causal, "bwd", [s for s, _ in derived], [r for _, r in derived])
    return out


class AttentionTable:
    """The attention curves of one GPU, with the fallbacks of the module doc. `borrow(kernel)`
    returns another GPU's table with that kernel measured, and the scale to apply to its rates."""

    def __init__(self, curves: dict[tuple[str, int, bool, str], Curve]):
        self.curves = curves

    def kernels(self) -> set[str]:
        return {k for k, _, _, _ in self.curves}

    def points(self, kernel: str) -> int:
        return sum(len(c.log_s) for key, c in self.curves.items() if key[0] == kernel)

    def _pick(self, kernel: str, d: int, causal: bool, pass_: str) -> tuple[Curve | None, bool, bool]:
        """(curve, same mask, same head dim) nearest to the query; None without any curve of the
        kernel and pass."""
        cands = [c for (k, _, _, p), c in self.curves.items() if k == kernel and p == pass_]
        if not cands:
            return None, False, False
        best = min(cands, key=lambda c: (c.causal != causal, abs(math.log(c.head_dim / d)), -len(c.log_s)))
        return best, best.causal == causal, best.head_dim == d

    def rate(self, kernel: str, seq: Scalars, d: int, causal: bool, pass_: str,
             shape_from: AttentionTable | None = None) -> tuple[Scalars, Scalars] | None:
        """(FLOP/s, provenance) of `kernel`'s `pass_` at `seq` queries (= keys) of head dim `d`;
        None when this GPU has no curve of that kernel and pass (nor a forward one for a backward:
        then the forward rate stands in, `EXTRAPOLATED`)."""
        curve, same_mask, same_d = self._pick(kernel, d, causal, pass_)
        worst = MEASURED
        if curve is None and pass_ != "fwd_bwd":
            # the combined rate prices forward + backward exactly in sum (3.5 F at one rate)
            curve, same_mask, same_d = self._pick(kernel, d, causal, "fwd_bwd")
        if curve is None and pass_ == "bwd":
            curve, same_mask, same_d = self._pick(kernel, d, causal, "fwd")
            worst = EXTRAPOLATED
        if curve is None:
            return None
        if len(curve.log_s) == 1 and shape_from is not None:
            ref, _, _ = shape_from._pick(kernel, d, curve.causal, curve.pass_)
            if ref is not None and len(ref.log_s) > 1:
                anchor = float(np.exp(curve.log_s[0]))
                r_ref, _ = ref.rate(seq)
                r_ref_anchor, _ = ref.rate(anchor)
                r = np.exp(curve.log_rate[0]) * np.asarray(r_ref) / float(r_ref_anchor)
                on = np.abs(np.log(np.asarray(seq, dtype=float)) - curve.log_s[0]) < 1e-3
                code = np.where(on, MEASURED, EXTRAPOLATED)
                curve_rate: tuple[Scalars, Scalars] = (r, code)
            else:
                curve_rate = curve.rate(seq)
        else:
            curve_rate = curve.rate(seq)
        r, code = curve_rate
        if not same_mask:
            r = r * tile_efficiency(seq, causal) / tile_efficiency(seq, curve.causal)
            worst = EXTRAPOLATED
        if not same_d:
            worst = EXTRAPOLATED
        code = np.maximum(code, worst)
        return r, code


__all__ = ["AttentionTable", "Curve", "curves_from_points", "tile_efficiency"]
