#!/usr/bin/env bash
# Megatron-LM arguments written by autopar
# llama-65b on 1 x L40S (l40s-pcie-8): 1 node x 1 GPU
# layout: dp=1 tp=1 pp=1
# knobs: ZeRO-2, micro-batch 2 x 8 accumulation, recompute full, optimizer offloaded to CPU
# training: seq_len 512, global batch 16 sequences, bf16
# estimate: step 12.500 s, 655 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Add data, tokenizer (vocabulary size 32000), optimizer and checkpoint arguments, then on every node:
#   source megatron_args.sh
#   torchrun --nnodes 1 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...
# Written for Megatron-LM core_v0.16.1 (megatron-core 0.16.1), whose parse_args and validate_args accept it at this world size.
# Not expressible in Megatron-LM (the plan priced it; this file does what each line says):
# - training method qlora (frozen base, rank-64 adapters): Megatron-LM's pretrain_gpt.py trains every weight; this file runs full training, which needs the gradients and optimizer states of the whole model (the plan priced the adapters'). Megatron-Bridge / NeMo PEFT run LoRA on Megatron-Core (LoRA(dim=r, alpha=alpha) on linear_qkv, linear_proj, linear_fc1, linear_fc2) with these parallel arguments.
# - eager cross entropy: Megatron computes the loss vocabulary-parallel (fp32), or fused with --cross-entropy-loss-fusion; the file keeps Megatron's default
# - priced for framework 'deepspeed': the step time assumed that framework's overlap and kernels; re-plan with --framework megatron for Megatron-LM's own
# Megatron-FSDP needs more than one CUDA hardware queue (validate_args)
unset CUDA_DEVICE_MAX_CONNECTIONS
MEGATRON_ARGS=(
    # model
    --num-layers 80
    --hidden-size 8192
    --ffn-hidden-size 22016
    --num-attention-heads 64
    --seq-length 512
    --max-position-embeddings 2048
    --position-embedding-type rope
    --swiglu
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    # parallelism
    --tensor-model-parallel-size 1
    --use-megatron-fsdp
    --use-distributed-optimizer
    --data-parallel-sharding-strategy optim_grads
    --ckpt-format fsdp_dtensor
    --optimizer-cpu-offload
    --overlap-cpu-optimizer-d2h-h2d
    --use-precision-aware-optimizer
    # batch
    --micro-batch-size 2
    --global-batch-size 16
    # recompute
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    # precision
    --bf16
    --grad-reduce-in-bf16
)
