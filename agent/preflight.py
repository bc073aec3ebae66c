"""Pre-flight collective bandwidth test, run by the agent as a torchrun child (never imported by
the agent process itself, which stays free of torch):

    python -m torch.distributed.run --standalone --nproc-per-node=N -m agent.preflight \
        --bytes 4194304 --iters 10 --backend gloo --out preflight.json

All-reduce of a float32 buffer of `--bytes` over the job's ranks on the run's backend: two warm-up
calls, then `--iters` timed calls between barriers; the time is the slowest rank's (MAX-reduced).
Bus bandwidth by the NCCL convention (nccl-tests doc/PERFORMANCE.md): algbw = bytes / t,
busbw = algbw x 2(n-1)/n for all-reduce, so it is comparable with the catalog's bus bandwidth and
with `cost_models.comm`. Rank 0 writes {"collective", "bytes", "ranks", "backend", "iters",
"time_s", "bus_bandwidth_bytes_per_s"}.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def bus_bandwidth(nbytes: int, ranks: int, seconds: float) -> float:
    """NCCL all-reduce bus bandwidth, bytes/s: 2(n-1)/n x bytes / t."""
    return 2.0 * (ranks - 1) / ranks * nbytes / seconds


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    p = argparse.ArgumentParser(prog="python -m agent.preflight")
    p.add_argument("--bytes", type=int, default=4 * 2**20)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    backend = a.backend if a.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    try:
        n = dist.get_world_size()
        buf = torch.ones(max(1, a.bytes // 4), dtype=torch.float32, device=device)
        nbytes = buf.numel() * 4
        for _ in range(2):
            dist.all_reduce(buf)
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(a.iters):
            dist.all_reduce(buf)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        t = float(elapsed.item()) / a.iters
        if dist.get_rank() == 0:
            result = {
                "collective": "all_reduce", "bytes": nbytes, "ranks": n, "backend": backend, "iters": a.iters,
                "time_s": t, "bus_bandwidth_bytes_per_s": bus_bandwidth(nbytes, n, t),
            }
            Path(a.out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
