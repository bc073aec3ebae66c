# torchtitan 0.3.0 config module written by autopar
# llama3-8b on 8 x H100-80GB (dgx-h100): 1 node x 8 GPUs
# layout: dp=8 tp=1 pp=1
# knobs: ZeRO-3, micro-batch 2 x 4 accumulation, recompute full
# training: seq_len 8192, global batch 64 sequences, bf16
# estimate: step 12.500 s, 41,943 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# On every node, from the directory holding this file:
#   PYTHONPATH=. torchrun --nnodes 1 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" -m torchtitan.train --module autopar_torchtitan --config autopar
# Written for torchtitan 0.3.0, whose ConfigManager loads it (torchtitan 0.2.x: export torchtitan, a TOML file).
# Everything the plan priced is expressed in this torchtitan 0.3.0 file.

from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_8b


def autopar():
    # the plan's layout over that recipe
    config = llama3_8b()  # torchtitan's own recipe for the model: data, tokenizer, optimizer, checkpoints
    config.model_spec = model_registry('8B', converters=[])
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 8
    config.parallelism.fsdp_reshard_after_forward = 'default'
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 1
    config.parallelism.context_parallel_degree = 1
    config.training.local_batch_size = 2
    config.training.global_batch_size = 64
    config.training.seq_len = 8192
    config.training.mixed_precision_param = 'bfloat16'
    config.activation_checkpoint = FullAC.Config()
    config.compile.enable = True
    config.compile.components = ['model', 'loss']
    config.compile.enable_async_tensor_parallel = False
    return config
