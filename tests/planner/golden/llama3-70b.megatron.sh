#!/usr/bin/env bash
# Megatron-LM arguments written by autopar
# llama3-70b on 64 x H100-80GB (dgx-h100): 8 nodes x 8 GPUs
# layout: dp=2 tp=8 pp=4
# knobs: ZeRO-1, micro-batch 1 x 256 accumulation, sequence parallel, recompute selective, 1f1b schedule
# training: seq_len 8192, global batch 512 sequences, bf16
# layers per stage: 19 | 21 | 21 | 19
# estimate: step 12.500 s, 335,544 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Add data, tokenizer (vocabulary size 128256), optimizer and checkpoint arguments, then on every node:
#   source megatron_args.sh
#   torchrun --nnodes 8 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...
# Written for Megatron-LM core_v0.16.1 (megatron-core 0.16.1), whose parse_args and validate_args accept it at this world size.
# Everything the plan priced is expressed in this Megatron-LM file.
# tensor/context parallelism: one CUDA hardware queue, so communication kernels are
# scheduled before the GEMMs they overlap with (validate_args, Hopper and earlier)
export CUDA_DEVICE_MAX_CONNECTIONS=1
MEGATRON_ARGS=(
    # model
    --num-layers 80
    --hidden-size 8192
    --ffn-hidden-size 28672
    --num-attention-heads 64
    --group-query-attention
    --num-query-groups 8
    --seq-length 8192
    --max-position-embeddings 131072
    --position-embedding-type rope
    --rotary-base 500000
    --use-rope-scaling
    --rope-scaling-factor 8.0
    --swiglu
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    # parallelism
    --tensor-model-parallel-size 8
    --sequence-parallel
    --pipeline-model-parallel-size 4
    --decoder-first-pipeline-num-layers 19
    --decoder-last-pipeline-num-layers 19
    --tp-comm-overlap
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    # batch
    --micro-batch-size 1
    --global-batch-size 512
    # recompute
    --recompute-granularity selective
    --recompute-modules core_attn
    # precision
    --bf16
    --grad-reduce-in-bf16
)
