#!/usr/bin/env bash
# Megatron-LM arguments written by autopar
# mixtral-8x7b on 64 x H100-80GB (dgx-h100): 8 nodes x 8 GPUs
# layout: dp=8 (shard 4 x replicate 2) tp=2 pp=2 cp=2 ep=4 etp=2
# knobs: ZeRO-3, micro-batch 1 x 64 accumulation, sequence parallel, recompute full (2 layers per stage), gpipe schedule, optimizer offloaded to CPU
# training: seq_len 8192, global batch 512 sequences, fp8
# layers per stage: 15 | 17
# estimate: step 12.500 s, 335,544 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Add data, tokenizer (vocabulary size 32000), optimizer and checkpoint arguments, then on every node:
#   source megatron_args.sh
#   torchrun --nnodes 8 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...
# Written for Megatron-LM core_v0.16.1 (megatron-core 0.16.1), whose parse_args and validate_args accept it at this world size.
# Not expressible in Megatron-LM (the plan priced it; this file does what each line says):
# - tensor / context parallelism beside Megatron-FSDP: FSDP needs CUDA_DEVICE_MAX_CONNECTIONS > 1, their overlap needs 1 before Blackwell (validate_args); the step time was priced with their traffic exposed
# - GPipe schedule: Megatron always runs (interleaved) 1F1B (same bubble, fewer micro-batches in flight)
# - FP8 scaling recipe: this file runs Megatron-Core's delayed scaling (--fp8-recipe delayed); the plan priced FP8 GEMMs at one rate fitted on published FP8 runs (cost_models/data/calibration.json), not per recipe
# Megatron-FSDP needs more than one CUDA hardware queue (validate_args)
unset CUDA_DEVICE_MAX_CONNECTIONS
MEGATRON_ARGS=(
    # model
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --seq-length 8192
    --max-position-embeddings 32768
    --position-embedding-type rope
    --rotary-base 1000000
    --swiglu
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --num-experts 8
    --moe-router-topk 2
    --moe-ffn-hidden-size 14336
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    # parallelism
    --tensor-model-parallel-size 2
    --sequence-parallel
    --pipeline-model-parallel-size 2
    --decoder-first-pipeline-num-layers 15
    --decoder-last-pipeline-num-layers 17
    --tp-comm-overlap
    --context-parallel-size 2
    --cp-comm-type p2p
    --expert-model-parallel-size 4
    --expert-tensor-parallel-size 2
    --use-megatron-fsdp
    --use-distributed-optimizer
    --data-parallel-sharding-strategy optim_grads_params
    --ckpt-format fsdp_dtensor
    --num-distributed-optimizer-instances 2
    --overlap-grad-reduce
    --overlap-param-gather
    --optimizer-cpu-offload
    --overlap-cpu-optimizer-d2h-h2d
    --use-precision-aware-optimizer
    # batch
    --micro-batch-size 1
    --global-batch-size 512
    # recompute
    --recompute-granularity full
    --recompute-method block
    --recompute-num-layers 2
    # precision
    --bf16
    --fp8-format hybrid
    --fp8-recipe delayed
    --grad-reduce-in-bf16
)
