#!/usr/bin/env bash
# Megatron-LM arguments written by autopar
# deepseek-v3 on 2048 x H800-80GB (dgx-h800): 256 nodes x 8 GPUs
# layout: dp=128 tp=1 pp=16 ep=64 etp=1
# knobs: ZeRO-1, micro-batch 1 x 120 accumulation, recompute full, 1f1b schedule
# training: seq_len 4096, global batch 15360 sequences, fp8
# layers per stage: 3 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 2
# estimate: step 12.500 s, 5,033,165 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Add data, tokenizer (vocabulary size 129280), optimizer and checkpoint arguments, then on every node:
#   source megatron_args.sh
#   torchrun --nnodes 256 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...
# Written for Megatron-LM core_v0.16.1 (megatron-core 0.16.1), whose parse_args and validate_args accept it at this world size.
# Not expressible in Megatron-LM (the plan priced it; this file does what each line says):
# - FP8 scaling recipe: this file runs Megatron-Core's delayed scaling (--fp8-recipe delayed); the plan priced FP8 GEMMs at one rate fitted on published FP8 runs (cost_models/data/calibration.json), not per recipe
MEGATRON_ARGS=(
    # model
    --num-layers 61
    --hidden-size 7168
    --ffn-hidden-size 18432
    --num-attention-heads 128
    --multi-latent-attention
    --q-lora-rank 1536
    --kv-lora-rank 512
    --qk-head-dim 128
    --qk-pos-emb-head-dim 64
    --v-head-dim 128
    --seq-length 4096
    --max-position-embeddings 163840
    --position-embedding-type rope
    --rotary-base 10000
    --rope-type yarn
    --rotary-scaling-factor 40.0
    --mscale 1.0
    --mscale-all-dim 1.0
    --swiglu
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --num-experts 256
    --moe-router-topk 8
    --moe-ffn-hidden-size 2048
    --moe-shared-expert-intermediate-size 2048
    --moe-layer-freq '([0]*3+[1]*58)'
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --moe-router-num-groups 8
    --moe-router-group-topk 4
    --mtp-num-layers 1
    # parallelism
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 16
    --decoder-first-pipeline-num-layers 3
    --decoder-last-pipeline-num-layers 2
    --expert-model-parallel-size 64
    --expert-tensor-parallel-size 1
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    # batch
    --micro-batch-size 1
    --global-batch-size 15360
    # recompute
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    # precision
    --bf16
    --fp8-format hybrid
    --fp8-recipe delayed
    --grad-reduce-in-bf16
)
