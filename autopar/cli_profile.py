"""`autopar profile`: measure, on this machine's GPU, the kernel-atlas entries a plan is priced with.

Imports only typer at module level; torch (the runtime extra) loads when the command runs. The
measurement itself is `runtime.kernel_profile`; the entries are the plan's own lookups
(`planner.kernel_profile.plan_needs`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer


def profile(
    plan_file: Path | None = typer.Argument(
        None, help="Plan JSON (autopar plan --json, or the service's GET /v1/plans/{id}); or give --model ... instead"
    ),
    model: str | None = typer.Option(None, help="model preset or HF config.json (instead of a plan file)"),
    cluster: str | None = typer.Option(None, help="cluster preset or YAML (instead of a plan file)"),
    gpus: int | None = typer.Option(None, help="GPUs in the job"),
    seq_len: int = typer.Option(4096, help="tokens per sequence"),
    global_batch: int | None = typer.Option(None, help="sequences per step"),
    precision: str = typer.Option("bf16", help="bf16 | fp16 | fp8 | fp32"),
    method: str = typer.Option("full", help="full | lora | qlora"),
    lora_rank: int | None = typer.Option(None, help="lora / qlora: adapter rank (default 16)"),
    framework: str | None = typer.Option(None, help="megatron | fsdp | deepspeed (as autopar plan)"),
    stack: str | None = typer.Option(None, help="fine-tuning stack: hf | torchtune (as autopar plan)"),
    out: Path = typer.Option(Path("kernel-profile.json"), help="atlas JSON written here"),
    max_seconds: float = typer.Option(300.0, min=1.0, help="stop timing new entries after this many seconds"),
    device: str = typer.Option("auto", help="auto (the GPU, else the CPU) | cuda | cpu"),
) -> None:
    """Measure the kernels a plan is priced with (GEMM shapes, attention, memory copy) on this
    machine's GPU, with progress on stderr, and write them as a kernel-atlas file: upload it with
    PUT /v1/clusters/{name}/atlas, or plan with it: autopar plan ... --atlas FILE."""
    from autopar.cli_args import _refuse
    from autopar.cli_support import require_extra

    if device not in ("auto", "cuda", "cpu"):
        _refuse(f"--device: {device!r} is not one of auto, cuda, cpu")
    if plan_file is not None:
        try:
            data = json.loads(plan_file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            _refuse(f"PLAN_FILE: cannot read {plan_file}: {exc}")
    elif model and cluster and gpus and global_batch:
        data = None
    else:
        _refuse("give a PLAN_FILE, or --model, --cluster, --gpus and --global-batch as for autopar plan")
    require_extra("runtime", "profile", ["torch"])
    from pydantic import ValidationError

    from runtime.kernel_profile import load_plan, profile_plan, stderr_progress

    if data is not None:
        try:
            plan = load_plan(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            _refuse(f"PLAN_FILE: {'.'.join(str(x) for x in first['loc'])}: {first['msg']}")
    else:
        plan = _search(model, cluster, gpus, seq_len, global_batch, precision, method, lora_rank, framework, stack)
    if plan.best is None:
        _refuse("the plan has no layout that fits: nothing to measure")
    import torch

    dev = None if device == "auto" else torch.device(device)
    if dev is not None and dev.type == "cuda" and not torch.cuda.is_available():
        _refuse("--device cuda: torch sees no CUDA device")
    doc, skipped = profile_plan(plan, device=dev, max_seconds=max_seconds, command=["autopar", *sys.argv[1:]],
                                progress=stderr_progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for line in skipped:
        typer.echo(f"skipped: {line}", err=True)
    n = sum(len(doc[k]) for k in ("gemm", "attention", "memory"))
    typer.echo(f"{n} points of {doc['gpu']} measured on {doc['provenance']['device']}; "
               f"{len(skipped)} entries skipped; atlas -> {out}")


def _search(model: str, cluster: str, gpus: int, seq_len: int, global_batch: int, precision: str, method: str,
            lora_rank: int | None, framework: str | None, stack: str | None):  # type: ignore[no-untyped-def]
    """The plan `autopar plan` would make for these options (its model / cluster resolution)."""
    from pydantic import ValidationError

    from autopar.cli_args import _cluster_ref, _method_fields, _model_ref, _refuse, _validation_message
    from cost_models.jobs import JobError, _resolve, resolve_cluster, resolve_model
    from model_specs.spec import TrainingSpec
    from planner.finetune import search_finetune
    from planner.plan import SearchConstraints

    try:
        spec = _resolve("model", resolve_model, _model_ref(model))
        cl = _resolve("cluster", resolve_cluster, _cluster_ref(cluster))
        training = TrainingSpec(seq_len=seq_len, global_batch=global_batch, precision=precision,  # type: ignore[arg-type]
                                **_method_fields(method, lora_rank, None, None, None))
        pinned = {k: v for k, v in dict(framework=framework, stack=stack).items() if v is not None}
        constraints = SearchConstraints(**pinned)
    except ValidationError as exc:
        _refuse(_validation_message(exc))
    except JobError as exc:
        _refuse(str(exc))
    return search_finetune(spec, training, cl, gpus, constraints)
