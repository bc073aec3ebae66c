"""What the CP-SAT re-cut's second phase (the tie-break) gains from its work budget.

    python -m bench.partition_tie_break [--top 3] [--json]

`planner.partition.partition_layers` solves in two phases: phase 1 minimizes the slowest rank's
micro-batch time (the price); phase 2, holding that time, minimizes the recompute time and then the
worst rank's memory (headroom), and stops once that is proved within `HEADROOM_GAP_BYTES` of the
best. For the pipelined layouts among the fastest few of each job below, this bench solves with
that gap and with none (phase 2 runs to its full work limit) and reports, per cut: the peak rank
memory (GiB) each reaches and the seconds each whole solve took (both phases). The slowest rank's
time is phase 1's, the same in both.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

from cluster_specs.presets import get_cluster
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner import partition
from planner.partition import DEFAULT_WORK_LIMIT, build_partition_data, partition_layers
from planner.plan import SearchConstraints
from planner.search import search


@dataclass(frozen=True)
class Job:
    model: str
    cluster: str
    gpus: int
    seq_len: int
    global_batch: int
    precision: str = "bf16"
    framework: str | None = None


JOBS = (
    Job("gpt3-175b", "dgx-a100-80g", 1024, 2048, 1536, framework="megatron"),
    Job("llama3-70b", "dgx-h100", 1024, 8192, 512, framework="megatron"),
    Job("llama3-405b", "dgx-h100", 8192, 8192, 2048, framework="megatron"),
    Job("llama3-405b", "dgx-h100", 16384, 8192, 2048),
    Job("mixtral-8x7b", "dgx-h100", 256, 4096, 1024, framework="megatron"),
    Job("deepseek-v3", "dgx-h800", 2048, 4096, 15360, "fp8", "megatron"),
    Job("llama3-70b", "dgx-h100", 64, 8192, 128),
    Job("gpt3-175b", "dgx-h100", 512, 2048, 1536),
    Job("llama3-405b", "dgx-h100", 1024, 8192, 512),
    Job("llama3-70b", "dgx-a100-80g", 128, 4096, 256),
)


def _solve(data: partition.PartitionData, gap_bytes: float) -> tuple[partition.PartitionResult, float]:
    t0 = time.perf_counter()
    result = partition_layers(data, headroom_gap_bytes=gap_bytes)
    return result, time.perf_counter() - t0


def rows(top: int) -> list[dict]:
    out = []
    for job in JOBS:
        training = TrainingSpec(seq_len=job.seq_len, global_batch=job.global_batch, precision=job.precision)  # type: ignore[arg-type]
        constraints = SearchConstraints(framework=job.framework) if job.framework else None
        model, cluster = get_model(job.model), get_cluster(job.cluster)
        plan = search(model, training, cluster, job.gpus, constraints, refine=False)
        ranked = [plan.best, *plan.alternatives] if plan.best else []
        pipelined = [r for r in ranked if r.layout.pp > 1][:top]
        for r in pipelined:
            layout = r.layout.resolved(job.gpus, training)
            usable = cluster.gpu.memory_bytes * (1.0 - (constraints or SearchConstraints()).memory_headroom)
            data = build_partition_data(model, training, cluster, job.gpus, layout, capacity_bytes=usable)
            gap, full = _solve(data, partition.HEADROOM_GAP_BYTES), _solve(data, 0.0)
            if not (gap[0].ok and full[0].ok):
                continue
            out.append({
                "job": f"{job.model} / {job.gpus} x {job.cluster}",
                "layout": f"tp{layout.tp} pp{layout.pp} vpp{layout.vpp} mb{layout.micro_batch} {layout.recompute}",
                "slowest_rank_s": gap[0].max_stage_time_s,
                "peak_gib_gap": max(gap[0].rank_bytes) / 2**30,
                "peak_gib_full": max(full[0].rank_bytes) / 2**30,
                "recompute_layers_gap": sum(gap[0].recompute_per_rank),
                "recompute_layers_full": sum(full[0].recompute_per_rank),
                "solve_s_gap": gap[1],
                "solve_s_full": full[1],
            })
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=3, help="pipelined layouts per job, fastest first")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = rows(args.top)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    gib = partition.HEADROOM_GAP_BYTES / 2**30
    print(f"phase 2 stopped within {gib:g} GiB of its best headroom, against run to {DEFAULT_WORK_LIMIT:g} of deterministic time")
    print(f"{'job':34s} {'layout':28s} {'peak GiB gap / full':>20s} {'solve s gap / full':>19s}")
    for r in result:
        print(f"{r['job']:34s} {r['layout']:28s} {r['peak_gib_gap']:9.3f} {r['peak_gib_full']:9.3f}"
              f" {r['solve_s_gap']:9.3f} {r['solve_s_full']:9.3f}")
    lost = [r["peak_gib_gap"] - r["peak_gib_full"] for r in result]
    more_recompute = sum(r["recompute_layers_gap"] > r["recompute_layers_full"] for r in result)
    ratio = sorted(r["solve_s_gap"] / r["solve_s_full"] for r in result)
    print(f"{len(result)} cuts: headroom lost at most {max(lost, default=0):.3f} GiB; more recompute on {more_recompute};"
          f" median solve time ratio gap / full {ratio[len(ratio) // 2] if ratio else float('nan'):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
