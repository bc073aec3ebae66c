"""The runtime on one real GPU against the prediction (issue "Run a plan": GPU check).

    python -m bench.gpu_reference [--cluster dgx-h100] [--steps 6] [--out DIR]

For each recompute mode (full, selective, none) the planner finds the largest Llama-3-8B-shaped
model (Llama-3-8B layers, fewer of them) that fits one GPU of the cluster at sequence 8192 and
global batch 8, priced as the runtime executes on one device: eager PyTorch (`framework=fsdp`),
eager cross-entropy, autocast to bf16 over float32 parameters and gradients (`grad_dtype=fp32`:
4-byte gradients; the float32 master and AdamW moments are the 12 optimizer bytes), 10% memory
headroom. `runtime.launch` then trains it for `--steps` steps and we print measured step time,
peak allocated memory (`torch.cuda.max_memory_allocated`) and MFU next to the prediction. Needs a
CUDA GPU; nothing in CI runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from cluster_specs.presets import get_cluster
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.plan import Plan, SearchConstraints
from planner.search import search


def largest_fitting(cluster: str, recompute: str) -> Plan | None:
    """The plan of the largest Llama-3-8B-shaped model (by layer count) that fits one GPU."""
    base, cl = get_model("llama3-8b"), get_cluster(cluster)
    training = TrainingSpec(seq_len=8192, global_batch=8, precision="bf16", optimizer="adamw", grad_dtype="fp32")
    constraints = SearchConstraints(
        framework="fsdp", cross_entropy="eager", allow_offload=False, memory_headroom=0.1, recompute=recompute
    )
    for layers in range(base.num_layers, 0, -1):
        spec = base.model_copy(update={"num_layers": layers, "name": f"llama3-8b-{layers}L"})
        plan = search(spec, training, cl, 1, constraints)
        if plan.best is not None:
            return plan
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", default="dgx-h100")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default="gpu-reference")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    print(f"{'recompute':10s} {'layers':>6s} {'pred s':>7s} {'meas s':>7s} {'pred GB':>8s} {'meas GB':>8s} "
          f"{'pred MFU':>8s} {'meas MFU':>8s}")
    for recompute in ("full", "selective", "none"):
        plan = largest_fitting(a.cluster, recompute)
        if plan is None or plan.best is None:
            print(f"{recompute:10s} nothing fits")
            continue
        plan_path, profile_path = out / f"plan_{recompute}.json", out / f"profile_{recompute}.json"
        plan_path.write_text(plan.model_dump_json())
        cmd = [sys.executable, "-m", "runtime.launch", str(plan_path), "--steps", str(a.steps), "--warmup-steps", "2",
               "--out", str(profile_path), "--no-track-memory"]
        if subprocess.run(cmd, env=env, check=False).returncode != 0:
            print(f"{recompute:10s} the run failed")
            continue
        prof = json.loads(profile_path.read_text())
        est = plan.best.estimate
        mem = est["memory"]["breakdown"]
        allocated = mem["total_bytes"] - mem["reserve_bytes"]  # the allocator's reserve is not allocated
        print(
            f"{recompute:10s} {plan.inputs.model.num_layers:6d} {est['step_s']:7.3f} {prof['step_s']:7.3f} "
            f"{allocated / 1e9:8.2f} {prof['peak_memory_bytes_per_rank'][0] / 1e9:8.2f} "
            f"{est['mfu']:8.3f} {prof['mfu']:8.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
