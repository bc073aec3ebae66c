"""The search's work estimate (`planner.budget.estimate_work`) against what searches measure.

    python -m bench.plan_budget [--json] [--case LABEL ...]

Each case runs in a fresh process (`python -m bench.plan_budget --child ...`): it counts the
work before the search (meshes, tables, layouts, estimated bytes, and how long counting took), then
runs `planner.search.search` and reports its seconds, its own layout counts and the growth of the
process's peak resident memory over the search (`ru_maxrss` after minus before, KiB -> bytes).
The estimate is an upper bound when `measured_bytes <= bytes` and the search's `generated` count
is at most `layouts`. The cases are the reference jobs and the shapes the budget exists for: very
deep models (1024 layers), many experts (4096), many GPUs (131,072), and jobs where nothing fits
(nothing is pruned). Run it on an idle machine: the heavy cases take tens of seconds each.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

from cluster_specs.presets import get_cluster
from model_specs.presets import get_model
from model_specs.spec import ModelSpec, TrainingSpec
from planner.budget import estimate_work
from planner.plan import SearchConstraints

CASES: list[tuple[str, str, dict[str, int], str, int, int, int]] = [
    # (label, model preset, fields overridden, cluster, gpus, seq_len, global batch)
    ("llama3-70b / 1024 x dgx-h100", "llama3-70b", {}, "dgx-h100", 1024, 8192, 512),
    ("llama3-405b / 16384 x dgx-h100", "llama3-405b", {}, "dgx-h100", 16384, 8192, 2048),
    ("deepseek-v3 / 2048 x dgx-h800", "deepseek-v3", {}, "dgx-h800", 2048, 4096, 15360),
    ("deepseek-v3 / 131072 x dgx-h100", "deepseek-v3", {}, "dgx-h100", 131072, 4096, 16384),
    ("llama3-8b, 512 layers / 1024 x dgx-h100", "llama3-8b", {"num_layers": 512}, "dgx-h100", 1024, 8192, 1024),
    ("llama3-8b, 1024 layers / 1024 x dgx-h100", "llama3-8b", {"num_layers": 1024}, "dgx-h100", 1024, 8192, 1024),
    ("deepseek-v3, 1024 layers / 4096 x dgx-h100", "deepseek-v3", {"num_layers": 1024}, "dgx-h100", 4096, 4096, 8192),
    ("deepseek-v3, 4096 experts / 131072 x dgx-h100", "deepseek-v3", {"num_experts": 4096}, "dgx-h100", 131072, 4096, 8192),
]


def job(model: str, fields: dict[str, int], cluster: str, gpus: int, seq: int, batch: int) -> tuple[Any, ...]:
    base = get_model(model).model_dump(mode="json", exclude_defaults=True)
    spec = ModelSpec(**{**base, **fields}) if fields else get_model(model)
    return spec, TrainingSpec(seq_len=seq, global_batch=batch), get_cluster(cluster), gpus


def measure(label: str) -> dict[str, Any]:
    """Run one case in this process (the child's side)."""
    from planner.search import search

    case = next(c for c in CASES if c[0] == label)
    model, training, cluster, gpus = job(*case[1:])
    t0 = time.perf_counter()
    work = estimate_work(model, training, cluster, gpus, SearchConstraints())
    count_s = time.perf_counter() - t0
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    plan = search(model, training, cluster, gpus, SearchConstraints())
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "case": label, **work.as_dict(), "count_s": round(count_s, 3), "search_s": round(seconds, 2),
        "generated": plan.stats.generated, "priced": plan.stats.priced, "feasible": plan.stats.feasible,
        "measured_bytes": (after - before) * 1024, "bytes_ratio": round((after - before) * 1024 / max(work.bytes, 1), 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--case", action="append", help="run only these cases (by label)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child)))
        return 0
    rows = []
    for case in CASES:
        if args.case and case[0] not in args.case:
            continue
        out = subprocess.run([sys.executable, "-m", "bench.plan_budget", "--child", case[0]],
                             capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        if not args.json:
            print(f"{row['case']:<48} layouts {row['layouts']:>11,} (search {row['generated']:>11,})  "
                  f"bytes est {row['bytes'] / 2**20:>8.0f} MiB, measured {row['measured_bytes'] / 2**20:>6.0f} MiB  "
                  f"count {row['count_s']:.2f} s, search {row['search_s']:.1f} s", flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    bounded = all(r["measured_bytes"] <= r["bytes"] and r["generated"] <= r["layouts"] for r in rows)
    return 0 if bounded else 1


if __name__ == "__main__":
    sys.exit(main())
