"""Cost-model memory against the runtime traced at its planned world size (issue "Run a plan").

    python -m bench.fake_world_memory [--only NAME ...] [--json OUT.json] [--steps 2]
    python -m bench.fake_world_memory --build [--only NAME ...] [--json OUT.json]

For each case, `runtime.fake_world` traces the first rank of every pipeline stage of the runtime
(fake process group of `gpus` ranks, FakeTensorMode, bf16 parameters and activations) and we print
its measured peak next to `cost_models.estimate` for the same layout priced as the runtime executes
it (`runtime.fake_world.compare_with_estimate`: framework `fsdp`, eager PyTorch kernels). The estimate's
allocator reserve (CUDA context, fragmentation) is left out: a CPU trace has neither.

Cases: Llama-3-8B and a Mixtral-style MoE (Mixtral-8x7B) at 64-256 ranks, across ZeRO stages,
TP/SP, PP schedules, EP and recompute modes; LoRA fine-tuning of Llama-3-8B on 8 ranks. Each
stage trace is a fresh Python process (5-60 s).

`--build` (BUILD_CASES: Llama-3-70B and Llama-3.1-405B plans, FSDP alone and TP x PP x FSDP): the
first rank of every pipeline stage builds its parts for real on this CPU (`runtime.fake_world.
measure_build`: the meta-device model, sharded, then only the local shards materialised and
initialised) and we print its shard's bytes beside the growth of its peak resident memory and the
whole model's float32 bytes, which every rank built before sharding until the runtime built on
the meta device. Each rank holds up to 1.5 GiB here: check `free -g`. FSDP2's set-up is O(FSDP
group) per parameter on the CPU (its meta chunks, `_chunk_with_empty`): the 1,024-rank FSDP case
spends most of its seconds there.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

CASES: list[dict[str, Any]] = [
    # --- Llama-3-8B, seq 8192 ------------------------------------------------------------------
    {"name": "8b-fsdp64-z3", "model": "llama3-8b", "gpus": 64, "seq": 8192, "gbs": 64,
     "layout": {"zero_stage": 3}},
    {"name": "8b-fsdp64-z3-full", "model": "llama3-8b", "gpus": 64, "seq": 8192, "gbs": 64,
     "layout": {"zero_stage": 3, "recompute": "full"}},
    {"name": "8b-dp128-z2-selective", "model": "llama3-8b", "gpus": 128, "seq": 8192, "gbs": 128,
     "layout": {"zero_stage": 2, "recompute": "selective"}},
    {"name": "8b-dp64-z1-full-mb2", "model": "llama3-8b", "gpus": 64, "seq": 4096, "gbs": 128,
     "layout": {"zero_stage": 1, "recompute": "full", "micro_batch": 2}},
    {"name": "8b-tp8-dp8-z3", "model": "llama3-8b", "gpus": 64, "seq": 8192, "gbs": 64,
     "layout": {"tp": 8, "zero_stage": 3}},
    {"name": "8b-tp4-pp4-dp8-1f1b-selective", "model": "llama3-8b", "gpus": 128, "seq": 8192, "gbs": 64,
     "layout": {"tp": 4, "pp": 4, "zero_stage": 1, "recompute": "selective"}},
    # zero bubble (torch's ScheduleInterleavedZeroBubble at vpp 1). Since the fake-world stages keep
    # the weight-gradient pass (`Trainer._static_stage_args`), the trace matches the real gloo run
    # (tests/runtime/test_parallel_layouts.py, within 33 KiB) and shows what torch 2.13 runs: every
    # rank holds pp micro-batches (not 1F1B's pp - r), and rank r >= 1 up to r + 1 of them between
    # their input- and weight-gradient passes, holding the gradients of every weight op's output
    # (`pipeline.split_backward_peaks`, `activations` pending bytes). Measured (torch 2.13 CPU trace,
    # 2 steps): 18.3 / 20.2 / 22.3 / 29.4 GiB per stage; 1F1B's count priced 17.8 / 12.5 / 9.4 / 9.7
    # (-3% / -38% / -58% / -67%); with the split-backward peaks -2.7% / -2.7% / -2.5% / -7.8%, and the LM head's pending
    # logit gradient on the last stage (`stage_table._pending_wgrad`) -2.7% / -2.7% / -2.5% / -1.1%.
    {"name": "8b-tp4-pp4-dp8-zero-bubble-selective", "model": "llama3-8b", "gpus": 128, "seq": 8192, "gbs": 64,
     "layout": {"tp": 4, "pp": 4, "zero_stage": 1, "recompute": "selective", "schedule": "zero_bubble", "framework": "fsdp"}},
    # interleaved zero bubble (two chunks per rank): torch warms rank r up with (v - 1) x p + (p - 1 - r)
    # forwards and defers its first r weight passes (`pipeline._zero_bubble_states` replays the order).
    # Measured (torch 2.13 CPU trace, 2 steps): 19.7 / 18.9 / 19.9 / 24.9 GiB; Megatron's interleaved
    # count with r + 1 pending chunks priced +15.1% / +2.5% / -13.0% / -25.1%, the replay -3.0% / -5.6%
    # / -5.3% / -6.6%, with the LM head's pending logit gradient -3.0% / -5.6% / -5.3% / -2.7%, with one
    # chunk's bf16 weight gradients left by its weight pass (`pipeline.WEIGHT_PASS_SCHEDULES`; live
    # bytes at rank 1's peak grouped by the stage action that allocated them) -0.9% / -3.4% / -3.3% / -1.1%.
    {"name": "8b-tp4-pp4-dp8-zero-bubble-v2-selective", "model": "llama3-8b", "gpus": 128, "seq": 8192, "gbs": 64,
     "layout": {"tp": 4, "pp": 4, "vpp": 2, "zero_stage": 1, "recompute": "selective", "schedule": "zero_bubble",
                "framework": "fsdp"}},
    # V-shape schedules: two chunks of 4 layers per rank placed as a V (rank 0: chunks 0 and 7, the
    # embedding and the LM head), 8 micro-batches (DualPipeV needs >= 2 x pp). Measured (torch 2.13
    # CPU trace, 2 steps): zbv 22.9 / 17.9 / 18.5 / 21.9 GiB. Priced with p micro-batches only:
    # -6.5% / -11.5% / -14.5% / -27.9% (each input pass keeps the weight ops' output gradients until
    # its weight pass, and in the cool-down rank r runs r input passes on each chunk first: rank 3
    # holds 7 chunks, all between their passes); with the split-backward peaks -2.0% / -5.7% / -3.1%
    # / -2.0%, with the LM head's pending logit gradient on rank 0 -0.9% / -5.7% / -3.1% / -2.0%, with
    # the bf16 weight gradients a weight pass leaves +0.9% / -3.5% / -0.9% / -0.1%.
    # dualpipev 21.7 / 18.0 / 17.9 / 17.8 GiB against (2pp + 1) / 2 micro-batches: +5.5% /
    # -3.5% / -3.4% / -2.9%. Rank 0's timeline (stage actions, live bytes; 2026-11-26): at the
    # minimum 2p micro-batches torch's DualPipeV runs the only loss backward that meets 2p + 1 chunks
    # (step 4, overlapped F0 + B1) before chunk 0's first backward, so chunk 0's gradients do not
    # exist yet (FSDP2 creates them lazily); the peak is chunk 0's first backward instead (19.5 GiB
    # live: 9 chunks and one micro-batch's retained logits, + 2.2 GiB of its gradients and backward), 1.2
    # GiB under the priced 9 chunks + loss transient + every gradient. Priced with that order
    # (`pipeline.dualpipev_loss_meets_first_chunk`, `stage_table.price_memory`): +1.0% / -3.5% / -3.4%
    # / -2.9%. With 2 x 2p micro-batches the step-4 loop pairs them every iteration, as priced: 23.5 /
    # 18.5 / 18.4 / 18.3 GiB traced, -1.5% / -3.4% / -3.3% / -2.8% (the `-m16` case).
    {"name": "8b-tp4-pp4-dp8-zbv-selective", "model": "llama3-8b", "gpus": 128, "seq": 8192, "gbs": 64,
     "layout": {"tp": 4, "pp": 4, "vpp": 2, "zero_stage": 1, "recompute": "selective", "schedule": "zbv",
                "framework": "fsdp"}},
    {"name": "8b-tp4-pp4-dp8-dualpipev-selective", "model": "llama3-8b", "gpus": 128, "seq": 8192, "gbs": 64,
     "layout": {"tp": 4, "pp": 4, "vpp": 2, "zero_stage": 1, "recompute": "selective", "schedule": "dualpipev",
                "framework": "fsdp"}},
    {"name": "8b-tp4-pp4-dp8-dualpipev-selective-m16", "model": "llama3-8b", "gpus": 128, "seq": 8192, "gbs": 128,
     "layout": {"tp": 4, "pp": 4, "vpp": 2, "zero_stage": 1, "recompute": "selective", "schedule": "dualpipev",
                "framework": "fsdp"}},
    # looped BFS (torch's ScheduleLoopedBFS): every forward of each local chunk, then every backward,
    # priced as GPipe's memory (all 8 micro-batches). Measured (torch 2.13 CPU trace, 2 steps):
    # 27.5 / 27.2 / 27.2 / 40.8 GiB, estimate -1.1% / -3.0% / -3.0% / -1.8%.
    {"name": "8b-tp4-pp4-dp8-looped-bfs-selective", "model": "llama3-8b", "gpus": 128, "seq": 8192, "gbs": 64,
     "layout": {"tp": 4, "pp": 4, "vpp": 2, "zero_stage": 1, "recompute": "selective", "schedule": "looped_bfs",
                "framework": "fsdp"}},
    {"name": "8b-tp8-pp2-dp16-gpipe", "model": "llama3-8b", "gpus": 256, "seq": 8192, "gbs": 64,
     "layout": {"tp": 8, "pp": 2, "zero_stage": 1, "schedule": "gpipe"}},
    {"name": "8b-tp2-cp2-dp16-z3", "model": "llama3-8b", "gpus": 64, "seq": 16384, "gbs": 32,
     "layout": {"tp": 2, "cp": 2, "zero_stage": 3}},
    # --- Mixtral-8x7B (top-2 of 8 experts), seq 4096 -------------------------------------------
    {"name": "mixtral-ep8-dp64-z3-full", "model": "mixtral-8x7b", "gpus": 64, "seq": 4096, "gbs": 64,
     "layout": {"ep": 8, "zero_stage": 3, "recompute": "full"}},
    {"name": "mixtral-ep8-dp64-z1-selective", "model": "mixtral-8x7b", "gpus": 64, "seq": 4096, "gbs": 64,
     "layout": {"ep": 8, "zero_stage": 1, "recompute": "selective"}},
    {"name": "mixtral-ep8-pp2-dp32-1f1b", "model": "mixtral-8x7b", "gpus": 64, "seq": 4096, "gbs": 128,
     "layout": {"ep": 8, "pp": 2, "zero_stage": 1, "recompute": "full"}},
    {"name": "mixtral-ep4-dp128-z2-selective", "model": "mixtral-8x7b", "gpus": 128, "seq": 4096, "gbs": 128,
     "layout": {"ep": 4, "zero_stage": 2, "recompute": "selective"}},
    # --- LoRA (frozen bf16 base, fp32 adapters: runtime.lora) ------------------------------------
    # Measured (torch 2.13 CPU trace, 2026-11-25): lora16-z3-full -0.3%, lora16-z3 +0.0%,
    # lora64-attn-z0 +1.9%. Before the cost model learned two things these rows showed, +13.0% and
    # -19.4%: a frozen RMSNorm scale spares the float32 normalized output
    # (`activations.EAGER_FP32_FROZEN_NORM_BYTES`), and FSDP2's `replicate` (ZeRO-0) holds an
    # unsharded bf16 copy of every block beside the stored weights (`stage_table._state_bytes`).
    {"name": "8b-lora16-fsdp8-z3-full", "model": "llama3-8b", "gpus": 8, "seq": 8192, "gbs": 8,
     "layout": {"zero_stage": 3, "recompute": "full"}, "training": {"method": "lora", "lora_rank": 16}},
    {"name": "8b-lora16-fsdp8-z3", "model": "llama3-8b", "gpus": 8, "seq": 4096, "gbs": 8,
     "layout": {"zero_stage": 3}, "training": {"method": "lora", "lora_rank": 16}},
    {"name": "8b-lora64-attn-dp8-z0-selective", "model": "llama3-8b", "gpus": 8, "seq": 4096, "gbs": 8,
     "layout": {"zero_stage": 0, "recompute": "selective"},
     "training": {"method": "lora", "lora_rank": 64, "lora_targets": "attention"}},
]


BUILD_CASES: list[dict[str, Any]] = [
    {"name": "70b-fsdp256-z3", "model": "llama3-70b", "gpus": 256, "seq": 8192, "gbs": 256, "layout": {"zero_stage": 3}},
    {"name": "70b-tp8-pp8-dp16", "model": "llama3-70b", "gpus": 1024, "seq": 8192, "gbs": 512,
     "layout": {"tp": 8, "pp": 8, "zero_stage": 1}},
    {"name": "405b-fsdp1024-z3", "model": "llama3-405b", "gpus": 1024, "seq": 8192, "gbs": 1024,
     "layout": {"zero_stage": 3}},
    {"name": "405b-tp8-pp16-dp8", "model": "llama3-405b", "gpus": 1024, "seq": 8192, "gbs": 512,
     "layout": {"tp": 8, "pp": 16, "zero_stage": 1}},
]
"""Plans whose ranks build their shards in `--build` mode (float32 parameters, the runtime's master copy)."""


def run_builds(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from dataclasses import asdict

    from runtime.fake_world import BUILD_HEADER, format_build, measure_builds
    from runtime.spec import load_run_spec

    rows: list[dict[str, Any]] = []
    print(f"{'case':22s} {BUILD_HEADER}")
    for case in cases:
        spec = run_spec(case)
        spec["dtype"] = "fp32"
        for b in measure_builds(load_run_spec(spec)):
            print(f"{case['name']:22s} {format_build(b)}", flush=True)
            rows.append({"case": case["name"], **asdict(b)})
    worst = max(rows, key=lambda r: r["rss_growth_bytes"] - r["local_bytes"])
    print(f"largest RSS growth beyond the shard: {(worst['rss_growth_bytes'] - worst['local_bytes']) / 2**20:.0f} MiB "
          f"({worst['case']} stage {worst['stage']}); largest shard {max(r['local_bytes'] for r in rows) / 2**30:.2f} GiB")
    return rows


def run_spec(case: dict[str, Any]) -> dict[str, Any]:
    """The RunSpec dict of a case: bf16 parameters and compute, AdamW, plus the case's `training`
    fields (a LoRA method)."""
    return {
        "model": case["model"],
        "training": {
            "seq_len": case["seq"], "global_batch": case["gbs"], "optimizer": "adamw", **case.get("training", {}),
        },
        "gpus": case["gpus"],
        "layout": case["layout"],
        "dtype": "bf16",
    }


def run_case(case: dict[str, Any], steps: int) -> list[dict[str, Any]]:
    from runtime.fake_world import compare_with_estimate, measure_stages
    from runtime.spec import load_run_spec

    run = load_run_spec(run_spec(case))
    rows = compare_with_estimate(run, measure_stages(run, steps))
    for r in rows:
        r["case"] = case["name"]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="case names to run")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--json", default=None, help="write all rows here")
    ap.add_argument("--build", action="store_true", help="host memory of the 70B / 405B builds (BUILD_CASES)")
    args = ap.parse_args(argv)
    if args.build:
        rows = run_builds([c for c in BUILD_CASES if not args.only or c["name"] in args.only])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=2)
        return 0
    cases = [c for c in CASES if not args.only or c["name"] in args.only]
    from runtime.fake_world import TABLE_HEADER, format_row, relative_error

    all_rows: list[dict[str, Any]] = []
    print(f"{'case':34s} {TABLE_HEADER}")
    worst = 0.0
    for case in cases:
        try:
            rows = run_case(case, args.steps)
        except Exception as exc:  # report and go on: one broken case must not hide the others
            print(f"{case['name']:34s} FAILED: {exc}", file=sys.stderr)
            continue
        for r in rows:
            r["error"] = relative_error(r)
            worst = max(worst, abs(r["error"]))
            print(f"{case['name']:34s} {format_row(r)}", flush=True)
        all_rows += rows
    print(f"worst |error|: {100 * worst:.1f}% over {len(all_rows)} stage traces")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
