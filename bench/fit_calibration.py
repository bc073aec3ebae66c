"""Fit the per-stack constants of `cost_models.calibration.Calibration` to the published runs, and
test them leaving each source family out in turn.

    python -m bench.fit_calibration              # fit, leave-one-family-out, bands; write the JSON
    python -m bench.fit_calibration --dry-run    # fit and print, write nothing
    python -m bench.fit_calibration --bands-only # re-derive the errors and bands of the stored fit

Data: every row of `data/calibration/published_runs.csv` (or `AUTOPAR_CALIBRATION_CSV`) that
`bench.calibration_rows` can turn into a priced layout with a measured tokens/s/GPU, and this
project's own runtime measured on one H200 (`calibration_rows.measured_runtime_rows`: its full-
training runs of `data/measurements/h200-2026-11`, a family of their own).

What is fitted. Kernel rates are measurements (`cost_models.kernels`); what a training step adds
to its kernels is a few constants per software stack (`calibration.Stack`, one set per
`calibration.stack_key`: the framework; FSDP1 and FSDP2 share one): `compute` (the kernels' time
stretched by gaps and unpriced small kernels),
`latency_exposed` (the share of a kernel call's fixed latency each launch adds), `step_s` (fixed
seconds per step), `fp8_compute` (what the stack's FP8 recipe adds to the measured FP8 GEMMs); for
DeepSpeed, whose published runs are six 16-bit ZeRO-3 rows of 2021 on DeepSpeed 0.3.13, only
`compute` and its collective efficiency (`overlaps.deepspeed.bus_efficiency`, the share of the bus
bandwidth its gathers and reduce-scatters reach; `stack_params`). Those rows' gathers are priced one
parameter tensor at a time, synchronised, with the host's work per rank of each call
(`cost_models.zero3_gathers`, the release a layout input): fitted on them the efficiency is a
plausible share of the ring's bus bandwidth, where pricing them as today's release needed about
0.10. The fine-tuning stacks' host overheads (`Calibration.stack_overheads`) are
`bench.finetune_runs --fit`'s: this fit keeps them as stored (`FITTED_ELSEWHERE`). A stack's
constants only move the rows of that stack, so each stack is fitted on its own rows (scipy
least_squares, trust-region reflective, bounds; from the priors): a refit takes seconds to a
minute instead of minutes. No constant belongs to a source family or a row.

Objective: mean squared log error of tokens/s/GPU, balanced over strata (each stratum's rows carry
total weight 1, so the 216 llm-foundry rows do not drown a paper's table of 6):
    loss = sum_strata  mean_{rows in stratum} log(predicted / measured)^2  /  n_strata

Leave-one-family-out. Rows are grouped into source families (`FAMILIES`: the same team and
software; a source this file does not name is a family of its own). Each family is held out in
turn: the stacks its rows run are refitted without it, and its rows are predicted with that fit.
Every reported error, and every error band (`cost_models.error_band`), comes from those held-out
predictions: no family is ever priced with constants fitted on itself. The per-family refits are
stored (`lofo_calibrations`) so `bench.published_vs_plan --holdout` and `bench.calibration_report
--split lofo` price each row with the calibration that never saw its family.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.calibration_report import Result, error_stats, evaluate, not_fitting  # noqa: E402
from bench.calibration_rows import CalibrationRow, load_rows, measured_runtime_rows, reason_counts, stratum  # noqa: E402
from bench.families import FAMILIES, family, forget_stored, lofo_calibration  # noqa: E402
from cost_models.calibration import (  # noqa: E402
    FITTED_PATH,
    STACKS,
    Calibration,
    Overlap,
    Stack,
    default_calibration,
    stack_key,
)
from cost_models.error_band import (  # noqa: E402
    band_widening,
    bands_from_ratios,
    ceiling_keys,
    ceilings_from_runs,
    regime_keys,
)

# --------------------------------------------------------------------------------------------------
# parameters
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    lo: float
    hi: float
    get: Callable[[Calibration], float]
    set: Callable[[Calibration, float], Calibration]


def _stack(framework: str, attr: str, lo: float, hi: float) -> Param:
    def get(c: Calibration) -> float:
        return float(getattr(c.stack(framework), attr))

    def set_(c: Calibration, v: float) -> Calibration:
        stacks = dict(c.stacks)
        stacks[framework] = replace(stacks.get(framework, Stack()), **{attr: float(v)})
        return replace(c, stacks=stacks)

    return Param(f"stacks.{framework}.{attr}", lo, hi, get, set_)


def _overlap(framework: str, attr: str, lo: float = 0.0, hi: float = 1.0) -> Param:
    def get(c: Calibration) -> float:
        return float(getattr(c.overlap(framework), attr))

    def set_(c: Calibration, v: float) -> Calibration:
        ov = dict(c.overlaps)
        ov[framework] = replace(ov.get(framework, Overlap()), **{attr: float(v)})
        return replace(c, overlaps=ov)

    return Param(f"overlaps.{framework}.{attr}", lo, hi, get, set_)


def row_stack(row: CalibrationRow) -> str:
    """The stack whose constants price a row (`cost_models.calibration.stack_key`)."""
    return stack_key(row.layout.framework, row.layout.fsdp_flat_params)


def stack_params(framework: str) -> list[Param]:
    """The constants fitted for one stack (module doc), each bounded to stay physical."""
    params = [_stack(framework, "compute", 0.5, 3.0)]
    if framework == "deepspeed":
        # its only published runs (ZeRO-3, 2021: six rows of one table, one optimizer step per
        # global batch of 1536-2240 sequences, steps of 60-260 s) are bound by their gathers: the
        # collective efficiency, not the kernels' latency, FP8 (none trained in FP8) or a fixed cost
        # per step (fitted, it sat at its 5 s bound: 5 s per step is no physical cost of these
        # steps). How DeepSpeed 0.3.13 gathers (one parameter tensor at a time, each after a device
        # sync, the host's work growing with the rank count) is priced by the release
        # (`cost_models.zero3_gathers`), not by this efficiency
        params.append(_overlap("deepspeed", "bus_efficiency", 0.01, 1.0))
    else:
        params += [_stack(framework, "step_s", 0.0, 5.0), _stack(framework, "latency_exposed", 0.0, 1.0),
                   _stack(framework, "fp8_compute", 0.5, 3.0)]
    return params


def make_calibration(base: Calibration, params: list[Param], x: np.ndarray, source: str = "fitting") -> Calibration:
    cal = base
    for p, v in zip(params, x, strict=True):
        cal = p.set(cal, float(v))
    return replace(cal, source=source)


# --------------------------------------------------------------------------------------------------
# objective and fit
# --------------------------------------------------------------------------------------------------


def log_errors(results: list[Result]) -> np.ndarray:
    out = []
    for r in results:
        m, p = r.row.measured_tokens_per_s_per_gpu, r.predicted
        if m is None:
            continue
        # a row the model cannot price counts as a large error rather than being silently dropped
        out.append(math.log(p / m) if p and p > 0 else 5.0)
    return np.array(out)


def weights(rows: list[CalibrationRow]) -> np.ndarray:
    counts: dict[str, int] = {}
    for r in rows:
        counts[stratum(r)] = counts.get(stratum(r), 0) + 1
    n_strata = len(counts)
    return np.array([1.0 / math.sqrt(counts[stratum(r)] * n_strata) for r in rows])


def balanced_msle(results: list[Result]) -> float:
    rows = [r.row for r in results]
    e = log_errors(results) * weights(rows)
    return float(np.sum(e**2))


def fit_stack(rows: list[CalibrationRow], base: Calibration, framework: str, max_nfev: int = 40) -> tuple[Calibration, dict]:
    """Fit one stack's constants on its rows (module doc); without rows its priors stay."""
    from scipy.optimize import least_squares

    params = stack_params(framework)
    mine = [r for r in rows if row_stack(r) == framework and r.has_throughput]
    if not mine:
        return base, {"framework": framework, "rows": 0, "evaluations": 0, "loss": None, "note": "no rows: priors"}
    w = weights(mine)
    x0 = np.array([min(max(p.get(base), p.lo), p.hi) for p in params])
    lo = np.array([p.lo for p in params])
    hi = np.array([p.hi for p in params])
    calls = {"n": 0}

    def residuals(x: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        return log_errors(evaluate(mine, make_calibration(base, params, x))) * w

    sol = least_squares(residuals, x0, bounds=(lo, hi), x_scale=np.maximum(hi - lo, 1e-3) / 4, diff_step=1e-3,
                        max_nfev=max_nfev, method="trf")
    cal = make_calibration(base, params, sol.x)
    info = {
        "framework": framework,
        "rows": len(mine),
        "evaluations": calls["n"],
        "loss": float(2 * sol.cost),
        "message": str(sol.message),
        "at_bound": [p.name for p, v in zip(params, sol.x, strict=True) if v <= p.lo + 1e-6 or v >= p.hi - 1e-6],
        "fitted": {p.name: p.get(cal) for p in params},
    }
    return cal, info


def fit_all(rows: list[CalibrationRow], base: Calibration, frameworks: tuple[str, ...] = STACKS,
            verbose: bool = True) -> tuple[Calibration, list[dict]]:
    """Every stack fitted on its own rows, in turn (module doc)."""
    cal, infos = base, []
    for fw in frameworks:
        t0 = time.time()
        cal, info = fit_stack(rows, cal, fw)
        info["seconds"] = time.time() - t0
        infos.append(info)
        if verbose:
            fitted = ", ".join(f"{k.split('.')[-1]} {v:.4g}" for k, v in info.get("fitted", {}).items())
            print(f"  {fw:<10} {info['rows']:>4} rows  {info['evaluations']:>3} evaluations  {info['seconds']:5.1f} s  {fitted}",
                  flush=True)
    return cal, infos


def leave_one_family_out(rows: list[CalibrationRow], full: Calibration, verbose: bool = True
                         ) -> tuple[dict[str, Calibration], list[Result], dict[str, float]]:
    """Each family held out in turn (module doc): (the calibration that never saw each family, every
    row priced with its family's, seconds per family's refit)."""
    fams = sorted({family(r) for r in rows})
    cals: dict[str, Calibration] = {}
    held: list[Result] = []
    seconds: dict[str, float] = {}
    for fam in fams:
        t0 = time.time()
        out = [r for r in rows if family(r) == fam]
        rest = [r for r in rows if family(r) != fam]
        frameworks = tuple(fw for fw in STACKS if any(row_stack(r) == fw for r in out))
        cal = full
        for fw in frameworks:  # the stacks the family runs are refitted from their priors without it
            prior = Calibration()
            start = replace(cal, stacks={**cal.stacks, fw: prior.stack(fw)},
                            overlaps={**cal.overlaps, fw: prior.overlap(fw)})
            cal, _ = fit_stack(rest, start, fw)
        cal = replace(cal, source=f"fitted without family {fam!r}")
        cals[fam] = cal
        held += evaluate(out, cal)
        seconds[fam] = time.time() - t0
        if verbose:
            st = error_stats([r for r in held if family(r.row) == fam])
            print(f"  held out {fam:<36} n={st.get('n', 0):>4}  refit {seconds[fam]:5.1f} s  "
                  f"median APE {st.get('median_ape', float('nan')):5.1f}%  signed {st.get('median_signed_pct', float('nan')):+6.1f}%",
                  flush=True)
    return cals, held, seconds


# --------------------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------------------


def stats_by_stratum(results: list[Result]) -> dict[str, dict]:
    names = sorted({stratum(r.row) for r in results})
    out = {n: error_stats([r for r in results if stratum(r.row) == n]) for n in names}
    out["ALL"] = error_stats(results)
    return out


def lofo_summary(held: list[Result]) -> dict:
    """Error statistics of the held-out predictions: overall, by family, by regime (dense / MoE)
    and by stratum."""
    fams: dict[str, list[Result]] = {}
    for r in held:
        fams.setdefault(family(r.row), []).append(r)
    return {
        "rows": len([r for r in held if r.ape is not None]),
        **{k: v for k, v in error_stats(held).items() if k != "n"},
        "by_family": {k: error_stats(v) for k, v in sorted(fams.items())},
        "by_regime": {
            "dense": error_stats([r for r in held if not r.row.model.num_experts]),
            "MoE": error_stats([r for r in held if r.row.model.num_experts]),
        },
        "by_stratum": stats_by_stratum(held),
    }


def ratio_samples(results: list[Result]) -> list[tuple[list[str], float]]:
    out = []
    for r in results:
        m, p = r.row.measured_tokens_per_s_per_gpu, r.predicted
        if m and p and p > 0:
            out.append((regime_keys(r.row.model, r.row.cluster.gpu.name, r.row.gpus), m / p))
    return out


def mfu_ceilings(results: list[Result]) -> dict[str, dict[str, float | int | str]]:
    """The highest MFU published runs measured, per regime (`cost_models.error_band.ceiling_keys`):
    a run's measured MFU is our predicted MFU scaled by measured / predicted tokens/s (our model
    FLOPs per token, the catalog's dense peak)."""
    samples = []
    for r in results:
        m, p = r.row.measured_tokens_per_s_per_gpu, r.predicted
        if m and p and p > 0 and r.estimate is not None:
            keys = ceiling_keys(r.row.model, r.row.cluster.gpu.name)
            label = f"{r.row.label} on {r.row.gpus} {r.row.cluster.gpu.name}, {r.row.source_id} row {r.row.row_id}"
            samples.append((keys, r.estimate.mfu * m / p, label))
    return ceilings_from_runs(samples)


FITTED_ELSEWHERE: dict[str, str] = {
    "stack_overheads": "bench/finetune_runs.py --fit: least squares on log tokens/s of data/calibration/finetune_runs.csv's "
    "throughput rows priced in their stacks and the H200 HF steps (data/measurements/h200-2026-11): each stack's host "
    "seconds per kernel launch and its own kernel-time stretch, kept where it predicts the held-out families no worse "
    "than its framework's",
}
"""Fields of the stored calibration another bench fits, with the command that fits them: this fit keeps
them as stored (the fine-tuning stacks' host overheads price no published pre-training row, so they
neither move nor are moved by the `Stack` constants here; they are fitted on top of them, so run this
fit first and `bench.finetune_runs --fit` after it)."""


def other_fits(path: Path) -> dict:
    """The stored values of the fields `FITTED_ELSEWHERE` names ({} without a stored file)."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text()).get("calibration", {})
    stored = Calibration.from_json({k: v for k, v in data.items() if k in FITTED_ELSEWHERE})
    return {k: getattr(stored, k) for k in FITTED_ELSEWHERE if k in data}


KEPT_REPORTS = ("stack_overheads_fit",)
"""Top-level entries of the stored file other benches write (`bench.finetune_runs --fit`'s figures)."""


def write_fit(doc: dict, path: Path) -> None:
    """Write the fit's document to `path`, keeping the fields other benches fit (`FITTED_ELSEWHERE`) and
    their reports (`KEPT_REPORTS`) as the stored file has them, and naming who fits them."""
    stored = json.loads(path.read_text()) if path.exists() else {}
    for key in FITTED_ELSEWHERE:
        if key in stored.get("calibration", {}):
            doc["calibration"][key] = stored["calibration"][key]
    for key in KEPT_REPORTS:
        if key in stored:
            doc[key] = stored[key]
    doc["fitted_elsewhere"] = dict(FITTED_ELSEWHERE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
    forget_stored(path)


def _cal_doc(cal: Calibration) -> dict:
    return {"stacks": {k: vars(v) for k, v in cal.stacks.items()},
            "deepspeed_bus_efficiency": cal.overlap("deepspeed").bus_efficiency}


def write_bands_only(path: Path) -> int:
    """Re-derive the held-out errors, bands and ceilings of the stored fit (after a change to the
    model or the catalog) without refitting: each row priced with its family's stored calibration."""
    rows, _ = load_rows()
    usable = [r for r in rows if r.has_throughput] + measured_runtime_rows()
    held = [x for r in usable for x in evaluate([r], lofo_calibration(r, path))]
    doc = json.loads(path.read_text())
    doc["lofo"] = {**lofo_summary(held), "seconds": doc.get("lofo", {}).get("seconds")}
    samples = ratio_samples(held)
    doc["error_bands"] = bands_from_ratios(samples)
    doc["band_widening"] = band_widening(samples)
    doc["published_mfu_ceilings"] = mfu_ceilings(evaluate(usable, default_calibration()))
    path.write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
    forget_stored(path)
    print_lofo(doc["lofo"])
    print(f"wrote lofo, error_bands, band_widening and published_mfu_ceilings into {path}")
    return 0


def print_lofo(summary: dict) -> None:
    print("\nLEAVE-ONE-FAMILY-OUT: tokens/s/GPU of each family predicted by the fit without it")
    for name, st in [*summary["by_family"].items(), *summary["by_regime"].items()]:
        if st.get("n"):
            print(f"  {name:<36} n={st['n']:>4}  median APE {st['median_ape']:5.1f}%  MAPE {st['mape']:5.1f}%  "
                  f"median signed {st['median_signed_pct']:+6.1f}%")
    print(f"  {'overall':<36} n={summary['rows']:>4}  median APE {summary['median_ape']:5.1f}%  MAPE {summary['mape']:5.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bands-only", action="store_true",
                    help="re-derive the held-out errors, error bands and published MFU ceilings of the stored fit, no refit")
    ap.add_argument("--dry-run", action="store_true", help="do not write cost_models/data/calibration.json")
    ap.add_argument("--out", default=str(FITTED_PATH), help="where to write the fitted calibration")
    args = ap.parse_args(argv)

    if args.bands_only:
        return write_bands_only(Path(args.out))

    rows, bad = load_rows()
    usable = [r for r in rows if r.has_throughput] + measured_runtime_rows()
    prior = replace(Calibration(), **other_fits(Path(args.out)))  # the fine-tuning stacks' fit, kept
    print(f"{len(usable)} rows with throughput in {len({family(r) for r in usable})} source families")
    print("fitting every stack on all families:")
    t0 = time.time()
    cal, infos = fit_all(usable, prior)
    full_s = time.time() - t0
    cal = replace(cal, source=f"fitted by bench/fit_calibration.py on {_dt.date.today().isoformat()}")
    print(f"full fit: {full_s:.0f} s")
    print("leave-one-family-out:")
    t1 = time.time()
    lofo_cals, held, lofo_s = leave_one_family_out(usable, cal)
    lofo_total = time.time() - t1
    fitted = evaluate(usable, cal)
    summary = {**lofo_summary(held), "seconds": {"per_family": lofo_s, "total": lofo_total}}
    print_lofo(summary)
    print(f"\nfit {full_s:.0f} s; leave-one-family-out {lofo_total:.0f} s ({len(lofo_cals)} refits); "
          f"in-sample median APE {error_stats(fitted)['median_ape']:.1f}%, balanced MSLE {balanced_msle(fitted):.5f}")
    nf = not_fitting(evaluate(rows, cal))
    print(f"published layouts predicted NOT to fit (all parsed rows): {len(nf)}")
    samples = ratio_samples(held)
    doc = {
        "calibration": cal.to_json(),
        "fit": {
            "rows": len(usable),
            "median_ape": error_stats(fitted).get("median_ape"),
            "mape": error_stats(fitted).get("mape"),
            "balanced_msle": balanced_msle(fitted),
            "stacks": infos,
            "seconds": full_s,
            "by_stratum": stats_by_stratum(fitted),
        },
        "lofo": summary,
        "lofo_calibrations": {fam: _cal_doc(c) for fam, c in lofo_cals.items()},
        "error_bands": bands_from_ratios(samples),
        "band_widening": band_widening(samples),
        "published_mfu_ceilings": mfu_ceilings(fitted),
        "families": {fam: sorted({stratum(r) for r in usable if family(r) == fam}) for fam in sorted(lofo_cals)},
        "objective": "stratum-balanced mean squared log error of tokens/s/GPU (scipy least_squares, trf), per stack",
        "unusable_rows": dict(reason_counts(bad)),
        "not_fitting_row_ids": [r.row.row_id for r in nf],
        "data": "data/calibration/published_runs.csv",
    }
    if not args.dry_run:
        write_fit(doc, Path(args.out))
        print(f"\nwrote {args.out} (kept as stored: {', '.join(FITTED_ELSEWHERE)}; refit them after this fit: "
              "python -m bench.finetune_runs --fit)")
    return 0


def _json_default(o: object) -> object:
    if isinstance(o, np.floating | np.integer):
        return o.item()
    raise TypeError(type(o).__name__)


__all__ = ["FAMILIES", "FITTED_ELSEWHERE", "family", "fit_all", "fit_stack", "leave_one_family_out", "lofo_calibration",
           "other_fits", "write_fit"]

if __name__ == "__main__":
    raise SystemExit(main())
