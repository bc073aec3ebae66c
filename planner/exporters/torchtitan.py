"""torchtitan job config (TOML).

Data parallelism maps onto FSDP2 / HSDP / DDP: `data_parallel_shard_degree` = dp_shard and
`data_parallel_replicate_degree` = dp / dp_shard for ZeRO-2/3 (ZeRO-2 keeps parameters gathered
between forward and backward: `fsdp_reshard_after_forward = "never"`), plain replication for
ZeRO-0. Stage cuts are written exactly, as `module_fqns_per_model_part` (one list of module names
per virtual stage: `tok_embeddings`, `layers.i`, `norm`, `output`).
"""

from __future__ import annotations

from typing import Any

from planner.exporters.common import ExportResult, Job, comment_block, summary_lines

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}
MODEL_NAMES = {"llama": "llama3", "deepseek_v3": "deepseek_v3", "deepseek_v2": "deepseek_v3", "qwen3": "qwen3", "qwen3_moe": "qwen3"}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        if v and isinstance(v[0], list):
            inner = ",\n".join(f"    {_toml_value(x)}" for x in v)
            return "[\n" + inner + ",\n]"
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _table(name: str, values: dict[str, Any]) -> str:
    lines = [f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines)


def _stage_modules(job: Job) -> list[list[str]]:
    """Module FQNs per virtual stage in model order (the embedding on the first, the final norm
    and output projection on the last)."""
    parts: list[list[str]] = []
    start = 0
    for n in job.chunk_layers:
        parts.append([f"layers.{i}" for i in range(start, start + n)])
        start += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
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
    p["enable_async_tensor_parallel"] = False
    if lay.tp > 1 and not lay.sp_:
        lost.append("tensor parallelism without sequence parallelism: torchtitan's TP plans shard the sequence")
    p["pipeline_parallel_degree"] = lay.pp
    if lay.pp > 1:
        p["pipeline_parallel_schedule"] = SCHEDULES[lay.schedule_]
        p["pipeline_parallel_microbatch_size"] = lay.micro_batch
        p["module_fqns_per_model_part"] = _stage_modules(job)
    p["context_parallel_degree"] = lay.cp
    if job.model.is_moe:
        p["expert_parallel_degree"] = lay.ep
        p["expert_tensor_parallel_degree"] = lay.etp_
    if lay.order != "tp-cp-ep-dp-pp":
        lost.append(f"rank order {lay.order}: torchtitan builds its device mesh as pp, dp_replicate, dp_shard, cp, tp")
    return p


def _activation_checkpoint(job: Job, lost: list[str]) -> dict[str, Any]:
    lay = job.lay
    if lay.recompute == "none":
        return {"mode": "none"}
    if lay.recompute == "selective":
        return {"mode": "selective", "selective_ac_option": "op"}
    if job.partial_recompute:
        lost.append(
            f"full recompute of {lay.recompute_layers} layers per stage: torchtitan recomputes every layer "
            "(full) or every n-th layer (selective_ac_option = n); written as full"
        )
    return {"mode": "full"}


def export_torchtitan(job: Job) -> ExportResult:
    lost: list[str] = []
    lay, tr, model = job.lay, job.training, job.model
    name = MODEL_NAMES.get(model.family)
    if name is None:
        lost.append(
            f"model family {model.family}: no torchtitan model of that family; [model] names the preset, "
            "register it with torchtitan before use"
        )
    model_table: dict[str, Any] = {"name": name or model.family, "flavor": model.name}
    if tr.precision == "fp8":
        model_table["converters"] = ["float8"]
    # With pipelining torchtitan splits the local batch into micro-batches; without, it
    # accumulates gradients until the global batch is reached.
    local = lay.micro_batch * lay.grad_accum_ if lay.pp > 1 else lay.micro_batch
    training: dict[str, Any] = {
        "local_batch_size": local,
        "global_batch_size": tr.global_batch,
        "seq_len": tr.seq_len,
        "mixed_precision_param": "float32" if tr.precision == "fp32" else "bfloat16",
    }
    if lay.offload_optimizer:
        training["enable_cpu_offload"] = True
        lost.append(
            "optimizer-only CPU offload: torchtitan's enable_cpu_offload moves parameters and gradients "
            "to the CPU too (FSDP2 CPUOffloadPolicy)"
        )
    if tr.precision == "fp16":
        lost.append("fp16 training: torchtitan mixed precision is bf16 or fp32; written as bf16")
    tables = [
        ("job", {"description": f"autopar: {model.name} on {job.gpus} x {job.cluster.gpu.name} ({job.cluster.name})"}),
        ("model", model_table),
        ("training", training),
        ("parallelism", _parallelism(job, lost)),
        ("activation_checkpoint", _activation_checkpoint(job, lost)),
        ("compile", {"enable": False}),
    ]
    if tr.precision == "fp8":
        tables.append(("float8", {"recipe_name": "rowwise"}))
    text = comment_block(["torchtitan job config written by autopar", *summary_lines(job)]) + "\n\n"
    text += "\n\n".join(_table(n, v) for n, v in tables) + "\n"
    return ExportResult(text, "torchtitan.toml", lost)
