"""The kernel atlas and the cost model against the H200 measurements of 2026-11.

    python -m bench.h200_check [--json]

1. Kernels: every GEMM and attention point of `data/measurements/h200-2026-11/kernel_rates.json`
   looked up in the H200's atlas (`cost_models.kernels`) as it was measured (one isolated call:
   the call latency included; attention forward and forward + backward), relative error per point.
   Shapes measured twice (the 8B MLP and the Mixtral expert shapes are the same GEMMs, timed in two
   sweeps) are one atlas entry, the mean of the two in log: the error against each measurement is
   shown.
2. Runs: the single-GPU runs of `runs.json` priced with the layouts of the plans they ran
   (`plan_full_none.json`, `plan_full_full.json`, `plan_lora_16L.json`: the runtime, torch SDPA
   attention, which runs FlashAttention-2 there) and with the calibrated model of this checkout:
   predicted vs measured step time and peak memory. Measured memory is `max_memory_allocated`, so
   the prediction is the worst stage's total less the allocator reserve (as `autopar run` compares).
   `hf_full16` (`hf_peer.py --layers 16 --seq 8192 --accum 8`: transformers' `LlamaForCausalLM` built
   in float32, each micro-batch's forward under `torch.autocast(bfloat16)`, torch's fused AdamW, no
   checkpointing, one GPU) is priced in the `hf` fine-tuning stack as the planner prices an HF
   Trainer job with `bf16=True` over a float32 model (`HF_FULL16`): ZeRO-0 without a wrapper, eager
   elementwise kernels and HF's float32 RMSNorm, float32 weights, gradients and AdamW states and
   autocast's casts of the GEMM weights (`cost_models.stacks.autocast_weights`).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from cluster_specs.catalog import get_gpu
from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration, default_calibration
from cost_models.estimate import estimate
from cost_models.kernels.atlas import atlas_for
from cost_models.layout import Layout
from cost_models.stages import StagePartition
from model_specs.spec import ModelSpec, TrainingSpec

FOLDER = Path(__file__).resolve().parents[1] / "data" / "measurements" / "h200-2026-11"
GIB = 2**30

RUNS = {"prof_full_none": "plan_full_none.json", "prof_full_full": "plan_full_full.json", "prof_lora16": "plan_lora_16L.json"}

HF_FULL16 = ("plan_full_none.json", {"stack": "hf", "zero_stage": 0, "elementwise_kernels": "eager", "norm_kernel": "eager_fp32",
                                     "optimizer_fused": True}, {"master_weights": True})
"""hf_full16 as the hf stack prices it (module doc, 2): the plan with the same model, batch (micro-batch 1,
8 accumulated) and sequence (8192) as `hf_peer.py`'s run, the layout's stack fields and the training's
float32 weights (`TrainingSpec.master_weights`: `from_pretrained(dtype=float32)` beside `bf16=True`).
`hf_peer.py` builds the model with `torch.set_default_dtype(torch.float32)` and steps
`torch.optim.AdamW(fused=True)`."""


def kernel_errors() -> dict:
    """Relative error of the atlas at every measured H200 kernel point (module doc, 1)."""
    raw = json.loads((FOLDER / "kernel_rates.json").read_text())
    atlas = atlas_for(get_gpu("H200-141GB"))
    table = atlas.gemm_table("bf16")
    gemm = []
    for g in raw["gemm"]:
        t = table.seconds(g["m"], g["n"], g["k"], 1, 2.0, latency_exposed=1.0)
        gemm.append({"label": g["label"], "m": g["m"], "n": g["n"], "k": g["k"], "measured_s": g["s"], "atlas_s": t,
                     "error": t / g["s"] - 1})
    shapes: dict[tuple, int] = {}
    for g in raw["gemm"]:
        shapes[(g["m"], g["n"], g["k"])] = shapes.get((g["m"], g["n"], g["k"]), 0) + 1
    attention = []
    kernel = {"flash": ("flash2",), "cudnn": ("cudnn",)}
    for row in raw["sdpa"]:
        if row["backend"] not in kernel or "error" in row:
            continue
        for pass_, key in (("fwd", "fwd_tflops"), ("fwd_bwd", "fwdbwd_tflops")):
            rate, _ = atlas.attention_rate(kernel[row["backend"]], float(row["seq"]), 128, True, pass_)
            attention.append({"kernel": row["backend"], "seq": row["seq"], "pass": pass_, "measured_tflops": row[key],
                              "atlas_tflops": float(rate) / 1e12, "error": row[key] * 1e12 / float(rate) - 1})
    once = [x for x in gemm if shapes[(x["m"], x["n"], x["k"])] == 1]
    twice = [x for x in gemm if shapes[(x["m"], x["n"], x["k"])] > 1]
    return {
        "gemm": gemm,
        "attention": attention,
        "max_abs_error_gemm_measured_once": max(abs(x["error"]) for x in once),
        "max_abs_error_gemm_measured_twice": max(abs(x["error"]) for x in twice) if twice else None,
        "spread_of_repeated_measurements": max(
            (abs(math.log(a["measured_s"] / b["measured_s"])) for a in twice for b in twice
             if (a["m"], a["n"], a["k"]) == (b["m"], b["n"], b["k"]) and a is not b), default=0.0),
        "max_abs_error_attention": max(abs(x["error"]) for x in attention),
        "points": {"gemm": len(gemm), "gemm_measured_twice": len(twice), "attention": len(attention)},
    }


def _priced(plan: dict, layout_update: dict | None = None, training_update: dict | None = None,
            calibration: Calibration | None = None):
    inputs = plan["inputs"]
    model = ModelSpec(**inputs["model"])
    cluster = ClusterSpec(**inputs["cluster"])
    training = TrainingSpec(**{**inputs["training"], **(training_update or {})})
    layout = Layout(**{**plan["best"]["layout"], **(layout_update or {})})
    partition = StagePartition.explicit(plan["best"]["partition"], layout.resolved(inputs["gpus"], training))
    return estimate(model, training, cluster, inputs["gpus"], layout, partition, calibration=calibration or default_calibration())


def hf_full16(calibration: Calibration | None = None) -> tuple[float, float, float, float]:
    """(predicted step s, measured step s, predicted peak allocated bytes, measured bytes) of `hf_full16`
    priced in the hf stack (`HF_FULL16`) with `calibration` (the stored one by default)."""
    hf = json.loads((FOLDER / "runs.json").read_text())["hf_full16"]
    plan_file, layout_update, training_update = HF_FULL16
    est = _priced(json.loads((FOLDER / plan_file).read_text()), layout_update, training_update, calibration)
    return est.step_s, hf["step_s"], max(s.total - s.reserve for s in est.memory), hf["max_allocated"]


def run_errors() -> list[dict]:
    """Predicted vs measured step time and peak allocated memory of each run (module doc, 2)."""
    runs = json.loads((FOLDER / "runs.json").read_text())
    out = []
    for name, plan_file in RUNS.items():
        plan = json.loads((FOLDER / plan_file).read_text())
        est = _priced(plan)
        measured = runs[name]
        peak = max(s.total - s.reserve for s in est.memory)
        out.append(_row(name, est.step_s, measured["step_s"], peak, max(measured["peak_memory_bytes_per_rank"])))
    row = _row("hf_full16", *hf_full16())
    row["note"] = "stack hf: float32 weights under bf16 autocast, eager kernels, one GPU"
    out.append(row)
    return out


def _row(name: str, pred_s: float, meas_s: float, pred_b: float, meas_b: float) -> dict:
    return {"run": name, "predicted_step_s": pred_s, "measured_step_s": meas_s, "step_error": pred_s / meas_s - 1,
            "predicted_peak_gib": pred_b / GIB, "measured_peak_gib": meas_b / GIB, "memory_error": pred_b / meas_b - 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    kernels, runs = kernel_errors(), run_errors()
    if args.json:
        print(json.dumps({"kernels": kernels, "runs": runs}, indent=1))
        return
    print(f"GEMM points: {kernels['points']['gemm']} ({kernels['points']['gemm_measured_twice']} of shapes measured twice)")
    print(f"  max |error| at shapes measured once:  {100 * kernels['max_abs_error_gemm_measured_once']:.2f}%")
    if kernels["max_abs_error_gemm_measured_twice"] is not None:
        print(f"  max |error| at shapes measured twice: {100 * kernels['max_abs_error_gemm_measured_twice']:.2f}% "
              f"(the two measurements of one shape differ by up to {100 * (math.exp(kernels['spread_of_repeated_measurements']) - 1):.1f}%)")
    print(f"attention points: {kernels['points']['attention']}, max |error| {100 * kernels['max_abs_error_attention']:.2f}%")
    worst = sorted(kernels["gemm"], key=lambda x: -abs(x["error"]))[:5]
    for x in worst:
        print(f"    {x['label']:<22} m={x['m']:<6} n={x['n']:<6} k={x['k']:<6} measured {1e6 * x['measured_s']:8.1f} us  "
              f"atlas {1e6 * x['atlas_s']:8.1f} us  {100 * x['error']:+.1f}%")
    print("\nsingle-GPU runs on the H200 (predicted vs measured):")
    for r in runs:
        print(f"  {r['run']:<16} step {r['predicted_step_s']:.3f} s vs {r['measured_step_s']:.3f} s ({100 * r['step_error']:+.1f}%)  "
              f"peak allocated {r['predicted_peak_gib']:.1f} GiB vs {r['measured_peak_gib']:.1f} GiB ({100 * r['memory_error']:+.1f}%)"
              + (f"  [{r['note']}]" if "note" in r else ""))


if __name__ == "__main__":
    main()
