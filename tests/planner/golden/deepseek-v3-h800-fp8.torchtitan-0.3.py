# torchtitan 0.3.0 config module written by autopar
# deepseek-v3 on 2048 x H800-80GB (dgx-h800): 256 nodes x 8 GPUs
# layout: dp=128 tp=1 pp=16 ep=64 etp=1
# knobs: ZeRO-1, micro-batch 1 x 120 accumulation, recompute full, 1f1b schedule
# training: seq_len 4096, global batch 15360 sequences, fp8
# layers per stage: 3 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 4 | 2
# estimate: step 12.500 s, 5,033,165 tokens/s, MFU 42.0%, peak 70.0 GiB per GPU
# On every node, from the directory holding this file:
#   PYTHONPATH=. torchrun --nnodes 256 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" -m torchtitan.train --module autopar_torchtitan --config autopar
# Written for torchtitan 0.3.0, whose ConfigManager loads it (torchtitan 0.2.x: export torchtitan, a TOML file).
# Not expressible in torchtitan 0.3.0 (the plan priced it; this file does what each line says):
# - bf16 gradient reduction: torchtitan's FSDP reduces gradients in float32 (mixed_precision_reduce)
# - multi-token prediction (1 module of deepseek-v3): torchtitan 0.3 (this module) trains without it; the plan priced its block, projection and extra output-head pass on the head rank, so this run is faster
# - ZeRO-1: torchtitan shards with FSDP2, which also shards gradients and weights; written as ZeRO-2-like FSDP (fsdp_reshard_after_forward = "never")
# - priced for framework 'megatron': the step time assumed that framework's overlap and kernels; re-plan with --framework fsdp for torchtitan's own
# - FP8 scaling recipe: this file runs torchao float8 with row-wise scaling (recipe_name rowwise); the plan priced FP8 GEMMs at one rate fitted on published FP8 runs (cost_models/data/calibration.json), not per recipe

from torchtitan.components.quantization import Float8GroupedExpertsConverter, Float8LinearConverter
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.models.deepseek_v3 import model_registry
from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_671b


def autopar():
    # the plan's layout over that recipe
    config = deepseek_v3_671b()  # torchtitan's own recipe for the model: data, tokenizer, optimizer, checkpoints
    config.model_spec = model_registry('671B', converters=[Float8LinearConverter.Config(recipe_name='rowwise', filter_fqns=['lm_head', 'router.gate'], model_compile_enabled=True), Float8GroupedExpertsConverter.Config(model_compile_enabled=True)])
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 128
    config.parallelism.fsdp_reshard_after_forward = 'never'
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 16
    config.parallelism.pipeline_parallel_schedule = '1F1B'
    config.parallelism.pipeline_parallel_microbatch_size = 1
    config.parallelism.context_parallel_degree = 1
    config.parallelism.expert_parallel_degree = 64
    config.parallelism.module_fqns_per_model_part = [
        ['tok_embeddings', 'layers.0', 'layers.1', 'layers.2'],
        ['layers.3', 'layers.4', 'layers.5', 'layers.6'],
        ['layers.7', 'layers.8', 'layers.9', 'layers.10'],
        ['layers.11', 'layers.12', 'layers.13', 'layers.14'],
        ['layers.15', 'layers.16', 'layers.17', 'layers.18'],
        ['layers.19', 'layers.20', 'layers.21', 'layers.22'],
        ['layers.23', 'layers.24', 'layers.25', 'layers.26'],
        ['layers.27', 'layers.28', 'layers.29', 'layers.30'],
        ['layers.31', 'layers.32', 'layers.33', 'layers.34'],
        ['layers.35', 'layers.36', 'layers.37', 'layers.38'],
        ['layers.39', 'layers.40', 'layers.41', 'layers.42'],
        ['layers.43', 'layers.44', 'layers.45', 'layers.46'],
        ['layers.47', 'layers.48', 'layers.49', 'layers.50'],
        ['layers.51', 'layers.52', 'layers.53', 'layers.54'],
        ['layers.55', 'layers.56', 'layers.57', 'layers.58'],
        ['layers.59', 'layers.60', 'norm', 'lm_head'],
    ]
    config.training.local_batch_size = 120
    config.training.global_batch_size = 15360
    config.training.seq_len = 4096
    config.training.mixed_precision_param = 'bfloat16'
    config.training.disable_cuda_graphs = True
    config.activation_checkpoint = FullAC.Config()
    config.compile.enable = True
    config.compile.components = ['model', 'loss']
    config.compile.enable_async_tensor_parallel = False
    return config
