"""Published layouts against our plans: is the published layout feasible in our model, is our best
plan's predicted throughput at least the published layout's predicted throughput, and where does
the published layout rank among all the layouts we price?

    python -m bench.published_vs_plan [--source ID] [--limit N] [--json]

"Fully specified" rows are those whose layout the source states (TP, PP, DP and the batch); the
same model, cluster, GPU count, training spec and framework are searched. Rank = 1 + the number of
fitting layouts that are strictly faster than the published one (counted exactly by the search).
Both sides are priced by the same calibrated cost model, so this compares layouts, not the model's
accuracy (that is `bench.calibration_report`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.calibration_rows import load_rows
from cost_models.calibration import default_calibration
from cost_models.estimate import estimate
from planner.plan import SearchConstraints
from planner.search import search


def compare(row, cal) -> dict:
    published = estimate(row.model, row.training, row.cluster, row.gpus, row.layout, calibration=cal)
    usable = row.cluster.gpu.memory_bytes * 0.95
    c = SearchConstraints(
        framework=row.layout.framework, cross_entropy=row.layout.cross_entropy, memory_headroom=0.0, top_k=3
    )
    t0 = time.perf_counter()
    plan = search(row.model, row.training, row.cluster, row.gpus, c, calibration=cal, refine=False,
                  reference_step_s=published.step_s)
    best = plan.best.estimate["tokens_per_s_per_gpu"] if plan.best else None
    return {
        "row_id": row.row_id,
        "source": row.source_id,
        "model": row.label,
        "published_fits": published.fits,
        "published_within_headroom": published.peak_bytes <= usable,
        "published_tokens_per_s_per_gpu": published.tokens_per_s_per_gpu,
        "best_tokens_per_s_per_gpu": best,
        "best_at_least_published": best is not None and best >= published.tokens_per_s_per_gpu * (1 - 1e-9),
        "published_rank": (plan.stats.faster_than_reference or 0) + 1,
        "feasible_layouts": plan.stats.feasible,
        "search_s": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--source", default=None)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows, _ = load_rows()
    rows = [r for r in rows if args.source is None or r.source_id == args.source]
    rows = rows[: args.limit] if args.limit else rows
    cal = default_calibration()
    out = [compare(r, cal) for r in rows]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{'row':>4s} {'source':24s} {'model':28s} {'fits':>4s} {'published':>10s} {'best':>10s} {'gain':>6s} {'rank':>6s} {'of':>7s}")
    for r in out:
        gain = r["best_tokens_per_s_per_gpu"] / r["published_tokens_per_s_per_gpu"] - 1 if r["best_tokens_per_s_per_gpu"] else float("nan")
        print(
            f"{r['row_id']:4d} {r['source'][:24]:24s} {r['model'][:28]:28s} {'yes' if r['published_fits'] else 'NO':>4s} "
            f"{r['published_tokens_per_s_per_gpu']:10,.0f} {r['best_tokens_per_s_per_gpu'] or 0:10,.0f} {100 * gain:+5.1f}% "
            f"{r['published_rank']:6d} {r['feasible_layouts']:7,d}"
        )
    n = len(out)
    print(f"\n{n} rows: published layout fits in {sum(r['published_fits'] for r in out)}; best plan >= published in "
          f"{sum(r['best_at_least_published'] for r in out)}; median rank {statistics.median(r['published_rank'] for r in out):.0f}; "
          f"median gain {100 * statistics.median(r['best_tokens_per_s_per_gpu'] / r['published_tokens_per_s_per_gpu'] - 1 for r in out if r['best_tokens_per_s_per_gpu']):.1f}%")


if __name__ == "__main__":
    main()
