"""Hugging Face Accelerate config (YAML), with the plugin of the framework the plan was priced for.

- FSDP2 (every plan not priced for DeepSpeed): Accelerate's N-D `parallelism_config` (data-parallel
  replicate x shard, tensor and context parallelism). Accelerate has no pipeline or expert
  parallelism, and FSDP2 shards weights and gradients (ZeRO-2/3), so those parts of a plan are
  reported as lost, in the file's own comments.
  Accelerate forms replicate x shard data-parallel ranks (the folded pp ranks among them), so the
  file's launch lines give train.py's DataLoader batch size and the accumulation
  (`ACCELERATE_GRADIENT_ACCUMULATION_STEPS` on the launch line) that make the plan's global batch
  over those ranks: folding pp=2 into the shard group with the plan's own accumulation would double
  the batch.
- DeepSpeed (plans priced with `framework: deepspeed`): `distributed_type: DEEPSPEED`. Without
  pipeline or tensor parallelism the plugin reads `deepspeed_config_file: ds_config.json`, the plan's
  DeepSpeed export (`autopar plan ... --export deepspeed`), so ZeRO stage, CPU / NVMe offload and
  ZeRO++ are exactly that file's; the precision is the file's too (Accelerate refuses
  `mixed_precision` beside a config file and reads `bf16.enabled` / `fp16.enabled`). Accelerate drives
  DeepSpeed's engine without its pipeline module, and hands `deepspeed.initialize` no model-parallel
  unit, so DeepSpeed counts every rank as data-parallel: a plan with pp or tp > 1 cannot use that
  file (its batch counts them apart). It gets the plugin's own keys instead (`zero_stage`,
  `offload_*_device`, `gradient_accumulation_steps`), with the pp and tp ranks folded into data
  parallelism, and says so.

The file names no node address: every node runs
`accelerate launch --config_file accelerate_config.yaml --machine_rank $NODE_RANK
--main_process_ip $MASTER_ADDR train.py`, which overrides `machine_rank` and sets the address.
Values are written by PyYAML's `safe_dump`; user text (model, cluster, GPU names) appears only in
comments, escaped by `one_line`."""

from __future__ import annotations

import json
from typing import Any

import yaml

from planner.exporters.common import (
    RDZV_PORT,
    ExportError,
    ExportResult,
    Job,
    comment_block,
    deepspeed_only_notes,
    fp8_note,
    framework_note,
    mtp_note,
    nodes_note,
    notes_lines,
    peft_lines,
    summary_lines,
    triton_attention_note,
)
from planner.exporters.deepspeed import NVME_PATH, export_deepspeed

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
RELEASE = "1.15.0"
"""The Accelerate release the file is written for and checked against (tests/planner/consumers/)."""

FUSED_KERNELS_NOTE = (
    "fused elementwise kernels: a Transformers model runs its norms, rotary and activation op by op "
    "unless it is compiled (torch.compile); priced fused"
)
"""What an Accelerate export cannot promise about `Layout.elementwise_kernels = "fused"`."""


def _losses(job: Job, lost: list[str]) -> None:
    lay = job.lay
    lost += mtp_note(job, "Accelerate (a Transformers model)")
    lost += triton_attention_note(job, "Accelerate (a Transformers model)", "SDPA (FlashAttention-2)")
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
    if lay.elementwise_kernels == "fused":
        lost.append(FUSED_KERNELS_NOTE)
    if job.training.precision != "fp32" and job.training.grad_dtype == "bf16":
        lost.append("bf16 gradient reduction: Accelerate's FSDP2 mixed precision reduces gradients in float32")
    if lay.fsdp_flat_params:
        lost.append("FSDP1 flat parameters: exported as FSDP2 (fsdp_version 2), whose per-layer copies of the "
                    "gathered weights make the step slower than priced")
    if job.model.family not in DECODER_LAYERS:
        lost.append(f"model family {job.model.family}: set fsdp_transformer_layer_cls_to_wrap to its decoder layer class")


def _fsdp_plugin(job: Job, lost: list[str]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """The FSDP2 plugin and Accelerate's N-D parallelism config (the pp dimension folds into the
    shard group: Accelerate has no pipeline parallelism), what train.py needs beside it (its
    DataLoader's batch size and the accumulation, so that micro x accumulation x the data-parallel
    ranks Accelerate forms is the plan's global batch), and the launch line's environment."""
    lay = job.lay
    _losses(job, lost)
    lost += framework_note(job, "fsdp", "Accelerate (FSDP2)")
    lost += fp8_note(job, "Accelerate", "torchao float8 through Accelerate's AO backend (tensor-wise dynamic scaling)")
    dp = job.dp * lay.pp  # Accelerate's data-parallel ranks: replicate x shard, the pp ranks folded in
    micro, accum = _split_batch(job, dp, lost, f"with the {lay.pp} pipeline ranks folded into data parallelism")
    launch = [
        f"train.py's DataLoader batch_size: {micro} (sequences per GPU per micro-batch); gradient accumulation "
        f"{accum} (ACCELERATE_GRADIENT_ACCUMULATION_STEPS below, or Accelerator(gradient_accumulation_steps={accum})):",
        f"  {micro} x {accum} x {dp} data-parallel ranks = global batch {job.training.global_batch} sequences"
        + (f" (the {lay.cp} context-parallel ranks of a replica share its sequences)" if lay.cp > 1 else ""),
    ]
    return {
        "distributed_type": "FSDP",
        "fsdp_config": {
            "fsdp_activation_checkpointing": lay.recompute != "none",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_cpu_ram_efficient_loading": lay.zero_init,
            "fsdp_offload_params": lay.offload_optimizer or lay.offload_params,
            "fsdp_reshard_after_forward": lay.zero_stage == 3,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_transformer_layer_cls_to_wrap": DECODER_LAYERS.get(job.model.family, "DecoderLayer"),
            "fsdp_version": 2,
        },
        "mixed_precision": MIXED[job.training.precision],
        **({"fp8_config": {"backend": "AO"}} if job.training.precision == "fp8" else {}),  # torchao float8
        "parallelism_config": {
            "parallelism_config_cp_size": lay.cp,
            "parallelism_config_dp_replicate_size": job.dp_replicate,
            "parallelism_config_dp_shard_size": job.dp_shard * lay.pp,
            "parallelism_config_tp_size": lay.tp,
        },
    }, launch, {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": str(accum)}


def _deepspeed_plugin(job: Job, lost: list[str]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """Accelerate's DeepSpeed plugin: the plan's ds_config.json when it has neither pipeline nor
    tensor parallelism, else the plugin's own keys with pp and tp folded into data parallelism
    (module docstring); what the launch needs beside the file (ds_config.json, train.py's DataLoader
    batch size), and the launch line's environment (none)."""
    lay = job.lay
    zero3_init = lay.zero_stage == 3 and lay.zero_init
    if lay.pp == 1 and lay.tp == 1:
        ds_config = export_deepspeed(job)
        lost += [_for_transformers(note) for note in ds_config.lost]  # what ds_config.json itself cannot say
        micro = json.loads(ds_config.text)["train_micro_batch_size_per_gpu"]
        return {
            "deepspeed_config": {
                "deepspeed_config_file": ds_config.filename,
                "deepspeed_multinode_launcher": "standard",
                "zero3_init_flag": zero3_init,
            },
            "distributed_type": "DEEPSPEED",
        }, [
            f"DeepSpeed config: {ds_config.filename}, the plan's DeepSpeed export, in the directory you launch from:",
            f"  autopar plan <the same arguments> --export deepspeed > {ds_config.filename}",
            "  or GET /v1/plans/ID/export/deepspeed with Accept: application/octet-stream",
            f"train.py's DataLoader batch_size: {micro} (the file's train_micro_batch_size_per_gpu)",
        ], {}
    micro, accum = _folded_batch(job, lost)
    _folded_losses(job, lost)
    nvme = lay.offload_device == "nvme" and lay.zero_stage == 3
    device = "nvme" if nvme else "cpu"
    ds: dict[str, Any] = {
        "deepspeed_multinode_launcher": "standard",
        "gradient_accumulation_steps": accum,
        "gradient_clipping": 1.0,
        "offload_optimizer_device": device if lay.offload_optimizer else "none",
        "offload_param_device": device if lay.offload_params and lay.zero_stage == 3 else "none",
        "zero3_init_flag": zero3_init,
        "zero_stage": lay.zero_stage,
    }
    if nvme:
        ds.update({"offload_optimizer_nvme_path": NVME_PATH, "offload_param_nvme_path": NVME_PATH})
        lost.append(
            f"NVMe offload: the path {NVME_PATH} is a placeholder for a local NVMe mount on every node; "
            "the swap buffers are DeepSpeed's defaults, not the ones priced"
        )
    if job.training.precision == "fp8":
        lost.append("FP8 GEMMs: DeepSpeed has no FP8 switch (use Transformer Engine layers); the plugin runs bf16")
    lost += framework_note(job, "deepspeed", "Accelerate (DeepSpeed)")
    precision = "bf16" if job.training.precision == "fp8" else MIXED[job.training.precision]
    keys = {"deepspeed_config": ds, "distributed_type": "DEEPSPEED", "mixed_precision": precision}
    return keys, [
        f"train.py's DataLoader batch_size: {micro} (micro-batch per GPU; every GPU data-parallel): "
        f"{micro} x {accum} x {job.gpus} = global batch {job.training.global_batch} sequences"
    ], {}


def _folded_losses(job: Job, lost: list[str]) -> None:
    """What the plugin's own keys cannot say: every parallelism but data and ZeRO, and the kernels."""
    lay = job.lay
    if lay.pp > 1:
        lost.append(
            f"pipeline parallelism (pp={lay.pp}): Accelerate drives DeepSpeed's engine without its pipeline module; "
            f"the {lay.pp} pipeline ranks of each replica become data-parallel ranks under ZeRO-{lay.zero_stage} "
            "(each holds every layer: more memory than planned)"
        )
    if lay.tp > 1:
        lost.append(
            f"tensor parallelism (tp={lay.tp}): Accelerate 1.15 hands deepspeed.initialize no model-parallel unit, so "
            "DeepSpeed would count every rank as data-parallel and refuse the plan's batch in ds_config.json; the tp "
            "ranks become data-parallel ranks (each holds whole layers: more memory than planned)"
        )
    if lay.cp > 1:
        lost.append(f"context parallelism (cp={lay.cp}): the cp ranks become data-parallel ranks on whole sequences")
    if lay.ep > 1:
        lost.append(f"expert parallelism (ep={lay.ep}): set ep_size on deepspeed.moe.layer.MoE in model code")
    if lay.recompute != "none":
        lost.append(_for_transformers(f"{lay.recompute} recompute: "))
    lost += [n for n in deepspeed_only_notes(job, "the plugin's own keys") if not n.startswith("NVMe")]
    if lay.cross_entropy_ != "eager":
        lost.append(f"{lay.cross_entropy_} cross entropy: the loss is the model's (Transformers: eager)")
    if lay.norm_kernel != "eager_fp32":
        lost.append(f"{lay.norm_kernel} RMSNorm: the norm is the model's (Transformers: eager, fp32 upcast)")
    if lay.elementwise_kernels == "fused":
        lost.append(FUSED_KERNELS_NOTE)


def _for_transformers(note: str) -> str:
    """A ds_config note in a Transformers model's terms: its layers are checkpointed by the model itself."""
    if note.startswith(("full recompute", "selective recompute")):  # whole layers, every layer
        return f"{note.split(':')[0]}: DeepSpeed's config has no switch; call model.gradient_checkpointing_enable() " \
            "(whole layers) in train.py"
    return note


def _folded_batch(job: Job, lost: list[str]) -> tuple[int, int]:
    """(micro-batch, accumulation) for every rank as a data-parallel rank (`_split_batch` over all GPUs)."""
    return _split_batch(job, job.gpus, lost, f"with all {job.gpus} ranks data-parallel")


def _split_batch(job: Job, dp: int, lost: list[str], why: str) -> tuple[int, int]:
    """(micro-batch, accumulation) with micro x accumulation x `dp` = the plan's global batch: the
    plan's micro-batch or the closest smaller one that divides (said in `lost` when it differs)."""
    lay, tr = job.lay, job.training
    for micro in range(lay.micro_batch, 0, -1):
        if tr.global_batch % (micro * dp) == 0:
            accum = tr.global_batch // (micro * dp)
            if micro != lay.micro_batch:
                lost.append(
                    f"micro-batch {lay.micro_batch}: {why} the global batch {tr.global_batch} splits as "
                    f"micro-batch {micro} x accumulation {accum} x {dp} ranks"
                )
            return micro, accum
    raise ExportError(
        f"global batch {tr.global_batch} does not split over {dp} data-parallel ranks ({why}): Accelerate has no "
        "pipeline parallelism; export megatron, deepspeed or torchtitan instead"
    )


def export_accelerate(job: Job) -> ExportResult:
    lost = nodes_note(job)
    deepspeed = job.lay.framework == "deepspeed"
    plugin, launch, env = _deepspeed_plugin(job, lost) if deepspeed else _fsdp_plugin(job, lost)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "downcast_bf16": "no",
        "machine_rank": 0,
        "main_process_port": RDZV_PORT,
        "main_training_function": "main",
        "num_machines": job.nodes,
        "num_processes": job.gpus,
        "rdzv_backend": "c10d",
        "same_network": True,
        "use_cpu": False,
        **plugin,
    }
    head = comment_block(
        [
            f"Accelerate config ({'DeepSpeed' if deepspeed else 'FSDP2'}) written by autopar",
            *summary_lines(job),
            *launch,
            "On every node (NODE_RANK 0 .. num_machines - 1, MASTER_ADDR the first node's address):",
            "  " + "".join(f"{k}={v} " for k, v in env.items()) + "accelerate launch --config_file "
            "accelerate_config.yaml --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR train.py",
            f"Written for Accelerate {RELEASE}, whose launcher and plugins accept it.",
        ]
    )
    notes = comment_block(notes_lines("Accelerate", lost) + peft_lines(job))
    body = yaml.safe_dump(dict(sorted(config.items())), sort_keys=False, default_flow_style=False)
    return ExportResult(head + "\n" + notes + "\n" + body, "accelerate_config.yaml", lost, "application/yaml")
