# torchtitan 0.3.0 config module written by autopar
# llama3-8b on 16 x H100-80GB (dgx-h100): 2 nodes x 8 GPUs
# layout: dp=4 tp=2 pp=2
# knobs: ZeRO-1, micro-batch 2 x 8 accumulation, sequence parallel, recompute full, 1f1b schedule
# training: seq_len 4096, global batch 64 sequences, bf16
# layers per stage: 16 | 16
# estimate: step 12.500 s, 20,972 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# On every node, from the directory holding this file:
#   PYTHONPATH=. torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" -m torchtitan.train --module autopar_torchtitan --config autopar
# Written for torchtitan 0.3.0, whose ConfigManager loads it (torchtitan 0.2.x: export torchtitan, a TOML file).
# Not expressible in torchtitan 0.3.0 (the plan priced it; this file does what each line says):
# - bf16 gradient reduction: torchtitan's FSDP reduces gradients in float32 (mixed_precision_reduce)
# - ZeRO-1: torchtitan shards with FSDP2, which also shards gradients and weights; written as ZeRO-2-like FSDP (fsdp_reshard_after_forward = "never")
# - priced for framework 'deepspeed': the step time assumed that framework's overlap and kernels; re-plan with --framework fsdp for torchtitan's own

from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_8b


def autopar():
    # the plan's layout over that recipe
    config = llama3_8b()  # torchtitan's own recipe for the model: data, tokenizer, optimizer, checkpoints
    config.model_spec = model_registry('8B', converters=[])
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 4
    config.parallelism.fsdp_reshard_after_forward = 'never'
    config.parallelism.tensor_parallel_degree = 2
    config.parallelism.enable_sequence_parallel = True
    config.parallelism.pipeline_parallel_degree = 2
    config.parallelism.pipeline_parallel_schedule = '1F1B'
    config.parallelism.pipeline_parallel_microbatch_size = 2
    config.parallelism.context_parallel_degree = 1
    config.parallelism.module_fqns_per_model_part = [
        ['tok_embeddings', 'layers.0', 'layers.1', 'layers.2', 'layers.3', 'layers.4', 'layers.5', 'layers.6', 'layers.7', 'layers.8', 'layers.9', 'layers.10', 'layers.11', 'layers.12', 'layers.13', 'layers.14', 'layers.15'],
        ['layers.16', 'layers.17', 'layers.18', 'layers.19', 'layers.20', 'layers.21', 'layers.22', 'layers.23', 'layers.24', 'layers.25', 'layers.26', 'layers.27', 'layers.28', 'layers.29', 'layers.30', 'layers.31', 'norm', 'lm_head'],
    ]
    config.training.local_batch_size = 16
    config.training.global_batch_size = 64
    config.training.seq_len = 4096
    config.training.mixed_precision_param = 'bfloat16'
    config.training.disable_cuda_graphs = True
    config.activation_checkpoint = FullAC.Config()
    config.compile.enable = True
    config.compile.components = ['model', 'loss']
    config.compile.enable_async_tensor_parallel = False
    return config
