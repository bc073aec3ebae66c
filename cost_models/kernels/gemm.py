"""GEMM times of one GPU: a tile / wave model whose few parameters the GPU's measured GEMMs set,
corrected toward every measured point, and where a shape lies between measured ones, between them.

Shape model (per GPU and dtype class). A GEMM (m x k) @ (k x n), `count` of them grouped in one
kernel (experts), runs as output tiles of tm x tn, one per SM, in waves of `sm_count` tiles
(NVIDIA, "Matrix Multiplication Background User's Guide": tile and wave quantization). Its GPU time
is the fastest of the tile shapes in `TILES` and split-K factors in `SPLITS` of

    flops / (rate x tile rate x tile utilization x wave utilization x k / (k + k_overhead))

(split-K adds the fp32 reduction of its partial outputs), never shorter than its operands' HBM
traffic at `memory_share` of the bandwidth. A call timed by itself on an idle GPU (`isolated`
points) also pays `latency_s`, the fixed time of one call: on the H200 of 2026-11 (torch 2.11
`a @ b`) about 15 us, which is why GEMMs of 512 rows or fewer ran 1.4-4x slower than the tile
model without it. The parameters (`ShapeParams`: rate, latency, k overhead, memory share) are the
least-squares fit (log time) of that model to the GPU's own points, all four where its points span
at least `MIN_SPAN` in rows, only the rate otherwise (the rest from the best-measured GPU's fit:
latency is the host's and the library's, the tile physics is shared).

Correction. At each measured point the residual c = log(measured GPU time / model GPU time) is
kept. Along a measured line (points sharing n, k and dtype, m varying) it is interpolated linearly
in log m and decays linearly to 0 over `DECAY` (log units) beyond the line's ends; across lines it
is blended with modified Shepard weights ((r - d) / (r d))^2 in (log n, log k) within radius
`DECAY`, against a prior weight 1 / r^2 for "no correction": a query on a measured line gets that
line's correction exactly, one far from every line gets the shape model alone. So the table
reproduces every measured point (up to repeated measurements of one shape, which it averages), and
between points it follows the measurements, not the fit.

Provenance (`MEASURED`, `INTERPOLATED`, `EXTRAPOLATED`, `DATASHEET`): a query at a measured shape
(within 1%); between a line's points and within half the radius of it; anywhere else the GPU has
points; a GPU without points (priced from its datasheet peak: `ShapeParams.datasheet`).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

Scalars = Any  # a float or a numpy array (elementwise)

MEASURED, INTERPOLATED, EXTRAPOLATED, DATASHEET = 0, 1, 2, 3
PROVENANCE = ("measured", "interpolated", "extrapolated", "datasheet")
"""Names of the provenance codes, best first."""

TILE_K = 64
"""Elements of k one mainloop iteration consumes (CUTLASS / cuBLAS Hopper and Ampere BF16 kernels)."""


def _tile_rate(tm: int, tn: int, ref: tuple[int, int] = (128, 256)) -> float:
    """Throughput of a tm x tn tile relative to the large 128 x 256 tile: a tile loads (tm + tn)
    elements per k step and does tm * tn multiply-adds on them, so its data reuse is
    tm*tn / (tm + tn). Modelling choice (not fitted): the rate scales as the square root of that
    reuse, which keeps 128 x 128 tiles within ~13% of the large tile and halves nothing smaller
    than 64 x 64."""
    reuse = tm * tn / (tm + tn)
    ref_reuse = ref[0] * ref[1] / (ref[0] + ref[1])
    return min(1.0, (reuse / ref_reuse) ** 0.5)


TILES: tuple[tuple[int, int, float], ...] = tuple(
    (tm, tn, _tile_rate(tm, tn)) for tm, tn in ((128, 256), (256, 128), (128, 128), (64, 128), (128, 64), (64, 64))
)
"""CTA tile shapes (rows of the output x columns) a GEMM library chooses from, with their rates."""

SPLITS = (1, 2, 4, 8)
"""Split-K factors tried for thin GEMMs (k cut into s slices, partial outputs reduced in fp32)."""

SMALL = 16
"""Array lookups of at most this many shapes take the scalar path, shape by shape."""

MIN_SPAN = 8.0
"""A GPU's own points set all four shape parameters when their rows span at least this ratio
(max m / min m); otherwise they set the rate only."""

DECAY = math.log(4.0)
"""Log distance over which a measured correction fades into the shape model (a factor of 4 in a
dimension)."""


@dataclass(frozen=True)
class ShapeParams:
    """The shape model's parameters for one GPU and dtype class (module doc)."""

    rate: float  # FLOP/s of a large tile at full occupancy
    latency_s: float  # fixed seconds of one isolated call
    k_overhead: float  # elements of k a tile's prologue and epilogue cost
    memory_share: float  # share of the HBM bandwidth operand traffic streams at
    points: int = 0  # measured points the parameters were fitted to (0: datasheet)
    fitted: tuple[str, ...] = ()  # which parameters those points set


def gpu_seconds(m: Scalars, n: Scalars, k: Scalars, count: Scalars, sms: int | None, bandwidth: float,
                act_bytes: float, p: ShapeParams) -> Scalars:
    """GPU seconds of a GEMM group under the shape model (module doc), without the call latency.
    Elementwise over arrays; floats in, float out."""
    array = any(isinstance(x, np.ndarray) for x in (m, n, k, count))
    if not array:
        return _gpu_seconds_scalar(float(m), float(n), float(k), float(count), sms, bandwidth, act_bytes, p)
    m, n, k, count = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (m, n, k, count)))
    if m.size <= SMALL:  # a few shapes (a one-point fit): numpy's per-call cost exceeds the work
        return np.array([_gpu_seconds_scalar(*row, sms, bandwidth, act_bytes, p)
                         for row in zip(m.ravel().tolist(), n.ravel().tolist(), k.ravel().tolist(),
                                        count.ravel().tolist(), strict=True)]).reshape(m.shape)
    flops = 2.0 * m * n * k * count
    memory = act_bytes * (m * k + k * n + m * n) * count / (bandwidth * p.memory_share)
    k0 = p.k_overhead
    if sms is None:
        return np.maximum(flops / (p.rate * k / (k + k0)), memory)
    best = np.full(np.broadcast(m, n, k, count).shape, np.inf)
    area = m * n * count
    red_bw = bandwidth * p.memory_share
    for tm, tn, tile_rate in TILES:
        tiles = np.ceil(m / tm) * np.ceil(n / tn) * count
        util_tiles = area / (tiles * tm * tn)
        for split in SPLITS:
            kk = k / split
            waves = np.ceil(tiles * split / sms)
            busy = tiles * split / (waves * sms)
            t = flops / (p.rate * tile_rate * util_tiles * busy * kk / (kk + k0))
            if split > 1:
                t = np.where(kk >= 2 * TILE_K, t + area * 4 * (split + 1) / red_bw, np.inf)
            best = np.minimum(best, t)
    return np.maximum(best, memory)


def _gpu_seconds_scalar(m: float, n: float, k: float, count: float, sms: int | None, bandwidth: float,
                        act_bytes: float, p: ShapeParams) -> float:
    flops = 2.0 * m * n * k * count
    red_bw = bandwidth * p.memory_share
    memory = act_bytes * (m * k + k * n + m * n) * count / red_bw
    k0 = p.k_overhead
    if sms is None:
        return max(flops / (p.rate * k / (k + k0)), memory)
    best = math.inf
    area = m * n * count
    ceil = math.ceil
    for tm, tn, tile_rate in TILES:
        tiles = ceil(m / tm) * ceil(n / tn) * count
        base = flops / (p.rate * tile_rate * area / (tiles * tm * tn))
        for split in SPLITS:
            kk = k / split
            if split > 1 and kk < 2 * TILE_K:
                break
            waves = ceil(tiles * split / sms)
            t = base / (tiles * split / (waves * sms) * kk / (kk + k0))
            if split > 1:
                t += area * 4 * (split + 1) / red_bw
            if t < best:
                best = t
    return max(best, memory)


@dataclass(frozen=True)
class Line:
    """Measured residuals along m for one (n, k): sorted log m, and c there."""

    log_n: float
    log_k: float
    log_m: np.ndarray
    c: np.ndarray


class Corrections:
    """The measured residuals of one GPU and dtype class, interpolated (module doc)."""

    def __init__(self, lines: list[Line]):
        self.lines = lines
        self._scalar = [(ln.log_n, ln.log_k, ln.log_m.tolist(), ln.c.tolist()) for ln in lines]

    def evaluate_scalar(self, m: float, n: float, k: float) -> tuple[float, int]:
        """`evaluate` for one query, in plain Python (the planner's scalar hot path)."""
        lm, ln, lk = math.log(m), math.log(n), math.log(k)
        r = DECAY
        num, den = 0.0, 1.0 / r**2
        inside = exact = False
        for log_n, log_k, xs, ys in self._scalar:
            d = math.hypot(ln - log_n, lk - log_k)
            if d >= r:
                continue
            if lm <= xs[0]:
                beyond = xs[0] - lm
                c = ys[0] * max(1.0 - beyond / r, 0.0)
            elif lm >= xs[-1]:
                beyond = lm - xs[-1]
                c = ys[-1] * max(1.0 - beyond / r, 0.0)
            else:
                beyond = 0.0
                i = bisect.bisect_right(xs, lm)
                c = ys[i - 1] + (lm - xs[i - 1]) / (xs[i] - xs[i - 1]) * (ys[i] - ys[i - 1])
            if d < 1e-2:
                w = 1e12
                if min(abs(lm - x) for x in xs) < 1e-2:
                    exact = True
            else:
                w = ((r - d) / (r * d)) ** 2
            num += w * c
            den += w
            if beyond <= 1e-9 and d < r / 2:
                inside = True
        code = MEASURED if exact else (INTERPOLATED if inside else EXTRAPOLATED)
        return num / den, code

    @classmethod
    def from_points(cls, m: np.ndarray, n: np.ndarray, k: np.ndarray, c: np.ndarray) -> Corrections:
        """Lines from measured points (shapes measured more than once: the mean of their residuals)."""
        groups: dict[tuple[float, float], dict[float, list[float]]] = {}
        for mi, ni, ki, ci in zip(m, n, k, c, strict=True):
            groups.setdefault((float(ni), float(ki)), {}).setdefault(float(mi), []).append(float(ci))
        lines = []
        for (ni, ki), by_m in sorted(groups.items()):
            ms = sorted(by_m)
            lines.append(Line(math.log(ni), math.log(ki), np.log(np.array(ms)), np.array([np.mean(by_m[x]) for x in ms])))
        return cls(lines)

    def __bool__(self) -> bool:
        return bool(self.lines)

    def evaluate(self, m: Scalars, n: Scalars, k: Scalars) -> tuple[Scalars, Scalars]:
        """(correction c, provenance code) at the queries (elementwise)."""
        lm, ln, lk = np.log(np.asarray(m, dtype=float)), np.log(np.asarray(n, dtype=float)), np.log(np.asarray(k, dtype=float))
        shape = np.broadcast(lm, ln, lk).shape
        r = DECAY
        num = np.zeros(shape)
        den = np.full(shape, 1.0 / r**2)
        nearest = np.full(shape, np.inf)
        inside = np.zeros(shape, dtype=bool)
        exact = np.zeros(shape, dtype=bool)
        for line in self.lines:
            d = np.sqrt((ln - line.log_n) ** 2 + (lk - line.log_k) ** 2)
            lo, hi = line.log_m[0], line.log_m[-1]
            c_line = np.interp(lm, line.log_m, line.c)
            beyond = np.maximum(lo - lm, 0.0) + np.maximum(lm - hi, 0.0)
            c_line = c_line * np.maximum(1.0 - beyond / r, 0.0)
            on_line = d < 1e-2
            w = np.where(on_line, 1e12, (np.maximum(r - d, 0.0) / (r * np.maximum(d, 1e-12))) ** 2)
            num = num + w * c_line
            den = den + w
            within = (beyond <= 1e-9) & (d < r / 2)
            inside |= within
            exact |= on_line & (np.min(np.abs(lm[..., None] - line.log_m), axis=-1) < 1e-2)
            nearest = np.minimum(nearest, d + beyond)
        c = num / den
        code = np.where(exact, MEASURED, np.where(inside, INTERPOLATED, EXTRAPOLATED))
        if c.ndim == 0:
            return float(c), int(code)
        return c, code

    def leave_one_out(self) -> np.ndarray:
        """|log error| of predicting each interior point of a line from its two neighbours (linear
        in log m): the interpolation error between measured points."""
        errs = []
        for line in self.lines:
            x, y = line.log_m, line.c
            for i in range(1, len(x) - 1):
                pred = y[i - 1] + (y[i + 1] - y[i - 1]) * (x[i] - x[i - 1]) / (x[i + 1] - x[i - 1])
                errs.append(abs(pred - y[i]))
        return np.array(errs)


def best_case_seconds(m: Scalars, n: Scalars, k: Scalars, bandwidth: float, act_bytes: float, p: ShapeParams) -> Scalars:
    """GPU seconds of a GEMM at the shape model's large-tile rate with no tile, wave or k loss:
    what a best-of-search figure (`schema.Source.selection`) is read as, the shape a search over
    shapes finds being one the library tiles without loss."""
    flops = 2.0 * np.asarray(m, dtype=float) * n * k
    memory = act_bytes * (np.asarray(m, dtype=float) * k + k * n + m * n) / (bandwidth * p.memory_share)
    return np.maximum(flops / p.rate, memory)


def fit_shape(m: np.ndarray, n: np.ndarray, k: np.ndarray, seconds: np.ndarray, isolated: np.ndarray, sms: int | None,
              bandwidth: float, act_bytes: float, prior: ShapeParams, best: np.ndarray | None = None) -> ShapeParams:
    """Least-squares fit (log time, Levenberg-Marquardt in numpy) of the shape model to measured
    points: all four parameters where the rows span `MIN_SPAN`, the rate alone otherwise (module doc).
    Isolated points' model time includes the call latency, queued points' does not; best-of-search
    points (`best`) are modelled by `best_case_seconds`."""
    best = np.zeros(len(m), dtype=bool) if best is None else best
    span = float(np.max(m) / np.min(m)) if len(m) else 1.0
    full = span >= MIN_SPAN and len(m) >= 8
    names = ("rate", "latency_s", "k_overhead", "memory_share") if full else ("rate",)

    def params(x: np.ndarray) -> ShapeParams:
        rate = math.exp(x[0])
        if not full:
            return ShapeParams(rate, prior.latency_s, prior.k_overhead, prior.memory_share, len(m), names)
        return ShapeParams(rate, math.exp(x[1]), math.exp(x[2]), 1.0 / (1.0 + math.exp(-x[3])), len(m), names)

    def residuals(x: np.ndarray) -> np.ndarray:
        p = params(x)
        t = np.where(best, best_case_seconds(m, n, k, bandwidth, act_bytes, p),
                     gpu_seconds(m, n, k, np.ones_like(m), sms, bandwidth, act_bytes, p))
        return np.log((t + np.where(isolated, p.latency_s, 0.0)) / seconds)

    share = min(max(prior.memory_share, 1e-3), 1 - 1e-3)
    x = np.array([math.log(prior.rate), math.log(max(prior.latency_s, 1e-7)), math.log(max(prior.k_overhead, 1.0)),
                  math.log(share / (1 - share))])
    if not full:
        x = x[:1]
    lam = 1e-2
    r = residuals(x)
    cost = float(r @ r)
    for _ in range(60):
        if cost < 1e-20:  # an exact fit (a rate to one point)
            break
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            dx = np.zeros_like(x)
            dx[j] = 1e-4
            jac[:, j] = (residuals(x + dx) - r) / 1e-4
        g = jac.T @ r
        h = jac.T @ jac
        step = np.linalg.solve(h + lam * np.diag(np.diag(h) + 1e-12), -g)
        trial = x + step
        r_trial = residuals(trial)
        cost_trial = float(r_trial @ r_trial)
        if cost_trial < cost:
            x, r, lam = trial, r_trial, lam / 3
            if cost - cost_trial < 1e-10:
                cost = cost_trial
                break
            cost = cost_trial
        else:
            lam *= 5
            if lam > 1e8:
                break
    return params(x)
