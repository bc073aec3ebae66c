#!/usr/bin/env bash
# autopar launch script (torchrun)
# llama-65b on 1 x L40S (l40s-pcie-8): 1 node x 1 GPU
# layout: dp=1 tp=1 pp=1
# knobs: ZeRO-2, micro-batch 2 x 8 accumulation, recompute full, optimizer offloaded to CPU
# training: seq_len 512, global batch 16 sequences, bf16
# estimate: step 12.500 s, 655 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# Run on each of the 1 node(s), with MASTER_ADDR the first node's address:
#   bash launch.sh TRAIN_SCRIPT [ARGS...]   your training script; the plan's degrees are in AUTOPAR_* below
#   bash launch.sh --autopar-runtime [ARGS...]   autopar's runtime: python -m runtime.launch plan.json
# The plan is written to $AUTOPAR_PLAN (default plan.json) before the launch.
# Not expressible in torchrun (the plan priced it; this file does what each line says):
# - qlora: the reference runtime has no 4-bit base weights and refuses the run (runtime.lora); use the accelerate or deepspeed export with bitsandbytes
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo 'usage: launch.sh TRAIN_SCRIPT [ARGS...] | launch.sh --autopar-runtime [ARGS...]' >&2
    exit 2
fi
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"
MASTER_PORT="${MASTER_PORT:-29500}"
RDZV_ID="${RDZV_ID:-autopar-c5fb8105ab}"
export AUTOPAR_PLAN="${AUTOPAR_PLAN:-plan.json}"
export AUTOPAR_WORLD_SIZE=1
export AUTOPAR_DP=1
export AUTOPAR_DP_SHARD=1
export AUTOPAR_DP_REPLICATE=1
export AUTOPAR_TP=1
export AUTOPAR_SP=0
export AUTOPAR_PP=1
export AUTOPAR_VPP=1
export AUTOPAR_CP=1
export AUTOPAR_CP_ATTENTION=ring
export AUTOPAR_EP=1
export AUTOPAR_ETP=1
export AUTOPAR_ZERO_STAGE=2
export AUTOPAR_OFFLOAD_OPTIMIZER=1
export AUTOPAR_MICRO_BATCH=2
export AUTOPAR_GRAD_ACCUM=8
export AUTOPAR_GLOBAL_BATCH=16
export AUTOPAR_SEQ_LEN=512
export AUTOPAR_PRECISION=bf16
export AUTOPAR_GRAD_DTYPE=bf16
export AUTOPAR_RECOMPUTE=full
export AUTOPAR_RECOMPUTE_LAYERS=all
export AUTOPAR_SCHEDULE=1f1b
export AUTOPAR_STAGE_LAYERS=80
export AUTOPAR_RANK_ORDER=tp-cp-ep-dp-pp
export AUTOPAR_CROSS_ENTROPY=eager
export AUTOPAR_NORM_KERNEL=fused
export AUTOPAR_TP_COMM_OVERLAP=0
export AUTOPAR_FRAMEWORK=deepspeed
cat > "$AUTOPAR_PLAN" <<'AUTOPAR_PLAN_JSON'
{"schema_version":1,"created_at":"2025-01-01T00:00:00+00:00","inputs":{"model":{"name":"llama-65b","family":"llama","vocab_size":32000,"hidden_size":8192,"num_layers":80,"num_heads":64,"num_kv_heads":null,"head_dim":null,"ffn_hidden_size":22016,"mlp":"swiglu","norm":"rmsnorm","qkv_bias":false,"attn_out_bias":false,"mlp_bias":false,"qk_norm":false,"qk_norm_scope":"head","norm_placement":"pre","tie_embeddings":false,"position_embedding":"rope","max_position_embeddings":2048,"rope_theta":null,"rope_scaling":null,"parallel_residual":false,"sliding_window":null,"sliding_window_every":1,"sliding_window_layers":null,"window_kind":"sliding","attention_sinks":false,"embedding_norm":false,"attention":"standard","q_lora_rank":null,"kv_lora_rank":null,"qk_rope_head_dim":null,"qk_nope_head_dim":null,"v_head_dim":null,"num_experts":0,"moe_top_k":0,"moe_ffn_hidden_size":null,"num_shared_experts":0,"shared_expert_ffn_hidden_size":null,"shared_expert_gate":false,"first_k_dense_layers":0,"moe_layer_freq":1,"moe_layer_offset":0,"dense_layers":[],"router_bias":false,"router_score_correction_bias":false,"moe_router_groups":0,"moe_router_group_topk":0,"mtp_layers":0,"notes":[]},"cluster":{"name":"l40s-pcie-8","gpu":{"name":"L40S","vendor":"nvidia","peak_flops_per_s":{"bf16":362050000000000.0,"fp16":362050000000000.0,"fp8":733000000000000.0,"fp32":183000000000000.0},"memory_bytes":48305799168,"memory_bandwidth_bytes_per_s":864000000000.0,"link_bandwidth_bytes_per_s":32000000000.0,"tdp_w":350.0,"sm_count":142,"warpgroup_mma":false,"sustained_clock_fraction":1.0,"matmul_share":{},"source":"NVIDIA L40S Datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"},"gpus_per_node":8,"intra_node":{"kind":"pcie_switch","bus_bandwidth_bytes_per_s":20000000000.0,"latency_s":2.4999999999999998e-06,"source":"derived; 8xH100 PCIe reference busbw from Alaya NeW, 'NCCL-tests in practice', https://docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests"},"nvlink_domain_size":null,"placement_segment_nodes":null,"inter_node":{"kind":"roce","nics_per_node":2,"nic_bandwidth_bytes_per_s":25000000000.0,"rail_optimized":false,"oversubscription":1.0,"nodes_per_leaf":16,"latency_s":4e-06,"source":"assumed configuration (2x ConnectX-7 200 Gb/s per node)"},"host_memory_bytes":1099511627776,"host_to_device_bytes_per_s":25000000000.0,"host_memory_bandwidth_bytes_per_s":614400000000.0,"cpu_cores":64,"nvme_bytes":15360000000000,"nvme_read_bytes_per_s":26000000000.0,"nvme_write_bytes_per_s":12000000000.0,"description":"8x L40S PCIe server (PCIe Gen4 switches, no NVLink; 2x 200 Gb/s RoCE)","source":"NVIDIA L40S Datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413; host CPUs and NVMe assumed (typical OEM configuration)"},"gpus":1,"training":{"seq_len":512,"global_batch":16,"global_batch_tokens":null,"precision":"bf16","optimizer":"adamw","grad_dtype":"bf16","method":"qlora","lora_rank":64,"lora_alpha":16.0,"lora_targets":null,"quant_format":null,"dora":false,"trainable_embeddings":false,"master_weights":null,"mean_tokens_per_sequence":null},"constraints":{"memory_headroom":0.05,"tp":null,"pp":null,"cp":null,"ep":null,"dp":null,"zero_stage":null,"max_zero_stage":3,"micro_batch":null,"recompute":null,"schedule":null,"framework":"megatron","cross_entropy":null,"stack":null,"optimizer_state":"full","optimizer_in_backward":false,"offload_activations":false,"search_techniques":true,"allow_8bit_optimizer":true,"elementwise_kernels":"fused","norm_kernel":"fused","attention_kernel":null,"allow_offload":true,"sequence_parallel":true,"selective_recompute":true,"allow_quantized_comm":false,"allow_moe_a2a_overlap":true,"moe_parallel_folding":true,"fsdp_flat_params":false,"megatron_fsdp_gradient_fusion":true,"framework_version":null,"max_tp":null,"top_k":5}},"best":{"layout":{"tp":1,"pp":1,"dp":1,"cp":1,"ep":1,"etp":1,"vpp":1,"dp_shard":1,"zero_stage":2,"micro_batch":2,"grad_accum":8,"recompute":"full","recompute_modules":null,"recompute_layers":null,"sp":false,"schedule":"1f1b","account_for_embedding_in_pipeline_split":false,"account_for_loss_in_pipeline_split":false,"decoder_first_pipeline_num_layers":null,"decoder_last_pipeline_num_layers":null,"offload_optimizer":true,"offload_params":false,"offload_device":"cpu","zero_hpz_partition_size":1,"zero_quantized_weights":false,"zero_quantized_gradients":false,"zero_init":true,"activation_offload_layers":0,"tp_comm_overlap":false,"order":"tp-cp-ep-dp-pp","framework":"deepspeed","framework_version":null,"cross_entropy":null,"norm_kernel":"fused","elementwise_kernels":"fused","moe_token_dispatcher":"alltoall","moe_parallel_folding":true,"moe_a2a_overlap":false,"fsdp_flat_params":false,"megatron_fsdp_gradient_fusion":true,"fsdp_root_holds_ends":false,"attention_kernel":null,"stack":null,"optimizer_state":"full","optimizer_in_backward":false,"optimizer_fused":true,"offload_activations":false,"cp_attention":"ring"},"partition":[80],"estimate":{"ok":true,"fits":true,"gpus":1,"step_s":12.5,"tokens_per_s":655.36,"mfu":0.42,"memory":{"peak_bytes":75161927680,"capacity_bytes":85899345920},"partition":{"chunk_layers":[80],"pp":1,"vpp":1}},"placement":null,"equivalent_count":0,"equivalents":[]},"alternatives":[],"pareto":[],"rejections":[],"closest_miss":null,"why":[],"calibration":"","stats":{"generated":1,"invalid":0,"pruned":0,"priced":1,"feasible":1,"floored":0,"dominated":0,"seconds":0.0,"faster_than_reference":null}}
AUTOPAR_PLAN_JSON
if [[ "$1" == --autopar-runtime ]]; then
    shift
    exec torchrun \
    --nnodes 1 \
    --nproc-per-node 1 \
    --rdzv-backend c10d \
    --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    --rdzv-id "$RDZV_ID" \
    -m runtime.launch "$AUTOPAR_PLAN" "$@"
fi
exec torchrun \
    --nnodes 1 \
    --nproc-per-node 1 \
    --rdzv-backend c10d \
    --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    --rdzv-id "$RDZV_ID" \
    "$@"
