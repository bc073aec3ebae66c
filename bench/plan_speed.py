"""Planning time on the issue's reference jobs, one core, median of repeated runs.

    python -m bench.plan_speed [--repeats 5] [--json]

Each case runs `planner.search.search` end to end (including the CP-SAT re-partition of the best
layout). Every run gets its own copies of the model, cluster and training objects, as separate
API requests or CLI calls would. The first run of a case (cold: a fresh process's caches) is
reported apart from the median of the following runs (warm: the process's memos of earlier equal
jobs, `cost_models.interning`, as a long-running service has them), in wall seconds and in CPU
seconds of the process (`time.process_time`, which other work on a shared machine does not add
to). "priced": layouts whose memory was priced; "timed": those of them that fit and had their
step composed (the rest fit but are bounded: `SearchStats.dominated`). Run it with `taskset -c 0`
to pin it to one core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from cluster_specs.presets import get_cluster
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.search import search

CASES = [
    # (label, model, cluster, gpus, seq_len, global batch in sequences)
    ("llama3-405b / 16384 x dgx-h100 / seq 8192 / gbs 2048", "llama3-405b", "dgx-h100", 16384, 8192, 2048),
    ("deepseek-v3 / 2048 x dgx-h800 / seq 4096 / gbs 15360", "deepseek-v3", "dgx-h800", 2048, 4096, 15360),
    ("llama3-70b / 512 x dgx-h100 / seq 8192 / gbs 512", "llama3-70b", "dgx-h100", 512, 8192, 512),
    # issue 31: an MoE on 32 nodes, the largest search of the set (6.2 M layouts)
    ("qwen3-235b-a22b / 256 x dgx-h100 / seq 8192 / gbs 1024", "qwen3-235b-a22b", "dgx-h100", 256, 8192, 1024),
]


def run_case(model: str, cluster: str, gpus: int, seq: int, batch: int, repeats: int) -> dict:
    times, cpu = [], []
    plan = None
    for _ in range(repeats + 1):
        spec, cl = get_model(model).model_copy(deep=True), get_cluster(cluster).model_copy(deep=True)
        training = TrainingSpec(seq_len=seq, global_batch=batch)
        t0, c0 = time.perf_counter(), time.process_time()
        plan = search(spec, training, cl, gpus)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    assert plan is not None
    return {
        "cold_s": times[0],
        "median_s": statistics.median(times[1:]),
        "cold_cpu_s": cpu[0],
        "median_cpu_s": statistics.median(cpu[1:]),
        "generated": plan.stats.generated,
        "priced": plan.stats.priced,
        "pruned": plan.stats.pruned,
        "feasible": plan.stats.feasible,
        "timed": plan.stats.feasible - plan.stats.dominated,
        "priced_per_s": plan.stats.priced / statistics.median(times[1:]),
        "best": plan.best.estimate["tokens_per_s_per_gpu"] if plan.best else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = {}
    for label, *case in CASES:
        results[label] = run_case(*case, repeats=args.repeats)  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'case':58s} {'cold s':>7s} {'median s':>9s} {'CPU s':>7s} {'generated':>10s} {'priced':>10s} "
          f"{'timed':>8s} {'priced/s':>9s}")
    for label, r in results.items():
        print(
            f"{label:58s} {r['cold_s']:7.2f} {r['median_s']:9.3f} {r['median_cpu_s']:7.2f} {r['generated']:10,d} "
            f"{r['priced']:10,d} {r['timed']:8,d} {r['priced_per_s']:9,.0f}"
        )


if __name__ == "__main__":
    main()
