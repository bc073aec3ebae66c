"""Hugging Face Accelerate config (YAML) for FSDP2, with Accelerate's N-D `parallelism_config`
(data-parallel replicate x shard, tensor and context parallelism). Accelerate has no pipeline or
expert parallelism, and FSDP2 shards weights and gradients (ZeRO-2/3), so those parts of a plan
are reported as lost, in the file's own comments.

The file names no node address: every node runs
`accelerate launch --config_file accelerate_config.yaml --machine_rank $NODE_RANK
--main_process_ip $MASTER_ADDR train.py`, which overrides `machine_rank` and sets the address.
Values are written by PyYAML's `safe_dump`; user text (model, cluster, GPU names) appears only in
comments, escaped by `one_line`."""

from __future__ import annotations

from typing import Any

import yaml

from planner.exporters.common import (
    RDZV_PORT,
    ExportResult,
    Job,
    comment_block,
    deepspeed_only_notes,
    framework_note,
    nodes_note,
    notes_lines,
    peft_lines,
    summary_lines,
)

DECODER_LAYERS = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "mixtral": "MixtralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "qwen2_moe": "Qwen2MoeDecoderLayer",
    "qwen3": "Qwen3DecoderLayer",
    "qwen3_moe": "Qwen3MoeDecoderLayer",
    "deepseek_v2": "DeepseekV2DecoderLayer",
    "deepseek_v3": "DeepseekV3DecoderLayer",
    "gpt2": "GPT2Block",
    "gpt_neox": "GPTNeoXLayer",
    "gpt_oss": "GptOssDecoderLayer",
    "bloom": "BloomBlock",
    "nemotron": "NemotronDecoderLayer",
    "phi3": "Phi3DecoderLayer",
    "granite": "GraniteDecoderLayer",
    "olmo2": "Olmo2DecoderLayer",
    "gemma": "GemmaDecoderLayer",
    "gemma2": "Gemma2DecoderLayer",
    "gemma3_text": "Gemma3DecoderLayer",
    "llama4_text": "Llama4TextDecoderLayer",
}
MIXED = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp32": "no"}


def _losses(job: Job, lost: list[str]) -> None:
    lay = job.lay
    if lay.pp > 1:
        cut = " | ".join(str(n) for n in job.chunk_layers)
        lost.append(
            f"pipeline parallelism (pp={lay.pp}, cut {cut}): Accelerate has none; the {lay.pp} pipeline "
            "ranks of each replica become data-parallel shard ranks"
        )
    if lay.ep > 1:
        lost.append(f"expert parallelism (ep={lay.ep}): Accelerate has none; experts are sharded by FSDP")
    if lay.zero_stage < 2:
        lost.append(
            f"ZeRO-{lay.zero_stage}: FSDP2 shards gradients and weights as well "
            "(written with fsdp_reshard_after_forward: false, ZeRO-2-like)"
        )
    if lay.tp > 1 and lay.sp_:
        lost.append("sequence parallelism with TP: Accelerate's TP follows the model's tp_plan (no SP)")
    if lay.offload_optimizer and not lay.offload_params:
        lost.append("optimizer-only CPU offload: fsdp_offload_params offloads parameters and gradients too")
    if job.partial_recompute:
        lost.append(
            f"recompute of {lay.recompute_layers} layers per stage: fsdp_activation_checkpointing "
            "recomputes every layer"
        )
    elif lay.recompute == "selective":
        lost.append("selective recompute: fsdp_activation_checkpointing recomputes whole layers")
    if lay.cp > 1 and lay.cp_attention != "ring":
        lost.append(f"{lay.cp_attention} context-parallel attention: Accelerate's CP is torch's ring attention")
    if lay.tp_comm_overlap_ and lay.tp > 1:
        lost.append("TP communication overlap: Accelerate's TP (DTensor) runs its collectives after the GEMMs")
    if lay.cross_entropy_ not in ("eager", "loss_parallel"):
        lost.append(f"{lay.cross_entropy_} cross entropy: the loss is the model's (Transformers: eager)")
    if lay.norm_kernel != "eager_fp32":
        lost.append(f"{lay.norm_kernel} RMSNorm: the norm is the model's (Transformers: eager, fp32 upcast)")
    if job.training.precision != "fp32" and job.training.grad_dtype == "bf16":
        lost.append("bf16 gradient reduction: Accelerate's FSDP2 mixed precision reduces gradients in float32")
    if job.model.family not in DECODER_LAYERS:
        lost.append(f"model family {job.model.family}: set fsdp_transformer_layer_cls_to_wrap to its decoder layer class")


def export_accelerate(job: Job) -> ExportResult:
    lost = nodes_note(job)
    lay = job.lay
    _losses(job, lost)
    lost += framework_note(job, "fsdp", "Accelerate (FSDP2)")
    lost += deepspeed_only_notes(job, "Accelerate")
    # Without pipeline parallelism in Accelerate, the pp dimension folds into the shard group.
    shard = job.dp_shard * lay.pp
    fsdp: dict[str, Any] = {
        "fsdp_activation_checkpointing": lay.recompute != "none",
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_cpu_ram_efficient_loading": lay.zero_init,
        "fsdp_offload_params": lay.offload_optimizer or lay.offload_params,
        "fsdp_reshard_after_forward": lay.zero_stage == 3,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_transformer_layer_cls_to_wrap": DECODER_LAYERS.get(job.model.family, "DecoderLayer"),
        "fsdp_version": 2,
    }
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "FSDP",
        "downcast_bf16": "no",
        "fsdp_config": fsdp,
        "machine_rank": 0,
        "main_process_port": RDZV_PORT,
        "main_training_function": "main",
        "mixed_precision": MIXED[job.training.precision],
        **({"fp8_config": {"backend": "AO"}} if job.training.precision == "fp8" else {}),  # torchao float8
        "num_machines": job.nodes,
        "num_processes": job.gpus,
        "parallelism_config": {
            "parallelism_config_cp_size": lay.cp,
            "parallelism_config_dp_replicate_size": job.dp_replicate,
            "parallelism_config_dp_shard_size": shard,
            "parallelism_config_tp_size": lay.tp,
        },
        "rdzv_backend": "c10d",
        "same_network": True,
        "use_cpu": False,
    }
    head = comment_block(
        [
            "Accelerate config (FSDP2) written by autopar",
            *summary_lines(job),
            "On every node (NODE_RANK 0 .. num_machines - 1, MASTER_ADDR the first node's address):",
            "  accelerate launch --config_file accelerate_config.yaml --machine_rank $NODE_RANK "
            "--main_process_ip $MASTER_ADDR train.py",
        ]
    )
    notes = comment_block(notes_lines("Accelerate", lost) + peft_lines(job))
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    return ExportResult(head + "\n" + notes + "\n" + body, "accelerate_config.yaml", lost, "application/yaml")
