"""`autopar`: one console script; each subcommand imports its package lazily, so `autopar evaluate`
and `autopar plan` never import torch or the web stack."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from autopar.cli_args import (  # noqa: F401  (shared with the other subcommand modules)
    FLAGS,
    _cluster_ref,
    _comma_list,
    _flag,
    _method_fields,
    _model_ref,
    _refuse,
    _validation_message,
)

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Auto-parallelism planner for LLM training.",
    rich_markup_mode=None,  # click's own help layout: whole option names at any width (COLUMNS=100 included)
    context_settings={"max_content_width": 120},  # help follows the terminal (COLUMNS) up to 120 columns
)


def _need_global_batch(global_batch: int | None, global_batch_tokens: int | None) -> None:
    if not global_batch and not global_batch_tokens:
        typer.echo("error: give the batch: --global-batch N (sequences per optimizer step) or "
                   "--global-batch-tokens N (tokens per step)", err=True)
        raise typer.Exit(2)


def _gpu_count(gpus: int | None, nodes: int | None, gpus_per_node: Any) -> int:
    """--gpus, or --nodes x the cluster's GPUs per node: at least 1 (exits 2 naming the option)."""
    if gpus is not None and nodes is not None:
        _refuse("give --gpus or --nodes, not both")
    if gpus is None and nodes is None:
        _refuse("give the job's size: --gpus N (GPUs) or --nodes N (whole nodes of the cluster)")
    if gpus is not None:
        if gpus < 1:
            _refuse(f"--gpus: {gpus} GPUs: a job needs at least 1 GPU")
        return gpus
    assert nodes is not None
    if nodes < 1:
        _refuse(f"--nodes: {nodes} nodes: a job needs at least 1 node")
    return nodes * int(gpus_per_node() if callable(gpus_per_node) else gpus_per_node)


def _gpus(gpus: int | None, nodes: int | None, cluster_ref: Any) -> int:
    def per_node() -> int:
        from cost_models.jobs import JobError, _resolve, resolve_cluster

        try:
            return int(_resolve("cluster", resolve_cluster, cluster_ref).gpus_per_node)
        except JobError as exc:
            _refuse(str(exc))

    return _gpu_count(gpus, nodes, per_node)


def _int_or_auto(option: str, value: str) -> int | str:
    """An integer option that also takes "auto" (`cost_models.auto_knobs`)."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(f"{option} takes an integer or auto, not {value!r}") from None


def _technique_fields(master_weights: bool | None, dora: bool, trainable_embeddings: bool) -> dict[str, Any]:
    """The technique fields of `TrainingSpec` from the CLI options (only those given)."""
    out: dict[str, Any] = {}
    if master_weights is not None:
        out["master_weights"] = master_weights
    if dora:
        out["dora"] = True
    if trainable_embeddings:
        out["trainable_embeddings"] = True
    return out


@app.command()
def evaluate(
    model: str | None = typer.Option(None, help="model preset or path to a HF config.json"),
    cluster: str | None = typer.Option(None, help="cluster preset or path to a cluster YAML"),
    gpus: int | None = typer.Option(None, help="GPUs in the job"),
    nodes: int | None = typer.Option(None, help="nodes in the job (instead of --gpus)"),
    seq_len: int = typer.Option(4096, help="tokens per sequence"),
    global_batch: int | None = typer.Option(None, help="sequences per step"),
    global_batch_tokens: int | None = typer.Option(None, help="tokens per step (instead of --global-batch)"),
    precision: str = typer.Option("bf16", help="bf16 | fp16 | fp8 | fp32"),
    grad_dtype: str = typer.Option("bf16", help="gradient buffer dtype: bf16 | fp32"),
    method: str = typer.Option("full", help="full | lora | qlora (frozen base, trained low-rank adapters)"),
    lora_rank: int | None = typer.Option(None, help="lora / qlora: adapter rank (default 16)"),
    lora_alpha: float | None = typer.Option(None, help="lora / qlora: adapter alpha (default 2 x rank)"),
    lora_targets: str | None = typer.Option(
        None, help="lora / qlora: all-linear (default) | attention | comma-separated PEFT module names (q_proj,v_proj)"
    ),
    quant_format: str | None = typer.Option(None, help="qlora: nf4_double (default) | nf4 | int8"),
    tp: int = typer.Option(1, help="tensor-parallel degree (with sequence parallelism unless --no-sp)"),
    pp: int = typer.Option(1, help="pipeline-parallel degree (stages)"),
    dp: int | None = typer.Option(None, help="data-parallel degree (default: GPUs / (tp x pp x cp))"),
    cp: int = typer.Option(1, help="context-parallel degree (sequence split over ranks)"),
    ep: int = typer.Option(1, help="expert-parallel degree (MoE models)"),
    etp: int | None = typer.Option(None, help="expert tensor-parallel degree (MoE; default: tp)"),
    vpp: str = typer.Option("1", help="virtual stages per pipeline rank, or auto"),
    zero: str = typer.Option("1", help="ZeRO stage 0-3 (3 = FSDP), or auto"),
    dp_shard: int | None = typer.Option(None, help="sharding group (< dp: hybrid sharding)"),
    micro_batch: str = typer.Option("1", help="sequences per micro-batch, or auto"),
    recompute: str = typer.Option("none", help="none | selective | full | op_sac (fsdp) | auto"),
    recompute_layers: int | None = typer.Option(None, help="full recompute: layers per stage"),
    recompute_modules: str | None = typer.Option(
        None, help="selective recompute: comma-separated core_attn, act, layernorm, mla_up_proj (Megatron's --recompute-modules)"
    ),
    partition: str | None = typer.Option(
        None, help="layers per pipeline chunk, comma-separated (pp x vpp of them), or auto (the planner's CP-SAT cut)"
    ),
    sp: bool | None = typer.Option(None, "--sp/--no-sp", help="sequence parallel (default: on when tp > 1)"),
    schedule: str | None = typer.Option(
        None, help="gpipe | 1f1b | interleaved_1f1b | zero_bubble, zbv, dualpipev, looped_bfs (fsdp; zbv, dualpipev: vpp 2) | auto"
    ),
    offload_optimizer: bool = typer.Option(
        False, help="optimizer states and step in host memory (ZeRO-Offload; or NVMe with --offload-device nvme)"
    ),
    offload_params: bool = typer.Option(False, help="ZeRO-3: weight shards in host memory (or NVMe)"),
    offload_device: str = typer.Option("cpu", help="where offloaded states live: cpu | nvme (DeepSpeed ZeRO-3)"),
    hpz: int = typer.Option(1, min=1, help="ZeRO++ zero_hpz_partition_size (DeepSpeed ZeRO-3; 1 = off)"),
    qwz: bool = typer.Option(False, "--qwz", help="ZeRO++ int8 weight all-gathers (DeepSpeed ZeRO-3)"),
    qgz: bool = typer.Option(False, "--qgz", help="ZeRO++ int4 gradient reduce-scatters (DeepSpeed ZeRO-3)"),
    activation_offload_layers: int = typer.Option(
        0, min=0, help="Megatron --cpu-offloading-num-layers: layers per stage whose activations go to host memory"
    ),
    account_for_embedding: bool = typer.Option(
        False, "--account-for-embedding", help="Megatron: the embedding takes a layer slot of the first chunk"
    ),
    account_for_loss: bool = typer.Option(
        False, "--account-for-loss", help="Megatron: the loss takes a layer slot of the last chunk"
    ),
    first_stage_layers: int | None = typer.Option(None, help="Megatron decoder_first_pipeline_num_layers"),
    last_stage_layers: int | None = typer.Option(None, help="Megatron decoder_last_pipeline_num_layers"),
    moe_dispatcher: str = typer.Option("alltoall", help="MoE token dispatcher: alltoall | flex (DeepEP)"),
    elementwise_kernels: str = typer.Option(
        "fused", help="fused (Megatron-Core, torch.compile) | eager (one kernel per PyTorch op: no compile, HF)"
    ),
    attention_kernel: str | None = typer.Option(
        None, help="fused (Transformer Engine / cuDNN attention, FlashAttention-3) | flash2 (FlashAttention-2, "
        "PyTorch SDPA's flash backend) | triton_flash (FlashAttention in Triton: llm-foundry's attn_impl triton); "
        "default by framework: megatron fused, fsdp / deepspeed flash2"
    ),
    moe_a2a_overlap: bool = typer.Option(
        False, "--moe-a2a-overlap", help="Megatron combined 1F1B (--overlap-moe-expert-parallel-comm): EP all-to-alls beside compute"
    ),
    moe_folding: bool = typer.Option(
        True, "--moe-folding/--no-moe-folding",
        help="MoE parallel folding (Megatron-Core 0.10+); --no-moe-folding: 0.9's expert grid, EP inside DP",
    ),
    fsdp1: bool = typer.Option(
        False, "--fsdp1", help="framework fsdp: FSDP1's flat parameters (no per-layer copy-out of FSDP2's gathered weights)"
    ),
    fsdp_fusion: bool = typer.Option(
        True, "--megatron-fsdp-gradient-fusion/--no-megatron-fsdp-gradient-fusion",
        help="framework megatron, ZeRO-2/3: the weight-gradient GEMMs accumulate into Megatron FSDP's buffer "
        "(Megatron-Core 0.14+); --no-...: NeMo 2.3 / 2.4 turn it off (a gradient copy per micro-batch)",
    ),
    framework: str | None = typer.Option(None, help="megatron | fsdp | deepspeed (default megatron; with --stack the stack's)"),
    stack: str | None = typer.Option(None, help="fine-tuning stack: hf (HF Trainer / accelerate + PEFT) | torchtune"),
    optimizer_state: str | None = typer.Option(None, help="with a stack: full | paged | int8 | int8_paged | int4"),
    optimizer_in_backward: bool = typer.Option(False, "--optimizer-in-backward", help="torchtune's optimizer_in_bwd"),
    offload_activations: bool = typer.Option(False, "--offload-activations", help="a stack's activation offloading"),
    cross_entropy: str | None = typer.Option(
        None, help="loss kernel: eager | chunked | fused_linear | fused | vocab_parallel | loss_parallel (default by framework / stack)"
    ),
    master_weights: bool | None = typer.Option(
        None, "--master-weights/--no-master-weights", help="float32 trained weights; default: the stack's"
    ),
    dora: bool = typer.Option(False, "--dora", help="lora / qlora: DoRA adapters"),
    trainable_embeddings: bool = typer.Option(False, "--trainable-embeddings", help="lora / qlora: train embedding and head too"),
    headroom: float = typer.Option(0.05, help="fraction of GPU memory kept free (as `autopar plan`): sets 'usable'"),
    as_json: bool = typer.Option(False, "--json", help="print the JSON result"),
    jobs: Path | None = typer.Option(None, help="JSONL file of jobs ('-' = stdin); one JSON result per line"),
    workers: int = typer.Option(
        0, min=0, help="with --jobs: processes pricing lines (0 = one per CPU core); output stays in input order"
    ),
) -> None:
    """Price one layout: memory per stage, step time breakdown, tokens/s and MFU."""
    if jobs is not None:
        _run_jobs(jobs, workers)
        return
    if not model or not cluster:
        raise typer.BadParameter("--model and --cluster are required (or --jobs FILE)")
    _need_global_batch(global_batch, global_batch_tokens)
    model_ref, cluster_ref = _model_ref(model), _cluster_ref(cluster)
    training: dict[str, Any] = {
        "seq_len": seq_len, "precision": precision, "grad_dtype": grad_dtype,
        **_method_fields(method, lora_rank, lora_alpha, lora_targets, quant_format),
        **_technique_fields(master_weights, dora, trainable_embeddings),
    }
    if framework is None:
        from cost_models.stacks import STACK_DEFAULTS

        framework = STACK_DEFAULTS[stack].frameworks[0] if stack in STACK_DEFAULTS else "megatron"
    if global_batch_tokens:
        training["global_batch_tokens"] = global_batch_tokens
    if global_batch:
        training["global_batch"] = global_batch
    layout = {
        "tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep, "etp": etp, "vpp": _int_or_auto("--vpp", vpp),
        "zero_stage": _int_or_auto("--zero", zero), "dp_shard": dp_shard,
        "micro_batch": _int_or_auto("--micro-batch", micro_batch), "recompute": recompute,
        "recompute_layers": recompute_layers, "sp": sp, "schedule": schedule,
        "recompute_modules": _comma_list(recompute_modules),
        "offload_optimizer": offload_optimizer, "framework": framework,
        "offload_params": offload_params, "offload_device": offload_device,
        "zero_hpz_partition_size": hpz if hpz > 1 else None,
        "zero_quantized_weights": qwz or None, "zero_quantized_gradients": qgz or None,
        "activation_offload_layers": activation_offload_layers or None,
        "account_for_embedding_in_pipeline_split": account_for_embedding or None,
        "account_for_loss_in_pipeline_split": account_for_loss or None,
        "decoder_first_pipeline_num_layers": first_stage_layers,
        "decoder_last_pipeline_num_layers": last_stage_layers,
        "moe_token_dispatcher": moe_dispatcher, "moe_a2a_overlap": moe_a2a_overlap or None,
        "moe_parallel_folding": None if moe_folding else False, "elementwise_kernels": elementwise_kernels,
        "fsdp_flat_params": fsdp1 or None,
        "megatron_fsdp_gradient_fusion": None if fsdp_fusion else False,
        "attention_kernel": attention_kernel,
        "stack": stack, "optimizer_state": optimizer_state, "optimizer_in_backward": optimizer_in_backward or None,
        "offload_activations": offload_activations or None, "cross_entropy": cross_entropy,
    }
    job = {
        "model": model_ref, "cluster": cluster_ref, "gpus": _gpus(gpus, nodes, cluster_ref),
        "training": training, "layout": {k: v for k, v in layout.items() if v is not None},
    }
    if partition is not None:
        job["partition"] = _partition(partition)
    from planner.inputs import run_checked_job
    from planner.partitioner import cp_sat_partitioner

    result = run_checked_job(job, cp_sat_partitioner)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        from autopar.render import print_evaluation

        print_evaluation(result, headroom=headroom)
    if not result["ok"]:
        raise typer.Exit(2)


def _partition(text: str) -> str | list[int]:
    if text.strip() == "auto":
        return "auto"
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"--partition: {text!r} is neither auto nor comma-separated layer counts") from None


def _job_line(numbered: tuple[int, str]) -> str | None:
    """One `--jobs` line -> its JSON result line (None for a blank line). Never raises."""
    from planner.inputs import run_checked_job as run_job
    from planner.partitioner import cp_sat_partitioner

    lineno, line = numbered
    if not line.strip():
        return None
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        result: dict[str, Any] = {"ok": False, "error": f"line {lineno}: invalid JSON: {exc.msg}"}
    else:
        result = (
            run_job(raw, cp_sat_partitioner) if isinstance(raw, dict)
            else {"ok": False, "error": f"line {lineno}: a job is a JSON object"}
        )
    return json.dumps(result, separators=(",", ":"))


def _run_jobs(path: Path, workers: int = 1) -> None:
    """Price every line of `path` (or stdin), writing results in input order. With several
    workers, lines go to a process pool in chunks (`Pool.imap` keeps the order)."""
    import contextlib
    import os
    from collections.abc import Iterator

    stream = sys.stdin if str(path) == "-" else path.open()
    workers = workers or os.cpu_count() or 1
    out = sys.stdout
    with stream, contextlib.ExitStack() as stack:
        numbered = enumerate(stream, 1)
        if workers == 1:
            results: Iterator[str | None] = map(_job_line, numbered)
        else:
            import multiprocessing

            pool = stack.enter_context(multiprocessing.get_context("fork").Pool(workers))
            results = pool.imap(_job_line, numbered, chunksize=64)
        for res in results:
            if res is not None:
                out.write(res + "\n")


@app.command()
def plan(
    model: str = typer.Option(..., help="model preset or path to a HF config.json"),
    cluster: str = typer.Option(..., help="cluster preset or path to a cluster YAML"),
    gpus: int | None = typer.Option(None, help="GPUs in the job"),
    nodes: int | None = typer.Option(None, help="nodes in the job (instead of --gpus)"),
    seq_len: int = typer.Option(4096, help="tokens per sequence"),
    global_batch: int | None = typer.Option(None, help="sequences per step"),
    global_batch_tokens: int | None = typer.Option(None, help="tokens per step (instead of --global-batch)"),
    precision: str = typer.Option("bf16", help="bf16 | fp16 | fp8 | fp32"),
    grad_dtype: str = typer.Option("bf16", help="gradient buffer dtype: bf16 | fp32"),
    method: str = typer.Option("full", help="full | lora | qlora (frozen base, trained low-rank adapters)"),
    lora_rank: int | None = typer.Option(None, help="lora / qlora: adapter rank (default 16)"),
    lora_alpha: float | None = typer.Option(None, help="lora / qlora: adapter alpha (default 2 x rank)"),
    lora_targets: str | None = typer.Option(
        None, help="lora / qlora: all-linear (default) | attention | comma-separated PEFT module names (q_proj,v_proj)"
    ),
    quant_format: str | None = typer.Option(None, help="qlora: nf4_double (default) | nf4 | int8"),
    top: int = typer.Option(5, min=1, help="layouts to show: the best and the next N-1"),
    headroom: float = typer.Option(0.05, help="fraction of GPU memory kept free"),
    framework: str | None = typer.Option(
        None, help="megatron | fsdp | deepspeed (default megatron; with --stack or for lora / qlora the stack's: fsdp)"
    ),
    stack: str | None = typer.Option(
        None, help="fine-tuning stack: hf (HF Trainer / accelerate + PEFT) | torchtune; default for lora / qlora: hf"
    ),
    optimizer_state: str | None = typer.Option(
        None, help="with a stack, pin Adam's moments: full | paged | int8 | int8_paged | int4 (default: searched)"
    ),
    optimizer_in_backward: bool | None = typer.Option(
        None, "--optimizer-in-backward/--no-optimizer-in-backward", help="torchtune: pin optimizer_in_bwd (default: searched)"
    ),
    offload_activations: bool | None = typer.Option(
        None, "--offload-activations/--no-offload-activations", help="with a stack: pin activation offloading (default: searched)"
    ),
    cross_entropy: str | None = typer.Option(
        None, help="pin the loss kernel: eager | chunked (torchtune) | fused_linear (Liger, HF) | fused | vocab_parallel | "
        "loss_parallel (default: the framework's / stack's, and with a stack the chunked / fused one is searched)"
    ),
    recompute: str | None = typer.Option(None, help="pin recompute: none | selective | full | op_sac"),
    micro_batch: int | None = typer.Option(None, min=1, help="pin the micro-batch"),
    technique_search: bool = typer.Option(
        True, "--technique-search/--no-technique-search",
        help="with a stack: search its memory techniques (checkpointing, offloading, 8-bit AdamW, optimizer in backward, "
        "chunked / fused loss) and keep the fastest plan that fits",
    ),
    allow_8bit_optimizer: bool = typer.Option(
        True, "--allow-8bit-optimizer/--no-8bit-optimizer", help="with a stack: may 8-bit AdamW be chosen (it changes the numerics)"
    ),
    master_weights: bool | None = typer.Option(
        None, "--master-weights/--no-master-weights",
        help="float32 trained weights (a master copy); default: the stack's (torchtune and HF's bf16 models: none)",
    ),
    dora: bool = typer.Option(False, "--dora", help="lora / qlora: DoRA adapters (PEFT use_dora, torchtune use_dora)"),
    trainable_embeddings: bool = typer.Option(
        False, "--trainable-embeddings", help="lora / qlora: train the embedding and LM head too (PEFT modules_to_save)"
    ),
    tp: int | None = typer.Option(None, help="pin the tensor-parallel degree"),
    pp: int | None = typer.Option(None, help="pin the pipeline-parallel degree"),
    cp: int | None = typer.Option(None, help="pin the context-parallel degree"),
    ep: int | None = typer.Option(None, help="pin the expert-parallel degree"),
    zero: int | None = typer.Option(None, help="pin the ZeRO stage"),
    max_zero: int = typer.Option(
        3, min=0, max=3, help="the highest ZeRO stage your stack runs (1: a Megatron-Core before 0.10, no FSDP)"
    ),
    schedule: str | None = typer.Option(
        None, help="pin the pipeline schedule: gpipe | 1f1b | interleaved_1f1b | zero_bubble, zbv, dualpipev, looped_bfs (fsdp)"
    ),
    offload: bool = typer.Option(
        True, "--offload/--no-offload", help="allow offloading the optimizer (and ZeRO-3 weights) to host memory or NVMe (--no-offload: never)"
    ),
    quantized_comm: bool = typer.Option(
        False, "--allow-quantized-comm", help="also search ZeRO++'s lossy qwZ / qgZ collectives (DeepSpeed ZeRO-3)"
    ),
    moe_a2a_overlap: bool = typer.Option(
        True, "--moe-a2a-overlap/--no-moe-a2a-overlap",
        help="search Megatron-Core's combined 1F1B for MoE models (--no-moe-a2a-overlap: a Megatron-Core that predates it)",
    ),
    moe_folding: bool = typer.Option(
        True, "--moe-folding/--no-moe-folding",
        help="MoE parallel folding (Megatron-Core 0.10+); --no-moe-folding: price every layout with 0.9's expert "
        "grid (EP carved out of DP, expert TP = TP)",
    ),
    sequence_parallel: bool = typer.Option(
        True, "--sequence-parallel/--no-sequence-parallel",
        help="Megatron's sequence parallelism beside TP (Megatron-LM v3.0+); --no-sequence-parallel: a stack "
        "before it, whose TP layouts replicate norms and dropout",
    ),
    selective_recompute: bool = typer.Option(
        True, "--selective-recompute/--no-selective-recompute",
        help="search selective recompute (Megatron-LM v3.0+, torchtitan's op-level SAC); --no-selective-recompute: "
        "a stack that checkpoints whole layers only",
    ),
    elementwise_kernels: str | None = typer.Option(
        None, help="fused (Megatron-Core, torch.compile) | eager (torchtitan without compile, HF Transformers): "
        "the norm / rotary / activation kernels every layout is priced with (default fused; with a stack eager, "
        "i.e. no torch.compile)"
    ),
    attention_kernel: str | None = typer.Option(
        None, help="the attention kernel every layout is priced with: fused (Transformer Engine / cuDNN attention, "
        "FlashAttention-3) | flash2 (FlashAttention-2, PyTorch SDPA's flash backend) | triton_flash (FlashAttention "
        "in Triton: llm-foundry's attn_impl triton); default by framework: megatron fused, fsdp / deepspeed flash2"
    ),
    fsdp1: bool = typer.Option(
        False, "--fsdp1", help="framework fsdp: price every layout as FSDP1 (flat parameters: llm-foundry, Accelerate "
        "fsdp_version 1) instead of FSDP2's fully_shard"
    ),
    fsdp_fusion: bool = typer.Option(
        True, "--megatron-fsdp-gradient-fusion/--no-megatron-fsdp-gradient-fusion",
        help="framework megatron: Megatron FSDP (ZeRO-2/3) keeps gradient-accumulation fusion (Megatron-Core 0.14+); "
        "--no-...: price it as NeMo 2.3 / 2.4 run it, fusion off (a gradient copy per micro-batch)",
    ),
    as_json: bool = typer.Option(False, "--json", help="print the Plan as JSON"),
    atlas: Path | None = typer.Option(
        None, help="a measured kernel profile of the cluster's GPU (autopar profile): price with its points "
        "layered over the shipped kernel atlas; the plan says which of its lookups they measured"
    ),
    export: str | None = typer.Option(
        None, help="write the best layout as a launch file: megatron | deepspeed | torchtitan (0.2.x TOML) | "
        "torchtitan-0.3 (0.3 config module) | torchrun | accelerate | hf (TrainingArguments + PEFT + accelerate "
        "config) | torchtune (recipe config)"
    ),
) -> None:
    """Search every hybrid layout, rank by step time, explain the choice."""
    from pydantic import ValidationError

    from cost_models.jobs import JobError, _resolve, resolve_cluster, resolve_model
    from model_specs.spec import TrainingSpec
    from planner.plan import SearchConstraints

    _need_global_batch(global_batch, global_batch_tokens)
    model_ref, cluster_ref = _model_ref(model), _cluster_ref(cluster)
    try:
        spec = _resolve("model", resolve_model, model_ref)
        cl = _resolve("cluster", resolve_cluster, cluster_ref)
        training = TrainingSpec(
            seq_len=seq_len, global_batch=global_batch or 0, global_batch_tokens=global_batch_tokens,
            precision=precision, grad_dtype=grad_dtype,  # type: ignore[arg-type]
            **_method_fields(method, lora_rank, lora_alpha, lora_targets, quant_format),
            **_technique_fields(master_weights, dora, trainable_embeddings),
        )
        pinned = {  # only what the user gave: the stack's defaults and the technique search fill the rest
            k: v for k, v in dict(
                framework=framework, elementwise_kernels=elementwise_kernels, stack=stack, optimizer_state=optimizer_state,
                optimizer_in_backward=optimizer_in_backward, offload_activations=offload_activations,
                cross_entropy=cross_entropy, recompute=recompute, micro_batch=micro_batch,
            ).items() if v is not None
        }
        constraints = SearchConstraints(
            memory_headroom=headroom, tp=tp, pp=pp, cp=cp, ep=ep, zero_stage=zero,
            max_zero_stage=max_zero, schedule=schedule,
            allow_offload=offload, allow_quantized_comm=quantized_comm, top_k=max(top - 1, 1),
            allow_moe_a2a_overlap=moe_a2a_overlap, moe_parallel_folding=moe_folding,
            sequence_parallel=sequence_parallel, selective_recompute=selective_recompute,
            fsdp_flat_params=fsdp1, megatron_fsdp_gradient_fusion=fsdp_fusion,
            attention_kernel=attention_kernel,  # type: ignore[arg-type]
            search_techniques=technique_search, allow_8bit_optimizer=allow_8bit_optimizer,
            **pinned,
        )
    except ValidationError as exc:
        _refuse(_validation_message(exc))
    except JobError as exc:
        _refuse(str(exc))
    n = _gpu_count(gpus, nodes, cl.gpus_per_node)
    from planner.inputs import plan_problems

    problems = plan_problems(spec, training, cl, n, constraints)
    if problems:
        _refuse("; ".join(f"{_flag(p.loc)}: {p.message}" for p in problems))
    if export is not None:
        from planner.exporters import EXPORTERS

        if export.strip().lower() not in EXPORTERS:
            _refuse(f"--export: unknown format {export!r}; choose one of: {', '.join(EXPORTERS)}")
    profile = None
    if atlas is not None:
        from cost_models.kernels.schema import AtlasError, read_atlas_file

        try:
            profile = read_atlas_file(atlas)
        except AtlasError as exc:
            _refuse(f"--atlas: {exc}")
    from autopar.render import SearchProgress, print_plan
    from planner.kernel_profile import search_with_profile

    with SearchProgress(enabled=not as_json and sys.stderr.isatty()) as progress:
        try:
            result = search_with_profile(spec, training, cl, n, constraints, profile, progress=progress.update)
        except ValueError as exc:
            if profile is None:
                raise
            _refuse(f"--atlas: {exc}")
    if result.best is not None and result.best.layout.stack and not as_json and not export:
        from cost_models.stacks import defaults
        from planner.finetune import STACK_NAMES, techniques_of, weights_of

        lay = result.best.layout
        chosen = techniques_of(lay, defaults(lay.stack).cross_entropy)
        weights = weights_of(result.inputs.training, lay.stack)
        typer.echo(f"stack: {lay.stack} ({STACK_NAMES[lay.stack]}) on {lay.framework}, ZeRO-{lay.zero_stage}; "
                   f"{weights + '; ' if weights else ''}techniques: {', '.join(chosen) or 'none'}; "
                   f"export it with --export {lay.stack}")
    if export:
        from planner.exporters import ExportError
        from planner.exporters import export as export_plan

        if result.best is None:
            typer.echo("error: no layout fits; nothing to export", err=True)
            raise typer.Exit(3)
        try:
            exported = export_plan(result, export)
        except ExportError as exc:
            _refuse(f"--export {export}: {exc}")
        typer.echo(exported.text)
        for item in exported.lost:
            typer.echo(f"# not expressible in {export}: {item}", err=True)
        return
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        print_plan(result, rows=top)
    if result.best is None:
        raise typer.Exit(3)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    plan_file: Path = typer.Argument(..., help="Plan JSON (autopar plan --json) or RunSpec JSON"),
    steps: int = typer.Option(10, min=1, help="training steps"),
    nproc_per_node: int | None = typer.Option(None, help="processes per node (default: the plan's GPUs, one node)"),
    backend: str = typer.Option("auto", help="auto | gloo | nccl"),
    out: Path = typer.Option(Path("profile.json"), help="Profile JSON written by rank 0"),
    checkpoint_dir: Path | None = typer.Option(None, help="save/resume with torch.distributed.checkpoint"),
    hf_checkpoint: Path | None = typer.Option(
        None, help="start from this HuggingFace checkpoint (config.json + safetensors, as save_pretrained "
        "writes it): each rank reads only the slices it holds"
    ),
    data_file: Path | None = typer.Option(
        None, "--data", help="tokenized training data: a flat binary file of token ids"
    ),
    data_dtype: str = typer.Option("uint16", help="token file element type: uint16 | uint32 | int32 | int64"),
    dry_run: bool = typer.Option(False, help="print the launch line and exit"),
    fake_world: int | None = typer.Option(
        None, help="trace one rank per pipeline stage at this world size (fake process group, fake "
        "tensors; no GPUs) and print measured peak memory next to the cost model's"
    ),
    fake_steps: int = typer.Option(2, help="with --fake-world: training steps traced"),
    as_json: bool = typer.Option(False, "--json", help="with --fake-world: print the rows as JSON"),
) -> None:
    """Execute a plan through torchrun (standalone on one host; extra torchrun flags pass through,
    e.g. --nnodes 4 --rdzv-endpoint host:29500 for multi-node). Shows the step progress, writes the
    Profile, and ends with the measured figures beside the plan's prediction. The workers' output
    goes to OUT with the suffix .log."""
    import os
    import shlex

    from autopar.cli_support import log_tail, require_extra, run_summary, run_with_progress

    try:
        data = json.loads(plan_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise typer.BadParameter(f"cannot read {plan_file}: {exc}") from exc
    if fake_world is not None:
        require_extra("runtime", "run --fake-world", ["torch"])
        _fake_world(data, fake_world, fake_steps, as_json)
        return
    gpus = data.get("inputs", {}).get("gpus") or data.get("gpus")
    nproc = nproc_per_node or gpus
    if not nproc:
        raise typer.BadParameter("the file names no GPU count; pass --nproc-per-node")
    extra = list(ctx.args)
    rendezvous = [] if any(a.startswith("--nnodes") for a in extra) else ["--standalone"]
    argv = [
        sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc-per-node={nproc}", *extra,
        "-m", "runtime.launch", str(plan_file), "--steps", str(steps), "--out", str(out), "--backend", backend,
    ]
    if checkpoint_dir is not None:
        argv += ["--checkpoint-dir", str(checkpoint_dir)]
    if hf_checkpoint is not None:
        argv += ["--hf-checkpoint", str(hf_checkpoint)]
    if data_file is not None:
        argv += ["--data", str(data_file), "--data-dtype", data_dtype]
    if dry_run:
        typer.echo(shlex.join(argv))
        return
    require_extra("runtime", "run", ["torch"])
    out.parent.mkdir(parents=True, exist_ok=True)
    progress_file = out.with_name(out.name + ".progress")
    log_file = out.with_suffix(".log")
    argv += ["--progress-file", str(progress_file)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    typer.echo(f"launching {nproc} processes (torchrun); their output: {log_file}", err=True)
    code = run_with_progress(argv, env, progress_file, log_file, steps)
    progress_file.unlink(missing_ok=True)
    if code != 0:
        typer.echo(f"error: the run failed with exit code {code}; last lines of {log_file}:\n{log_tail(log_file)}", err=True)
        raise typer.Exit(code)
    try:
        profile = json.loads(out.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        typer.echo(f"error: the run ended but wrote no readable profile at {out}: {exc}", err=True)
        raise typer.Exit(1) from exc
    for line in run_summary(profile, data if "best" in data else None):
        typer.echo(line)
    typer.echo(f"profile: {out}")


def _fake_world(data: dict[str, Any], world: int, steps: int, as_json: bool) -> None:
    """`autopar run --fake-world N`: runtime.fake_world on the plan's layout at N ranks. When N
    differs from the plan's GPU count, the data-parallel degree is re-derived and the global batch
    scaled with it (same sequences per data-parallel rank), so a plan made for 4 GPUs traces at 256."""
    from pydantic import ValidationError

    from autopar.cli_support import busy
    from cost_models.jobs import format_validation_error
    from cost_models.layout import LayoutError
    from runtime.spec import load_run_spec

    note = ""
    try:
        run = load_run_spec(data, dtype="bf16")
        if world != run.gpus:
            lay = run.layout
            model_ranks = lay.tp * lay.pp * lay.cp
            if world % model_ranks:
                raise ValueError(f"{world} ranks is not a multiple of tp x pp x cp = {model_ranks}")
            new_dp = world // model_ranks
            old_batch = run.training.global_batch
            batch = old_batch * new_dp // lay.dp
            layout = lay.model_dump(exclude={"dp", "dp_shard", "grad_accum"})
            training = {**run.training.model_dump(mode="json"), "global_batch": batch, "global_batch_tokens": None}
            run = load_run_spec({**run.model_dump(mode="json"), "gpus": world, "layout": layout, "training": training})
            note = (f"at {world} ranks: dp {lay.dp} -> {new_dp}, global batch {old_batch} "
                    f"-> {batch} sequences (same {batch // new_dp} per data-parallel rank)")
    except ValidationError as exc:
        typer.echo(f"error: the layout cannot run on {world} ranks: {format_validation_error(exc)}", err=True)
        raise typer.Exit(2) from exc
    except (LayoutError, ValueError) as exc:
        typer.echo(f"error: the layout cannot run on {world} ranks: {exc}", err=True)
        raise typer.Exit(2) from exc
    from runtime.fake_world import TABLE_HEADER, compare_with_estimate, format_row, measure_stages

    if note and not as_json:
        typer.echo(note, err=True)
    with busy(f"tracing {run.layout.pp} pipeline stage(s) at {world} fake ranks"):
        rows = compare_with_estimate(run, measure_stages(run, steps))
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo(TABLE_HEADER)
    for r in rows:
        typer.echo(format_row(r))
    typer.echo("measured: live tensor storage under FakeTensorMode (CPU dispatch); estimate: "
               "cost_models without the allocator reserve (runtime.spec.traced_layout)")


@app.command()
def models(
    show: str | None = typer.Option(None, "--show", help="print one preset's ModelSpec fields as JSON (loadable "
                                    "with --model FILE.json)"),
) -> None:
    """List model presets with their parameter counts (B = 1e9)."""
    from model_specs.params import count_params
    from model_specs.presets import get_model, list_models

    if show is not None:
        try:
            spec = get_model(show)
        except KeyError as exc:
            typer.echo(f"error: {exc.args[0] if exc.args else exc}", err=True)
            raise typer.Exit(2) from exc
        pc = count_params(spec)
        typer.echo(f"# {spec.name}: {pc.total / 1e9:.3f} B parameters, {pc.active / 1e9:.3f} B active per token", err=True)
        typer.echo(spec.model_dump_json(indent=2))
        return
    for name in list_models():
        pc = count_params(get_model(name))
        typer.echo(f"{name:24s} {pc.total / 1e9:10.3f} B total {pc.active / 1e9:10.3f} B active")
    typer.echo("(autopar models --show NAME prints a preset's fields; --model also takes a HF config.json)", err=True)


@app.command()
def clusters(
    show: str | None = typer.Option(None, "--show", help="print one preset as a cluster YAML file to copy and edit"),
) -> None:
    """List cluster presets (or print one as YAML with --show NAME)."""
    from cluster_specs.presets import get_cluster, list_clusters

    if show is not None:
        from autopar.cli_support import preset_cluster_yaml

        try:
            typer.echo(preset_cluster_yaml(show), nl=False)
        except KeyError as exc:
            typer.echo(f"error: {exc.args[0] if exc.args else exc}", err=True)
            raise typer.Exit(2) from exc
        return
    for name in list_clusters():
        c = get_cluster(name)
        typer.echo(f"{name:18s} {c.gpu.name:22s} {c.gpus_per_node} GPUs/node  domain {c.domain_size}")
    typer.echo("(autopar clusters --show NAME prints one as a YAML cluster file to edit; --cluster takes the file)",
               err=True)


@app.command()
def gpus() -> None:
    """List the GPU catalog: memory (GiB), dense bf16 and fp8 peak (TFLOP/s, 1e12), memory bandwidth
    (TB/s, 1e12 bytes) and GPU-to-GPU link bandwidth per direction (GB/s, 1e9 bytes)."""
    from rich.console import Console
    from rich.table import Table

    from cluster_specs.catalog import get_gpu, list_gpus

    table = Table(title="GPU catalog (datasheet figures, dense peaks)")
    for col in ("name", "vendor", "memory GiB", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM TB/s", "link GB/s"):
        table.add_column(col, justify="left" if col in ("name", "vendor") else "right")
    for name in list_gpus():
        g = get_gpu(name)
        peak = g.peak_flops_per_s

        def tflops(key: str, peak: dict[str, float] = peak) -> str:
            return f"{peak[key] / 1e12:,.0f}" if key in peak else "-"

        table.add_row(g.name, g.vendor, f"{g.memory_bytes / 2**30:,.1f}", tflops("bf16"), tflops("fp8"),
                      f"{g.memory_bandwidth_bytes_per_s / 1e12:.2f}", f"{g.link_bandwidth_bytes_per_s / 1e9:,.0f}")
    Console(width=120).print(table)


from autopar.cli_agent import agent as _agent  # noqa: E402  (typer only; the agent loads when it runs)
from autopar.cli_profile import profile as _profile  # noqa: E402  (typer only; torch loads when it runs)

app.command(name="agent")(_agent)
app.command(name="profile")(_profile)


from autopar.cli_service import register as _register_service  # noqa: E402  (serve, tokens)

_register_service(app)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
