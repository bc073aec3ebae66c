#!/usr/bin/env bash
# Megatron-LM arguments written by autopar
# llama3-70b on 16 x A100-80GB (dgx-a100-80g): 2 nodes x 8 GPUs
# layout: dp=16 tp=1 pp=1
# knobs: ZeRO-3, micro-batch 1 x 2 accumulation, recompute full, optimizer offloaded to CPU
# training: seq_len 4096, global batch 32 sequences, bf16
# estimate: step 12.500 s, 10,486 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Add data, tokenizer (vocabulary size 128256), optimizer and checkpoint arguments, then on every node:
#   source megatron_args.sh
#   torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...
# Written for Megatron-LM core_v0.16.1 (megatron-core 0.16.1), whose parse_args and validate_args accept it at this world size.
# Not expressible in Megatron-LM (the plan priced it; this file does what each line says):
# - parameter offload (ZeRO-3 weight shards in host memory): Megatron-Core offloads the optimizer (--optimizer-cpu-offload) and activations, not parameters; the weight shards stay on the GPU (more GPU memory than planned)
# - eager cross entropy: Megatron computes the loss vocabulary-parallel (fp32), or fused with --cross-entropy-loss-fusion; the file keeps Megatron's default
# - priced for framework 'deepspeed': the step time assumed that framework's overlap and kernels; re-plan with --framework megatron for Megatron-LM's own
# - NVMe offload (ZeRO-Infinity): Megatron-LM offloads to CPU memory only; the states priced on NVMe need the node's host RAM instead
# - ZeRO++ hpZ (zero_hpz_partition_size=8), qwZ (int8 weight all-gathers), qgZ (int4 gradient reduce-scatters): DeepSpeed's; Megatron-LM gathers and reduces in full precision over the whole sharding group
# Megatron-FSDP needs more than one CUDA hardware queue (validate_args)
unset CUDA_DEVICE_MAX_CONNECTIONS
MEGATRON_ARGS=(
    # model
    --num-layers 80
    --hidden-size 8192
    --ffn-hidden-size 28672
    --num-attention-heads 64
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
    --optimizer-cpu-offload
    --overlap-cpu-optimizer-d2h-h2d
    --use-precision-aware-optimizer
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
