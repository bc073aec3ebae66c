#!/usr/bin/env bash
# autopar launch script (torchrun)
# llama3-8b on 32 x H100-80GB (dgx-h100): 4 nodes x 8 GPUs
# layout: dp=8 tp=2 pp=2 vpp=2
# knobs: ZeRO-2, micro-batch 1 x 8 accumulation, sequence parallel, recompute selective, zero_bubble schedule
# training: seq_len 8192, global batch 64 sequences, bf16
# layers per stage: 8 | 8 | 8 | 8
# estimate: step 12.500 s, 41,943 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Run on each of the 4 node(s), with MASTER_ADDR the first node's address:
#   bash launch.sh TRAIN_SCRIPT [ARGS...]   your training script; the plan's degrees are in AUTOPAR_* below
#   bash launch.sh --autopar-runtime [ARGS...]   autopar's runtime: python -m runtime.launch plan.json
# The plan is written to $AUTOPAR_PLAN (default plan.json) before the launch.
# Everything the plan priced is expressed in this torchrun file.
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo 'usage: launch.sh TRAIN_SCRIPT [ARGS...] | launch.sh --autopar-runtime [ARGS...]' >&2
    exit 2
fi
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"
MASTER_PORT="${MASTER_PORT:-29500}"
RDZV_ID="${RDZV_ID:-autopar-c7166bf098}"
export AUTOPAR_PLAN="${AUTOPAR_PLAN:-plan.json}"
export AUTOPAR_WORLD_SIZE=32
export AUTOPAR_DP=8
export AUTOPAR_DP_SHARD=8
export AUTOPAR_DP_REPLICATE=1
export AUTOPAR_TP=2
export AUTOPAR_SP=1
export AUTOPAR_PP=2
export AUTOPAR_VPP=2
export AUTOPAR_CP=1
export AUTOPAR_CP_ATTENTION=ring
export AUTOPAR_EP=1
export AUTOPAR_ETP=2
export AUTOPAR_ZERO_STAGE=2
export AUTOPAR_OFFLOAD_OPTIMIZER=0
export AUTOPAR_MICRO_BATCH=1
export AUTOPAR_GRAD_ACCUM=8
export AUTOPAR_GLOBAL_BATCH=64
export AUTOPAR_SEQ_LEN=8192
export AUTOPAR_PRECISION=bf16
export AUTOPAR_GRAD_DTYPE=bf16
export AUTOPAR_RECOMPUTE=selective
export AUTOPAR_RECOMPUTE_LAYERS=all
export AUTOPAR_SCHEDULE=zero_bubble
export AUTOPAR_STAGE_LAYERS=8,8,8,8
export AUTOPAR_RANK_ORDER=tp-cp-ep-dp-pp
export AUTOPAR_CROSS_ENTROPY=loss_parallel
export AUTOPAR_NORM_KERNEL=fused
export AUTOPAR_TP_COMM_OVERLAP=0
export AUTOPAR_FRAMEWORK=fsdp
cat > "$AUTOPAR_PLAN" <<'AUTOPAR_PLAN_JSON'
{"schema_version":1,"created_at":"2025-01-01T00:00:00+00:00","inputs":{"model":{"name":"llama3-8b","family":"llama","vocab_size":128256,"hidden_size":4096,"num_layers":32,"num_heads":32,"num_kv_heads":8,"head_dim":null,"ffn_hidden_size":14336,"mlp":"swiglu","norm":"rmsnorm","qkv_bias":false,"attn_out_bias":false,"mlp_bias":false,"qk_norm":false,"qk_norm_scope":"head","norm_placement":"pre","tie_embeddings":false,"position_embedding":"rope","max_position_embeddings":131072,"rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192,"beta_fast":null,"beta_slow":null,"mscale":null,"mscale_all_dim":null},"parallel_residual":false,"sliding_window":null,"sliding_window_every":1,"sliding_window_layers":null,"window_kind":"sliding","attention_sinks":false,"embedding_norm":false,"attention":"standard","q_lora_rank":null,"kv_lora_rank":null,"qk_rope_head_dim":null,"qk_nope_head_dim":null,"v_head_dim":null,"num_experts":0,"moe_top_k":0,"moe_ffn_hidden_size":null,"num_shared_experts":0,"shared_expert_ffn_hidden_size":null,"shared_expert_gate":false,"first_k_dense_layers":0,"moe_layer_freq":1,"moe_layer_offset":0,"dense_layers":[],"router_bias":false,"router_score_correction_bias":false,"moe_router_groups":0,"moe_router_group_topk":0,"mtp_layers":0,"notes":[]},"cluster":{"name":"dgx-h100","gpu":{"name":"H100-80GB","vendor":"nvidia","peak_flops_per_s":{"bf16":989400000000000.0,"fp16":989400000000000.0,"fp8":1978900000000000.0,"fp32":494700000000000.0},"memory_bytes":85520809984,"memory_bandwidth_bytes_per_s":3350000000000.0,"link_bandwidth_bytes_per_s":450000000000.0,"tdp_w":700.0,"sm_count":132,"warpgroup_mma":true,"sustained_clock_fraction":1.0,"matmul_share":{"bf16":0.9238190303947508,"fp16":0.9238190303947508,"fp8":1.0},"source":"NVIDIA H100 Tensor Core GPU Architecture whitepaper (Table 3), https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper; NVIDIA H100 Tensor Core GPU Datasheet, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"},"gpus_per_node":8,"intra_node":{"kind":"nvswitch","bus_bandwidth_bytes_per_s":368000000000.0,"latency_s":1.8999999999999998e-06,"source":"ML Engineering, network/benchmarks/results/all-reduce-8xH200.md, https://github.com/stas00/ml-engineering/blob/master/network/benchmarks/results/all-reduce-8xH200.md"},"nvlink_domain_size":null,"placement_segment_nodes":null,"inter_node":{"kind":"infiniband","nics_per_node":8,"nic_bandwidth_bytes_per_s":50000000000.0,"rail_optimized":true,"oversubscription":1.0,"nodes_per_leaf":32,"latency_s":4e-06,"source":"DGX H100/H200 User Guide, hardware overview (8x ConnectX-7 400 Gb/s, one per GPU), https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html"},"host_memory_bytes":2199023255552,"host_to_device_bytes_per_s":50000000000.0,"host_memory_bandwidth_bytes_per_s":614400000000.0,"cpu_cores":112,"nvme_bytes":30720000000000,"nvme_read_bytes_per_s":52000000000.0,"nvme_write_bytes_per_s":24000000000.0,"description":"DGX H100 (8x H100 SXM5, 4x NVSwitch gen3, 8x NDR 400 Gb/s, rail-optimized)","source":"NVIDIA DGX H100/H200 User Guide (2x Xeon Platinum 8480C, 112 cores; 8x 3.84 TB U.2 NVMe data cache), https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html; NVMe bandwidth assumed"},"gpus":32,"training":{"seq_len":8192,"global_batch":64,"global_batch_tokens":null,"precision":"bf16","optimizer":"adamw","grad_dtype":"bf16","method":"full","lora_rank":null,"lora_alpha":null,"lora_targets":null,"quant_format":null,"dora":false,"trainable_embeddings":false,"master_weights":null,"mean_tokens_per_sequence":null},"constraints":{"memory_headroom":0.05,"tp":null,"pp":null,"cp":null,"ep":null,"dp":null,"zero_stage":null,"max_zero_stage":3,"micro_batch":null,"recompute":null,"schedule":null,"framework":"megatron","cross_entropy":null,"stack":null,"optimizer_state":"full","optimizer_in_backward":false,"offload_activations":false,"search_techniques":true,"allow_8bit_optimizer":true,"elementwise_kernels":"fused","norm_kernel":"fused","attention_kernel":null,"allow_offload":true,"sequence_parallel":true,"selective_recompute":true,"allow_quantized_comm":false,"allow_moe_a2a_overlap":true,"moe_parallel_folding":true,"fsdp_flat_params":false,"megatron_fsdp_gradient_fusion":true,"framework_version":null,"max_tp":null,"top_k":5}},"best":{"layout":{"tp":2,"pp":2,"dp":8,"cp":1,"ep":1,"etp":2,"vpp":2,"dp_shard":8,"zero_stage":2,"micro_batch":1,"grad_accum":8,"recompute":"selective","recompute_modules":null,"recompute_layers":null,"sp":true,"schedule":"zero_bubble","account_for_embedding_in_pipeline_split":false,"account_for_loss_in_pipeline_split":false,"decoder_first_pipeline_num_layers":null,"decoder_last_pipeline_num_layers":null,"offload_optimizer":false,"offload_params":false,"offload_device":"cpu","zero_hpz_partition_size":1,"zero_quantized_weights":false,"zero_quantized_gradients":false,"zero_init":true,"activation_offload_layers":0,"tp_comm_overlap":false,"order":"tp-cp-ep-dp-pp","framework":"fsdp","framework_version":null,"cross_entropy":null,"norm_kernel":"fused","elementwise_kernels":"fused","moe_token_dispatcher":"alltoall","moe_parallel_folding":true,"moe_a2a_overlap":false,"fsdp_flat_params":false,"megatron_fsdp_gradient_fusion":true,"fsdp_root_holds_ends":false,"attention_kernel":null,"stack":null,"optimizer_state":"full","optimizer_in_backward":false,"optimizer_fused":true,"offload_activations":false,"cp_attention":"ring"},"partition":[8,8,8,8],"estimate":{"ok":true,"fits":true,"gpus":32,"step_s":12.5,"tokens_per_s":41943.04,"mfu":0.42,"memory":{"peak_bytes":75161927680,"capacity_bytes":85899345920},"partition":{"chunk_layers":[8,8,8,8],"pp":2,"vpp":2}},"placement":null,"equivalent_count":0,"equivalents":[]},"alternatives":[],"pareto":[],"rejections":[],"closest_miss":null,"why":[],"calibration":"","stats":{"generated":1,"invalid":0,"pruned":0,"priced":1,"feasible":1,"floored":0,"dominated":0,"seconds":0.0,"faster_than_reference":null}}
AUTOPAR_PLAN_JSON
if [[ "$1" == --autopar-runtime ]]; then
    shift
    exec torchrun \
    --nnodes 4 \
    --nproc-per-node 8 \
    --rdzv-backend c10d \
    --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    --rdzv-id "$RDZV_ID" \
    -m runtime.launch "$AUTOPAR_PLAN" "$@"
fi
exec torchrun \
    --nnodes 4 \
    --nproc-per-node 8 \
    --rdzv-backend c10d \
    --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    --rdzv-id "$RDZV_ID" \
    "$@"
