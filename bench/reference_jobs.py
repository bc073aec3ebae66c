"""The issue's reference jobs: our plan, its predicted MFU with the error band, and the published
figure of the same (or the nearest published) job beside it.

    python -m bench.reference_jobs [--json]

Every job is searched with default constraints (framework Megatron-Core unless the published run
used another stack), the calibrated cost model and its stored error bands. "Published" is what the
source measured, converted to tokens/s/GPU where the source gives FLOP/s or GPU hours:

- GPT-3 175B on 1024 A100, seq 2048, global batch 1536 (Narayanan et al. 2021, arXiv 2104.04473,
  Sec. 5.1: 140 TFLOP/s per GPU counted with their Eq. 3, which includes the recompute forward):
  `narayanan_step_s` turns it into 31.5 s per step, 97.6 tokens/s/GPU, 33.6% MFU. A year later the
  same stack with sequence parallelism and selective recompute ran the model at 51.4% MFU (Korthikanti
  et al. 2022, arXiv 2205.05198, 64 A100, TP8 PP8; `data/calibration/` row 38).
- Llama-3-405B on 8,192 and 16,384 H100, seq 8192, 16M-token batches (Llama 3 paper, arXiv
  2407.21783, Table 4: 43% and 41% BF16 MFU, 430 and 400 TFLOP/s per GPU).
- DeepSeek-V3 on 2,048 H800, FP8 (DeepSeek-V3 report, arXiv 2412.19437: 180K H800 GPU hours per
  trillion tokens, i.e. 1e12 / (180e3 x 3600) = 1,543 tokens/s/GPU).
- Llama-3-8B on 8 H100, seq 8192 (torchtitan, FSDP2 on 8 H100 96 GB at 500 W, 2024-12: 5,762
  tokens/s/GPU eager BF16, 6,667 with torch.compile; `data/calibration/` rows 64-65).
- Llama-3-70B on 1,024 H100, seq 8192, global batch 512: no run at this batch is published; the
  nearest is NVIDIA's DGX Cloud recipe at global batch 2048 (1,118 tokens/s/GPU, row 426).
- Mixtral-8x7B on 256 H100, seq 4096, global batch 1024: the nearest published run is Megatron-Core's
  MoE README, 64 H100 at global batch 256 (468 TFLOP/s per GPU, 5,643 tokens/s/GPU, row 61).
The ratio column is predicted / published tokens/s/GPU; where the published job differs (batch,
scale), the row says so and the ratio is only indicative. "ceiling" is the highest MFU any published
run of the job's regime measured (`cost_models.error_band.published_ceiling`), marked "!" when the
plan is predicted above it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

from cluster_specs.presets import get_cluster
from cost_models.error_band import above_published_ceiling
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.plan import SearchConstraints
from planner.search import describe, search


def narayanan_step_s(batch: int, seq: int, layers: int, hidden: int, vocab: int, tflops_per_gpu: float, gpus: int) -> float:
    """Seconds per step implied by a per-GPU FLOP rate counted with Narayanan et al. 2021 Eq. 3:
    F = 96 B s l h^2 (1 + s / 6h + V / 16lh) FLOPs per iteration (forward, backward and the
    recompute forward of every layer)."""
    flops = 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    return flops / (tflops_per_gpu * 1e12 * gpus)


GPT3_STEP_S = narayanan_step_s(1536, 2048, 96, 12288, 51200, 140.0, 1024)
"""31.5 s: GPT-3 175B on 1024 A100 at 140 TFLOP/s per GPU (Narayanan et al. 2021, Sec. 5.1)."""

DEEPSEEK_V3_TOKENS_PER_S_PER_GPU = 1e12 / (180e3 * 3600)
"""1,543: 180K H800 GPU hours per trillion tokens (DeepSeek-V3 report, Table 1)."""


@dataclass(frozen=True)
class Job:
    name: str
    model: str
    cluster: str
    gpus: int
    seq_len: int
    global_batch: int
    precision: str
    framework: str
    published_tokens_per_s_per_gpu: float | None
    published_mfu: float | None  # fraction of the dense peak, as the source states it
    published: str  # the source and how the figure was derived


JOBS = (
    Job("GPT-3 175B / 1024 A100", "gpt3-175b", "dgx-a100-80g", 1024, 2048, 1536, "bf16", "megatron",
        1536 * 2048 / GPT3_STEP_S / 1024, 0.336,
        f"Narayanan et al. 2021: 140 TFLOP/s/GPU with recompute = {GPT3_STEP_S:.1f} s/step; the same model "
        "with sequence parallelism and selective recompute: 51.4% MFU (Korthikanti et al. 2022, 64 A100)"),
    Job("Llama-3-70B / 1024 H100", "llama3-70b", "dgx-h100", 1024, 8192, 512, "bf16", "megatron",
        1118.4, None, "nearest: NVIDIA DGX Cloud Llama 3.1 70B, 1024 H100, global batch 2048 (not 512)"),
    Job("Llama-3-405B / 8192 H100", "llama3-405b", "dgx-h100", 8192, 8192, 2048, "bf16", "megatron",
        None, 0.43, "Llama 3 paper Table 4: 430 TFLOP/s/GPU, 43% BF16 MFU"),
    Job("Llama-3-405B / 16384 H100", "llama3-405b", "dgx-h100", 16384, 8192, 2048, "bf16", "megatron",
        None, 0.41, "Llama 3 paper Table 4: 400 TFLOP/s/GPU, 41% BF16 MFU"),
    Job("Mixtral-8x7B / 256 H100", "mixtral-8x7b", "dgx-h100", 256, 4096, 1024, "bf16", "megatron",
        5643.0, None, "nearest: Megatron-Core MoE README, 64 H100, global batch 256 (not 256 GPUs / 1024)"),
    Job("DeepSeek-V3 / 2048 H800 fp8", "deepseek-v3", "dgx-h800", 2048, 4096, 15360, "fp8", "megatron",
        DEEPSEEK_V3_TOKENS_PER_S_PER_GPU, None, "DeepSeek-V3 report: 180K H800 GPU hours per trillion tokens"),
    Job("Llama-3-8B / 8 H100", "llama3-8b", "dgx-h100", 8, 8192, 32, "bf16", "fsdp",
        6667.0, None, "torchtitan 2024-12, FSDP2 + torch.compile, 8 H100 96 GB 500 W (5,762 eager)"),
)


def plan_row(job: Job) -> dict:
    """Search the job and return the row of the table (units in the keys)."""
    training = TrainingSpec(seq_len=job.seq_len, global_batch=job.global_batch, precision=job.precision)  # type: ignore[arg-type]
    plan = search(get_model(job.model), training, get_cluster(job.cluster), job.gpus,
                  SearchConstraints(framework=job.framework), refine=False)
    row: dict = {"job": job.name, "published": job.published,
                 "published_tokens_per_s_per_gpu": job.published_tokens_per_s_per_gpu,
                 "published_mfu": job.published_mfu, "plan": None}
    if plan.best is None:
        return row
    lay, e = plan.best.layout, plan.best.estimate
    band = e.get("error_band") or {}
    row.update(
        plan=describe(lay),
        step_s=e["step_s"], tokens_per_s_per_gpu=e["tokens_per_s_per_gpu"], mfu=e["mfu"],
        mfu_low=band.get("mfu_low"), mfu_high=band.get("mfu_high"), peak_gib=e["memory"]["peak_bytes"] / 2**30,
        ceiling_mfu=(e.get("published_mfu_ceiling") or {}).get("mfu"), above_ceiling=above_published_ceiling(e),
    )
    if job.published_tokens_per_s_per_gpu:
        row["predicted_over_published"] = e["tokens_per_s_per_gpu"] / job.published_tokens_per_s_per_gpu
    elif job.published_mfu:
        row["predicted_over_published"] = e["mfu"] / job.published_mfu
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    rows = [plan_row(j) for j in JOBS]
    if args.json:
        print(json.dumps({"jobs": [asdict(j) for j in JOBS], "rows": rows}, indent=2))
        return 0
    print(f"{'job':28s} {'tok/s/GPU':>9s} {'MFU (band)':>16s} {'ceiling':>7s} {'published':>10s} {'pred/pub':>8s}")
    for r in rows:
        if r["plan"] is None:
            print(f"{r['job']:28s} no layout fits")
            continue
        band = f"{100 * r['mfu']:.1f}% ({100 * (r['mfu_low'] or 0):.0f}-{100 * (r['mfu_high'] or 0):.0f})"
        pub = (f"{r['published_tokens_per_s_per_gpu']:,.0f}" if r["published_tokens_per_s_per_gpu"]
               else f"{100 * r['published_mfu']:.0f}% MFU")
        ceiling = (f"{100 * r['ceiling_mfu']:.0f}%" if r["ceiling_mfu"] else "-") + ("!" if r["above_ceiling"] else "")
        print(f"{r['job']:28s} {r['tokens_per_s_per_gpu']:9,.0f} {band:>16s} {ceiling:>7s} {pub:>10s} "
              f"{r.get('predicted_over_published', float('nan')):8.2f}")
        print(f"{'':4s}plan: {r['plan']}")
        print(f"{'':4s}published: {r['published']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
