#!/usr/bin/env bash
# autopar launch script (torchrun)
# llama3-70b on 128 x H100-80GB (dgx-h100): 16 node(s) x 8 GPUs
# layout: dp=4 tp=8 pp=4 vpp=5
# knobs: ZeRO-1, micro-batch 1 x 128 accumulation, sequence parallel, recompute full, interleaved_1f1b schedule
# training: seq_len 8192, global batch 512 sequences, bf16
# layers per stage: 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 5 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 3
# estimate: step 12.500 s, 335,544 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Run this script on each of the 16 node(s) with MASTER_ADDR set to the first node's
# address and plan.json (the exported plan) in the working directory.
set -euo pipefail
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"
torchrun \
    --nnodes 16 \
    --nproc-per-node 8 \
    --rdzv-backend c10d \
    --rdzv-endpoint "$MASTER_ADDR:29500" \
    --rdzv-id "${RDZV_ID:-autopar-a25aa7823d}" \
    -m runtime.launch plan.json
