"""DeepSeek-V3's own training layout, priced, against the technical report's cost.

    python -m bench.deepseek_v3_paper [--json]

The report (DeepSeek-AI 2024, arXiv 2412.19437, Sec. 3.2 and Table 1) trains on 2,048 H800 with
16-way pipeline parallelism (DualPipe), 64-way expert parallelism over 8 nodes, no tensor
parallelism, ZeRO-1 data parallelism, FP8 mixed precision, sequence 4,096 and a global batch of
15,360 sequences, recomputing the RMSNorms, the MLA up-projections and the SwiGLU output (from
its input, cached in FP8: the report's Sec. 3.3.4); a token reaches at most 4
nodes and IB traffic is deduplicated per node (DeepEP, our `flex` dispatcher). It reports 180K
H800 GPU hours per trillion tokens: 6.48e-4 GPU-seconds per token, 19.9 s per step at this batch.

We price the layout four ways, because no framework we export to runs it exactly:
- `megatron-combined-1f1b`: Megatron-Core's combined 1F1B (`--overlap-moe-expert-parallel-comm`),
  the closest Megatron-Core comes to DualPipe: a micro-batch's forward beside another's backward,
  the all-to-alls of both hidden behind the compute of both. It needs interleaving, so the 61
  layers are cut into 32 chunks (`PARTITION_INTERLEAVED`, the CP-SAT partitioner's cut), and
  Megatron runs the 120 micro-batches per pipeline in groups
  of 20 (`--microbatch-group-size-per-virtual-pipeline-stage`: 120 % 16 leaves a group smaller
  than pp). Interleaving warms up with 2(p - r - 1) + 20 + 1 chunk forwards, about 1.6 p
  micro-batches on rank 0 where DualPipe holds p + 1: to fit, it recomputes the attention core on
  top of the report's RMSNorm, MLA up-projection and SwiGLU recompute (the report caches the
  SwiGLU inputs and recomputes its output).
- `megatron-1f1b`: Megatron-Core's 1F1B with the report's recompute, no F&B pairs (all-to-alls
  exposed).
- `fsdp-dualpipev`: torch's DualPipeV (DualPipe cut in half: the same bubble and activations per
  rank, half the parameter copies) with torchtitan's EP overlap, the report's schedule; 61 layers
  cut into 32 chunks placed as a V (`PARTITION_V`). Its memory is torchtitan's MoE activations (three
  routed 16-bit copies per token, eager SwiGLU) and torch pipelining's receive buffers (one per
  micro-batch and chunk): it does not fit.
- `fsdp-zbv`: the same V without the F&B pairs (all-to-alls exposed).
Every variant attends with a fused Hopper kernel (`Layout.attention_kernel` "fused"): the report ran
DeepSeek's own kernels, and the FlashAttention-2 default of the fsdp framework would price a kernel it
did not run (MLA's 192-wide queries and keys against 128-wide values are not FlashAttention-2's
shape either).
The report's one MTP module is priced (the preset's `mtp_layers`): a block, a projection and one
more pass of the BF16 output head, on the rank that holds the head. Where that rank also held its
share of the layers, it set the pace (+32% over the report); the report puts the embedding, the
output head and the MTP module on one rank with the shallowest and deepest layers (Sec. 3.2.1),
and the cuts below leave that rank one layer.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from cost_models.jobs import run_job
from cost_models.pipeline import is_v_shape

GPU_HOURS_PER_TRILLION_TOKENS = 180_000
"""DeepSeek-V3 technical report, Table 1 note and Sec. 1: 180K H800 GPU hours per trillion tokens."""
GPUS, SEQ, GLOBAL_BATCH = 2048, 4096, 15360
PARTITION_INTERLEAVED = [2] * 15 + [1] + [2] * 15 + [0]
"""61 layers over pp 16 x 2 interleaved chunks (chunk c on rank c % 16), as the CP-SAT partitioner
cuts them (`partition: "auto"` finds it): the rank holding the LM head and the MTP module keeps one
layer, its last chunk only the head."""
PARTITION_V = [0] + [2] * 30 + [1]
"""The same 61 layers placed as a V (chunk c on rank c, then 31 - c): rank 0 holds the embedding,
the deepest layer, the output head and the MTP module, the report's placement; every other rank
four layers."""

BASE: dict[str, Any] = {
    "model": "deepseek-v3", "cluster": "dgx-h800", "gpus": GPUS,
    "training": {"seq_len": SEQ, "global_batch": GLOBAL_BATCH, "precision": "fp8"},
    "layout": {
        "tp": 1, "pp": 16, "ep": 64, "micro_batch": 1, "zero_stage": 1, "recompute": "selective",
        "recompute_modules": ["layernorm", "mla_up_proj", "act"], "moe_token_dispatcher": "flex",
        "attention_kernel": "fused",
    },
}
VARIANTS: dict[str, dict[str, Any]] = {
    "megatron-combined-1f1b": {
        "vpp": 2, "schedule": "interleaved_1f1b", "moe_a2a_overlap": True,
        "recompute_modules": ["layernorm", "mla_up_proj", "act", "core_attn"],
    },
    "megatron-1f1b": {},
    "fsdp-dualpipev": {"framework": "fsdp", "vpp": 2, "schedule": "dualpipev"},
    "fsdp-zbv": {"framework": "fsdp", "vpp": 2, "schedule": "zbv"},
}


def paper_step_s() -> float:
    """Seconds per step the report's GPU hours imply at its batch."""
    tokens = GLOBAL_BATCH * SEQ
    return tokens * GPU_HOURS_PER_TRILLION_TOKENS * 3600 / 1e12 / GPUS


def price(variant: str) -> dict[str, Any]:
    job = json.loads(json.dumps(BASE))
    job["layout"].update(VARIANTS[variant])
    if job["layout"].get("vpp") == 2:
        v_shape = is_v_shape(job["layout"].get("schedule", "interleaved_1f1b"), job["layout"]["pp"])
        job["partition"] = PARTITION_V if v_shape else PARTITION_INTERLEAVED
    out = run_job(job)
    if not out.get("ok"):
        raise ValueError(f"{variant}: {out.get('error')}")
    return out


def rows() -> list[dict[str, Any]]:
    target = paper_step_s()
    out = []
    for name in VARIANTS:
        r = price(name)
        out.append({
            "variant": name, "step_s": r["step_s"], "paper_step_s": target, "error": r["step_s"] / target - 1,
            "mfu": r["mfu"], "peak_gib": r["memory"]["peak_bytes"] / 2**30,
            "usable_gib": r["memory"]["capacity_bytes"] / 2**30, "fits": r["fits"],
            "parts_s": {k.removesuffix("_s"): v for k, v in r["time"]["breakdown"].items() if v},
        })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    table = rows()
    if args.json:
        print(json.dumps(table, indent=2))
        return
    print(f"DeepSeek-V3, 2048 x H800, paper step {table[0]['paper_step_s']:.2f} s (180K GPU-h per 1T tokens)")
    for r in table:
        print(
            f"{r['variant']:24s} step {r['step_s']:6.2f} s ({r['error']:+.1%})  MFU {r['mfu']:.3f}  "
            f"peak {r['peak_gib']:.1f} / {r['usable_gib']:.1f} GiB  {'fits' if r['fits'] else 'does not fit'}"
        )
        print("    " + ", ".join(f"{k} {v:.2f}" for k, v in r["parts_s"].items()))


if __name__ == "__main__":
    main()
