"""Human-readable rendering of evaluation results with rich. Sizes print in GiB (2**30 bytes)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cost_models.error_band import above_published_ceiling
from planner.explain import counted, outside_band

GIB = 2**30


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:,.2f} GiB"


def memory_verdict(peak_bytes: int, capacity_bytes: int, headroom: float) -> tuple[str, str]:
    """(sentence, rich verdict) in the planner's wording: usable = capacity x (1 - headroom), the
    figure `autopar plan` prints as "GiB usable" (planner/explain.py)."""
    usable = int(capacity_bytes * (1.0 - headroom))
    if peak_bytes <= usable:
        verdict = "[green]fits[/]"
    elif peak_bytes <= capacity_bytes:
        verdict = f"[yellow]fits only without the {100 * headroom:.0f}% headroom[/]"
    else:
        verdict = "[red]does not fit[/]"
    sentence = (f"peak memory {peak_bytes / GIB:.1f} GiB of {usable / GIB:.1f} GiB usable "
                f"({capacity_bytes / GIB:.2f} GiB per GPU less {100 * headroom:.0f}% headroom)")
    return sentence, verdict


def print_evaluation(result: dict[str, Any], console: Console | None = None, headroom: float = 0.05) -> None:
    console = console or Console()
    if not result["ok"]:
        console.print(f"[bold red]invalid:[/] {result['error']}")
        return
    m, mem = result["model"], result["memory"]
    lay = result["layout"]
    console.print(
        f"[bold]{m['name']}[/] ({m['params'] / 1e9:.2f} B params, {m['active_params'] / 1e9:.2f} B active) on "
        f"{counted(result['gpus'], 'GPU')} of {result['cluster']}"
    )
    console.print(
        "layout: " + " ".join(
            f"{k}={lay[k]}" for k in ("dp", "tp", "pp", "vpp", "cp", "ep", "zero_stage", "dp_shard",
                                      "micro_batch", "grad_accum", "recompute", "sp", "schedule", "framework")
        )
    )
    auto = result.get("auto") or {}
    if "knobs" in auto:
        chosen = ", ".join(f"{k}={v}" for k, v in auto["chosen"].items())
        line = f"auto: chose {chosen}: {auto['why']}"
        if "runner_up" in auto:
            runner = ", ".join(f"{k}={v}" for k, v in auto["runner_up"].items())
            line += f"; runner-up {runner} is {auto['runner_up_slower_pct']:.1f}% slower"
        console.print(line)
    if "partition" in auto:
        cut = auto["partition"]
        console.print(f"auto: partition {','.join(map(str, cut['chosen']))} ({cut['from']}): {cut['why']}")
    sentence, verdict = memory_verdict(mem["peak_bytes"], mem["capacity_bytes"], headroom)
    console.print(f"{sentence}, worst on stage {mem['worst_stage']}: {verdict}")
    host = result.get("host_memory")
    if host and (host["bytes_per_node"] or not host["fits"]):
        over = host["bytes_per_node"] - host["capacity_bytes_per_node"]
        tail = "[green]fits[/]" if host["fits"] else f"[red]does not fit[/], {over:,} bytes ({gib(over)}) over"
        from planner.explain import host_memory_sentence

        console.print(f"{host_memory_sentence(host).removesuffix('.')}: {tail}")
    nvme = result.get("nvme")
    if nvme and nvme["bytes_per_node"]:
        over = nvme["bytes_per_node"] - nvme["capacity_bytes_per_node"]
        tail = "[green]fits[/]" if nvme["fits"] else f"[red]does not fit[/], {over:,} bytes ({gib(over)}) over"
        console.print(
            f"NVMe: {gib(nvme['bytes_per_node'])} per node of offloaded state (ZeRO-Infinity) "
            f"of {gib(nvme['capacity_bytes_per_node'])}: {tail}"
        )
    console.print(memory_table(mem["stages"]))
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
    if result["hfu"] < result["mfu"]:
        console.print(
            "HFU below MFU: MFU counts model FLOPs by the Megatron convention (3 x forward, attention over all s x s "
            "pairs), HFU the FLOPs the GPU runs (causal attention, recompute included); with little recompute the "
            "convention's unmasked attention counts more than the hardware runs"
        )
    band = result.get("error_band")
    if band:
        console.print(
            f"error band ({band['regime']}, {band['holdout_rows']} hold-out runs, 10th-90th percentile): "
            f"{band['tokens_per_s_per_gpu_low']:,.1f}-{band['tokens_per_s_per_gpu_high']:,.1f} tokens/s/GPU, "
            f"MFU {100 * band['mfu_low']:.1f}-{100 * band['mfu_high']:.1f}%" + outside_band(band)
        )


def _mfu_with_band(e: dict) -> str:
    """MFU and, when the estimate has one, its error band (`cost_models.error_band`); "!" when it is
    above every published run of its regime."""
    band = e.get("error_band")
    mfu = f"{100 * e['mfu']:.1f}%"
    text = f"{mfu} ({100 * band['mfu_low']:.0f}-{100 * band['mfu_high']:.0f})" if band else mfu
    return text + ("!" if above_published_ceiling(e) else "")


def ranking_notes(shown: list) -> tuple[str, list[str]]:
    """The table's title and the notes under it: why row 1 is first when a row below it is predicted
    faster (the planner's tie-break, `planner.search.choose_among_ties`), and what the MFU band is and
    why a prediction can sit outside it (`cost_models.error_band`)."""
    best = shown[0].estimate
    faster = [i + 1 for i, c in enumerate(shown) if i and c.estimate["step_s"] < best["step_s"]]
    notes: list[str] = []
    if faster:
        title = "best layouts (#1 chosen by the tie-break below, then by predicted step time)"
        gap = max(best["step_s"] / shown[i - 1].estimate["step_s"] - 1 for i in faster)
        band = best.get("error_band")
        resolution = (
            f"{100 * 0.25 * (band['measured_over_predicted_q90'] - band['measured_over_predicted_q10']) / 2:.1f}%, "
            "a quarter of the error band" if band else "the model's resolution"
        )
        notes.append(
            f"* #1 is predicted up to {100 * gap:.1f}% slower than {_rows_text(faster)}: within the model's resolution "
            f"({resolution}), a tie, broken towards fewer moving parts (lower cp, fewer virtual stages, the default "
            "rank order) and more memory headroom."
        )
    else:
        title = "best layouts (ranked by predicted step time)"
    bands = [c.estimate.get("error_band") for c in shown]
    if any(bands):
        notes.append(
            "MFU (band): the prediction, then the 10th-90th percentile of what held-out published runs of its regime "
            "measured relative to their own predictions, applied to this one."
        )
        first = next(b for b in bands if b)
        q10, q90 = first["measured_over_predicted_q10"], first["measured_over_predicted_q90"]
        if q10 > 1:
            notes.append(
                f"The prediction sits below its band: those runs all measured at least {q10:.2f}x their prediction "
                "(the model is conservative in this regime)."
            )
        elif q90 < 1:
            notes.append(
                f"The prediction sits above its band: those runs measured at most {q90:.2f}x their prediction "
                "(the model is optimistic in this regime)."
            )
    if any(above_published_ceiling(c.estimate) for c in shown):
        notes.append("!: above every published run of its regime (see below).")
    return title, notes


def _rows_text(rows: list[int]) -> str:
    if len(rows) == 1:
        return f"row {rows[0]}"
    if rows == list(range(rows[0], rows[-1] + 1)):
        return f"rows {rows[0]}-{rows[-1]}"
    return "rows " + ", ".join(map(str, rows))


MEMORY_COLUMNS = [
    ("params", "parameters"), ("grads", "gradients"), ("optim", "optimizer"), ("acts", "activations"),
    ("logits", "logits"), ("buffers", "comm_buffers"), ("reserve", "reserve"), ("total", "total"),
]


def memory_table(stages: list[dict[str, int]], limit: int = 8) -> Table:
    """Memory per pipeline stage in GiB (first and last stages when there are many)."""
    table = Table(title="memory per pipeline stage, worst rank (GiB)")
    table.add_column("stage")
    for short, _ in MEMORY_COLUMNS:
        table.add_column(short, justify="right")
    shown = list(range(len(stages)))
    if len(stages) > limit:
        shown = shown[: limit // 2] + shown[-limit // 2 :]
    for i in shown:
        st = stages[i]
        table.add_row(str(i), *(f"{st[f'{key}_bytes'] / GIB:.2f}" for _, key in MEMORY_COLUMNS))
    return table


class SearchProgress:
    """A progress bar that appears only when the search takes longer than a blink (0.3 s)."""

    def __init__(self, enabled: bool = True, delay_s: float = 0.3) -> None:
        self.enabled = enabled
        self.delay_s = delay_s
        self._start = 0.0
        self._progress: Progress | None = None
        self._task: int | None = None

    def __enter__(self) -> SearchProgress:
        self._start = time.perf_counter()
        return self

    def update(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._progress is None:
            if time.perf_counter() - self._start < self.delay_s:
                return
            self._progress = Progress(
                TextColumn("searching"), BarColumn(), TextColumn("{task.completed}/{task.total} meshes"),
                TimeElapsedColumn(), transient=True, console=Console(stderr=True),
            )
            self._progress.start()
            self._task = self._progress.add_task("search", total=total)
        assert self._task is not None
        self._progress.update(self._task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def print_plan(plan: object, console: Console | None = None, rows: int | None = None) -> None:
    """The best `rows` layouts as a table (all returned when None), then the explanation and the
    main rejections."""
    from planner.plan import Plan
    from planner.search import describe

    assert isinstance(plan, Plan)
    console = console or Console()
    inp = plan.inputs
    kernels = "" if inp.constraints.elementwise_kernels == "fused" else ", eager kernels (one per PyTorch op)"
    console.print(
        f"[bold]{inp.model.name}[/] on {counted(inp.gpus, 'GPU')} of {inp.cluster.name}, seq {inp.training.seq_len}, "
        f"global batch {inp.training.global_batch} sequences, {inp.training.precision}{kernels}"
    )
    if plan.best is not None:
        shown = [plan.best, *plan.alternatives][:rows]
        title, notes = ranking_notes(shown)
        table = Table(title=title, caption="\n".join(notes), caption_justify="left")
        for col in ("#", "layout", "step s", "tokens/s/GPU", "MFU (band)", "peak GiB"):
            table.add_column(col, justify="right" if col != "layout" else "left")
        for i, cand in enumerate(shown):
            e = cand.estimate
            mark = "*" if i == 0 and any(c.estimate["step_s"] < e["step_s"] for c in shown[1:]) else ""
            table.add_row(
                f"{i + 1}{mark}",
                describe(cand.layout) + (f" (and {cand.equivalent_count} equivalent)" if cand.equivalent_count else ""),
                f"{e['step_s']:.3f}", f"{e['tokens_per_s_per_gpu']:,.0f}",
                _mfu_with_band(e), f"{e['memory']['peak_bytes'] / GIB:.1f}",
            )
        console.print(table)
        above = [c.estimate for c in [plan.best, *plan.alternatives][:rows] if above_published_ceiling(c.estimate)]
        if above:
            ceiling = above[0]["published_mfu_ceiling"]
            console.print(
                f"! above {100 * ceiling['mfu']:.1f}% MFU, the most any published run in regime {ceiling['regime']} measured"
            )
        console.print(memory_table(plan.best.estimate["memory"]["stages"]))
    for line in plan.why:
        console.print(line)
    if plan.rejections:
        rej = Table(title="rejected (top reasons)")
        rej.add_column("count", justify="right")
        rej.add_column("reason")
        rej.add_column("example")
        for r in plan.rejections[:6]:
            rej.add_row(f"{r.count:,}", r.reason, r.example)
        console.print(rej)
    st = plan.stats
    bounded = f", {st.dominated:,} of them bounded, not timed (slower than the best and dominated)" if st.dominated else ""
    floored = f" ({st.floored:,} of them over memory by their activations alone)" if st.floored else ""
    console.print(
        f"[dim]search: {st.seconds:.2f} s, {st.generated:,} layouts: {st.invalid:,} invalid, {st.pruned:,} pruned by a "
        f"bound or dominance{floored}, {st.priced:,} priced, {st.feasible:,} fit{bounded}; calibration: {plan.calibration}[/]"
    )
