"""Published layouts against our plans: is the published layout feasible in our model, is our best
plan's predicted throughput at least the published layout's predicted throughput, where does the
published layout rank among all the layouts we price, and, the number that matters, how does the
best plan's *predicted* throughput compare with the *measured* published figure (a tuned recipe
is close to the best its stack reaches: a plan promising far more is a blind spot of the model)?

    python -m bench.published_vs_plan [--source ID] [--family NAME] [--holdout] [--limit N] [--json]
    python -m bench.published_vs_plan --summarize out.json   # the summary of an earlier --json run

`--holdout`: every row is priced and searched with the calibration fitted without its source
family (`bench.families.lofo_calibration`: leave-one-family-out), and the summary is given
per family.

Rows of stacks that run a subset of the layouts are searched in that subset (`FSDP_ONLY_SOURCES`),
and without the features their stack did not have yet (`COMBINED_1F1B_SOURCES`,
`MLA_CONTEXT_PARALLEL_SOURCES`; a Megatron-Core before 0.10: no MoE parallel folding, no FSDP, no
optimizer offload, `RecipeSwitches.megatron_core_before_0_10`; DeepSpeed's release, `Layout.framework_version`). Each row's JSON names the layout
behind its best / measured (`recommended_layout`).

"Fully specified" rows are those whose layout the source states (TP, PP, DP and the batch); the
same model, cluster, GPU count, training spec and framework are searched. Rank = 1 + the number of
fitting layouts that are strictly faster than the published one (counted exactly by the search).
Rank and gain price both layouts with the same calibrated model, so they compare layouts. Best /
measured also carries the model's error on the recipe: the summary splits it into best plan /
published layout (the search) x published layout / measured (`bench.calibration_report`'s error).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.calibration_report import evaluate_row
from bench.calibration_rows import load_rows, stratum
from bench.families import FAMILIES, family, lofo_calibration
from cost_models.calibration import default_calibration
from cost_models.estimate import estimate
from planner.plan import SearchConstraints
from planner.search import describe, search

FSDP_ONLY_SOURCES = {"llmfoundry_mpt": "llm-foundry runs PyTorch FSDP only (no tensor, pipeline or context parallelism)"}
"""Sources whose software stack runs a subset of the layouts: their plans are searched in it."""

COMBINED_1F1B_SOURCES: frozenset[str] = frozenset()
"""Sources measured on a Megatron-Core with combined 1F1B (`Layout.moe_a2a_overlap`,
--overlap-moe-expert-parallel-comm): none yet. The feature was still being asked for in April 2025
(Megatron-LM issue #1550), integrated against Megatron-Core's top of tree by Megatron-Bridge on
27 August 2025 (PR #497), and its last merge requests landed by 2 September 2025 (Megatron-LM
issue #1728); the newest rows of the CSV (DGX Cloud v25.05 recipes, May 2025) predate it. Every
other source's rows are searched without it, as a user of that stack would be."""

MLA_CONTEXT_PARALLEL_SOURCES: frozenset[str] = frozenset()
"""Sources measured on a Megatron-Core that splits multi-latent attention (DeepSeek-V3) over context
parallel ranks: none yet. Transformer Engine's fused attention had no context parallelism for MLA
in March 2025 (TransformerEngine issue #1552: its P2P ring concatenates K and V, whose head sizes
differ under MLA), the support was a draft in April 2025 (TransformerEngine PR #1729), and
Megatron-Core lists "Context Parallelism (CP) support for MTP and MLA" among its v0.14 features
(September 2025, megatron/core/transformer/moe/README.md). The DGX Cloud DeepSeek-V3 rows (v25.05,
May 2025) predate it, so an MLA model from any other source is searched with cp = 1."""


PROMISE_LIMIT = 1.25
"""Issue 9's bar: a plan predicted above this multiple of what a tuned published recipe measured on
the same job is more likely a blind spot of the model than a better layout (90% of rows under it)."""


def constraints_for(row) -> SearchConstraints:
    """The search space of the row's own software stack: its framework, its loss and kernel
    implementations (a run without torch.compile is compared with plans priced without it, as a
    BF16 run is with BF16 plans; a FlashAttention-2 run with FlashAttention-2 plans), its expert grid (`Layout.moe_parallel_folding`), its FSDP
    (`Layout.fsdp_flat_params`), the FSDP and optimizer offload a Megatron-Core before 0.10 lacks
    (`CalibrationRow.megatron_core_before_0_10`), any ZeRO or offload a Megatron-LM of 2021-22 lacks
    (`CalibrationRow.distributed_optimizer`), the sequence parallelism, selective recompute and
    context parallelism a Megatron-LM before v3.0 lacks (`CalibrationRow.before_megatron_lm_3`),
    Megatron FSDP without gradient-accumulation fusion
    (every Megatron row ran a stack older than Megatron-Core 0.14 / NeMo 2.5, which turn it off
    under Megatron FSDP: `Layout.megatron_fsdp_gradient_fusion`),
    its parallelisms (`FSDP_ONLY_SOURCES`; context parallelism of MLA, `MLA_CONTEXT_PARALLEL_SOURCES`)
    and its schedules (`COMBINED_1F1B_SOURCES`)."""
    fixed = {"tp": 1, "pp": 1, "cp": 1} if row.source_id in FSDP_ONLY_SOURCES else {}
    if (row.model.attention == "mla" and row.source_id not in MLA_CONTEXT_PARALLEL_SOURCES) or row.before_megatron_lm_3:
        fixed["cp"] = 1  # no context parallelism of MLA in the stack, or none at all
    lay = row.layout
    older = row.megatron_core_before_0_10  # no FSDP, no optimizer offload (RecipeSwitches.megatron_core_before_0_10)
    return SearchConstraints(
        framework=lay.framework, cross_entropy=lay.cross_entropy, elementwise_kernels=lay.elementwise_kernels,
        norm_kernel=lay.norm_kernel, attention_kernel=lay.attention_kernel_, memory_headroom=0.0, top_k=3,
        allow_moe_a2a_overlap=row.source_id in COMBINED_1F1B_SOURCES or lay.moe_a2a_overlap,
        moe_parallel_folding=lay.moe_parallel_folding, fsdp_flat_params=lay.fsdp_flat_params,
        framework_version=lay.framework_version,
        megatron_fsdp_gradient_fusion=lay.framework != "megatron",
        max_zero_stage=0 if not row.distributed_optimizer else (1 if older else 3),
        allow_offload=not older and row.distributed_optimizer, sequence_parallel=not row.before_megatron_lm_3,
        selective_recompute=not row.before_megatron_lm_3, **fixed,
    )


def compare(row, cal) -> dict:
    """One row: the published layout priced, the search in the row's own stack (`constraints_for`,
    no memory headroom, so that every layout the published one competes with is in it), and the plan
    `autopar plan` would recommend, with its default headroom (`SearchConstraints.memory_headroom`):
    the same plan unless the fastest layouts need more than that share of HBM, in which case the
    search is run again with the headroom. `best_over_measured` is the recommended plan's."""
    resolved = evaluate_row(row, cal)  # the least recompute with which it fits, where not stated
    row = resolved.row
    published = estimate(row.model, row.training, row.cluster, row.gpus, row.layout, calibration=cal)
    headroom = SearchConstraints.model_fields["memory_headroom"].default
    usable = row.cluster.gpu.memory_bytes * (1 - headroom)
    c = constraints_for(row)
    t0 = time.perf_counter()
    plan = search(row.model, row.training, row.cluster, row.gpus, c, calibration=cal, refine=False,
                  reference_step_s=published.step_s)
    best = plan.best.estimate["tokens_per_s_per_gpu"] if plan.best else None
    fastest = max((x.estimate["tokens_per_s_per_gpu"] for x in [plan.best, *plan.alternatives] if x), default=None)
    recommended, recommended_layout = best, plan.best.layout if plan.best else None
    if plan.best and plan.best.estimate["memory"]["peak_bytes"] > usable:
        kept = search(row.model, row.training, row.cluster, row.gpus, c.model_copy(update={"memory_headroom": headroom}),
                      calibration=cal, refine=False)
        if kept.best:
            recommended, recommended_layout = kept.best.estimate["tokens_per_s_per_gpu"], kept.best.layout
    measured = row.measured_tokens_per_s_per_gpu

    return {
        "row_id": row.row_id,
        "source": row.source_id,
        "stratum": stratum(row),
        "calibration": cal.source,
        "model": row.label,
        "published_fits": published.fits,
        "published_within_headroom": published.peak_bytes <= usable,
        "published_tokens_per_s_per_gpu": published.tokens_per_s_per_gpu,
        "best_tokens_per_s_per_gpu": best,
        "recommended_tokens_per_s_per_gpu": recommended,
        "fastest_tokens_per_s_per_gpu": fastest,
        "best_at_least_published": fastest is not None and fastest >= published.tokens_per_s_per_gpu * (1 - 1e-9),
        "measured_tokens_per_s_per_gpu": measured,
        "best_over_measured": recommended / measured if recommended and measured else None,
        "recommended_layout": describe(recommended_layout) if recommended_layout else None,
        "published_rank": (plan.stats.faster_than_reference or 0) + 1,
        "feasible_layouts": plan.stats.feasible,
        "search_s": time.perf_counter() - t0,
    }


def summary_by_family(out: list[dict]) -> list[str]:
    """Best plan / measured (median, 90th percentile) per source family and overall."""
    fams: dict[str, list[float]] = {}
    for r in out:
        if r["best_over_measured"]:
            fam = FAMILIES.get(r.get("stratum", r["source"]), r.get("stratum", r["source"]))
            fams.setdefault(fam, []).append(r["best_over_measured"])
    lines = []
    for fam, ratios in sorted(fams.items()):
        lines.append(f"  {fam:<36} n={len(ratios):>4}  best/measured median {statistics.median(ratios):.3f}  "
                     f"p90 {quantile(ratios, 0.9):.3f}  above {PROMISE_LIMIT}: {sum(x > PROMISE_LIMIT for x in ratios)}")
    return lines


def quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summary_over_measured(out: list[dict], title: str) -> str:
    """Median and 90th percentile of the recommended plan's predicted tokens/s/GPU over the measured
    published figure, and how many rows promise more than `PROMISE_LIMIT` x."""
    ratios = [r["best_over_measured"] for r in out if r["best_over_measured"]]
    if not ratios:
        return f"{title}: no rows with a measured throughput"
    over = sum(x > PROMISE_LIMIT for x in ratios)
    return (f"{title}: best plan / measured published, n={len(ratios)}: median {statistics.median(ratios):.3f}, "
            f"p90 {quantile(ratios, 0.9):.3f}, max {max(ratios):.3f}; {over} rows above {PROMISE_LIMIT}")


def rows_above(out: list[dict], threshold: float = PROMISE_LIMIT) -> list[dict]:
    """The rows whose best plan promises more than `threshold` x the measured figure, grouped by
    source and model, each ratio split into its two factors: best plan / published layout (what the
    search adds over the recipe) x published layout / measured (the model's error on the recipe
    itself, `bench.calibration_report`). A group whose second factor is already above the threshold
    is a blind spot of the model on that recipe; one whose first factor is large is the search
    finding (or believing) a better layout."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in out:
        if r["best_over_measured"] and r["best_over_measured"] > threshold:
            model = r["model"].split(" (proxy")[0]
            groups.setdefault((r["source"], model), []).append(r)
    summary = []
    for (source, model), members in groups.items():
        summary.append({
            "source": source, "model": model, "rows": [m["row_id"] for m in members],
            "best_over_measured": statistics.median(m["best_over_measured"] for m in members),
            "published_over_measured": statistics.median(
                m["published_tokens_per_s_per_gpu"] / m["measured_tokens_per_s_per_gpu"] for m in members),
            "best_over_published": statistics.median(
                m["best_over_measured"] * m["measured_tokens_per_s_per_gpu"] / m["published_tokens_per_s_per_gpu"]
                for m in members),
        })
    return sorted(summary, key=lambda g: -len(g["rows"]))


def print_rows_above(out: list[dict], threshold: float = PROMISE_LIMIT) -> None:
    groups = rows_above(out, threshold)
    if not groups:
        return
    print(f"\nrows above {threshold} by source and model (medians): best plan / measured, split into best plan / "
          "published layout (the search) and published layout / measured (the model on the recipe)")
    print(f"  {'rows':>4s} {'source':20s} {'model':34s} {'best/meas':>9s} {'best/pub':>9s} {'pub/meas':>9s}  ids")
    for g in groups:
        print(f"  {len(g['rows']):4d} {g['source'][:20]:20s} {g['model'][:34]:34s} {g['best_over_measured']:9.2f} "
              f"{g['best_over_published']:9.2f} {g['published_over_measured']:9.2f}  {g['rows'][0]}-{g['rows'][-1]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--source", default=None)
    ap.add_argument("--holdout", action="store_true",
                    help="price and search each row with the calibration fitted without its source family")
    ap.add_argument("--family", default=None, help="only rows of this source family (bench.families.FAMILIES)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--summarize", metavar="JSON", default=None,
                    help="print the summary of an earlier --json run (no search)")
    args = ap.parse_args()
    if args.summarize:
        with open(args.summarize) as f:
            earlier = json.load(f)
        print(summary_over_measured(earlier, args.summarize))
        print("\n".join(summary_by_family(earlier)))
        print_rows_above(earlier)
        return

    rows, _ = load_rows()
    rows = [r for r in rows if args.source is None or r.source_id == args.source]
    rows = [r for r in rows if args.family is None or family(r) == args.family]
    rows = rows[: args.limit] if args.limit else rows
    cal = default_calibration()
    out = [compare(r, lofo_calibration(r) if args.holdout else cal) for r in rows]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{'row':>4s} {'source':24s} {'model':28s} {'fits':>4s} {'published':>10s} {'best':>10s} {'gain':>6s} "
          f"{'measured':>9s} {'best/meas':>9s} {'rank':>6s} {'of':>7s}")
    for r in out:
        gain = r["best_tokens_per_s_per_gpu"] / r["published_tokens_per_s_per_gpu"] - 1 if r["best_tokens_per_s_per_gpu"] else float("nan")
        print(
            f"{r['row_id']:4d} {r['source'][:24]:24s} {r['model'][:28]:28s} {'yes' if r['published_fits'] else 'NO':>4s} "
            f"{r['published_tokens_per_s_per_gpu']:10,.0f} {r['best_tokens_per_s_per_gpu'] or 0:10,.0f} {100 * gain:+5.1f}% "
            f"{r['measured_tokens_per_s_per_gpu'] or 0:9,.0f} {r['best_over_measured'] or float('nan'):9.3f} "
            f"{r['published_rank']:6d} {r['feasible_layouts']:7,d}"
        )
    print(summary_over_measured(out, "all rows shown"))
    print("\n".join(summary_by_family(out)))
    print_rows_above(out)
    n = len(out)
    print(f"\n{n} rows: published layout fits in {sum(r['published_fits'] for r in out)}; best plan >= published in "
          f"{sum(r['best_at_least_published'] for r in out)}; median rank {statistics.median(r['published_rank'] for r in out):.0f}; "
          f"median gain {100 * statistics.median(r['best_tokens_per_s_per_gpu'] / r['published_tokens_per_s_per_gpu'] - 1 for r in out if r['best_tokens_per_s_per_gpu']):.1f}%")


if __name__ == "__main__":
    main()
