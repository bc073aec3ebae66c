"""Start-up of the runtime and its host memory per rank: launch to the first training step, and each
rank's peak resident memory, for FSDP ZeRO-3 jobs of 1, 2 and 4 gloo ranks on this machine.

    python -m bench.runtime_startup [--case small|0.55b] [--ranks 1 2 4] [--steps 2] [--root DIR] [--json OUT]

Each job is `torchrun --standalone --nproc-per-node=N -m runtime.launch SPEC` run from `--root`
(default this checkout; another checkout of the repository, e.g. an older commit unpacked with
`git archive`, measures that commit's runtime the same way). Everything is measured from outside,
so any version of the runtime can be compared:

- start-up: seconds from launching torchrun to the start of the first step (the moment
  runtime.launch's progress file first shows step 1, less that step's own time, polled every 0.1 s);
  with `--steps 0` (build the model and stop: start-up alone, whatever training would need), to
  the job's exit;
- peak RSS per rank: the kernel's high-water mark (VmHWM in /proc/PID/status) of each worker
  process torchrun started, last read before it exits (polled every 0.1 s).

When the runtime writes them (this checkout), the profile's own figures are printed beside them:
each rank's start-up from its process start (`startup_s_per_rank`) and phases, its
`host_peak_rss_bytes_per_rank`, the cost model's `host_memory_predicted_bytes` and the allocated
peak the live-storage tracker measured.

Cases (Llama-3 shapes, one layer, the 128,256-token vocabulary; sequence 512, global batch 4, AdamW,
fp32 on CPU): `0.55b` is hidden 2048, 16 heads (8 KV), FFN 2048: 0.551 B parameters, 525 M of them
in the embedding and the LM head (the issue's job, planned by `autopar plan --cluster local-cpu
--gpus 4 --framework fsdp --zero 3 --precision fp32`); `small` is the same with a 32,000-token
vocabulary (0.156 B), small enough that the whole-model build of older runtimes fits 4 ranks on a
24 GiB machine. Check `free -g` first.

Measured on the 2-core CI machine under other jobs (load average 6-10, so seconds vary by +-40%
between runs), 2026-11-28, before = df27df0 (every rank built the whole fp32 model, then sharded):

    0.55b --steps 0   ranks 1 / 2 / 4   start s before 13.6-26.5 / 13.0-29.7 / 28.3-32.5, after
                                        15.9-24.6 / 14.6-17.9 / 18.4-25.2; peak RSS per rank before
                                        2.35 / 3.29 / 2.78 GiB, after 2.35 / 1.35 / 0.84 GiB
    small (2 steps)   ranks 1 / 2 / 4   peak RSS per rank 3.37-3.39 / 3.42 / 2.51 GiB before, 3.39 /
                                        3.32 / 2.51 after: the training peak, which the build never
                                        reached for this model, dominates both

Until the embedding and the norm + LM head were FSDP2 units of their own (`runtime.parallelize.
edge_units`, torchtitan's), the 0.55b job could not train on 4 ranks of that machine: its ranks
allocated 6.0 GiB each at the training peak (`python -m runtime.fake_world SPEC --cluster local-cpu
--dtype fp32`: the root group gathered the embedding and the LM head, 0.98 GiB each in fp32, and
held their gradients). Now 4.25 GiB, the plan's 4.31 (`autopar evaluate --model MODEL.json
--cluster local-cpu --gpus 4 --seq-len 512 --global-batch 4 --framework fsdp --zero 3 --precision
fp32 --tp 1 --pp 1 --micro-batch 1`: allocated, the reserve left out); its peak is the embedding's
reduce-scatter (its 0.98 GiB gradient beside FSDP2's float32 copy of it).

Measured after, 2026-11-28, same machine and load (this checkout):

    0.55b --steps 0   ranks 1 / 2 / 4   start s 21.9 / 27.3 / 24.6, peak RSS per rank 2.35 / 1.35 /
                                        0.84 GiB (the build: the units change no shard)
    0.55b --steps 3   ranks 2           peak RSS 8.44 / 8.41 GiB, allocated 7.92 (live-storage
                                        tracker), predicted 7.00 (fake-world trace 6.94): gloo copies
                                        the buffers of its collectives (a reduce-scatter allocates
                                        1.5 x its input, an all-gather 1 x its output, measured on 2
                                        ranks), which neither the trace nor the cost model (NCCL's
                                        in-place collectives) holds: +0.98 GiB, the embedding's
                                        table in float32
    0.55b --steps 3   ranks 4           did not complete on that machine while it was shared (the
                                        ranks reached 5.4 GiB RSS each, sampled every 15 s, before
                                        free memory ran out: twice the kernel's OOM killer, once a
                                        watchdog at 0.3 GiB free)

Measured 2026-11-28 on the same machine with nothing else running (load average below 1):

    0.55b --steps 3   ranks 4           completes: launch to first step 7.9 s, peak RSS per rank
                                        5.91 / 5.89 / 5.84 / 5.82 GiB (1.6 GiB over the plan's
                                        4.31 allocated; tracker 5.23, gloo's copies), least free
                                        memory 0.67 GiB; with the rank's allocator returning freed
                                        memory (`runtime.host.return_freed_memory`, which a CPU
                                        rank now calls at start) 5.56 GiB on every rank, +1.25 GiB
                                        over the plan, start 7.3 s, least free memory 1.5 GiB

Measured 2026-11-28 after FSDP2's collectives on gloo stopped copying (`runtime.gloo_comms`: gloo's
reduce-scatter cloned its whole input, the embedding's 0.98 GiB gradient at this job's peak; its
all-gather filled a flat copy of its output on a worker thread), same shared machine (load 15-20):

    0.55b --steps 3   ranks 2           peak RSS 7.26 / 7.26 GiB (8.44 / 8.41 before), allocated
                                        6.94 (7.92 before; the fake-world trace's 6.94), predicted
                                        7.00: RSS 0.26 GiB over the plan (was 1.44)
    small --steps 3   ranks 4           peak RSS 1.59 GiB per rank, allocated 1.26, predicted 1.25;
                                        at 2b7096f (--root of that commit) 1.76, 1.44 and 1.25
    0.55b --steps 3   ranks 4           not run again: about 18 GiB for the job, more than this
                                        shared machine had free
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30

LAYER = {"hidden_size": 2048, "num_heads": 16, "num_kv_heads": 8, "ffn_hidden_size": 2048, "num_layers": 1}
CASES: dict[str, dict[str, Any]] = {
    "0.55b": {"name": "llama3-vocab-1layer-0.55b", "vocab_size": 128256, **LAYER},
    "small": {"name": "llama3-32k-vocab-1layer-0.16b", "vocab_size": 32000, **LAYER},
}


def run_spec(case: str, ranks: int, steps: int) -> dict[str, Any]:
    """The RunSpec of a case at `ranks` ranks: FSDP ZeRO-3 (no sharding at one rank)."""
    from model_specs.presets import get_model

    base = get_model("llama3-8b").model_dump(mode="json")
    model = {**base, "head_dim": None, "rope_scaling": None, **CASES[case]}
    return {
        "model": model,
        "training": {"seq_len": 512, "global_batch": 4, "precision": "fp32", "optimizer": "adamw"},
        "gpus": ranks, "layout": {"zero_stage": 3}, "steps": steps, "warmup_steps": min(steps, 1),
    }


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def _hwm_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def measure(spec: dict[str, Any], ranks: int, root: Path, workdir: Path) -> dict[str, Any]:
    """Launch one job and measure it from outside (module doc)."""
    spec_file, progress, profile = workdir / "spec.json", workdir / "progress.json", workdir / "profile.json"
    spec_file.write_text(json.dumps(spec))
    progress.unlink(missing_ok=True)
    profile.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
            "-m", "runtime.launch", str(spec_file), "--out", str(profile), "--backend", "gloo",
            "--progress-file", str(progress)]
    t0 = time.perf_counter()
    log = (workdir / "job.log").open("w")
    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    hwm: dict[int, int] = {}
    first_step_start = None
    while proc.poll() is None:
        for pid in _children(proc.pid):
            value = _hwm_bytes(pid)
            if value is not None:
                hwm[pid] = max(hwm.get(pid, 0), value)
        if first_step_start is None and progress.exists():
            try:
                p = json.loads(progress.read_text())
                first_step_start = time.perf_counter() - t0 - float(p["step_s"])
            except (OSError, ValueError, KeyError):
                pass
        time.sleep(0.1)
    log.close()
    if proc.returncode != 0:
        tail = (workdir / "job.log").read_text()[-3000:]
        raise RuntimeError(f"the {ranks}-rank job failed ({proc.returncode}):\n{tail}")
    wall = time.perf_counter() - t0
    out: dict[str, Any] = {
        "ranks": ranks, "steps": spec["steps"], "wall_s": wall,
        "launch_to_first_step_s": first_step_start if spec["steps"] else wall,
        "peak_rss_bytes_per_worker": sorted(hwm.values(), reverse=True)[:ranks],
    }
    if profile.exists():
        prof = json.loads(profile.read_text())
        for key in ("startup_s_per_rank", "startup_phases_s", "host_peak_rss_bytes_per_rank",
                    "host_memory_predicted_bytes", "peak_memory_bytes_per_rank", "step_s"):
            out[key] = prof.get(key)
    return out


def _row(case: str, r: dict[str, Any]) -> str:
    rss = r["peak_rss_bytes_per_worker"]
    line = (f"{case:6s} {r['ranks']:5d} {r['launch_to_first_step_s']:9.1f} {max(rss) / GIB:10.2f} "
            f"{' '.join(f'{x / GIB:.2f}' for x in rss):>24s}")
    if r.get("startup_s_per_rank"):
        phases = {k: max(v for v in vals if v is not None) for k, vals in (r.get("startup_phases_s") or {}).items()}
        alloc = [v for v in r.get("peak_memory_bytes_per_rank") or [] if v is not None]
        line += (f" {max(r['startup_s_per_rank']):9.1f} {(max(alloc) / GIB if alloc else float('nan')):9.2f}"
                 f" {r['host_memory_predicted_bytes'] / GIB:9.2f}  "
                 + ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in phases.items()))
    return line


HEADER = (f"{'case':6s} {'ranks':>5s} {'start s':>9s} {'max RSS':>10s} {'RSS per rank (GiB)':>24s}"
          f" {'rank s':>9s} {'alloc GiB':>9s} {'pred GiB':>9s}  phases on the slowest rank (s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=sorted(CASES), default="small")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=2, help="training steps; 0: start-up alone (to the job's exit)")
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout whose runtime to launch (default: this one)")
    ap.add_argument("--json", default=None, help="write the rows here")
    a = ap.parse_args(argv)
    rows = []
    print(HEADER)
    with tempfile.TemporaryDirectory(prefix="autopar-startup-") as tmp:
        for n in a.ranks:
            r = measure(run_spec(a.case, n, a.steps), n, a.root.resolve(), Path(tmp))
            rows.append({"case": a.case, **r})
            print(_row(a.case, r), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
