"""torchtitan 0.3 config module (Python), for `--module autopar_torchtitan --config autopar`.

torchtitan 0.3 dropped the TOML job file: `torchtitan.config.manager.ConfigManager` imports a
module, calls a function of it that returns a `Trainer.Config`, then applies `--section.key value`
overrides (tyro). The module written here starts from torchtitan's own config function for the
model and flavor (`llama3_70b()`, `deepseek_v3_671b()`, ...: the data, tokenizer, optimizer and
checkpoint settings torchtitan ships) and sets on it what the plan decided: the parallel degrees and
FSDP reshard policy, the pipeline schedule and the stage cut (`module_fqns_per_model_part`: in 0.3
the output projection is `lm_head`, 0.2's `output`), the batch, the activation-checkpointing policy
(`FullAC.Config()`, `SelectiveAC.Config()`, or None), torch.compile, and for FP8 the float8 converters
(`Float8LinearConverter` with row-wise scaling; the MoE experts' `Float8GroupedExpertsConverter`, which
0.3 runs with pipeline parallelism too). Keys of the 0.2 TOML that 0.3 no longer has (an expert
tensor-parallel degree, `disable_loss_parallel`, `context_parallel_rotate_method`,
`pipeline_parallel_expert_parallel_overlap`, `job.description`) are listed as lost where the plan set
them. Checked against torchtitan 0.3.0's ConfigManager and ParallelDims
(tests/planner/consumers/check_torchtitan_03.py).

Every value is a Python literal written by `repr` (integers, strings of a fixed table, lists of module
names); user text (model, cluster, GPU names) appears only in comments, escaped by `one_line`.
"""

from __future__ import annotations

from typing import Any

from planner.exporters.common import (
    ExportError,
    ExportResult,
    Job,
    comment_block,
    mtp_note,
    notes_lines,
    summary_lines,
    triton_attention_note,
)
from planner.exporters.torchtitan import SCHEDULES, _tail_notes, stage_modules, titan_job

RELEASE = "0.3.0"
MODULE = "autopar_torchtitan"
FUNCTION = "autopar"

CONFIG_FUNCTIONS: dict[str, dict[str, str]] = {
    # torchtitan module -> flavor -> its config function in torchtitan/models/<module>/config_registry.py (0.3.0)
    "llama3": {"8B": "llama3_8b", "70B": "llama3_70b", "405B": "llama3_405b"},
    "deepseek_v3": {"16B": "deepseek_v3_16b", "671B": "deepseek_v3_671b"},
    "qwen3": {"0.6B": "qwen3_0_6b", "1.7B": "qwen3_1_7b", "14B": "qwen3_14b", "32B": "qwen3_32b", "30B-A3B": "qwen3_30b_a3b"},
    "gpt_oss": {"20b": "gpt_oss_20b", "120b": "gpt_oss_120b"},
}
"""Flavors of a model module without a function of their own start from the module's first one, with
the flavor's model swapped in (`model_registry(flavor)`)."""


def _parallelism(job: Job, lost: list[str]) -> dict[str, Any]:
    lay = job.lay
    p: dict[str, Any] = {}
    if lay.zero_stage == 0:
        p |= {"data_parallel_replicate_degree": job.dp, "data_parallel_shard_degree": 1}
    else:
        p |= {"data_parallel_replicate_degree": job.dp_replicate, "data_parallel_shard_degree": job.dp_shard,
              "fsdp_reshard_after_forward": "default" if lay.zero_stage == 3 else "never"}
        if lay.zero_stage == 1:
            lost.append(
                "ZeRO-1: torchtitan shards with FSDP2, which also shards gradients and weights; written as "
                'ZeRO-2-like FSDP (fsdp_reshard_after_forward = "never")'
            )
    p["tensor_parallel_degree"] = lay.tp
    if lay.tp > 1:
        p["enable_sequence_parallel"] = lay.sp_
    p["pipeline_parallel_degree"] = lay.pp
    if lay.pp > 1:
        p["pipeline_parallel_schedule"] = SCHEDULES[lay.schedule_]
        p["pipeline_parallel_microbatch_size"] = lay.micro_batch
        p["module_fqns_per_model_part"] = stage_modules(job, head="lm_head")  # 0.3's name
    p["context_parallel_degree"] = lay.cp
    if lay.cp > 1 and lay.cp_attention == "allgather_mask":
        lost.append("allgather_mask CP attention: torchtitan 0.3 runs torch's context parallelism (no rotate-method key)")
    if job.model.is_moe:
        p["expert_parallel_degree"] = lay.ep
        if lay.ep > 1 and lay.etp_ > 1:
            lost.append(f"expert tensor parallelism (etp={lay.etp_}): torchtitan 0.3's ParallelismConfig has no "
                        "expert tensor-parallel degree")
    if lay.order != "tp-cp-ep-dp-pp":
        lost.append(f"rank order {lay.order}: torchtitan builds its device mesh as pp, dp_replicate, dp_shard, cp, tp")
    return p


def _activation_checkpoint(job: Job, lost: list[str]) -> str:
    """The `activation_checkpoint` value as Python source."""
    lay = job.lay
    if lay.recompute == "none":
        return "None"
    if lay.recompute == "selective":
        lost.append(
            "selective recompute: priced as Megatron's (attention core and MLP activation recomputed); "
            "torchtitan's SelectiveAC saves compute-heavy ops and recomputes every second matmul, which keeps more "
            "activations (plan with --framework fsdp to price it)"
        )
    if lay.recompute in ("selective", "op_sac"):
        return "SelectiveAC.Config()"
    if job.partial_recompute:
        lost.append(
            f"full recompute of {lay.recompute_layers} layers per stage: torchtitan's FullAC recomputes every layer"
        )
    return "FullAC.Config()"


def _converters(job: Job, compiled: bool) -> list[str]:
    """The model converters as Python source (FP8: linear layers, and an MoE model's routed experts)."""
    if job.training.precision != "fp8":
        return []
    out = [
        "Float8LinearConverter.Config(recipe_name='rowwise', filter_fqns=['lm_head', 'router.gate'], "
        f"model_compile_enabled={compiled})"
    ]
    if job.model.is_moe:
        out.append(f"Float8GroupedExpertsConverter.Config(model_compile_enabled={compiled})")
    return out


def export_torchtitan_module(job: Job) -> ExportResult:
    tt = titan_job(job)
    lost = tt.lost
    lost += mtp_note(job, "torchtitan 0.3 (this module)")
    lost += triton_attention_note(job, "torchtitan 0.3 (this module)", "SDPA (FlashAttention-2 on Hopper)")
    name, flavor = tt.name, tt.flavor
    model = job.model
    if name is None or flavor is None or name not in CONFIG_FUNCTIONS:
        what = f"family {model.family}" if name is None else f"a {name} flavor of hidden size {model.hidden_size} " \
            f"and {model.num_layers} layers"
        raise ExportError(
            f"torchtitan {RELEASE} has no model of {what} ({model.name}): its config module can only start from a model "
            "torchtitan ships; export torchtitan (0.2.x TOML, which names the model for you to register) instead"
        )
    functions = CONFIG_FUNCTIONS[name]
    base = functions.get(flavor, next(iter(functions.values())))
    lay = job.lay
    par = _parallelism(job, lost)
    ac = _activation_checkpoint(job, lost)
    _tail_notes(job, lost)
    converters = _converters(job, tt.compiled)
    async_tp = lay.tp > 1 and lay.tp_comm_overlap_
    imports = []  # what the function uses, in isort's order
    if converters:
        used = sorted({c.split(".Config(")[0] for c in converters})
        imports.append(f"from torchtitan.components.quantization import {', '.join(used)}")
    if ac != "None":
        imports.append(f"from torchtitan.distributed.activation_checkpoint import {ac.split('.')[0]}")
    imports += [
        f"from torchtitan.models.{name} import model_registry",
        f"from torchtitan.models.{name}.config_registry import {base}",
    ]
    body = [f"    config = {base}()  # torchtitan's own recipe for the model: data, tokenizer, optimizer, checkpoints"]
    # always the flavor's model with the plan's converters: a recipe may carry its own (llama3_405b is FP8)
    body.append(f"    config.model_spec = model_registry({flavor!r}, converters=[{', '.join(converters)}])")
    body += [f"    config.parallelism.{k} = {v!r}" for k, v in par.items() if k != "module_fqns_per_model_part"]
    if "module_fqns_per_model_part" in par:
        body.append("    config.parallelism.module_fqns_per_model_part = [")
        body += [f"        {part!r}," for part in par["module_fqns_per_model_part"]]
        body.append("    ]")
    body += [f"    config.training.{k} = {v!r}" for k, v in tt.training.items()]
    if lay.pp > 1 or lay.ep > 1:  # 0.3's Trainer.Config refuses CUDA graphs with either (a CPU-synchronizing dispatcher)
        body.append("    config.training.disable_cuda_graphs = True")
    body.append(f"    config.activation_checkpoint = {ac}")
    body.append(f"    config.compile.enable = {tt.compiled!r}")
    if tt.compiled:
        body.append("    config.compile.components = ['model', 'loss']")
    body.append(f"    config.compile.enable_async_tensor_parallel = {async_tp!r}")
    body.append("    return config")
    head = comment_block([
        f"torchtitan {RELEASE} config module written by autopar",
        *summary_lines(job),
        "On every node, from the directory holding this file:",
        f"  PYTHONPATH=. torchrun --nnodes {job.nodes} --nproc-per-node {job.gpus_per_node} --rdzv-backend c10d "
        f'--rdzv-endpoint "$MASTER_ADDR:29500" -m torchtitan.train --module {MODULE} --config {FUNCTION}',
        f"Written for torchtitan {RELEASE}, whose ConfigManager loads it (torchtitan 0.2.x: export torchtitan, a TOML file).",
    ])
    text = "\n".join([
        head, comment_block(notes_lines(f"torchtitan {RELEASE}", lost)), "", *imports, "", "",
        f"def {FUNCTION}():", "    # the plan's layout over that recipe", *body, "",
    ])
    return ExportResult(text, f"{MODULE}.py", lost, "text/x-python")
