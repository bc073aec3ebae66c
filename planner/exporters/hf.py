"""Hugging Face fine-tuning stack (`Layout.stack` hf): one YAML file of the values transformers'
Trainer, PEFT and Accelerate read, in four sections, each the keyword arguments of the class that
reads it:

- `model`: `AutoModelForCausalLM.from_pretrained` keywords: the dtype the plan stored the trained
  weights in (bf16 without a master copy; float32 with one, which `bf16=True` then trains under
  autocast: `cost_models.stacks.autocast_weights`) and SDPA attention.
- `bitsandbytes_config` (qlora): `transformers.BitsAndBytesConfig` (NF4 with double quantization, or
  int8; `bnb_4bit_quant_storage` in the compute dtype so FSDP / ZeRO-3 shard the packed weights).
- `lora_config` (lora / qlora): `peft.LoraConfig` (the adapted modules this model has, no dropout,
  `use_dora`, `modules_to_save` for trainable embeddings).
- `training_arguments`: `transformers.TrainingArguments` (or `HfArgumentParser(TrainingArguments)
  .parse_dict`): micro-batch, accumulation, bf16 autocast, gradient checkpointing and its offload,
  the optimizer (`adamw_torch_fused`, `adamw_bnb_8bit`, `paged_adamw_8bit`, `paged_adamw_32bit`,
  `adamw_torch_4bit`), Liger's fused linear cross-entropy (`use_liger_kernel`), torch.compile.
- `accelerate_config`: the plan's Accelerate config (`planner.exporters.accelerate`: FSDP2 or
  DeepSpeed; one GPU: no distributed type), for `accelerate launch --config_file`.

A train.py reads it with `yaml.safe_load` and passes each section to its class. What the stack
cannot express of the plan is in `lost` and in the file's comments."""

from __future__ import annotations

from typing import Any

import yaml

from cost_models import stacks
from planner.exporters.accelerate import export_accelerate
from planner.exporters.common import (
    ExportError,
    ExportResult,
    Job,
    comment_block,
    notes_lines,
    peft_config,
    summary_lines,
)
from planner.finetune import weights_of

OPTIM = {"full": "adamw_torch_fused", "paged": "paged_adamw_32bit", "int8": "adamw_bnb_8bit",
         "int8_paged": "paged_adamw_8bit", "int4": "adamw_torch_4bit"}
"""`Layout.optimizer_state` as TrainingArguments' `optim` (transformers' OptimizerNames)."""


def hf_sections(job: Job) -> dict[str, Any]:
    """The file's sections (module doc)."""
    lay, tr = job.lay, job.training
    if lay.stack not in (None, "hf"):
        raise ExportError(f"the plan runs in stack {lay.stack}: export it as {lay.stack}")
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(tr.precision, "float32")
    fp32 = stacks.master_weights(tr, "hf") and not tr.frozen_base
    out: dict[str, Any] = {"model": {"dtype": "float32" if fp32 else dtype, "attn_implementation": "sdpa"}}
    peft = peft_config(job)
    if peft is not None:
        if "bitsandbytes_config" in peft:
            out["bitsandbytes_config"] = peft["bitsandbytes_config"]
        lora = dict(peft["lora_config"])
        lora["use_dora"] = tr.dora
        if tr.trainable_embeddings:
            lora["modules_to_save"] = ["embed_tokens", "lm_head"]
        out["lora_config"] = lora
    args: dict[str, Any] = {
        "output_dir": "output",
        "per_device_train_batch_size": lay.micro_batch,
        "gradient_accumulation_steps": lay.grad_accum_,
        "bf16": tr.precision == "bf16",
        "fp16": tr.precision == "fp16",
        "gradient_checkpointing": lay.recompute == "full",
        "optim": OPTIM[lay.optimizer_state] if lay.optimizer_fused or lay.optimizer_state != "full" else "adamw_torch",
        "use_liger_kernel": lay.cross_entropy_ == "fused_linear",
        "torch_compile": lay.elementwise_kernels == "fused",
        "dataloader_pin_memory": True,
    }
    if lay.recompute == "full" and lay.framework == "fsdp" and job.gpus > 1:
        # under Accelerate's FSDP plugin the checkpointing is the plugin's (fsdp_activation_checkpointing):
        # Trainer refuses both at once
        args["gradient_checkpointing"] = False
    elif lay.recompute == "full":
        args["gradient_checkpointing_kwargs"] = {"use_reentrant": False, **({"offload": True} if lay.offload_activations else {})}
    out["training_arguments"] = args
    return out


SINGLE_GPU = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "num_machines": 1, "num_processes": 1,
              "machine_rank": 0, "use_cpu": False, "debug": False}
"""Accelerate's config for one GPU: no distributed wrapper (what the plan priced: ZeRO-0, no FSDP)."""


def export_hf(job: Job) -> ExportResult:
    lay = job.lay
    lost: list[str] = []
    if lay.recompute in ("selective", "op_sac"):
        lost.append(f"recompute {lay.recompute}: Trainer checkpoints whole decoder layers only; the file turns "
                    "gradient checkpointing off (more memory than priced)")
    if lay.tp * lay.pp * lay.cp * lay.ep > 1:
        raise ExportError("the HF stack trains data-parallel only: the plan's tp / pp / cp / ep have no place in Trainer")
    sections = hf_sections(job)
    if job.gpus == 1:
        mixed = {"bf16": "bf16", "fp16": "fp16"}.get(job.training.precision, "no")
        sections["accelerate_config"] = {**SINGLE_GPU, "mixed_precision": mixed}
    else:
        accelerate = export_accelerate(job)
        # the loss, norm and kernels are the stack's own settings here (Liger, compile), not losses
        lost += [x for x in accelerate.lost if not any(k in x for k in ("cross entropy", "RMSNorm", "fused", "compile"))]
        sections["accelerate_config"] = yaml.safe_load(accelerate.text)
    weights = weights_of(job.training, "hf")
    head = comment_block([
        "Hugging Face fine-tuning stack (transformers Trainer + PEFT + Accelerate) written by autopar",
        *summary_lines(job),
        *([f"Priced with {weights}: model.dtype and training_arguments.bf16 / fp16 below say so"] if weights else []),
        "In train.py: cfg = yaml.safe_load(open('hf_finetune.yaml'));",
        "  model = AutoModelForCausalLM.from_pretrained(NAME, **cfg['model'], quantization_config="
        "BitsAndBytesConfig(**cfg['bitsandbytes_config']) if 'bitsandbytes_config' in cfg else None)",
        "  model = peft.get_peft_model(model, peft.LoraConfig(**cfg['lora_config']))  # lora / qlora",
        "  trainer = Trainer(model, TrainingArguments(**cfg['training_arguments']), train_dataset=...)",
        "Write cfg['accelerate_config'] to accelerate_config.yaml and run:",
        "  accelerate launch --config_file accelerate_config.yaml train.py",
    ])
    notes = comment_block(notes_lines("HF", lost))
    body = yaml.safe_dump(sections, sort_keys=False, default_flow_style=False)
    return ExportResult(head + "\n" + notes + "\n" + body, "hf_finetune.yaml", lost, "application/yaml")
