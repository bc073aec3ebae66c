"""torchtune recipe config (YAML) of a plan priced in the torchtune stack (`Layout.stack`).

The config has the keys of torchtune's own recipe configs (0.6.1: `recipes/configs/llama3_1/
8B_lora_single_device.yaml`, `8B_full_single_device.yaml`, `70B_lora.yaml` ...) and is run by the
recipe named in its header: `lora_finetune_single_device` / `lora_finetune_distributed` (lora, qlora)
or `full_finetune_single_device` / `full_finetune_distributed` (full), `tune run --nproc_per_node N
RECIPE --config torchtune_config.yaml`. Every `_component_` is a torchtune (or torch, bitsandbytes,
torchao) callable with keyword arguments it takes:

- `model`: the Llama component builder with the model's own dimensions (`torchtune.models.llama2.
  lora_llama2`, `llama3.lora_llama3`, `llama3_1.lora_llama3_1` for Llama 3 RoPE scaling,
  `llama3_2.lora_llama3_2` for tied embeddings, and the full-model builders), the adapted modules
  (`lora_attn_modules`, `apply_lora_to_mlp`), `use_dora`, and `quantize_base` for QLoRA (torchao
  NF4). torchtune builds other families with their own builders: a non-Llama model is refused.
- `optimizer`: `torch.optim.AdamW` (fused), `bitsandbytes.optim.PagedAdamW` / `PagedAdamW8bit` (as
  torchtune's low-memory configs name them), `torchao.optim.AdamW8bit` / `AdamW4bit`;
  `optimizer_in_bwd` (full fine-tuning recipes).
- `loss`: `torchtune.modules.loss.CEWithChunkedOutputLoss` (chunked) or `torch.nn.CrossEntropyLoss`.
- `enable_activation_checkpointing`, `enable_activation_offloading`, `compile`, `fsdp_cpu_offload`,
  `fsdp_reshard_after_forward` (ZeRO-3 vs ZeRO-2), `batch_size`, `gradient_accumulation_steps`,
  `dataset.packed` (True unless the plan priced padded sequences), `tokenizer.max_seq_len`.

Paths (checkpoint, tokenizer, output) are placeholders the user sets, as in torchtune's configs."""

from __future__ import annotations

from typing import Any

import yaml

from cost_models import stacks
from planner.exporters.common import (
    ExportError,
    ExportResult,
    Job,
    comment_block,
    notes_lines,
    summary_lines,
    triton_attention_note,
)

OPTIMIZERS = {
    "full": {"_component_": "torch.optim.AdamW", "fused": True, "lr": 2e-5},
    "paged": {"_component_": "bitsandbytes.optim.PagedAdamW", "lr": 2e-5},
    "int8": {"_component_": "torchao.optim.AdamW8bit", "lr": 2e-5},
    "int8_paged": {"_component_": "bitsandbytes.optim.PagedAdamW8bit", "lr": 2e-5},
    "int4": {"_component_": "torchao.optim.AdamW4bit", "lr": 2e-5},
}
"""`Layout.optimizer_state` as a torchtune optimizer component (the configs' learning rates)."""
ATTN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "output_proj"}
"""PEFT's attention module names as torchtune's `lora_attn_modules`."""


def _builder(job: Job) -> tuple[str, dict[str, Any]]:
    """(module path prefix, dimension keywords) of the model's torchtune component builder."""
    m = job.model
    if m.family != "llama" or m.attention != "standard" or m.is_moe or not m.gated_mlp:
        raise ExportError(f"torchtune's generic builders cover Llama-architecture models; {m.name} ({m.family}) needs "
                          "its family's own builder")
    dims: dict[str, Any] = {
        "vocab_size": m.vocab_size, "num_layers": m.num_layers, "num_heads": m.num_heads,
        "num_kv_heads": m.kv_heads, "embed_dim": m.hidden_size, "max_seq_len": job.training.seq_len,
        "intermediate_dim": m.ffn_hidden_size, "rope_base": int(m.rope_theta or 10_000),
    }
    scaling = m.rope_scaling
    if m.tie_embeddings:
        path = "torchtune.models.llama3_2.{}llama3_2"
        if scaling is not None and scaling.factor is not None:
            dims["scale_factor"] = int(scaling.factor)
    elif scaling is not None and scaling.rope_type == "llama3":
        path = "torchtune.models.llama3_1.{}llama3_1"
        dims["scale_factor"] = int(scaling.factor or 8)
    elif m.vocab_size >= 100_000:
        path = "torchtune.models.llama3.{}llama3"
    else:
        path = "torchtune.models.llama2.{}llama2"
        dims.pop("rope_base")
        dims["max_seq_len"] = max(job.training.seq_len, 4096)
    return path, dims


def torchtune_config(job: Job) -> tuple[dict[str, Any], str]:
    """(the recipe config, the recipe's name)."""
    lay, tr = job.lay, job.training
    if lay.stack != "torchtune":
        raise ExportError(f"the plan runs in stack {lay.stack or lay.framework}: a torchtune config prices torchtune's "
                          "own defaults (bf16 weights and states, chunked loss); plan with --stack torchtune")
    path, dims = _builder(job)
    distributed = job.gpus > 1
    model: dict[str, Any] = {}
    if tr.frozen_base:
        modules = tr.lora_modules
        model = {
            "_component_": path.format("lora_"),
            "lora_attn_modules": [ATTN[x] for x in ("q_proj", "k_proj", "v_proj", "o_proj") if x in modules],
            "apply_lora_to_mlp": any(x in modules for x in ("gate_proj", "up_proj", "down_proj")),
            "apply_lora_to_output": False,
            **dims,
            "lora_rank": tr.lora_rank_, "lora_alpha": tr.lora_alpha_, "lora_dropout": 0.0,
            "use_dora": tr.dora, "quantize_base": tr.method == "qlora",
        }
        recipe = "lora_finetune_distributed" if distributed else "lora_finetune_single_device"
    else:
        model = {"_component_": path.format(""), **dims}
        recipe = "full_finetune_distributed" if distributed else "full_finetune_single_device"
    cfg: dict[str, Any] = {
        "output_dir": "/tmp/torchtune/autopar",
        "model": model,
        "tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer", "path": "/tmp/model/original/tokenizer.model",
                      "max_seq_len": tr.seq_len},
        "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer", "checkpoint_dir": "/tmp/model",
                         "checkpoint_files": ["model.safetensors"], "recipe_checkpoint": None,
                         "output_dir": "/tmp/torchtune/autopar", "model_type": "LLAMA3" if "llama3" in path else "LLAMA2"},
        "resume_from_checkpoint": False,
        "dataset": {"_component_": "torchtune.datasets.alpaca_cleaned_dataset", "packed": tr.mean_tokens_per_sequence is None},
        "seed": None,
        "shuffle": True,
        "batch_size": lay.micro_batch,
        "optimizer": dict(OPTIMIZERS[lay.optimizer_state]),
        "loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss" if lay.cross_entropy_ == "chunked"
                 else "torch.nn.CrossEntropyLoss"},
        "epochs": 1,
        "max_steps_per_epoch": None,
        "gradient_accumulation_steps": lay.grad_accum_,
        "compile": lay.elementwise_kernels == "fused",
        "device": "cuda",
        "dtype": "bf16" if tr.precision == "bf16" else "fp32",
        "enable_activation_checkpointing": lay.recompute == "full",
        "enable_activation_offloading": lay.offload_activations,
        "metric_logger": {"_component_": "torchtune.training.metric_logging.DiskLogger", "log_dir": "/tmp/torchtune/autopar/logs"},
        "log_every_n_steps": 1,
        "log_peak_memory_stats": True,
    }
    if tr.frozen_base:
        cfg["lr_scheduler"] = {"_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
                               "num_warmup_steps": 100}
        cfg["save_adapter_weights_only"] = True
    else:
        cfg["optimizer_in_bwd"] = lay.optimizer_in_backward
    if distributed:
        cfg["fsdp_cpu_offload"] = lay.offload_params or lay.offload_optimizer
        cfg["fsdp_reshard_after_forward"] = lay.zero_stage >= 3
    return cfg, recipe


def export_torchtune(job: Job) -> ExportResult:
    lay, tr = job.lay, job.training
    lost: list[str] = triton_attention_note(job, "torchtune", "SDPA (FlashAttention-2 on Hopper)")
    if lay.recompute in ("selective", "op_sac"):
        lost.append(f"recompute {lay.recompute}: torchtune checkpoints whole layers; the config turns checkpointing off")
    if lay.zero_stage in (1, 2) and job.gpus > 1:
        lost.append(f"ZeRO-{lay.zero_stage}: torchtune's FSDP2 shards parameters too; fsdp_reshard_after_forward False "
                    "keeps them gathered between forward and backward (ZeRO-2's traffic, more memory than ZeRO-1)")
    if tr.precision not in ("bf16", "fp32"):
        lost.append(f"precision {tr.precision}: torchtune trains in bf16 or fp32; the config says bf16")
    if stacks.master_weights(tr, "torchtune"):
        lost.append("float32 master weights: torchtune has no mixed precision; dtype bf16 trains bf16 weights")
    cfg, recipe = torchtune_config(job)
    head = comment_block([
        f"torchtune recipe config written by autopar (recipe {recipe})",
        *summary_lines(job),
        "Set the checkpoint, tokenizer and output paths, then:",
        f"  tune run {'--nproc_per_node ' + str(job.gpus) + ' ' if job.gpus > 1 else ''}{recipe} --config torchtune_config.yaml",
    ])
    notes = comment_block(notes_lines("torchtune", lost))
    body = yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False)
    return ExportResult(head + "\n" + notes + "\n" + body, "torchtune_config.yaml", lost, "application/yaml")
