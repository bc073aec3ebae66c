# torchtitan 0.3.0 config module written by autopar
# llama3-70b on 64 x H100-80GB (dgx-h100): 8 nodes x 8 GPUs
# layout: dp=2 tp=8 pp=4
# knobs: ZeRO-1, micro-batch 1 x 256 accumulation, sequence parallel, recompute selective, 1f1b schedule
# training: seq_len 8192, global batch 512 sequences, bf16
# layers per stage: 19 | 21 | 21 | 19
# estimate: step 12.500 s, 335,544 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# On every node, from the directory holding this file:
#   PYTHONPATH=. torchrun --nnodes 8 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" -m torchtitan.train --module autopar_torchtitan --config autopar
# Written for torchtitan 0.3.0, whose ConfigManager loads it (torchtitan 0.2.x: export torchtitan, a TOML file).
# Not expressible in torchtitan 0.3.0 (the plan priced it; this file does what each line says):
# - bf16 gradient reduction: torchtitan's FSDP reduces gradients in float32 (mixed_precision_reduce)
# - ZeRO-1: torchtitan shards with FSDP2, which also shards gradients and weights; written as ZeRO-2-like FSDP (fsdp_reshard_after_forward = "never")
# - selective recompute: priced as Megatron's (attention core and MLP activation recomputed); torchtitan's SelectiveAC saves compute-heavy ops and recomputes every second matmul, which keeps more activations (plan with --framework fsdp to price it)
# - priced for framework 'megatron': the step time assumed that framework's overlap and kernels; re-plan with --framework fsdp for torchtitan's own

from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_70b


def autopar():
    # the plan's layout over that recipe
    config = llama3_70b()  # torchtitan's own recipe for the model: data, tokenizer, optimizer, checkpoints
    config.model_spec = model_registry('70B', converters=[])
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 2
    config.parallelism.fsdp_reshard_after_forward = 'never'
    config.parallelism.tensor_parallel_degree = 8
    config.parallelism.enable_sequence_parallel = True
    config.parallelism.pipeline_parallel_degree = 4
    config.parallelism.pipeline_parallel_schedule = '1F1B'
    config.parallelism.pipeline_parallel_microbatch_size = 1
    config.parallelism.context_parallel_degree = 1
    config.parallelism.module_fqns_per_model_part = [
        ['tok_embeddings', 'layers.0', 'layers.1', 'layers.2', 'layers.3', 'layers.4', 'layers.5', 'layers.6', 'layers.7', 'layers.8', 'layers.9', 'layers.10', 'layers.11', 'layers.12', 'layers.13', 'layers.14', 'layers.15', 'layers.16', 'layers.17', 'layers.18'],
        ['layers.19', 'layers.20', 'layers.21', 'layers.22', 'layers.23', 'layers.24', 'layers.25', 'layers.26', 'layers.27', 'layers.28', 'layers.29', 'layers.30', 'layers.31', 'layers.32', 'layers.33', 'layers.34', 'layers.35', 'layers.36', 'layers.37', 'layers.38', 'layers.39'],
        ['layers.40', 'layers.41', 'layers.42', 'layers.43', 'layers.44', 'layers.45', 'layers.46', 'layers.47', 'layers.48', 'layers.49', 'layers.50', 'layers.51', 'layers.52', 'layers.53', 'layers.54', 'layers.55', 'layers.56', 'layers.57', 'layers.58', 'layers.59', 'layers.60'],
        ['layers.61', 'layers.62', 'layers.63', 'layers.64', 'layers.65', 'layers.66', 'layers.67', 'layers.68', 'layers.69', 'layers.70', 'layers.71', 'layers.72', 'layers.73', 'layers.74', 'layers.75', 'layers.76', 'layers.77', 'layers.78', 'layers.79', 'norm', 'lm_head'],
    ]
    config.training.local_batch_size = 256
    config.training.global_batch_size = 512
    config.training.seq_len = 8192
    config.training.mixed_precision_param = 'bfloat16'
    config.training.disable_cuda_graphs = True
    config.activation_checkpoint = SelectiveAC.Config()
    config.compile.enable = True
    config.compile.components = ['model', 'loss']
    config.compile.enable_async_tensor_parallel = True
    return config
