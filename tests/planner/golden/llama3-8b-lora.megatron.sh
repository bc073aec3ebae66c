#!/usr/bin/env bash
# Megatron-LM arguments written by autopar
# llama3-8b on 16 x H100-80GB (dgx-h100): 2 nodes x 8 GPUs
# layout: dp=16 tp=1 pp=1
# knobs: ZeRO-3, micro-batch 1 x 2 accumulation, recompute full
# training: seq_len 4096, global batch 32 sequences, bf16
# estimate: step 12.500 s, 10,486 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Add data, tokenizer (vocabulary size 128256), optimizer and checkpoint arguments, then on every node:
#   source megatron_args.sh
#   torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...
# Written for Megatron-LM core_v0.16.1 (megatron-core 0.16.1), whose parse_args and validate_args accept it at this world size.
# Not expressible in Megatron-LM (the plan priced it; this file does what each line says):
# - training method lora (frozen base, rank-16 adapters): Megatron-LM's pretrain_gpt.py trains every weight; this file runs full training, which needs the gradients and optimizer states of the whole model (the plan priced the adapters'). Megatron-Bridge / NeMo PEFT run LoRA on Megatron-Core (LoRA(dim=r, alpha=alpha) on linear_qkv, linear_proj, linear_fc1, linear_fc2) with these parallel arguments.
# - eager cross entropy: Megatron computes the loss vocabulary-parallel (fp32), or fused with --cross-entropy-loss-fusion; the file keeps Megatron's default
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
    --seq-length 4096
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
    --tensor-model-parallel-size 1
    --use-megatron-fsdp
    --use-distributed-optimizer
    --data-parallel-sharding-strategy optim_grads_params
    --ckpt-format fsdp_dtensor
    --overlap-grad-reduce
    --overlap-param-gather
    # batch
    --micro-batch-size 1
    --global-batch-size 32
    # recompute
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    # precision
    --bf16
    --grad-reduce-in-bf16
)
