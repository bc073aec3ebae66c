"""DeepSpeed `ds_config.json`.

What the config holds: batch sizes, precision, the ZeRO stage (with CPU optimizer offload), AutoTP
training (`tensor_parallel.autotp_size`) and the pipeline engine's section (`stages`,
`partition`, `activation_checkpoint_interval`). What lives in model code, not the config, and so is
reported as lost: pipeline cuts other than DeepSpeed's own partition methods, interleaving,
context parallelism, Megatron-style sequence parallelism, expert parallelism (`deepspeed.moe`'s
`ep_size`), and selective or partial recompute.
"""

from __future__ import annotations

import json
from typing import Any

from planner.exporters.common import ExportResult, Job


def _zero_section(job: Job, lost: list[str]) -> dict[str, Any]:
    lay = job.lay
    zero: dict[str, Any] = {"stage": lay.zero_stage}
    if lay.zero_stage >= 1:
        zero.update({"overlap_comm": True, "contiguous_gradients": True, "reduce_scatter": True})
    if lay.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if job.dp_replicate > 1 and lay.zero_stage >= 1:
        if lay.zero_stage == 3:
            zero["zero_hpz_partition_size"] = job.dp_shard
            lost.append(
                f"hybrid sharding over groups of {job.dp_shard}: DeepSpeed's closest is ZeRO++ hpZ "
                f"(zero_hpz_partition_size={job.dp_shard}), a secondary weight shard per group while "
                "gradients and optimizer states stay sharded over all data-parallel ranks"
            )
        else:
            lost.append(
                f"hybrid sharding over groups of {job.dp_shard}: ZeRO-{lay.zero_stage} in DeepSpeed shards "
                f"over all {job.dp} data-parallel ranks (less memory, more traffic than planned)"
            )
    if lay.pp > 1 and lay.zero_stage >= 2:
        lost.append(
            f"ZeRO-{lay.zero_stage} with pipeline parallelism: DeepSpeed's pipeline engine supports ZeRO-0/1 only"
        )
    return zero


def _pipeline_section(job: Job, lost: list[str]) -> dict[str, Any] | None:
    lay = job.lay
    if lay.pp == 1:
        return None
    section: dict[str, Any] = {"stages": lay.pp, "partition": "uniform"}
    if lay.recompute == "full":
        section["activation_checkpoint_interval"] = 1
    if not job.default_cut or lay.vpp > 1:
        cut = " | ".join(str(n) for n in job.chunk_layers)
        lost.append(
            f"stage cut {cut}: DeepSpeed's PipelineModule partitions by 'uniform' layer count or "
            "'parameters'; pass the cut yourself through a custom partition of the LayerSpecs"
        )
    if lay.vpp > 1:
        lost.append(f"interleaved pipeline (vpp={lay.vpp}): DeepSpeed's pipeline engine has one stage per rank")
    if lay.schedule_ == "gpipe":
        lost.append("GPipe schedule: DeepSpeed's pipeline engine runs its 1F1B-style TrainSchedule")
    return section


def _other_losses(job: Job, lost: list[str]) -> None:
    lay = job.lay
    if lay.cp > 1:
        lost.append(
            f"context parallelism (cp={lay.cp}, ring attention): not in ds_config; DeepSpeed's Ulysses "
            "sequence parallelism is set up in model code"
        )
    if lay.sp_:
        lost.append("Megatron-style sequence parallelism with TP: AutoTP replicates norms and activations")
    if lay.ep > 1:
        lost.append(f"expert parallelism (ep={lay.ep}): set ep_size on deepspeed.moe.layer.MoE in model code")
    if lay.recompute == "selective":
        lost.append("selective recompute: DeepSpeed checkpoints whole layers in model code")
    elif lay.recompute == "full" and (lay.pp == 1 or job.partial_recompute):
        what = f"{lay.recompute_layers} layers per stage" if job.partial_recompute else "every layer"
        lost.append(f"full recompute of {what}: wrap the layers with deepspeed.checkpointing in model code")
    if job.training.precision == "fp8":
        lost.append("FP8 GEMMs: ds_config has no FP8 switch (use Transformer Engine layers); config runs bf16")
    if lay.order != "tp-cp-ep-dp-pp":
        lost.append(f"rank order {lay.order}: DeepSpeed's topology orders ranks pipe-data-model")


def export_deepspeed(job: Job) -> ExportResult:
    lost: list[str] = []
    lay, tr = job.lay, job.training
    config: dict[str, Any] = {
        "train_batch_size": tr.global_batch,
        "train_micro_batch_size_per_gpu": lay.micro_batch,
        "gradient_accumulation_steps": lay.grad_accum_,
        "gradient_clipping": 1.0,
    }
    if tr.precision in ("bf16", "fp8"):
        config["bf16"] = {"enabled": True}
    elif tr.precision == "fp16":
        config["fp16"] = {"enabled": True}
    if tr.precision != "fp32" and tr.grad_dtype == "fp32":
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    config["zero_optimization"] = _zero_section(job, lost)
    if lay.tp > 1:
        config["tensor_parallel"] = {"autotp_size": lay.tp}
    pipeline = _pipeline_section(job, lost)
    if pipeline is not None:
        config["pipeline"] = pipeline
    _other_losses(job, lost)
    config["steps_per_print"] = 10
    config["wall_clock_breakdown"] = False
    return ExportResult(json.dumps(config, indent=2) + "\n", "ds_config.json", lost)
