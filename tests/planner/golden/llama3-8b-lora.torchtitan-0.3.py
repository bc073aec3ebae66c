# torchtitan 0.3.0 config module written by autopar
# llama3-8b on 16 x H100-80GB (dgx-h100): 2 nodes x 8 GPUs
# layout: dp=16 tp=1 pp=1
# knobs: ZeRO-3, micro-batch 1 x 2 accumulation, recompute full
# training: seq_len 4096, global batch 32 sequences, bf16
# estimate: step 12.500 s, 10,486 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# On every node, from the directory holding this file:
#   PYTHONPATH=. torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" -m torchtitan.train --module autopar_torchtitan --config autopar
# Written for torchtitan 0.3.0, whose ConfigManager loads it (torchtitan 0.2.x: export torchtitan, a TOML file).
# Not expressible in torchtitan 0.3.0 (the plan priced it; this file does what each line says):
# - training method lora (frozen base, rank-16 adapters): torchtitan trains every weight; this file runs full training, which needs the gradients and optimizer states of the whole model (the plan priced the adapters'). Use the accelerate or deepspeed export (PEFT), or torchtune's LoRA recipes.
# - bf16 gradient reduction: torchtitan's FSDP reduces gradients in float32 (mixed_precision_reduce)

from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_8b


def autopar():
    # the plan's layout over that recipe
    config = llama3_8b()  # torchtitan's own recipe for the model: data, tokenizer, optimizer, checkpoints
    config.model_spec = model_registry('8B', converters=[])
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 16
    config.parallelism.fsdp_reshard_after_forward = 'default'
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 1
    config.parallelism.context_parallel_degree = 1
    config.training.local_batch_size = 1
    config.training.global_batch_size = 32
    config.training.seq_len = 4096
    config.training.mixed_precision_param = 'bfloat16'
    config.activation_checkpoint = FullAC.Config()
    config.compile.enable = True
    config.compile.components = ['model', 'loss']
    config.compile.enable_async_tensor_parallel = False
    return config
