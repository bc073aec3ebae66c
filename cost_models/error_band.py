"""Error bands of predicted throughput, from leave-one-source-family-out residuals.

`bench/fit_calibration.py` holds each source family of the published runs out in turn, refits the
stack constants without it and prices its rows; per *regime* it stores quantiles of measured /
predicted tokens/s/GPU of those held-out rows in `cost_models/data/calibration.json` under
`error_bands`. A regime is (dense | moe, GPU generation, scale); a prediction takes the most
specific regime with at least `MIN_ROWS` held-out rows, falling back to coarser ones:

    moe|hopper|>1024  ->  moe|hopper  ->  moe  ->  all

The band of a predicted figure x (tokens/s, MFU; inversely a step time) is [x * q10, x * q90]: the
10th and 90th percentile of measured / predicted over that regime's held-out rows, so 80% of the
published runs of families the fit did not see fell inside it. Bands say how far the model has
been off, not why.

Widened where nothing measured the regime (`band_widening`, `error_band`):
- a job of a kind (dense or MoE) no published run measured on its GPU generation takes the coarser
  band stretched by how far the measured generations' medians spread around their kind's;
- a GPU without kernel measurements of its own is stretched further by the atlas's uncertainty of
  what it is priced from (`cost_models.kernels.atlas.Uncertainty`: a die sibling's measurements, or
  the datasheet).
The band says which (`ErrorBand.widened`). Its slow end (`q10`) is the conservative figure the
planner ranks by.

A band is relative to the prediction; a *ceiling* is absolute: the highest MFU any published run
of the same kind, GPU generation and size class measured, stored under `published_mfu_ceilings`.
A plan predicted above it promises what no published run of its kind has shown: the search found a
layout the data never tested, or a place where the model is optimistic; `planner.explain` says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from cluster_specs.catalog import gpu_generation
from cost_models.calibration import FITTED_PATH
from model_specs.params import count_params
from model_specs.spec import ModelSpec

MIN_ROWS = 8
"""Held-out rows a regime needs before its quantiles are used (else the next coarser regime)."""

SCALES = ((64, "<=64"), (1024, "<=1024"))
"""GPU-count classes of a regime: up to 64, up to 1024, more."""


def scale_class(gpus: int) -> str:
    for limit, label in SCALES:
        if gpus <= limit:
            return label
    return f">{SCALES[-1][0]}"


def regime_keys(model: ModelSpec, gpu_name: str, gpus: int) -> list[str]:
    """Most specific first (module doc)."""
    kind = "moe" if model.num_experts else "dense"
    gen = gpu_generation(gpu_name)
    return [f"{kind}|{gen}|{scale_class(gpus)}", f"{kind}|{gen}", kind, "all"]


@dataclass(frozen=True)
class ErrorBand:
    """measured / predicted quantiles of one regime's held-out rows, widened where nothing measured
    the regime (module doc; `widened` says why)."""

    regime: str
    rows: int
    q10: float
    q50: float
    q90: float
    widened: tuple[str, ...] = ()

    def as_dict(self, tokens_per_s_per_gpu: float, mfu: float, step_s: float) -> dict[str, float | int | str | list[str]]:
        return {
            "regime": self.regime,
            "holdout_rows": self.rows,
            "measured_over_predicted_q10": self.q10,
            "measured_over_predicted_q50": self.q50,
            "measured_over_predicted_q90": self.q90,
            "tokens_per_s_per_gpu_low": tokens_per_s_per_gpu * self.q10,
            "tokens_per_s_per_gpu_high": tokens_per_s_per_gpu * self.q90,
            "mfu_low": mfu * self.q10,
            "mfu_high": mfu * self.q90,
            "step_s_low": step_s / self.q90,
            "step_s_high": step_s / self.q10,
            "widened": list(self.widened),
        }

    @property
    def half_width_rel(self) -> float:
        """Half the band's width relative to the prediction ((q90 - q10) / 2)."""
        return (self.q90 - self.q10) / 2


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of an ascending list."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bands_from_ratios(samples: Iterable[tuple[list[str], float]]) -> dict[str, dict[str, float | int]]:
    """Quantiles of measured / predicted per regime key, from (regime keys of a row, ratio) pairs:
    each row counts in all of its keys (its own regime and every coarser one)."""
    by: dict[str, list[float]] = {}
    for keys, ratio in samples:
        for k in keys:
            by.setdefault(k, []).append(ratio)
    out: dict[str, dict[str, float | int]] = {}
    for k, values in sorted(by.items()):
        values.sort()
        out[k] = {"rows": len(values), "q10": _quantile(values, 0.1), "q50": _quantile(values, 0.5), "q90": _quantile(values, 0.9)}
    return out


def band_widening(samples: Iterable[tuple[list[str], float]]) -> dict[str, dict[str, float]]:
    """How far the median measured / predicted of each measured (kind, generation) regime sits from
    its kind's, from (regime keys, ratio) pairs: per kind, the lowest and highest of those medians
    over the kind's median ('lo' <= 1 <= 'hi'). A job of that kind on a generation no run measured
    may sit anywhere in that spread (`error_band`)."""
    by: dict[str, list[float]] = {}
    for keys, ratio in samples:
        for k in keys:
            by.setdefault(k, []).append(ratio)
    out: dict[str, dict[str, float]] = {}
    for kind in ("dense", "moe"):
        if len(by.get(kind, [])) < MIN_ROWS:
            continue
        base = _quantile(sorted(by[kind]), 0.5)
        rel = [_quantile(sorted(v), 0.5) / base for k, v in by.items()
               if k.startswith(f"{kind}|") and k.count("|") == 1 and len(v) >= MIN_ROWS]
        out[kind] = {"lo": min([1.0, *rel]), "hi": max([1.0, *rel])}
    return out


@lru_cache(maxsize=4)
def _stored_bands(path: Path = FITTED_PATH) -> dict[str, dict[str, float | int]]:
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text()).get("error_bands", {}))


@lru_cache(maxsize=4)
def _stored_widening(path: Path = FITTED_PATH) -> dict[str, dict[str, float]]:
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text()).get("band_widening", {}))


# --------------------------------------------------------------------------------------------------
# the highest MFU published runs reached
# --------------------------------------------------------------------------------------------------

SIZE_CLASSES = ((3e9, "<3B"), (30e9, "3-30B"), (150e9, "30-150B"), (math.inf, ">150B"))
"""Classes of total parameters in `ceiling_keys`: (upper bound, label)."""


def size_class(total_params: float) -> str:
    return next(label for limit, label in SIZE_CLASSES if total_params < limit)


def ceiling_keys(model: ModelSpec, gpu_name: str) -> list[str]:
    """(dense | moe, GPU generation, size class of the model's total parameters), then without the
    size class: most specific first."""
    kind = "moe" if model.num_experts else "dense"
    gen = gpu_generation(gpu_name)
    return [f"{kind}|{gen}|{size_class(count_params(model).total)}", f"{kind}|{gen}"]


@dataclass(frozen=True)
class PublishedCeiling:
    """The highest MFU any published run of a regime measured (MFU with our model FLOPs: the run's
    measured tokens/s x FLOPs per token / the dense peak), and that run."""

    regime: str
    mfu: float
    run: str  # the run's label: model, GPUs, source
    runs: int  # published runs in the regime

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def ceilings_from_runs(samples: Iterable[tuple[list[str], float, str]]) -> dict[str, dict[str, float | int | str]]:
    """The highest measured MFU per key, from (ceiling keys of a run, its measured MFU, its label)."""
    out: dict[str, dict[str, float | int | str]] = {}
    for keys, mfu, label in samples:
        for k in keys:
            cell = out.setdefault(k, {"mfu": 0.0, "run": "", "runs": 0})
            cell["runs"] = int(cell["runs"]) + 1
            if mfu > float(cell["mfu"]):
                cell["mfu"], cell["run"] = mfu, label
    return dict(sorted(out.items()))


@lru_cache(maxsize=4)
def _stored_ceilings(path: Path = FITTED_PATH) -> dict[str, dict[str, float | int | str]]:
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text()).get("published_mfu_ceilings", {}))


def published_ceiling(model: ModelSpec, gpu_name: str, ceilings: dict[str, dict] | None = None) -> PublishedCeiling | None:
    """The ceiling of the most specific regime any published run falls in (`ceiling_keys`); None
    when the calibration file holds none for this GPU generation."""
    table = _stored_ceilings() if ceilings is None else ceilings
    for key in ceiling_keys(model, gpu_name):
        cell = table.get(key)
        if cell:
            return PublishedCeiling(key, float(cell["mfu"]), str(cell["run"]), int(cell["runs"]))
    return None


def above_published_ceiling(estimate: dict) -> bool:
    """Whether an estimate (`cost_models.report.estimate_dict`) predicts an MFU above every published
    run of its regime (its `published_mfu_ceiling`)."""
    ceiling = estimate.get("published_mfu_ceiling")
    return bool(ceiling) and estimate["mfu"] > ceiling["mfu"]


def error_band(model: ModelSpec, gpu_name: str, gpus: int, bands: dict[str, dict] | None = None,
               widening: dict[str, dict] | None = None) -> ErrorBand | None:
    """The band of the most specific regime with `MIN_ROWS` held-out rows, widened where no run
    measured the job's kind on its GPU generation and where the GPU has no kernel measurements of
    its own (module doc); None when the calibration file holds no bands."""
    table = _stored_bands() if bands is None else bands
    spread = _stored_widening() if widening is None else widening
    keys = regime_keys(model, gpu_name, gpus)
    for key in keys:
        cell = table.get(key)
        if cell and int(cell["rows"]) >= MIN_ROWS:
            break
    else:
        return None
    q10, q50, q90 = float(cell["q10"]), float(cell["q50"]), float(cell["q90"])
    why: list[str] = []
    kind, gen = keys[0].split("|")[:2]
    if key.count("|") < 1 and spread.get(kind):  # no (kind, generation) regime with enough runs
        q10, q90 = q10 * spread[kind]["lo"], q90 * spread[kind]["hi"]
        why.append(f"no published {kind} run measured on {gen}: stretched by the spread of the measured generations")
    u, what = _kernel_margin(gpu_name)
    if u:
        q10, q90 = q10 * math.exp(-u), q90 * math.exp(u)
        why.append(what)
    return ErrorBand(key, int(cell["rows"]), q10, q50, q90, tuple(why))


def _kernel_margin(gpu_name: str) -> tuple[float, str]:
    """(log margin, reason) for a GPU without its own kernel measurements: the atlas's uncertainty
    of a die sibling's measurements or of its datasheet; (0, "") for a measured GPU."""
    from cluster_specs.catalog import get_gpu
    from cost_models.kernels.atlas import atlas_for, uncertainty
    from cost_models.kernels.gemm import DATASHEET, EXTRAPOLATED

    try:
        gpu = get_gpu(gpu_name)
    except KeyError:
        return uncertainty().by_provenance[DATASHEET], f"{gpu_name} is not in the GPU catalog: priced from its datasheet"
    atlas = atlas_for(gpu)
    if atlas.source == gpu.name:
        return 0.0, ""
    if atlas.source:
        return (uncertainty().by_provenance[EXTRAPOLATED],
                f"no kernel measurements of {gpu.name}: priced from its die sibling {atlas.source}'s")
    return uncertainty().by_provenance[DATASHEET], f"no kernel measurements of {gpu.name}: priced from its datasheet"
