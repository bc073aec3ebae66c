"""torchtitan job config (TOML), for torchtitan 0.2.x's `--job.config_file` (`JobConfig`; checked with
0.2.2). torchtitan 0.3 reads no TOML: it builds its config from a Python function (`--module M --config
F`, `torchtitan.config.manager.ConfigManager`) with `--section.key value` overrides on the command line;
the file's header gives that command for 0.3.0 (the model's own config function, and the overrides of
the keys 0.3.0 still has), and lists the keys 0.3.0 no longer reads.

Data parallelism maps onto FSDP2 / HSDP / DDP: `data_parallel_shard_degree` = dp_shard and
`data_parallel_replicate_degree` = dp / dp_shard for ZeRO-2/3 (ZeRO-2 keeps parameters gathered
between forward and backward: `fsdp_reshard_after_forward = "never"`), plain replication for
ZeRO-0. Stage cuts are written exactly, as `module_fqns_per_model_part` (one list of module names
per virtual stage: `tok_embeddings`, `layers.i`, `norm`, `output`).

`[model] name` is torchtitan's model module (`llama3`, `deepseek_v3`, `qwen3`, `gpt_oss`) and
`flavor` the key of that module's config table, as torchtitan spells it ("8B", "70B", "405B",
"671B", ...), found by the model's shape (`FLAVORS`, from torchtitan 0.2.2's
`torchtitan/models/*/__init__.py`).

The file is written by `tomli_w` (every value a TOML value, strings escaped); user text (model,
cluster, GPU names) appears in comments escaped by `one_line` and in `job.description` as a TOML
string. What torchtitan cannot express is listed in the file's comments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tomli_w

from cost_models.pipeline import FB_PAIRED_SCHEDULES
from model_specs.spec import ModelSpec
from planner.exporters.common import (
    ExportResult,
    Job,
    comment_block,
    deepspeed_only_notes,
    fp8_note,
    framework_note,
    method_note,
    mtp_note,
    notes_lines,
    summary_lines,
    triton_attention_note,
)

SCHEDULES = {
    "gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B", "zero_bubble": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV", "looped_bfs": "LoopedBFS",
}
MODEL_NAMES = {
    "llama": "llama3",
    "deepseek_v3": "deepseek_v3",
    "deepseek_v2": "deepseek_v3",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3",
    "gpt_oss": "gpt_oss",
}
FLAVORS: dict[str, dict[tuple[int, int], str]] = {
    # torchtitan module -> (hidden size, layers) -> flavor key, from torchtitan 0.2.2
    # (https://github.com/pytorch/torchtitan/tree/v0.2.2/torchtitan/models)
    "llama3": {(4096, 32): "8B", (8192, 80): "70B", (16384, 126): "405B"},
    "deepseek_v3": {(2048, 27): "16B", (5120, 60): "236B", (7168, 61): "671B"},
    "qwen3": {
        (1024, 28): "0.6B", (2048, 28): "1.7B", (2560, 36): "4B", (4096, 36): "8B", (5120, 40): "14B",
        (5120, 64): "32B", (2048, 48): "30B-A3B", (4096, 94): "235B-A22B",
    },
    "gpt_oss": {(2880, 24): "20b", (2880, 36): "120b"},
}
CP_ROTATE = {"ring": "alltoall", "allgather_mask": "allgather"}


FLAVOR_TRAITS: dict[str, dict[str, int]] = {
    # what every flavor of a module shares beyond its (hidden, layers) key: torchtitan 0.2.2's llama3 models
    # are Llama 3 (GQA with 8 KV heads, the 128,256-token vocabulary: TransformerModelArgs, models/llama3/__init__.py),
    # which LLaMA-65B's 8192 x 80 shape is not
    "llama3": {"kv_heads": 8, "vocab_size": 128256},
}


def flavor_of(model: ModelSpec) -> tuple[str | None, str | None]:
    """(torchtitan model module, flavor) for `model`, None where torchtitan has none."""
    name = MODEL_NAMES.get(model.family)
    if name is None:
        return None, None
    traits = FLAVOR_TRAITS.get(name, {})
    if any(getattr(model, field) != value for field, value in traits.items()):
        return name, None
    return name, FLAVORS.get(name, {}).get((model.hidden_size, model.num_layers))


def stage_modules(job: Job, head: str = "output") -> list[list[str]]:
    """Module FQNs per virtual stage in model order (the embedding on the first, the final norm
    and the output projection `head` on the last: torchtitan 0.2 names it `output`, 0.3 `lm_head`)."""
    parts: list[list[str]] = []
    start = 0
    for n in job.chunk_layers:
        parts.append([f"layers.{i}" for i in range(start, start + n)])
        start += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", head]
    return parts


def _parallelism(job: Job, lost: list[str]) -> dict[str, Any]:
    lay = job.lay
    p: dict[str, Any] = {}
    if lay.zero_stage == 0:
        p["data_parallel_replicate_degree"] = job.dp
        p["data_parallel_shard_degree"] = 1
    else:
        p["data_parallel_replicate_degree"] = job.dp_replicate
        p["data_parallel_shard_degree"] = job.dp_shard
        p["fsdp_reshard_after_forward"] = "default" if lay.zero_stage == 3 else "never"
        if lay.zero_stage == 1:
            lost.append(
                "ZeRO-1: torchtitan shards with FSDP2, which also shards gradients and weights; written as "
                'ZeRO-2-like FSDP (fsdp_reshard_after_forward = "never")'
            )
    p["tensor_parallel_degree"] = lay.tp
    p["enable_async_tensor_parallel"] = lay.tp > 1 and lay.tp_comm_overlap_  # with [compile] on
    if lay.tp > 1 and not lay.sp_:
        lost.append("tensor parallelism without sequence parallelism: torchtitan's TP plans shard the sequence")
    p["pipeline_parallel_degree"] = lay.pp
    if lay.pp > 1:
        p["pipeline_parallel_schedule"] = SCHEDULES[lay.schedule_]
        if lay.schedule_ in FB_PAIRED_SCHEDULES and job.model.is_moe and lay.ep > 1:
            # the F&B pairs priced (`cost_models.step_time`): EP all-to-alls beside the other micro-batch's compute
            p["pipeline_parallel_expert_parallel_overlap"] = True
        p["pipeline_parallel_microbatch_size"] = lay.micro_batch
        p["module_fqns_per_model_part"] = stage_modules(job)
    p["context_parallel_degree"] = lay.cp
    if lay.cp > 1:
        p["context_parallel_rotate_method"] = CP_ROTATE[lay.cp_attention]
        if lay.cp_attention == "allgather_mask":
            lost.append("allgather_mask CP attention: torchtitan all-gathers K/V without a dense mask")
    if lay.tp > 1:
        # loss_parallel and Megatron's vocab_parallel both keep the logits vocabulary-sharded
        p["disable_loss_parallel"] = lay.cross_entropy_ == "eager"
        if lay.cross_entropy_ == "fused":
            lost.append("fused (chunked) cross entropy: torchtitan runs its loss-parallel cross entropy")
    if job.model.is_moe:
        p["expert_parallel_degree"] = lay.ep
        p["expert_tensor_parallel_degree"] = lay.etp_
    if job.model.is_moe and lay.ep > 1 and lay.etp_ not in (1, lay.tp):
        lost.append(f"expert tensor parallel {lay.etp_}: torchtitan supports etp = tp or 1")
    if lay.order != "tp-cp-ep-dp-pp":
        lost.append(f"rank order {lay.order}: torchtitan builds its device mesh as pp, dp_replicate, dp_shard, cp, tp")
    return p


def _activation_checkpoint(job: Job, lost: list[str]) -> dict[str, Any]:
    lay = job.lay
    if lay.recompute == "none":
        return {"mode": "none"}
    if lay.recompute == "op_sac":
        return {"mode": "selective", "selective_ac_option": "op"}
    if lay.recompute == "selective":
        lost.append(
            "selective recompute: priced as Megatron's (attention core and MLP activation recomputed); "
            "torchtitan's selective mode is op-level SAC (every other matmul saved), written here, which "
            "keeps more activations (plan with --framework fsdp to price it)"
        )
        return {"mode": "selective", "selective_ac_option": "op"}
    if job.partial_recompute:
        lost.append(
            f"full recompute of {lay.recompute_layers} layers per stage: torchtitan recomputes every layer "
            "(full) or every n-th layer (selective_ac_option = n); written as full"
        )
    return {"mode": "full"}


@dataclass
class TitanJob:
    """What both torchtitan exports (0.2's TOML, 0.3's config module) write, and what neither can say."""

    name: str | None  # torchtitan model module (llama3, deepseek_v3, ...), None where it has none
    flavor: str | None  # key of that module's config table, None where it has none
    training: dict[str, Any]
    compiled: bool
    lost: list[str]


def titan_job(job: Job) -> TitanJob:
    """The values and notes common to every torchtitan release the exports target."""
    lost: list[str] = method_note(job, "torchtitan", "Use the accelerate or deepspeed export (PEFT), or torchtune's LoRA recipes.")
    lay, tr, model = job.lay, job.training, job.model
    name, flavor = flavor_of(model)
    # With pipelining torchtitan splits the local batch into micro-batches; without, it
    # accumulates gradients until the global batch is reached.
    local = lay.micro_batch * lay.grad_accum_ if lay.pp > 1 else lay.micro_batch
    training: dict[str, Any] = {
        "local_batch_size": local,
        "global_batch_size": tr.global_batch,
        "seq_len": tr.seq_len,
        "mixed_precision_param": "float32" if tr.precision == "fp32" else "bfloat16",
    }
    if lay.offload_optimizer or lay.offload_params:
        training["enable_cpu_offload"] = True
    if lay.offload_optimizer and not lay.offload_params:
        lost.append(
            "optimizer-only CPU offload: torchtitan's enable_cpu_offload moves parameters and gradients "
            "to the CPU too (FSDP2 CPUOffloadPolicy)"
        )
    if tr.precision == "fp16":
        lost.append("fp16 training: torchtitan mixed precision is bf16 or fp32; written as bf16")
    if tr.precision != "fp32" and tr.grad_dtype == "bf16" and lay.zero_stage >= 1 and job.dp_shard > 1:
        lost.append("bf16 gradient reduction: torchtitan's FSDP reduces gradients in float32 (mixed_precision_reduce)")
    if lay.norm_kernel != "fused":
        lost.append(f"{lay.norm_kernel} RMSNorm: torchtitan's models use torch's fused RMSNorm")
    if lay.framework == "fsdp" and lay.attention_kernel_ == "fused":  # (another framework's plan: noted as such)
        lost.append(
            "fused attention: torchtitan's SDPA puts FlashAttention-2 first on Hopper (cuDNN first only on "
            "Blackwell, pytorch/torchtitan#1196); the plan's price needs the cuDNN backend or FlashAttention-3"
        )
    async_tp = lay.tp > 1 and lay.tp_comm_overlap_
    # the plan prices fused norms, rotary and activations (`Layout.elementwise_kernels`): torch.compile
    # fuses them; async TP (torch's symmetric-memory collective matmuls) runs only on a compiled model
    compiled = lay.elementwise_kernels == "fused" or async_tp
    if async_tp and lay.elementwise_kernels == "eager":
        lost.append("eager elementwise kernels: async tensor parallelism needs torch.compile, which fuses them")
    return TitanJob(name, flavor, training, compiled, lost)


def _tail_notes(job: Job, lost: list[str]) -> None:
    """Notes both releases add after their own (framework, FSDP1, DeepSpeed-only features, FP8 recipe)."""
    lost += framework_note(job, "fsdp", "torchtitan")
    if job.lay.fsdp_flat_params:
        lost.append("FSDP1 flat parameters: torchtitan runs FSDP2, whose per-layer copies of the gathered weights "
                    "make the step slower than priced")
    lost += deepspeed_only_notes(job, "torchtitan")
    lost += fp8_note(job, "torchtitan", "torchao float8 with row-wise scaling (recipe_name rowwise)")


def moe_fp8_blocked(job: Job) -> str | None:
    """Why torchtitan 0.2's float8 grouped-GEMM converter cannot take the routed experts of an FP8 MoE
    plan (its Float8GroupedMMConverter asserts pipeline and context parallel degree 1), None when it can."""
    lay = job.lay
    if job.training.precision != "fp8" or not job.model.is_moe:
        return None
    if lay.pp > 1 or lay.cp > 1:
        which = "pipeline" if lay.pp > 1 else "context"
        return (
            f"FP8 routed experts: torchtitan 0.2's float8 grouped-GEMM converter (quantize.grouped_mm.float8) refuses "
            f"{which} parallelism (Float8GroupedMMConverter asserts its degree is 1), so the experts run bf16 GEMMs and "
            "only nn.Linear layers are FP8; the plan priced the experts in FP8, so this run is slower (torchtitan 0.3's "
            "Float8GroupedExpertsConverter has no such limit: the torchtitan-0.3 export)"
        )
    return None


RELEASE = "0.2.2"
"""The torchtitan release the TOML is checked against (tests/planner/consumers/check_torchtitan.py)."""


def export_torchtitan(job: Job) -> ExportResult:
    tt = titan_job(job)
    lost = tt.lost
    lost += mtp_note(job, "torchtitan")
    lost += triton_attention_note(job, "torchtitan", "SDPA (FlashAttention-2 on Hopper)")
    tr, model = job.training, job.model
    name, flavor = tt.name, tt.flavor
    if name is None:
        lost.append(
            f"model family {model.family}: no torchtitan model of that family; [model] names the family "
            "and the preset, register them with torchtitan before use"
        )
    elif flavor is None:
        lost.append(
            f"{model.name}: no {name} flavor with hidden size {model.hidden_size} and {model.num_layers} layers; "
            f"[model] flavor names the preset, add it to torchtitan's {name} config table before use"
        )
    model_table: dict[str, Any] = {"name": name or model.family, "flavor": flavor or model.name}
    moe_blocked = moe_fp8_blocked(job)
    if tr.precision == "fp8":
        model_table["converters"] = ["quantize.linear.float8"]
        if model.is_moe and moe_blocked is None:
            model_table["converters"].append("quantize.grouped_mm.float8")
    if moe_blocked:
        lost.append(moe_blocked)
    tables = [
        ("job", {"description": f"autopar: {model.name} on {job.gpus} x {job.cluster.gpu.name} ({job.cluster.name})"}),
        ("model", model_table),
        ("training", tt.training),
        ("parallelism", _parallelism(job, lost)),
        ("activation_checkpoint", _activation_checkpoint(job, lost)),
        ("compile", {"enable": True, "components": ["model", "loss"]} if tt.compiled else {"enable": False}),
    ]
    _tail_notes(job, lost)
    doc: dict[str, Any] = dict(tables)
    if tr.precision == "fp8":
        doc["quantize"] = {"linear": {"float8": {"recipe_name": "rowwise"}}}
        if model.is_moe and moe_blocked is None:
            doc["quantize"]["grouped_mm"] = {"float8": {"fqns": ["experts"]}}
    launch = [
        f"For torchtitan 0.2.x (checked with {RELEASE}'s ConfigManager); on every node:",
        f"  torchrun --nnodes {job.nodes} --nproc-per-node {job.gpus_per_node} --rdzv-backend c10d "
        '--rdzv-endpoint "$MASTER_ADDR:29500" -m torchtitan.train --job.config_file torchtitan.toml',
        "torchtitan 0.3 reads no TOML (its config is a Python function: --module M --config F): export "
        "torchtitan-0.3 instead (autopar plan ... --export torchtitan-0.3).",
    ]
    text = comment_block(["torchtitan job config written by autopar", *summary_lines(job), *launch]) + "\n"
    text += comment_block(notes_lines("torchtitan", lost)) + "\n\n"
    text += tomli_w.dumps(doc, multiline_strings=False)
    return ExportResult(text, "torchtitan.toml", lost, "application/toml")
