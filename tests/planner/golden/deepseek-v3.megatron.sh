#!/usr/bin/env bash
# Megatron-LM arguments written by autopar
# deepseek-v3 on 1024 x H100-80GB (dgx-h100): 128 nodes x 8 GPUs
# layout: dp=8 tp=8 pp=16 ep=8 etp=8
# knobs: ZeRO-1, micro-batch 1 x 128 accumulation, sequence parallel, recompute full, 1f1b schedule
# training: seq_len 4096, global batch 1024 sequences, bf16
# layers per stage: 5 | 3 | 3 | 3 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 3
# estimate: step 12.500 s, 335,544 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Add data, tokenizer (vocabulary size 129280), optimizer and checkpoint arguments, then on every node:
#   source megatron_args.sh
#   torchrun --nnodes 128 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...
# Written for Megatron-LM core_v0.16.1 (megatron-core 0.16.1), whose parse_args and validate_args accept it at this world size.
# Everything the plan priced is expressed in this Megatron-LM file.
# tensor/context parallelism: one CUDA hardware queue, so communication kernels are
# scheduled before the GEMMs they overlap with (validate_args, Hopper and earlier)
export CUDA_DEVICE_MAX_CONNECTIONS=1
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
    --tensor-model-parallel-size 8
    --sequence-parallel
    --pipeline-model-parallel-size 16
    --pipeline-model-parallel-layout 'E,t*5|t*3|t*3|t*3|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*3,m*1,L'
    --tp-comm-overlap
    --expert-model-parallel-size 8
    --expert-tensor-parallel-size 8
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    # batch
    --micro-batch-size 1
    --global-batch-size 1024
    # recompute
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    # precision
    --bf16
    --grad-reduce-in-bf16
)
