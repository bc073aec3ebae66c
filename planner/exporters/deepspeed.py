"""DeepSpeed `ds_config.json`.

What the config holds: batch sizes, precision, the ZeRO stage (with optimizer and parameter offload
to CPU or NVMe, ZeRO++'s hpZ / qwZ / qgZ), AutoTP
training (`tensor_parallel.autotp_size`) and the pipeline engine's section (`stages`,
`partition`, `activation_checkpoint_interval`). What lives in model code, not the config, and so is
reported as lost: pipeline cuts other than DeepSpeed's own partition methods, interleaving,
context parallelism, Megatron-style sequence parallelism, expert parallelism (`deepspeed.moe`'s
`ep_size`), and selective or partial recompute.

Batch: DeepSpeed checks `train_batch_size == micro x accumulation x its data-parallel size`, and
its data-parallel size is world / (TP x PP): it has no context-parallel dimension, so the CP ranks
of a plan are data-parallel ranks here (`ds_dp = dp x cp`). The file keeps the plan's global
batch and micro-batch and divides the accumulation by cp when it can; otherwise the closest
micro-batch that divides, and the note says so. DeepSpeed's pipeline engine takes ZeRO-0/1 only,
so a pipelined plan with ZeRO-2/3 is written as ZeRO-1 with a note.

Release and initialization: written for DeepSpeed 0.19.8. DeepSpeed checks the batch against its
data-parallel size, which it reads from the model-parallel unit (`mpu`) handed to
`deepspeed.initialize`, or takes as the whole world without one. So the file says how to call it
(`autopar.initialize`, Python lines): with AutoTP (tp > 1, no pipeline) DeepSpeed's own TP x DP
groups are built first (`deepspeed.utils.groups._init_tp_mesh_device`, which the engine itself calls
when it shards the model; HF's integration calls it the same way) and passed as `mpu`, without
which 8 ranks at tp 2 fail "train_batch_size is not equal to micro_batch_per_gpu *
gradient_acc_step * world_size"; a pipelined plan builds a `PipelineModule` over a
`PipeModelDataParallelTopology` of the plan's pp x tp x dp, whose grid is the engine's `mpu`. AutoTP
does not shard a `PipelineModule` (the engine would replace the pipeline grid with its TP groups), so
a pipelined plan's tensor parallelism is the topology's model-parallel axis: tensor-parallel layers
in the LayerSpecs (Megatron-DeepSpeed's), said in the notes.

JSON has no comments: what the file cannot express is listed in its own `autopar` key
(`summary`, `release`, `initialize`, `not_expressible`), which DeepSpeed ignores.
"""

from __future__ import annotations

import json
from typing import Any

from cost_models.memory import (
    NVME_OPTIMIZER_BUFFER_COUNT,
    NVME_PARAM_BUFFER_COUNT,
    NVME_PARAM_BUFFER_ELEMENTS,
    NVME_SUB_GROUP_ELEMENTS,
)
from planner.exporters.common import (
    SCHEDULE_NAMES,
    ExportResult,
    Job,
    framework_note,
    mtp_note,
    peft_config,
    summary_lines,
    triton_attention_note,
)


def _zero_section(job: Job, lost: list[str]) -> dict[str, Any]:
    lay = job.lay
    stage = lay.zero_stage
    if lay.pp > 1 and stage >= 2:
        stage = 1
        lost.append(
            f"ZeRO-{lay.zero_stage} with pipeline parallelism: DeepSpeed's pipeline engine supports ZeRO-0/1 "
            "only; written as ZeRO-1 (gradients and weights replicated over data-parallel ranks: more memory)"
        )
    zero: dict[str, Any] = {"stage": stage}
    if stage >= 1:
        zero.update({"overlap_comm": True, "contiguous_gradients": True, "reduce_scatter": True})
    nvme = lay.offload_device == "nvme" and stage == 3
    if lay.offload_optimizer:
        zero["offload_optimizer"] = _offload_target(nvme, {"buffer_count": NVME_OPTIMIZER_BUFFER_COUNT})
    if lay.offload_params and stage == 3:  # ZeRO-Infinity's tier for the weight shards
        zero["offload_param"] = _offload_target(
            nvme, {"buffer_count": NVME_PARAM_BUFFER_COUNT, "buffer_size": NVME_PARAM_BUFFER_ELEMENTS}
        )
    if nvme:
        # the optimizer swaps one sub-group at a time through its pinned buffers (memory.NVME_SUB_GROUP_ELEMENTS)
        zero["sub_group_size"] = NVME_SUB_GROUP_ELEMENTS
        lost.append(
            f"NVMe offload: the path {NVME_PATH} is a placeholder for a local NVMe mount on every node "
            "(edit nvme_path; DeepSpeed's aio library must be built: DS_BUILD_AIO=1)"
        )
    if stage == 3 and lay.zero_hpz_partition_size > 1:
        zero["zero_hpz_partition_size"] = lay.zero_hpz_partition_size
    if stage == 3 and lay.zero_quantized_weights:
        zero["zero_quantized_weights"] = True
    if stage == 3 and lay.zero_quantized_gradients:
        zero["zero_quantized_gradients"] = True
    if stage == 3 and not lay.zero_init:
        lost.append(
            "no sharded init (zero_init off): build the model outside deepspeed.zero.Init; transformers' "
            "from_pretrained enters it by itself under a ZeRO-3 config"
        )
    if job.dp_replicate > 1 and stage >= 1:
        if stage == 3 and lay.zero_hpz_partition_size == 1:
            zero["zero_hpz_partition_size"] = job.dp_shard
            lost.append(
                f"hybrid sharding over groups of {job.dp_shard}: DeepSpeed's closest is ZeRO++ hpZ "
                f"(zero_hpz_partition_size={job.dp_shard}), a secondary weight shard per group while "
                "gradients and optimizer states stay sharded over all data-parallel ranks"
            )
        else:
            lost.append(
                f"hybrid sharding over groups of {job.dp_shard}: ZeRO-{stage} in DeepSpeed shards "
                f"over all {job.dp} data-parallel ranks (less memory, more traffic than planned)"
            )
    return zero


NVME_PATH = "/local_nvme"
"""Where the exported config points DeepSpeed's NVMe swap files (DeepSpeed's own docs use this path)."""


def _offload_target(nvme: bool, buffers: dict[str, int]) -> dict[str, Any]:
    """An `offload_optimizer` / `offload_param` section: pinned CPU memory, or NVMe through pinned
    staging buffers of the sizes the memory model prices (`cost_models.memory`)."""
    if not nvme:
        return {"device": "cpu", "pin_memory": True}
    return {"device": "nvme", "nvme_path": NVME_PATH, "pin_memory": True, **buffers}


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
    if lay.schedule_ not in ("1f1b", "interleaved_1f1b"):  # interleaving: the vpp note above
        lost.append(f"{SCHEDULE_NAMES[lay.schedule_]} schedule: DeepSpeed's pipeline engine runs its 1F1B-style TrainSchedule")
    return section


def _other_losses(job: Job, lost: list[str]) -> None:
    lay = job.lay
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
    if lay.offload_optimizer and lay.pp > 1:
        lost.append("optimizer CPU offload with pipeline parallelism: DeepSpeed offloads only with ZeRO-1/2/3 engines")
    if lay.tp_comm_overlap_ and lay.tp > 1:
        lost.append("TP communication overlap: AutoTP runs its all-reduces after the GEMMs")
    if lay.cross_entropy_ not in ("eager",):
        lost.append(f"{lay.cross_entropy_} cross entropy: the loss is model code under DeepSpeed")
    if lay.norm_kernel != "fused":
        lost.append(f"{lay.norm_kernel} RMSNorm: the norm kernel is model code under DeepSpeed")
    if lay.elementwise_kernels == "eager":
        lost.append("eager elementwise kernels: the kernels are model code under DeepSpeed")


def deepspeed_dp(job: Job) -> int:
    """DeepSpeed's data-parallel size: world / (TP x PP) (no context-parallel dimension)."""
    return job.gpus // (job.lay.tp * job.lay.pp)


def _batch(job: Job, lost: list[str]) -> tuple[int, int, int]:
    """(train_batch_size, micro-batch, accumulation) that DeepSpeed's check accepts."""
    lay, tr = job.lay, job.training
    ds_dp = deepspeed_dp(job)
    if lay.cp == 1:
        return tr.global_batch, lay.micro_batch, lay.grad_accum_
    what = (
        f"context parallelism (cp={lay.cp}, {lay.cp_attention} attention): DeepSpeed has no CP dimension "
        f"(Ulysses sequence parallelism is model code); its {ds_dp} = dp x cp data-parallel ranks each run "
        "whole sequences (more activation memory than planned)"
    )
    for micro in (lay.micro_batch, *range(lay.micro_batch - 1, 0, -1)):
        if tr.global_batch % (micro * ds_dp) == 0:
            accum = tr.global_batch // (micro * ds_dp)
            lost.append(f"{what}; global batch {tr.global_batch} kept as micro-batch {micro} x accumulation {accum} x {ds_dp}")
            return tr.global_batch, micro, accum
    batch = lay.micro_batch * ds_dp
    lost.append(f"{what}; {tr.global_batch} sequences do not split over {ds_dp} ranks, so the global batch is {batch}")
    return batch, lay.micro_batch, 1


RELEASE = "DeepSpeed 0.19.8"
"""The release the file is written for and checked against (tests/planner/consumers/check_deepspeed.py)."""


TRAINED = "[p for p in model.parameters() if p.requires_grad]"
"""The parameters DeepSpeed's optimizer steps: the trained ones (all of them, or a PEFT model's adapters)."""


def initialize_lines(job: Job, filename: str = "ds_config.json") -> list[str]:
    """How the training script calls DeepSpeed with this file (Python lines, `model` and its layers
    are the script's): the model-parallel unit that gives DeepSpeed the plan's data-parallel size."""
    lay = job.lay
    dp = deepspeed_dp(job)
    if lay.pp > 1:
        ckpt = ", activation_checkpoint_interval=1" if lay.recompute == "full" else ""
        return [
            "import deepspeed",
            "from deepspeed.pipe import PipelineModule",
            "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology",
            "deepspeed.init_distributed()",
            f"topology = PipeModelDataParallelTopology(num_pp={lay.pp}, num_mp={lay.tp}, num_dp={dp})",
            f"model = PipelineModule(layers=layer_specs, topology=topology, partition_method='uniform'{ckpt})",
            f"engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters={TRAINED}, "
            f"config='{filename}')",
        ]
    if lay.tp > 1:
        return [
            "import deepspeed",
            "from deepspeed.utils import groups",
            "deepspeed.init_distributed()",
            f"groups._init_tp_mesh_device(tensor_model_parallel_size={lay.tp})  # DeepSpeed's TP x DP groups: "
            f"{dp} data-parallel ranks",
            f"engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters={TRAINED}, "
            f"config='{filename}', mpu=groups)",
        ]
    return [
        "import deepspeed",
        f"engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters={TRAINED}, "
        f"config='{filename}')",
    ]


def export_deepspeed(job: Job) -> ExportResult:
    lost: list[str] = mtp_note(job, "DeepSpeed (a Transformers model)")
    lost += triton_attention_note(job, "DeepSpeed (a Transformers model)", "SDPA (FlashAttention-2)")
    lay, tr = job.lay, job.training
    if lay.framework_version is not None:
        lost.append(
            f"the plan was priced as DeepSpeed {lay.framework_version} runs it (Layout.framework_version, "
            f"cost_models.zero3_gathers); this file is written for {RELEASE}, whose ZeRO-3 gathers and reduces "
            "per module, prefetched: it runs no slower than priced"
        )
    batch, micro, accum = _batch(job, lost)
    config: dict[str, Any] = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": 1.0,
    }
    if tr.precision in ("bf16", "fp8"):
        config["bf16"] = {"enabled": True}
    elif tr.precision == "fp16":
        config["fp16"] = {"enabled": True}
    if tr.precision != "fp32":
        config["data_types"] = {"grad_accum_dtype": tr.grad_dtype}  # the gradient buffers the plan priced
    # the optimizer the plan priced (Adam's two float32 states per trained parameter, `cost_models.memory`);
    # DeepSpeed builds it from this section (AdamW, DeepSpeedCPUAdam when offloaded); lr and schedule: the script's
    config["optimizer"] = {"type": "AdamW"}
    config["zero_optimization"] = _zero_section(job, lost)
    if lay.tp > 1 and lay.pp == 1:
        config["tensor_parallel"] = {"autotp_size": lay.tp}
    elif lay.tp > 1:
        lost.append(
            f"tensor parallelism (tp={lay.tp}) with DeepSpeed's pipeline engine: AutoTP does not shard a "
            "PipelineModule; the topology's num_mp axis needs tensor-parallel layers in the LayerSpecs "
            "(Megatron-DeepSpeed's)"
        )
    pipeline = _pipeline_section(job, lost)
    if pipeline is not None:
        config["pipeline"] = pipeline
    _other_losses(job, lost)
    lost += framework_note(job, "deepspeed", "DeepSpeed")
    config["steps_per_print"] = 10
    config["wall_clock_breakdown"] = False
    config["autopar"] = {
        "summary": summary_lines(job),
        "release": RELEASE,
        "deepspeed_data_parallel_size": deepspeed_dp(job),
        "initialize": initialize_lines(job),
        "not_expressible": lost,
    }
    peft = peft_config(job)
    if peft is not None:  # model code, not DeepSpeed's: the Trainer / script applies it
        config["autopar"]["peft"] = peft
    text = json.dumps(config, indent=2, ensure_ascii=True) + "\n"
    return ExportResult(text, "ds_config.json", lost, "application/json")
