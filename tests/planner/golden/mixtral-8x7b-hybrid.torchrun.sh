#!/usr/bin/env bash
# autopar launch script (torchrun)
# mixtral-8x7b on 64 x H100-80GB (dgx-h100): 8 node(s) x 8 GPUs
# layout: dp=8 (shard 4 x replicate 2) tp=2 pp=2 cp=2 ep=4 etp=2
# knobs: ZeRO-3, micro-batch 1 x 64 accumulation, sequence parallel, recompute full (2 layers per stage), gpipe schedule, optimizer offloaded to CPU
# training: seq_len 8192, global batch 512 sequences, fp8
# layers per stage: 15 | 17
# estimate: step 12.500 s, 335,544 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Run this script on each of the 8 node(s) with MASTER_ADDR set to the first node's
# address and plan.json (the exported plan) in the working directory.
set -euo pipefail
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"
torchrun \
    --nnodes 8 \
    --nproc-per-node 8 \
    --rdzv-backend c10d \
    --rdzv-endpoint "$MASTER_ADDR:29500" \
    --rdzv-id "${RDZV_ID:-autopar-6fd15df983}" \
    -m runtime.launch plan.json
