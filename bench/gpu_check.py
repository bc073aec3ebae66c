"""The one-file GPU check: the profiler, one full and one LoRA run of the runtime, predicted beside measured.

    python -m bench.gpu_check                 # on one GPU (H200-class: under 8 minutes), writes
                                              # data/measurements/gpu-check/<gpu>-<date>.json (+ .atlas.json)
    python -m bench.gpu_check --tiny --out D  # the same code path on the CPU: a tiny model, few steps

Whenever a GPU is lent, run it and commit what it writes (data/measurements/gpu-check/README.md).

GPU mode: the Llama-3-8B-shaped plans the H200 ran in 2026-11 (`data/measurements/h200-2026-11`,
its README: `plan_full_none.json`, full training, seq 8192, global batch 8, no recompute;
`plan_lora_16L.json`, LoRA r16 on every linear, seq 4096, global batch 16). Both plans are of 16
of Llama-3-8B's 32 layers (the model the H200 measurements ran: the full 32 layers would not fit
a full-training step in the GPU's memory at that batch without recompute, and would double the
time); the checkpoint here has those 16 layers. Steps:

1. `autopar profile`'s measurement (`runtime.kernel_profile`) of the kernels both plans look up,
   within `--profile-seconds`; written as an atlas file beside the result.
2. A random-weight checkpoint of the plans' model written by transformers' `save_pretrained`
   (`LlamaConfig` from the plan's ModelSpec; weights drawn on the device in bf16).
3. Each plan run by `autopar run PLAN --hf-checkpoint DIR --steps N` (torchrun + `runtime.launch`,
   one process), its Profile read back.
4. For each run: the step time predicted by this checkout's cost model with the shipped atlas and
   with the profile layered over it (`planner.kernel_profile`, `cost_models.kernels.overlay`), the
   measured step time (mean after the runtime's warm-up steps), the peak memory predicted (worst
   stage less the allocator reserve, as `autopar run` compares) and measured
   (`cuda.max_memory_allocated`), and the start-up seconds (process start to first step, the
   slowest rank; target under `STARTUP_TARGET_S` on a GPU).

Tiny mode (`--tiny`): the `tiny` model preset on the `local-cpu` cluster, a full and a LoRA plan made
here, everything else the same code (the profiler on the CPU, labelled so; gloo; 3 steps).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "data" / "measurements" / "h200-2026-11"
OUT = ROOT / "data" / "measurements" / "gpu-check"
GPU_PLANS = {"full": H200 / "plan_full_none.json", "lora": H200 / "plan_lora_16L.json"}
STARTUP_TARGET_S = 20.0
"""Start-up (process start to first step) the runtime aims at on a GPU, seconds (issue 33)."""
GIB = 2**30


def tiny_plans() -> dict[str, dict[str, Any]]:
    """A full and a LoRA plan of the `tiny` preset on one `local-cpu` rank (the tiny mode's)."""
    from cluster_specs.presets import get_cluster
    from model_specs.presets import get_model
    from model_specs.spec import TrainingSpec
    from planner.finetune import search_finetune
    from planner.plan import SearchConstraints

    model, cluster = get_model("tiny"), get_cluster("local-cpu")
    out = {}
    for name, training in (("full", TrainingSpec(seq_len=64, global_batch=4)),
                           ("lora", TrainingSpec(seq_len=64, global_batch=4, method="lora", lora_rank=8))):
        plan = search_finetune(model, training, cluster, 1, SearchConstraints(framework="fsdp"))
        assert plan.best is not None, f"the tiny {name} plan does not fit"
        out[name] = plan.model_dump(mode="json")
    return out


def hf_config(model: dict[str, Any]) -> Any:
    """transformers' `LlamaConfig` of a Llama-family ModelSpec (its tensor shapes, RoPE and norms)."""
    import transformers

    if model["family"] != "llama":
        raise ValueError(f"model.family: the check writes Llama checkpoints, not {model['family']}")
    return transformers.LlamaConfig(
        vocab_size=model["vocab_size"], hidden_size=model["hidden_size"], intermediate_size=model["ffn_hidden_size"],
        num_hidden_layers=model["num_layers"], num_attention_heads=model["num_heads"],
        num_key_value_heads=model["num_kv_heads"], max_position_embeddings=model["max_position_embeddings"],
        rope_theta=model.get("rope_theta") or 10000.0,
        rope_scaling={k: v for k, v in (model.get("rope_scaling") or {}).items() if v is not None} or None,
        rms_norm_eps=1e-5, tie_word_embeddings=bool(model.get("tie_embeddings")),
    )


def write_checkpoint(model: dict[str, Any], directory: Path, device: str) -> float:
    """`save_pretrained` of a random-weight model of `model`'s shape (bf16, drawn on `device`);
    returns the seconds it took."""
    import torch
    import transformers

    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        hf = transformers.LlamaForCausalLM(hf_config(model)).to(torch.bfloat16)
    hf.save_pretrained(directory)
    del hf
    if device == "cuda":
        torch.cuda.empty_cache()
    return time.perf_counter() - t0


def measure_kernels(plans: dict[str, dict[str, Any]], max_seconds: float) -> tuple[dict[str, Any], list[str], float]:
    """The profiler on the union of the plans' kernel lookups: (atlas document, skipped, seconds)."""
    from cost_models.kernels.record import Lookups
    from planner.kernel_profile import plan_needs
    from planner.plan import Plan
    from runtime.kernel_profile import default_device, profile, stderr_progress

    t0 = time.perf_counter()
    needs = Lookups()
    for plan in plans.values():
        got = plan_needs(Plan.model_validate(plan))
        needs.gemm |= got.gemm
        needs.attention |= got.attention
        needs.collectives |= got.collectives
    device = default_device()
    first = Plan.model_validate(next(iter(plans.values())))
    gpu = first.inputs.cluster.gpu.name if device.type == "cuda" else "cpu"
    doc, skipped = profile(needs, gpu, device=device, max_seconds=max_seconds,
                           command=["python", "-m", "bench.gpu_check", *sys.argv[1:]], progress=stderr_progress)
    return doc, skipped, time.perf_counter() - t0


def run_plan(plan_file: Path, checkpoint: Path, steps: int, out: Path) -> dict[str, Any]:
    """`autopar run PLAN --hf-checkpoint DIR --steps N` (the runtime's own entry point); its Profile."""
    argv = [sys.executable, "-m", "autopar.cli", "run", str(plan_file), "--steps", str(steps),
            "--hf-checkpoint", str(checkpoint), "--out", str(out)]
    print(f"$ {' '.join(argv[1:])}", file=sys.stderr, flush=True)
    done = subprocess.run(argv, cwd=ROOT, text=True, capture_output=True)
    sys.stderr.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"autopar run {plan_file.name} failed with exit code {done.returncode}")
    return dict(json.loads(out.read_text()))


def predictions(plan: dict[str, Any], atlas: dict[str, Any] | None) -> dict[str, float]:
    """Step seconds and peak allocated bytes of the plan's layout priced by this checkout, with
    the shipped atlas and with `atlas` layered over it."""
    from cost_models.calibration import default_calibration
    from cost_models.estimate import estimate
    from cost_models.kernels.overlay import profiled_cluster
    from cost_models.kernels.schema import parse_atlas
    from cost_models.stages import StagePartition
    from planner.plan import Plan

    p = Plan.model_validate(plan)
    assert p.best is not None
    inputs, layout = p.inputs, p.best.layout
    partition = StagePartition.explicit(p.best.partition, layout.resolved(inputs.gpus, inputs.training))
    cal = default_calibration()
    shipped = estimate(inputs.model, inputs.training, inputs.cluster, inputs.gpus, layout, partition, calibration=cal)
    out = {"step_s": shipped.step_s, "peak_bytes": float(max(s.total - s.reserve for s in shipped.memory))}
    if atlas is not None:
        doc = parse_atlas(atlas, "the check's profile")
        if doc.gpu == inputs.cluster.gpu.name:
            cluster = profiled_cluster(inputs.cluster, doc)
            profiled = estimate(inputs.model, inputs.training, cluster, inputs.gpus, layout, partition, calibration=cal)
            out["step_s_with_profile"] = profiled.step_s
    return out


def check(tiny: bool, out_dir: Path, steps: int, profile_seconds: float) -> Path:
    """Run the check (module doc); returns the result file written."""
    import torch

    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() and not tiny else "cpu"
    if not tiny and device != "cuda":
        raise SystemExit("no CUDA device: the GPU check needs one (python -m bench.gpu_check --tiny runs on the CPU)")
    plans = tiny_plans() if tiny else {k: json.loads(f.read_text()) for k, f in GPU_PLANS.items()}
    atlas, skipped, profile_s = measure_kernels(plans, profile_seconds)
    model = next(iter(plans.values()))["inputs"]["model"]
    gpu_name = atlas["gpu"].lower() if device == "cuda" else "cpu-tiny"
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out_dir.mkdir(parents=True, exist_ok=True)
    atlas_file = out_dir / f"{gpu_name}-{stamp}.atlas.json"
    atlas_file.write_text(json.dumps(atlas, indent=1) + "\n")
    runs = []
    with tempfile.TemporaryDirectory(prefix="autopar-gpu-check-") as tmp:
        ckpt = Path(tmp) / "checkpoint"
        checkpoint_s = write_checkpoint(model, ckpt, device)
        for name, plan in plans.items():
            plan_file = Path(tmp) / f"plan_{name}.json"
            plan_file.write_text(json.dumps(plan))
            prof = run_plan(plan_file, ckpt, steps, Path(tmp) / f"profile_{name}.json")
            pred = predictions(plan, atlas)
            peaks = [p for p in prof.get("peak_memory_bytes_per_rank") or [] if p is not None]
            startup = [s for s in prof.get("startup_s_per_rank") or [] if s is not None]
            runs.append({
                "run": name, "method": plan["inputs"]["training"]["method"],
                "layers": plan["inputs"]["model"]["num_layers"], "seq_len": plan["inputs"]["training"]["seq_len"],
                "global_batch": plan["inputs"]["training"]["global_batch"], "steps": steps,
                "predicted_step_s": pred["step_s"], "predicted_step_s_with_profile": pred.get("step_s_with_profile"),
                "measured_step_s": prof.get("step_s"), "step_times_s": prof.get("step_times_s"),
                "predicted_peak_gib": pred["peak_bytes"] / GIB,
                "measured_peak_gib": max(peaks) / GIB if peaks else None,
                "memory_source": prof.get("memory_source"),
                "startup_s": max(startup) if startup else None, "startup_target_s": STARTUP_TARGET_S,
                "tokens_per_s": prof.get("tokens_per_s"), "mfu": prof.get("mfu"),
            })
    result = {
        "what": "bench/gpu_check.py: autopar profile, and a full and a LoRA run of the runtime from a "
                "save_pretrained checkpoint, predicted beside measured",
        "mode": "tiny (CPU)" if tiny else "gpu",
        "device": atlas["provenance"]["device"], "gpu": atlas["gpu"], "date": stamp,
        "software": atlas["provenance"]["software"], "host": platform.node(),
        "model": {"name": model["name"], "layers": model["num_layers"],
                  "why_layers": "the layer count of the measured H200 plans (data/measurements/h200-2026-11)"
                  if not tiny else "the tiny preset"},
        "profile": {"file": atlas_file.name, "points": sum(len(atlas[k]) for k in ("gemm", "attention", "memory")),
                    "skipped": skipped, "seconds": profile_s},
        "checkpoint_write_s": checkpoint_s,
        "runs": runs,
        "total_s": time.perf_counter() - started,
    }
    out_file = out_dir / f"{gpu_name}-{stamp}.json"
    out_file.write_text(json.dumps(result, indent=1) + "\n")
    return out_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU: the tiny preset, 3 steps (the test's mode)")
    ap.add_argument("--out", type=Path, default=OUT, help="folder for the result and the atlas file")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (default: GPU 5, tiny 3)")
    ap.add_argument("--profile-seconds", type=float, default=None,
                    help="the profiler's time budget (default: GPU 150, tiny 30)")
    a = ap.parse_args(argv)
    steps = a.steps or (3 if a.tiny else 5)
    budget = a.profile_seconds or (30.0 if a.tiny else 150.0)
    out_file = check(a.tiny, a.out, steps, budget)
    result = json.loads(out_file.read_text())
    for r in result["runs"]:
        print(f"{r['run']:<5} step predicted {r['predicted_step_s']:.3f} s (with the profile "
              f"{r['predicted_step_s_with_profile'] or float('nan'):.3f} s), measured {r['measured_step_s']:.3f} s; "
              f"peak {r['predicted_peak_gib']:.2f} vs {r['measured_peak_gib'] or float('nan'):.2f} GiB; "
              f"start-up {r['startup_s'] or float('nan'):.1f} s (target < {STARTUP_TARGET_S:g} s)")
    print(f"profile: {result['profile']['points']} points in {result['profile']['seconds']:.0f} s; "
          f"total {result['total_s']:.0f} s -> {out_file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
