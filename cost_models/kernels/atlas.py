"""The kernel atlas of every GPU: measured rates (`cost_models/data/atlas/*.json`) and their lookup.

`atlas_for(gpu)` returns the `KernelAtlas` of a `GPUSpec`: its GEMM tables (16-bit and FP8),
attention curves, memory-bound bandwidth and collective size curves, each from the GPU's own atlas
file where it has one, else from a *die sibling's* file (`AtlasFile` entries name the GPUs that
share their die, `SIBLINGS`: H800 and the 500 W H100 take the H100 SXM's kernels at their own
clock), else from the datasheet. Every lookup also returns its provenance (`gemm.PROVENANCE`).

Derived, never stored (recomputed from the points whenever the files change):
- the GEMM shape parameters of each GPU (`gemm.fit_shape`); the *reference* fit is the GPU with
  the most GEMM points, whose latency, k overhead and memory share GPUs with few points use;
- the *best-of-search discount*: a figure that is the best of a search over shapes (ML
  Engineering's maximum achievable matmul FLOP/s, `Source.selection`) is read at the shape model's
  large-tile rate with no tile, wave or k loss (`gemm.best_case_seconds`: the search found a shape
  the library tiles without loss), and it tops the GPU's spread: the reference GPU, measured both
  ways, gives the ratio of its fitted large-tile rate to its best-of-search figure (0.94 on the
  H200), and every best-of-search point is read as that much slower;
- the *datasheet share*: the median over measured GPUs of their large-GEMM rate over their dense
  peak, which prices a GPU without measurements (at its `sustained_clock_fraction`);
- the memory-bound share (achieved / datasheet HBM bandwidth): the GPU's own, else the median of
  the measured ones;
- `Uncertainty`: how far each provenance class has been off, measured on the atlas itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from cluster_specs.spec import GPUSpec
from cost_models.interning import KeptMemo
from cost_models.kernels import attention as attn
from cost_models.kernels import collectives as coll
from cost_models.kernels import gemm
from cost_models.kernels import record as rec
from cost_models.kernels.schema import AtlasFile, parse_atlas

Scalars = Any

SIBLINGS: dict[str, str] = {
    "H800-80GB": "H100-80GB",
    "H100-96GB-HBM2e-500W": "H100-80GB",
    "A100-40GB": "A100-80GB",
    "GB300": "B300",
}
"""GPUs priced with a die sibling's measured kernels (same SMs and tensor cores; memory and links
their own), at the ratio of their dense peaks x `sustained_clock_fraction` (the clock): H800 is the
export H100 SXM (NVLink cut), the Grand Teton H100 the same GH100 SXM die with HBM2e at 500 W
(0.922 of the clock), A100-40GB the same GA100 SXM as the 80 GB part (ML Engineering's A100 SXM
figure states no memory size), GB300 the Blackwell Ultra GPU of the B300 on a superchip (its 2.5
PFLOP/s bf16 datasheet peak against B300's 2.25: a higher clock at 1400 W). Their lookups are at
best `EXTRAPOLATED`."""

DTYPE_CLASS = {"bf16": "16", "fp16": "16", "fp8": "fp8", "fp32": "16"}
"""GEMM table a precision reads (fp32 training's GEMMs run in TF32 at the 16-bit shape; FP8 has its own)."""

ACT_BYTES = {"16": 2.0, "fp8": 1.0}

K_STEP_RATIO = {"16": 1.0, "fp8": 2.0}
"""Elements of k per mainloop step over the 16-bit kernels' (`gemm.TILE_K`): an FP8 tile loads as
many bytes per step, twice the elements (CUTLASS Hopper FP8 kernels: 128-deep k steps against 64),
so a tile's fixed prologue and epilogue cost twice the elements of k (the FP8 shape model's
k overhead, which FP8's single measured points cannot set)."""


@lru_cache(maxsize=1)
def _files() -> dict[str, AtlasFile]:
    """Every shipped atlas file, keyed by the catalog name of its GPU."""
    from cluster_specs.catalog import get_gpu

    out: dict[str, AtlasFile] = {}
    folder = resources.files("cost_models").joinpath("data/atlas")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        import json

        doc = parse_atlas(json.loads(entry.read_text()), f"cost_models/data/atlas/{entry.name}")
        name = get_gpu(doc.gpu).name
        if name in out:
            raise ValueError(f"two atlas files for GPU {name}")
        out[name] = doc
    return out


def atlas_files() -> dict[str, AtlasFile]:
    """The shipped atlas files by GPU (read-only)."""
    return dict(_files())


@dataclass(frozen=True)
class GemmTable:
    """One GPU's GEMMs of one dtype class: shape parameters, measured corrections, provenance floor."""

    params: gemm.ShapeParams
    corrections: gemm.Corrections | None
    floor: int  # best provenance a query can have (MEASURED own points, EXTRAPOLATED a sibling's, DATASHEET)
    sms: int | None
    bandwidth: float  # HBM bytes/s (datasheet)
    scale: float = 1.0  # rate over the measured GPU's: a die sibling's peak x clock ratio where borrowed
    dtype_class: str = "16"  # the `DTYPE_CLASS` it prices (what `record` names its lookups by)
    memo: dict = field(default_factory=dict, repr=False, compare=False)
    """Scalar lookups before `scale` (the planner prices the same shapes under many geometries); a
    copy with another scale (`dataclasses.replace`) shares it, as it shares the parameters."""

    def seconds(self, m: Scalars, n: Scalars, k: Scalars, count: Scalars, act_bytes: float,
                latency_exposed: float = 0.0) -> Scalars:
        """Seconds of a GEMM group: GPU time (shape model x measured correction, elementwise over
        arrays) plus `latency_exposed` x the call's fixed latency (1: the time of one isolated
        call, as the H200 points were timed; `cost_models.compute` adds the latency per kernel
        launch at the stack's exposure instead)."""
        if not any(isinstance(x, np.ndarray) for x in (m, n, k, count)):
            return self._scalar(float(m), float(n), float(k), float(count), float(act_bytes)) + latency_exposed * self.params.latency_s
        # arrays: the same operations elementwise (numpy's exp may differ from math's in the last
        # place: an entry agrees with the scalar lookup of its shape to 1e-15), on the distinct
        # shapes only (the planner's geometries repeat most shapes: `_distinct`)
        t, _ = self.lookup(m, n, k, count, act_bytes)
        return t + latency_exposed * self.params.latency_s

    def lookup(self, m: Scalars, n: Scalars, k: Scalars, count: Scalars,
               act_bytes: float) -> tuple[np.ndarray, np.ndarray]:
        """(GPU seconds, provenance code) of array shapes, elementwise, each distinct shape looked
        up once (the planner's geometries repeat most shapes: `_distinct`)."""
        ms, ns, ks, cs = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (m, n, k, count)))
        (um, un, uk, uc), inverse = _distinct(ms.ravel(), ns.ravel(), ks.ravel(), cs.ravel())
        if rec.ACTIVE:
            rec.gemm(self.dtype_class, um, un, uk)
        t = gemm.gpu_seconds(um, un, uk, uc, self.sms, self.bandwidth, act_bytes, self.params)
        if self.corrections:
            c, code = self.corrections.evaluate(um, un, uk)
            t = t * np.exp(c)
            code = np.maximum(code, self.floor)
        else:
            code = np.full(len(um), self.floor, dtype=int)
        return (t[inverse] / self.scale).reshape(ms.shape), code[inverse].reshape(ms.shape)

    def _scalar(self, m: float, n: float, k: float, count: float, act_bytes: float) -> float:
        """GPU seconds of one shape (memoized in `memo`, before the scale)."""
        if rec.ACTIVE:
            rec.gemm(self.dtype_class, m, n, k)
        key = (m, n, k, count, act_bytes)
        t = self.memo.get(key)
        if t is None:
            t = gemm.gpu_seconds(m, n, k, count, self.sms, self.bandwidth, act_bytes, self.params)
            if self.corrections:
                t *= math.exp(self.corrections.evaluate_scalar(m, n, k)[0])
            if len(self.memo) > 1 << 18:
                self.memo.clear()
            self.memo[key] = t
        return t / self.scale

    def provenance(self, m: Scalars, n: Scalars, k: Scalars) -> Scalars:
        """Provenance code of each shape (`gemm.PROVENANCE`), at least the table's `floor`."""
        if not any(isinstance(x, np.ndarray) for x in (m, n, k)):
            code = self.corrections.evaluate_scalar(float(m), float(n), float(k))[1] if self.corrections else self.floor
            return max(code, self.floor)
        if not self.corrections:
            return np.maximum(np.zeros(np.broadcast(np.asarray(m), np.asarray(n), np.asarray(k)).shape, dtype=int),
                              self.floor)
        _, code = self.corrections.evaluate(m, n, k)
        return np.maximum(code, self.floor)


_MIX = (1.0, 0.7071067811865476, 1.3247179572447460, 2.718281828459045)


def _distinct(*columns: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """The distinct rows of equal-length float columns and each row's index among them. Fast
    path: one sort of a mixed key (a weighted sum of the columns), its groups checked against every
    column (two rows with equal keys but different values fail the check); otherwise every column
    coded by its sorted distinct values, the codes combined into one exact integer key."""
    mixed = sum(w * c for w, c in zip(_MIX, columns, strict=False))  # (more columns: checked below)
    _, first, inverse = np.unique(mixed, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    reps = tuple(col[first] for col in columns)
    if all(np.array_equal(r[inverse], col) for r, col in zip(reps, columns, strict=True)):
        return reps, inverse
    key = np.zeros(len(columns[0]), dtype=np.int64)
    for col in columns:
        values, codes = np.unique(col, return_inverse=True)
        key = key * len(values) + codes.ravel()
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return tuple(col[first] for col in columns), inverse.ravel()


@dataclass(frozen=True)
class Uncertainty:
    """Relative slow-end margin of a kernel time by provenance (`gemm.PROVENANCE` order), measured
    on the atlas: repeated measurements of one shape (half their median spread), interpolating a
    measured point from its neighbours (80th percentile), the shape model against the best-measured
    GPU's points (80th percentile of |log error|), and a GPU priced from its datasheet (that, and
    the spread of the measured GPUs' large-GEMM shares, in quadrature)."""

    by_provenance: tuple[float, float, float, float]

    def of(self, code: Scalars) -> Scalars:
        return np.asarray(self.by_provenance)[np.asarray(code, dtype=int)]


@dataclass
class KernelAtlas:
    """A GPU's kernels (module doc)."""

    gpu: GPUSpec
    source: str  # the atlas file's GPU ("" for datasheet)
    gemm: dict[str, GemmTable]
    attention: attn.AttentionTable | None
    memory_share: float
    memory_floor: int
    collectives: list[coll.SizeCurve] = field(default_factory=list)
    memo: dict = field(default_factory=dict, repr=False)
    """Scalar attention lookups of this GPU."""

    def gemm_table(self, precision: str) -> GemmTable:
        cls = DTYPE_CLASS.get(precision, "16")
        return self.gemm.get(cls) or self.gemm["16"]

    def memory_bandwidth(self) -> float:
        """Bytes/s streaming memory-bound kernels sustain on this GPU."""
        return self.gpu.memory_bandwidth_bytes_per_s * self.memory_share

    def attention_rate(self, kernels: tuple[str, ...], seq: Scalars, head_dim: int, causal: bool, pass_: str
                       ) -> tuple[Scalars, Scalars]:
        """(FLOP/s, provenance) of the first of `kernels` this GPU (or, borrowed, another) has.
        Arrays of lengths: every distinct length through the scalar lookup (bit for bit)."""
        if rec.ACTIVE:
            rec.attention(kernels, seq, head_dim, causal, pass_)
        if isinstance(seq, np.ndarray):
            values, inverse = np.unique(seq, return_inverse=True)
            pairs = [self._attention_rate(kernels, float(v), head_dim, causal, pass_) for v in values.tolist()]
            rates = np.array([float(r) for r, _ in pairs])[inverse].reshape(seq.shape)
            codes = np.array([int(c) for _, c in pairs])[inverse].reshape(seq.shape)
            return rates, codes
        key = (kernels, float(seq), head_dim, causal, pass_)
        hit = self.memo.get(key)
        if hit is None:
            r, c = self._attention_rate(kernels, float(seq), head_dim, causal, pass_)
            hit = self.memo[key] = (float(r), int(c))
        return hit

    def _attention_rate(self, kernels: tuple[str, ...], seq: float, head_dim: int, causal: bool, pass_: str
                        ) -> tuple[Scalars, Scalars]:
        reg = _registry()
        for kernel in kernels:
            if self.attention is not None and kernel in self.attention.kernels():
                out = self.attention.rate(kernel, seq, head_dim, causal, pass_, reg.shape_source(kernel))
                if out is not None:
                    r, code = out
                    return r * self.gemm["16"].scale, np.maximum(code, self._attention_floor())
        donor = reg.attention_donor(kernels, self.gpu)
        if donor is not None:
            kernel, table, donor_atlas = donor
            out = table.rate(kernel, seq, head_dim, causal, pass_, reg.shape_source(kernel))
            if out is not None:
                r, code = out
                ratio = self.gemm["16"].params.rate * self.gemm["16"].scale / (
                    donor_atlas.gemm["16"].params.rate * donor_atlas.gemm["16"].scale)
                floor = gemm.DATASHEET if self.source == "" else gemm.EXTRAPOLATED
                return r * ratio, np.maximum(code, floor)
        raise KeyError(f"no atlas measures any of the attention kernels {kernels}")

    def _attention_floor(self) -> int:
        """Own measurements can be `MEASURED`; a die sibling's are `EXTRAPOLATED` at best."""
        return gemm.MEASURED if self.source == self.gpu.name else gemm.EXTRAPOLATED

    def collective_curve(self, span: str) -> tuple[coll.SizeCurve | None, bool]:
        """The size curve of `span` ("nvlink" or "nic") of a ring collective, the algorithm the
        alpha-beta model describes: this GPU's own, else the best-measured one of that span on any
        GPU; and whether it is this GPU's own."""
        own = [c for c in self.collectives if c.span == span and usable_curve(c)]
        if own:
            return max(own, key=lambda c: (c.ranks * c.nodes, len(c.log_bytes))), True
        return _registry().collective_curve(span), False


class _Registry:
    """Every GPU's atlas and the quantities derived across them (module doc)."""

    def __init__(self) -> None:
        from cluster_specs.catalog import get_gpu

        self.files = _files()
        self.gpus = {name: get_gpu(name) for name in self.files}
        self.reference = self._reference_fit()
        self.discount = self._best_of_search_discount()
        self.tables: dict[str, dict[str, GemmTable]] = {name: self._own_tables(doc) for name, doc in self.files.items()}
        self.datasheet_share = self._datasheet_share()
        self.memory_measured = {
            name: max(p.gb_per_s for p in doc.memory) * 1e9 / self.gpus[name].memory_bandwidth_bytes_per_s
            for name, doc in self.files.items() if doc.memory
        }
        self.memory_default = float(np.median(list(self.memory_measured.values()))) if self.memory_measured else 1.0
        self.attention = {name: attn.AttentionTable(attn.curves_from_points(doc.attention))
                          for name, doc in self.files.items() if doc.attention}
        self.collectives = {name: coll.curves_from_points(list(doc.collectives)) for name, doc in self.files.items()}
        self.uncertainty = self._uncertainty()

    # --- GEMM ----------------------------------------------------------------------------------
    def _points(self, doc: AtlasFile, cls: str, best: bool | None = None) -> tuple[np.ndarray, ...]:
        """(m, n, k, seconds, isolated) of a file's GEMMs of one dtype class; `best`: only the
        best-of-search points (True) or only the others (False)."""
        pts = [p for p in doc.gemm if DTYPE_CLASS[p.dtype] == cls
               and (best is None or (doc.sources[p.source].selection == "best_of_search") == best)]
        m = np.array([p.m for p in pts], dtype=float)
        n = np.array([p.n for p in pts], dtype=float)
        k = np.array([p.k for p in pts], dtype=float)
        t = np.array([p.time_s for p in pts], dtype=float)
        iso = np.array([doc.sources[p.source].method == "isolated" for p in pts], dtype=bool)
        return m, n, k, t, iso

    def _reference_fit(self) -> gemm.ShapeParams:
        """The 16-bit shape fit of the GPU with the most 16-bit GEMM points, on its points that
        are not best-of-search (module doc)."""
        name = self._reference_name()
        gpu = self.gpus[name]
        m, n, k, t, iso = self._points(self.files[name], "16", best=False)
        prior = gemm.ShapeParams(0.75 * gpu.peak("bf16"), 10e-6, 2.0 * gemm.TILE_K, 0.8)
        return gemm.fit_shape(m, n, k, t, iso, gpu.sm_count, gpu.memory_bandwidth_bytes_per_s, 2.0, prior)

    def _best_of_search_discount(self) -> float:
        """Measured / shape-model time of the reference GPU's best-of-search figures (mean in log):
        below 1, how much faster a best-of-search figure is than the typical shape (module doc)."""
        name = self._reference_name()
        gpu = self.gpus[name]
        m, n, k, t, iso = self._points(self.files[name], "16", best=True)
        if not len(m):
            return 1.0
        model = gemm.best_case_seconds(m, n, k, gpu.memory_bandwidth_bytes_per_s, 2.0, self.reference) + np.where(
            iso, self.reference.latency_s, 0.0)
        return float(np.exp(np.mean(np.log(t / model))))

    def _own_tables(self, doc: AtlasFile, gpu: GPUSpec | None = None) -> dict[str, GemmTable]:
        """GEMM tables fitted on `doc`'s points: a shipped file's (its GPU found by the file), or a
        profile merged over one (`overlay.merge`) for `gpu`."""
        if gpu is None:
            gpu = self.gpus[self._name(doc)]
        name = gpu.name
        out = {}
        for cls in ("16", "fp8"):
            m, n, k, t, iso = self._points(doc, cls)
            if not len(m):
                continue
            if name == self._reference_name() and cls == "16":
                # the reference's best-of-search figures set the discount, not its table
                m, n, k, t, iso = self._points(doc, cls, best=False)
            best = np.array([doc.sources[p.source].selection == "best_of_search"
                             for p in doc.gemm if DTYPE_CLASS[p.dtype] == cls], dtype=bool)
            if name == self._reference_name() and cls == "16":
                best = np.zeros(len(m), dtype=bool)
            else:
                t = np.where(best, t / self.discount, t)
            peak = gpu.peak("fp8" if cls == "fp8" else "bf16")
            ref = self.reference
            prior = gemm.ShapeParams(peak * ref.rate / self.gpus[self._reference_name()].peak("bf16"),
                                     ref.latency_s, ref.k_overhead * K_STEP_RATIO[cls], ref.memory_share)
            act = ACT_BYTES[cls]
            bw = gpu.memory_bandwidth_bytes_per_s
            if name == self._reference_name() and cls == "16":
                p = ref
            else:
                p = gemm.fit_shape(m, n, k, t, iso, gpu.sm_count, bw, act, prior, best)
            model = np.where(best, gemm.best_case_seconds(m, n, k, bw, act, p),
                             gemm.gpu_seconds(m, n, k, np.ones_like(m), gpu.sm_count, bw, act, p))
            measured_gpu = np.maximum(t - np.where(iso, p.latency_s, 0.0), 1e-3 * t)
            corr = gemm.Corrections.from_points(m, n, k, np.log(measured_gpu / model))
            out[cls] = GemmTable(p, corr, gemm.MEASURED, gpu.sm_count, bw, dtype_class=cls)
        return out

    def _name(self, doc: AtlasFile) -> str:
        return next(name for name, d in self.files.items() if d is doc)

    def _reference_name(self) -> str:
        return max(sorted(self.files), key=lambda g: sum(DTYPE_CLASS[p.dtype] == "16" for p in self.files[g].gemm))

    def _datasheet_share(self) -> dict[str, float]:
        """Per dtype class: median over measured GPUs of fitted rate / dense peak."""
        out = {}
        for cls in ("16", "fp8"):
            shares = [t[cls].params.rate / self.gpus[name].peak("fp8" if cls == "fp8" else "bf16")
                      for name, t in self.tables.items() if cls in t]
            out[cls] = float(np.median(shares)) if shares else 0.75
        return out

    def datasheet_tables(self, gpu: GPUSpec) -> dict[str, GemmTable]:
        """GEMM tables of a GPU without measurements: its dense peak x the datasheet share x its
        sustained clock, the reference shape otherwise (module doc)."""
        ref = self.reference
        out = {}
        for cls in ("16", "fp8"):
            precision = "fp8" if cls == "fp8" else "bf16"
            if cls == "fp8" and "fp8" not in gpu.peak_flops_per_s:
                continue
            peak = gpu.peak(precision) if precision in gpu.peak_flops_per_s or precision == "fp8" else gpu.peak("fp16")
            rate = peak * self.datasheet_share[cls] * gpu.sustained_clock_fraction
            params = gemm.ShapeParams(rate, ref.latency_s, ref.k_overhead * K_STEP_RATIO[cls], ref.memory_share)
            out[cls] = GemmTable(params, None, gemm.DATASHEET, gpu.sm_count, gpu.memory_bandwidth_bytes_per_s,
                                 dtype_class=cls)
        return out

    # --- attention and collectives ------------------------------------------------------------
    def shape_source(self, kernel: str) -> attn.AttentionTable | None:
        """The GPU table with the most points of `kernel` (shapes for one-point curves)."""
        tables = [t for t in self.attention.values() if kernel in t.kernels()]
        return max(tables, key=lambda t: t.points(kernel)) if tables else None

    def attention_donor(self, kernels: tuple[str, ...], gpu: GPUSpec) -> tuple[str, attn.AttentionTable, KernelAtlas] | None:
        """The nearest GPU that measured one of `kernels` (module doc of `cost_models.kernels.
        attention`): the same architecture generation first, then the same tensor-core class, then
        the most points; and the first of `kernels` it measured."""
        from cluster_specs.catalog import gpu_generation

        cands = [(name, t) for name, t in sorted(self.attention.items()) if set(kernels) & t.kernels()]
        if not cands:
            return None
        gen = gpu_generation(gpu.name)
        cands.sort(key=lambda x: (gpu_generation(x[0]) != gen, self.gpus[x[0]].warpgroup_mma != gpu.warpgroup_mma,
                                  -sum(x[1].points(k) for k in kernels)))
        name, table = cands[0]
        kernel = next(k for k in kernels if k in table.kernels())
        return kernel, table, atlas_for(self.gpus[name])

    def collective_curve(self, span: str) -> coll.SizeCurve | None:
        cands = [c for curves in self.collectives.values() for c in curves if c.span == span and usable_curve(c)]
        return max(cands, key=lambda c: (c.ranks * c.nodes, len(c.log_bytes), c.source)) if cands else None

    def nic_efficiency(self) -> float | None:
        """Large-buffer bus bandwidth over the NICs' line rate, of the NIC-spanning curves (median)."""
        effs = [c.nic_efficiency for curves in self.collectives.values() for c in curves if c.nic_efficiency]
        return float(np.median(effs)) if effs else None

    # --- uncertainty ---------------------------------------------------------------------------
    def _uncertainty(self) -> Uncertainty:
        name = self._reference_name()
        table = self.tables[name]["16"]
        gpu = self.gpus[name]
        m, n, k, t, iso = self._points(self.files[name], "16")
        model = gemm.gpu_seconds(m, n, k, np.ones_like(m), gpu.sm_count, gpu.memory_bandwidth_bytes_per_s, 2.0,
                                 table.params) + np.where(iso, table.params.latency_s, 0.0)
        extrapolated = float(np.quantile(np.abs(np.log(model / t)), 0.8))
        assert table.corrections is not None
        loo = table.corrections.leave_one_out()
        interpolated = float(np.quantile(loo, 0.8)) if len(loo) else extrapolated
        repeats: dict[tuple, list[float]] = {}
        for mi, ni, ki, ti in zip(m, n, k, t, strict=True):
            repeats.setdefault((mi, ni, ki), []).append(ti)
        spreads = [abs(math.log(max(v) / min(v))) / 2 for v in repeats.values() if len(v) > 1]
        measured = float(np.median(spreads)) if spreads else interpolated / 2
        shares = [tb["16"].params.rate / self.gpus[g].peak("bf16") for g, tb in self.tables.items() if "16" in tb]
        spread = float(np.quantile(np.abs(np.log(np.array(shares) / self.datasheet_share["16"])), 0.8)) if shares else 0.1
        datasheet = math.hypot(extrapolated, spread)
        return Uncertainty((measured, max(interpolated, measured), max(extrapolated, interpolated), datasheet))


def usable_curve(curve: coll.SizeCurve) -> bool:
    """Whether a size curve stands for the ring collectives `cost_models.comm` prices: a ring inside
    an NVLink domain (NVLS reduces in the switch), any algorithm across NICs."""
    return curve.algorithm == "ring" or curve.span == "nic"


@lru_cache(maxsize=1)
def _registry() -> _Registry:
    return _Registry()


_ATLASES: KeptMemo[KernelAtlas] = KeptMemo(64)


def atlas_for(gpu: GPUSpec) -> KernelAtlas:
    """The kernel atlas of `gpu` (module doc): its own file, a die sibling's, or its datasheet;
    with `GPUSpec.kernel_profile`, that measured profile layered over it (`overlay`). Memoized on
    the GPU object (`KeptMemo`: pricing asks for it thousands of times per search, and a
    GPUSpec hashes its dict fields afresh each time), equal GPUs sharing one atlas (`_atlas_of`)."""
    atlas = _ATLASES.get(id(gpu))
    if atlas is None:
        atlas = _ATLASES.put(id(gpu), gpu, _atlas_of(gpu))
    return atlas


@lru_cache(maxsize=64)
def _atlas_of(gpu: GPUSpec) -> KernelAtlas:
    """`atlas_for`, memoized on the GPU's values."""
    if gpu.kernel_profile:
        return _profiled_atlas(gpu)
    reg = _registry()
    name = gpu.name
    sibling = SIBLINGS.get(name)
    if name in reg.files:
        # the GPU's own measurements, at the clock it sustains in training relative to theirs
        # (`GPUSpec.sustained_clock_fraction`: 1 unless a source says otherwise)
        own = {cls: replace(t, scale=gpu.sustained_clock_fraction) for cls, t in reg.tables[name].items()}
        datasheet = reg.datasheet_tables(gpu)
        tables: dict[str, GemmTable] = {**datasheet, **own}
        mem = reg.memory_measured.get(name)
        return KernelAtlas(
            gpu, name, tables, reg.attention.get(name), mem if mem is not None else reg.memory_default,
            gemm.MEASURED if mem is not None else gemm.DATASHEET, reg.collectives.get(name, []),
        )
    if sibling and sibling in reg.files:
        base = atlas_for(reg.gpus[sibling])
        donor = reg.gpus[sibling]
        clock = gpu.peak("bf16") * gpu.sustained_clock_fraction / (donor.peak("bf16") * donor.sustained_clock_fraction)
        tables = {str(cls): GemmTable(t.params, t.corrections, max(t.floor, gemm.EXTRAPOLATED), gpu.sm_count,
                                      gpu.memory_bandwidth_bytes_per_s, t.scale * clock, dtype_class=str(cls))
                  for cls, t in base.gemm.items()}
        return KernelAtlas(gpu, sibling, tables, base.attention, base.memory_share, max(base.memory_floor, gemm.EXTRAPOLATED),
                           [])
    return KernelAtlas(gpu, "", reg.datasheet_tables(gpu), None, reg.memory_default, gemm.DATASHEET, [])


def _profiled_atlas(gpu: GPUSpec) -> KernelAtlas:
    """`gpu`'s atlas from its shipped file (if any) merged with the registered profile its
    `kernel_profile` names (`overlay.merge`): the GEMM tables refitted on the merged points,
    attention curves, memory share and collective curves from the merged points where it has any,
    the shipped atlas's (own, sibling's or datasheet) otherwise. The profile's points are the GPU's
    own measurements: `MEASURED` where a lookup falls on one."""
    from cost_models.kernels import overlay

    reg = _registry()
    profile = overlay.registered(gpu.kernel_profile)
    plain = gpu.model_copy(update={"kernel_profile": ""})
    base = atlas_for(plain)
    doc = overlay.merge(reg.files.get(gpu.name), profile)
    own = {cls: replace(t, scale=gpu.sustained_clock_fraction) for cls, t in reg._own_tables(doc, gpu).items()}
    tables: dict[str, GemmTable] = {**base.gemm, **own} if own else dict(base.gemm)
    attention = attn.AttentionTable(attn.curves_from_points(doc.attention)) if doc.attention else base.attention
    if doc.memory:
        memory, floor = max(p.gb_per_s for p in doc.memory) * 1e9 / gpu.memory_bandwidth_bytes_per_s, gemm.MEASURED
    else:
        memory, floor = base.memory_share, base.memory_floor
    curves = coll.curves_from_points(list(doc.collectives)) or base.collectives
    source = gpu.name if (own or doc.attention) else base.source
    return KernelAtlas(gpu, source, tables, attention, memory, floor, curves)


def uncertainty() -> Uncertainty:
    """Slow-end margins by provenance (`Uncertainty`)."""
    return _registry().uncertainty


def nic_efficiency() -> float | None:
    """Measured scale-out bus bandwidth over the NICs' line rate (`_Registry.nic_efficiency`)."""
    return _registry().nic_efficiency()


def reference_gpu() -> str:
    """The GPU whose GEMM fit gives the shared shape parameters (the most GEMM points)."""
    return _registry()._reference_name()


def datasheet_share() -> dict[str, float]:
    """Large-GEMM rate over dense peak that prices GPUs without measurements, per dtype class."""
    return dict(_registry().datasheet_share)
