"""Real 4-rank gloo runs against their fake-world traces: peak bytes real - fake per stage, over runs.

    python -m bench.gloo_memory_gap [--runs 5] [--only NAME ...] [--json OUT.json]

The cases are those of tests/runtime/test_parallel_layouts.py that record their peak memory
(`track_memory`). Each run is one `torchrun --nproc_per_node=4 -m runtime.verify` job of all of
them (gloo, one thread per rank, the runtime's live-storage tracker, `runtime.memory`); the fake
world (`runtime.fake_world.measure_stages`) is traced once per case, since it is deterministic.
Prints, per case and traced rank, the fake peak and real - fake in KiB for every run, then the
largest gap beside the test's tolerance (max(1% of the real peak, 128 KiB)). About 40 s a run on
two cores, plus 5-10 s of tracing per case.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

NPROC = 4


def _cases(only: list[str] | None) -> list[dict[str, Any]]:
    mod = importlib.import_module("tests.runtime.test_parallel_layouts")
    cases = [c for c in mod.CASES if c.get("track_memory")]
    if only:
        unknown = sorted(set(only) - {c["name"] for c in cases})
        if unknown:
            raise SystemExit(f"--only: no tracked case named {', '.join(unknown)}")
        cases = [c for c in cases if c["name"] in only]
    return cases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gloo_memory_gap", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.runs < 1:
        raise SystemExit("--runs: must be at least 1")

    from runtime.fake_world import measure_stages
    from runtime.spec import load_run_spec
    from runtime.verify import launch, load_results

    cases = _cases(a.only)
    fake = {c["name"]: measure_stages(load_run_spec(c["run"]), steps=2) for c in cases}
    gaps: dict[str, dict[int, list[int]]] = {c["name"]: {m.rank: [] for m in fake[c["name"]]} for c in cases}
    real_peaks: dict[str, dict[int, list[int]]] = {c["name"]: {m.rank: [] for m in fake[c["name"]]} for c in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.runs):
            out = Path(tmp) / f"run{i}"
            proc = launch(cases, NPROC, out)
            if proc.returncode != 0:
                print(f"run {i}: torchrun failed ({proc.returncode})\n{proc.stderr[-3000:]}", file=sys.stderr)
                return 1
            for c in cases:
                ranks = load_results(out, c["name"], NPROC)
                for m in fake[c["name"]]:
                    real = ranks[m.rank]["peak_memory_bytes"]
                    real_peaks[c["name"]][m.rank].append(real)
                    gaps[c["name"]][m.rank].append(real - m.peak_bytes)
            print(f"run {i + 1}/{a.runs} done", file=sys.stderr, flush=True)
    print(f"{'case':28s} {'rank':>4s} {'fake KiB':>9s}  real - fake KiB per run{'':12s} {'max':>6s} {'tol':>6s}")
    for c in cases:
        for m in fake[c["name"]]:
            g = gaps[c["name"]][m.rank]
            tol = max(0.01 * min(real_peaks[c["name"]][m.rank]), 128 * 1024)
            runs = " ".join(f"{x / 1024:+7.1f}" for x in g)
            print(f"{c['name']:28s} {m.rank:4d} {m.peak_bytes / 1024:9.1f}  {runs}  {max(g, key=abs) / 1024:+6.1f} {tol / 1024:6.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"fake": {k: [m.__dict__ for m in v] for k, v in fake.items()},
                                            "real_peaks": real_peaks, "gaps": gaps}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
