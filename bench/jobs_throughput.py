"""Throughput of the batch contract: `autopar evaluate --jobs FILE` lines per second.

    python -m bench.jobs_throughput [--lines 5000]

Writes a JSONL file of varied Llama-3-70B / DeepSeek-V3 layouts (a fixed seed), runs the real
CLI on it as a subprocess (start-up included; default `--workers`: one process per CPU core) and
reports lines/s, median of three runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_jobs(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    jobs = []
    for _ in range(n):
        if rng.random() < 0.8:
            job = {
                "model": "llama3-70b", "cluster": "dgx-h100", "gpus": 256,
                "training": {"seq_len": 8192, "global_batch": 512},
                "layout": {"tp": rng.choice([1, 2, 4, 8]), "pp": rng.choice([1, 2, 4]), "zero_stage": rng.choice([0, 1, 2, 3]),
                           "micro_batch": rng.choice([1, 2]), "recompute": rng.choice(["none", "selective", "full"])},
            }
        else:
            job = {
                "model": "deepseek-v3", "cluster": "dgx-h800", "gpus": 2048,
                "training": {"seq_len": 4096, "global_batch": 15360},
                "layout": {"tp": rng.choice([1, 2]), "pp": rng.choice([8, 16]), "ep": rng.choice([8, 16, 32, 64]),
                           "zero_stage": 1, "recompute": rng.choice(["none", "full"])},
            }
        jobs.append(job)
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=5000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.jsonl"
        path.write_text("".join(json.dumps(j) + "\n" for j in make_jobs(args.lines)))
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-m", "autopar.cli", "evaluate", "--jobs", str(path)],
                check=True, capture_output=True, text=True,
            ).stdout
            times.append(time.perf_counter() - t0)
        results = [json.loads(line) for line in out.splitlines()]
        assert len(results) == args.lines
        ok = sum(r["ok"] for r in results)
    med = statistics.median(times)
    print(f"{args.lines} lines ({ok} valid) in {med:.2f} s (median of 3, start-up included): {args.lines / med:,.0f} lines/s")


if __name__ == "__main__":
    main()
