"""Predicted vs published tokens/s/GPU for every usable row of the calibration CSV.

    python -m bench.calibration_report                 # table + error summary (current calibration)
    python -m bench.calibration_report --priors        # with the prior constants instead of the fit
    python -m bench.calibration_report --json out.json # also a machine-readable summary
    python -m bench.calibration_report --split lofo    # each row priced by the fit without its source family

Prints one line per row (id, source, model, layout, measured, predicted, % error, fits), then the
median and mean absolute percentage error per source and overall, then every published layout
the model predicts NOT to fit (there must be none) with its memory breakdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.calibration_rows import CalibrationRow, Unusable, load_rows, reason_counts, stratum  # noqa: E402
from bench.families import lofo_calibration  # noqa: E402
from cost_models.calibration import Calibration, default_calibration  # noqa: E402
from cost_models.estimate import Estimate, estimate  # noqa: E402

GIB = 2**30


@dataclass
class Result:
    row: CalibrationRow
    estimate: Estimate | None
    error: str | None = None

    @property
    def predicted(self) -> float | None:
        return self.estimate.tokens_per_s_per_gpu if self.estimate else None

    @property
    def ape(self) -> float | None:
        """Absolute percentage error of tokens/s/GPU (None without throughput or estimate)."""
        m, p = self.row.measured_tokens_per_s_per_gpu, self.predicted
        if m is None or p is None:
            return None
        return abs(p - m) / m * 100.0

    @property
    def signed_pct(self) -> float | None:
        m, p = self.row.measured_tokens_per_s_per_gpu, self.predicted
        if m is None or p is None:
            return None
        return (p - m) / m * 100.0

    @property
    def fits(self) -> bool | None:
        return self.estimate.fits if self.estimate else None


def evaluate_row(row: CalibrationRow, cal: Calibration) -> Result:
    """Price the row's layout. Where the source does not state the recompute and the layout does
    not fit without it, the published run must have recomputed: the least recompute with which it
    fits (selective, then full) is taken and written into the row's assumptions."""
    try:
        est = estimate(row.model, row.training, row.cluster, row.gpus, row.layout, calibration=cal)
        if not est.fits and not row.recompute_stated and row.layout.recompute == "none":
            for mode in ("selective", "full"):
                layout = row.layout.model_copy(update={"recompute": mode})
                trial = estimate(row.model, row.training, row.cluster, row.gpus, layout, calibration=cal)
                if trial.fits:
                    note = f"does not fit without recompute (not stated): {mode} recompute, the least that fits"
                    row = replace(row, layout=layout, assumptions=(*row.assumptions, note))
                    est = trial
                    break
    except Exception as exc:  # a LayoutError or a modelling failure: report it, never hide it
        return Result(row, None, f"{type(exc).__name__}: {exc}")
    return Result(row, est)


def evaluate(rows: list[CalibrationRow], cal: Calibration) -> list[Result]:
    return [evaluate_row(r, cal) for r in rows]


def error_stats(results: list[Result]) -> dict[str, float | int]:
    apes = [r.ape for r in results if r.ape is not None]
    signed = [r.signed_pct for r in results if r.signed_pct is not None]
    if not apes:
        return {"n": 0}
    return {
        "n": len(apes),
        "median_ape": statistics.median(apes),
        "mape": statistics.fmean(apes),
        "max_ape": max(apes),
        "median_signed_pct": statistics.median(signed),
    }


def by_source(results: list[Result]) -> dict[str, dict[str, float | int]]:
    """Error statistics per stratum (source; Narayanan Table 2 split by framework) and overall."""
    sources = sorted({stratum(r.row) for r in results})
    out = {s: error_stats([r for r in results if stratum(r.row) == s]) for s in sources}
    out["ALL"] = error_stats(results)
    return out


def not_fitting(results: list[Result]) -> list[Result]:
    return [r for r in results if r.estimate is not None and not r.estimate.fits]


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(results: list[Result], out=sys.stdout) -> None:
    head = f"{'row':>4} {'source':<22} {'model':<26} {'layout':<36} {'measured':>9} {'predicted':>9} {'err%':>7} {'fits':>4} {'peak GiB':>8}"
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in results:
        e = r.estimate
        print(
            f"{r.row.row_id:>4} {r.row.source_id[:22]:<22} {r.row.label[:26]:<26} {r.row.layout_str()[:36]:<36} "
            f"{_fmt(r.row.measured_tokens_per_s_per_gpu):>9} {_fmt(r.predicted):>9} {_fmt(r.signed_pct, '+.1f'):>7} "
            f"{('yes' if r.fits else 'NO') if e else 'ERR':>4} {_fmt(e.peak_bytes / GIB if e else None, '.1f'):>8}",
            file=out,
        )
        if r.error:
            print(f"     ! {r.error}", file=out)


def print_summary(stats: dict[str, dict[str, float | int]], title: str, out=sys.stdout) -> None:
    print(f"\n{title}", file=out)
    print(f"  {'source':<32} {'n':>4} {'median APE':>11} {'MAPE':>7} {'max APE':>8} {'median signed':>14}", file=out)
    for src, s in stats.items():
        if not s.get("n"):
            print(f"  {src:<32} {0:>4}", file=out)
            continue
        print(
            f"  {src:<32} {s['n']:>4} {s['median_ape']:>10.1f}% {s['mape']:>6.1f}% {s['max_ape']:>7.1f}% "
            f"{s['median_signed_pct']:>+13.1f}%",
            file=out,
        )


def memory_lines(r: Result) -> list[str]:
    assert r.estimate is not None
    e = r.estimate
    mem = e.peak_memory.as_dict()
    parts = ", ".join(f"{k.removesuffix('_bytes')} {v / GIB:.1f}" for k, v in mem.items() if k != "total_bytes" and v)
    return [
        f"row {r.row.row_id} {r.row.source_id} {r.row.label} [{r.row.layout_str()}] on {r.row.gpus}x {r.row.cluster_name}: "
        f"peak {e.peak_bytes / GIB:.1f} GiB (stage {e.peak_memory.stage}) > capacity {e.capacity_bytes / GIB:.1f} GiB",
        f"    GiB: {parts}",
    ]


def summary_json(results: list[Result], bad: list[Unusable], cal: Calibration) -> dict:
    return {
        "calibration_source": cal.source,
        "rows": [
            {
                "row_id": r.row.row_id,
                "source_id": r.row.source_id,
                "model": r.row.label,
                "layout": r.row.layout_str(),
                "gpus": r.row.gpus,
                "cluster": r.row.cluster_name,
                "measured_tokens_per_s_per_gpu": r.row.measured_tokens_per_s_per_gpu,
                "measured_from": r.row.measured_from,
                "predicted_tokens_per_s_per_gpu": r.predicted,
                "error_pct": r.signed_pct,
                "fits": r.fits,
                "peak_gib": r.estimate.peak_bytes / GIB if r.estimate else None,
                "mfu": r.estimate.mfu if r.estimate else None,
                "time_s": r.estimate.time.as_dict() if r.estimate else None,
                "error": r.error,
                "assumptions": list(r.row.assumptions),
            }
            for r in results
        ],
        "by_source": by_source([r for r in results if r.row.has_throughput]),
        "not_fitting": [r.row.row_id for r in not_fitting(results)],
        "errors": [r.row.row_id for r in results if r.error],
        "unusable": [{"row_id": u.row_id, "source_id": u.source_id, "reason": u.reason} for u in bad],
        "unusable_counts": dict(reason_counts(bad)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="PATH", help="write a machine-readable summary here ('-' = stdout)")
    ap.add_argument("--priors", action="store_true", help="use the prior constants, not cost_models/data/calibration.json")
    ap.add_argument("--calibration", metavar="JSON", help="a calibration file written by bench/fit_calibration.py")
    ap.add_argument("--split", choices=["all", "lofo"], default="all",
                    help="lofo: price each row with the calibration fitted without its source family (bench.fit_calibration)")
    ap.add_argument("--source", help="only rows of this source_id")
    ap.add_argument("--quiet", action="store_true", help="no per-row table")
    args = ap.parse_args(argv)

    if args.calibration:
        cal = Calibration.from_json(json.loads(Path(args.calibration).read_text())["calibration"])
    else:
        cal = Calibration() if args.priors else default_calibration()
    rows, bad = load_rows()
    if args.source:
        rows = [r for r in rows if r.source_id == args.source]
    if args.split == "lofo":
        results = [evaluate_row(r, lofo_calibration(r)) for r in rows]
    else:
        results = evaluate(rows, cal)
    out = sys.stdout if args.json != "-" else sys.stderr
    print(f"calibration: {cal.source}", file=out)
    if not args.quiet:
        print_table(results, out)
    thr = [r for r in results if r.row.has_throughput]
    print_summary(by_source(thr), f"tokens/s/GPU error by source ({args.split} rows)", out)
    print(f"\nunusable rows: {len(bad)}", file=out)
    for reason, n in reason_counts(bad).most_common():
        ids = ", ".join(str(u.row_id) for u in bad if u.reason == reason)
        print(f"  {n:4d}  {reason}: rows {ids}", file=out)
    errs = [r for r in results if r.error]
    if errs:
        print(f"\nrows that failed to price: {len(errs)}", file=out)
        for r in errs:
            print(f"  row {r.row.row_id}: {r.error}", file=out)
    nf = not_fitting(results)
    print(f"\npublished layouts predicted NOT to fit: {len(nf)} (must be 0)", file=out)
    for r in nf:
        for line in memory_lines(r):
            print("  " + line, file=out)
    if args.json:
        data = summary_json(results, bad, cal)
        text = json.dumps(data, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
    return 1 if (nf or errs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
