#!/usr/bin/env bash
# Megatron-LM arguments written by autopar
# mixtral-8x7b on 64 x H100-80GB (dgx-h100): 8 nodes x 8 GPUs
# layout: dp=16 tp=1 pp=4 vpp=2 ep=8 etp=1
# knobs: ZeRO-1, micro-batch 1 x 8 accumulation, recompute selective, dualpipev schedule
# training: seq_len 4096, global batch 128 sequences, bf16
# layers per stage: 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4
# estimate: step 12.500 s, 41,943 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Add data, tokenizer (vocabulary size 32000), optimizer and checkpoint arguments, then on every node:
#   source megatron_args.sh
#   torchrun --nnodes 8 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...
# Written for Megatron-LM core_v0.16.1 (megatron-core 0.16.1), whose parse_args and validate_args accept it at this world size.
# Not expressible in Megatron-LM (the plan priced it; this file does what each line says):
# - dualpipev (V-shape) schedule: Megatron runs interleaved 1F1B with chunks looped over the ranks
# - eager cross entropy: Megatron computes the loss vocabulary-parallel (fp32), or fused with --cross-entropy-loss-fusion; the file keeps Megatron's default
# - priced for framework 'fsdp': the step time assumed that framework's overlap and kernels; re-plan with --framework megatron for Megatron-LM's own
MEGATRON_ARGS=(
    # model
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --seq-length 4096
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
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 4
    --num-layers-per-virtual-pipeline-stage 4
    --expert-model-parallel-size 8
    --expert-tensor-parallel-size 1
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    # batch
    --micro-batch-size 1
    --global-batch-size 128
    # recompute
    --recompute-granularity selective
    --recompute-modules core_attn moe_act
    # precision
    --bf16
    --grad-reduce-in-bf16
)
