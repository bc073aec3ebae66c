#!/usr/bin/env bash
# Megatron-LM arguments written by autopar
# llama3-8b on 32 x H100-80GB (dgx-h100): 4 nodes x 8 GPUs
# layout: dp=8 tp=2 pp=2 vpp=2
# knobs: ZeRO-2, micro-batch 1 x 8 accumulation, sequence parallel, recompute selective, zero_bubble schedule
# training: seq_len 8192, global batch 64 sequences, bf16
# layers per stage: 8 | 8 | 8 | 8
# estimate: step 12.500 s, 41,943 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Add data, tokenizer (vocabulary size 128256), optimizer and checkpoint arguments, then on every node:
#   source megatron_args.sh
#   torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...
# Written for Megatron-LM core_v0.16.1 (megatron-core 0.16.1), whose parse_args and validate_args accept it at this world size.
# Not expressible in Megatron-LM (the plan priced it; this file does what each line says):
# - tensor / context parallelism beside Megatron-FSDP: FSDP needs CUDA_DEVICE_MAX_CONNECTIONS > 1, their overlap needs 1 before Blackwell (validate_args); the step time, priced for fsdp, hid part of it
# - zero-bubble schedule (ZB1P): Megatron runs (interleaved) 1F1B, whose bubble is three times larger
# - selective recompute of the dense MLP activation: Megatron-Core recomputes expert activations (moe_act) or whole MLPs (mlp), not a dense MLP's activation alone
# - loss_parallel cross entropy: Megatron computes the loss vocabulary-parallel (fp32), or fused with --cross-entropy-loss-fusion; the file keeps Megatron's default
# - priced for framework 'fsdp': the step time assumed that framework's overlap and kernels; re-plan with --framework megatron for Megatron-LM's own
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
    --tensor-model-parallel-size 2
    --sequence-parallel
    --pipeline-model-parallel-size 2
    --num-layers-per-virtual-pipeline-stage 8
    --use-megatron-fsdp
    --use-distributed-optimizer
    --data-parallel-sharding-strategy optim_grads
    --ckpt-format fsdp_dtensor
    --overlap-grad-reduce
    --overlap-param-gather
    # batch
    --micro-batch-size 1
    --global-batch-size 64
    # recompute
    --recompute-granularity selective
    --recompute-modules core_attn
    # precision
    --bf16
    --grad-reduce-in-bf16
)
