"""Human-readable rendering of evaluation results with rich. Sizes print in GiB (2**30 bytes)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

GIB = 2**30


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:,.2f} GiB"


def print_evaluation(result: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    if not result["ok"]:
        console.print(f"[bold red]invalid:[/] {result['error']}")
        return
    m, mem = result["model"], result["memory"]
    lay = result["layout"]
    console.print(
        f"[bold]{m['name']}[/] ({m['params'] / 1e9:.2f} B params, {m['active_params'] / 1e9:.2f} B active) on "
        f"{result['gpus']} GPUs of {result['cluster']}"
    )
    console.print(
        "layout: " + " ".join(
            f"{k}={lay[k]}" for k in ("dp", "tp", "pp", "vpp", "cp", "ep", "zero_stage", "dp_shard",
                                      "micro_batch", "grad_accum", "recompute", "sp", "schedule", "framework")
        )
    )
    verdict = "[green]fits[/]" if result["fits"] else "[red]does not fit[/]"
    console.print(
        f"memory: peak {gib(mem['peak_bytes'])} on stage {mem['worst_stage']} of {gib(mem['capacity_bytes'])}: {verdict}"
    )
    table = Table(title="memory per pipeline stage (worst rank)")
    keys = ["parameters", "gradients", "optimizer", "activations", "logits", "comm_buffers", "reserve", "total"]
    table.add_column("stage")
    for k in keys:
        table.add_column(k, justify="right")
    for i, st in enumerate(mem["stages"]):
        table.add_row(str(i), *(gib(st[f"{k}_bytes"]) for k in keys))
    console.print(table)
    t = Table(title="step time (critical path)")
    t.add_column("component")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    step = result["step_s"]
    for k, v in result["time"]["breakdown"].items():
        t.add_row(k.removesuffix("_s"), f"{v:.4f}", f"{100 * v / step:.1f}%")
    t.add_row("[bold]step[/]", f"[bold]{step:.4f}[/]", "100%")
    console.print(t)
    console.print(
        f"throughput: {result['tokens_per_s']:,.0f} tokens/s, {result['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU, "
        f"{result['model_flops_per_s_per_gpu'] / 1e12:,.1f} model TFLOP/s/GPU, MFU {100 * result['mfu']:.1f}% "
        f"(HFU {100 * result['hfu']:.1f}%), bubble {100 * result['bubble_fraction']:.1f}%"
    )
