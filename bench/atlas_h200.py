"""Write the H200 kernel atlas from the measurements of 2026-11 and the public figures for the same GPU.

    python -m bench.atlas_h200            # rewrites cost_models/data/atlas/h200-141gb.json
    python -m bench.atlas_h200 --check    # exit 1 when the stored file differs from what this writes

GEMMs and attention come from `data/measurements/h200-2026-11/kernel_rates.json` (every point as
measured, `kernel_rates.py` in that folder; the 'efficient' SDPA backend is left out: no stack the
planner prices attends with it); the FP8 GEMM, the all-reduce sweep and the NVLS / ring figures from
ML Engineering (S. Bekman, stas00/ml-engineering at commit 744d01e, the files named per source).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "data" / "measurements" / "h200-2026-11" / "kernel_rates.json"
OUT = REPO / "cost_models" / "data" / "atlas" / "h200-141gb.json"

MLENG = "S. Bekman, ML Engineering (github.com/stas00/ml-engineering, commit 744d01e)"

ALL_REDUCE_8X_H200 = (
    # payload, busbw GB/s: network/README.md, "Real network throughput", all_reduce_bench.py on 8x H200
    ("32KiB", 1.44), ("64KiB", 2.93), ("128KiB", 5.73), ("256KiB", 11.74), ("512KiB", 23.94), ("1MiB", 39.93),
    ("2MiB", 64.53), ("4MiB", 107.16), ("8MiB", 155.53), ("16MiB", 219.89), ("32MiB", 275.84), ("64MiB", 346.51),
    ("128MiB", 401.93), ("256MiB", 436.15), ("512MiB", 450.29), ("1GiB", 463.58), ("2GiB", 469.17), ("4GiB", 473.10),
    ("8GiB", 477.45), ("16GiB", 482.26),
)


def _bytes(text: str) -> int:
    for unit, scale in (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    raise ValueError(text)


def build() -> dict:
    raw = json.loads(MEASURED.read_text())
    sources = {
        "h200-2026-11": {
            "citation": "data/measurements/h200-2026-11/kernel_rates.json, measured with kernel_rates.py in that folder "
                        "(median of 20 CUDA-event timings of one call after 3 warm-ups; README.md there)",
            "method": "isolated",
            "software": f"{raw['torch']}, driver 580.159.04, CUDA 13.0",
        },
        "mamf-fp8": {
            "citation": f"{MLENG}, compute/accelerator/README.md, 'Maximum Achievable Matmul FLOPS comparison table', "
                        "FP8 row 'NVIDIA H200 SXM' (best shape 1280x4096x12032)",
            "method": "queued",
            "software": "torch 2.7.1+cu128",
            "selection": "best_of_search",
        },
        "mamf-bf16": {
            "citation": f"{MLENG}, compute/accelerator/README.md, 'Maximum Achievable Matmul FLOPS comparison table', "
                        "BF16 row 'NVIDIA H100 SXM', whose note reads 'H200 is the same' (best shape 2048x2048x13312)",
            "method": "queued",
            "software": "torch 2.7.0+cu126",
            "selection": "best_of_search",
        },
        "mleng-allreduce-h200": {
            "citation": f"{MLENG}, network/README.md, 'Real network throughput': all_reduce_bench.py on one 8x H200 "
                        "node, NCCL's default algorithm (ring below 2 MiB, NVLS from 2 MiB, the 'SHARP' section says)",
            "method": "queued",
            "software": "torch 2.9.1+cu130, NCCL 2.27.7",
        },
        "mleng-ring-h200": {
            "citation": f"{MLENG}, network/README.md, 'SHARP': nccl-tests at 16 GiB on 8x H200 with NCCL_NVLS_ENABLE=0 "
                        "(all-reduce) and all-gather / reduce-scatter (ring)",
            "method": "queued",
            "software": "NCCL 2.27.7",
        },
    }
    gemm = [
        {"m": g["m"], "n": g["n"], "k": g["k"], "dtype": "bf16", "seconds": g["s"], "source": "h200-2026-11", "label": g["label"]}
        for g in raw["gemm"]
    ]
    gemm.append({"m": 2048, "n": 2048, "k": 13312, "dtype": "bf16", "tflops": 794.5, "source": "mamf-bf16"})
    gemm.append({"m": 1280, "n": 4096, "k": 12032, "dtype": "fp8", "tflops": 1453.4, "source": "mamf-fp8"})
    kernel = {"flash": "flash2", "cudnn": "cudnn"}
    attention = []
    for row in raw["sdpa"]:
        if row["backend"] not in kernel or "error" in row:
            continue
        for pass_, key in (("fwd", "fwd_tflops"), ("fwd_bwd", "fwdbwd_tflops")):
            attention.append({
                "kernel": kernel[row["backend"]], "head_dim": 128, "seq_len": row["seq"], "causal": True, "pass": pass_,
                "tflops": row[key], "batch": row["B"], "heads": 32, "source": "h200-2026-11",
            })
    collectives = [
        {"op": "all_reduce", "span": "nvlink", "ranks": 8, "bytes": _bytes(size), "busbw_gb_per_s": bw,
         "algorithm": "default", "source": "mleng-allreduce-h200"}
        for size, bw in ALL_REDUCE_8X_H200
    ]
    for op, bw in (("all_reduce", 367.2), ("all_gather", 361.4), ("reduce_scatter", 362.9)):
        collectives.append({"op": op, "span": "nvlink", "ranks": 8, "bytes": 16 * 2**30, "busbw_gb_per_s": bw,
                            "algorithm": "ring", "source": "mleng-ring-h200"})
    return {
        "format": "autopar-kernel-atlas/1",
        "gpu": "H200-141GB",
        "description": "NVIDIA H200 SXM (141 GB, 700 W): this repository's measurements of 2026-11 and public figures",
        "sources": sources,
        "gemm": gemm,
        "attention": attention,
        "memory": [],
        "collectives": collectives,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the stored file, write nothing")
    args = ap.parse_args(argv)
    text = json.dumps(build(), indent=1) + "\n"
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print(f"{OUT}: {'up to date' if same else 'differs from the measurements'}")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(build()['gemm'])} GEMMs, {len(build()['attention'])} attention points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
