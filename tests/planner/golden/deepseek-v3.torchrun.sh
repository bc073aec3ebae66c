#!/usr/bin/env bash
# autopar launch script (torchrun)
# deepseek-v3 on 1024 x H100-80GB (dgx-h100): 128 node(s) x 8 GPUs
# layout: dp=8 tp=8 pp=16 ep=8 etp=8
# knobs: ZeRO-1, micro-batch 1 x 128 accumulation, sequence parallel, recompute full, 1f1b schedule
# training: seq_len 4096, global batch 1024 sequences, bf16
# layers per stage: 5 | 3 | 3 | 3 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 3
# estimate: step 12.500 s, 335,544 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Run this script on each of the 128 node(s) with MASTER_ADDR set to the first node's
# address and plan.json (the exported plan) in the working directory.
set -euo pipefail
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"
torchrun \
    --nnodes 128 \
    --nproc-per-node 8 \
    --rdzv-backend c10d \
    --rdzv-endpoint "$MASTER_ADDR:29500" \
    --rdzv-id "${RDZV_ID:-autopar-b866674e0f}" \
    -m runtime.launch plan.json
