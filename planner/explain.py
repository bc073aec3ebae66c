"""Sentences that explain a Plan: why this layout, what it spends its time on, or why nothing fits."""

from __future__ import annotations

from cost_models import stacks
from cost_models.error_band import above_published_ceiling
from planner.plan import HOST_MEMORY_REASON, Plan

GIB = 2**30


def _plural(n: int, word: str) -> str:
    """`word` for one, its plural otherwise ("GPU", "GPUs", "processes")."""
    if n == 1:
        return word
    return word + ("es" if word.endswith(("s", "sh", "ch", "x")) else "s")


def counted(n: int, word: str) -> str:
    """A count with its noun in the right number: "1 GPU", "8 GPUs", "1,024 ranks"."""
    return f"{n:,} {_plural(n, word)}"


def outside_band(band: dict) -> str:
    """Why the prediction itself lies outside its band, when it does: the band is measured /
    predicted over held-out runs, and need not contain 1."""
    q10, q90 = band["measured_over_predicted_q10"], band["measured_over_predicted_q90"]
    if q10 > 1:
        return (f" The prediction lies below the band: those runs all measured at least {q10:.2f}x their prediction "
                "(the model is conservative in this regime).")
    if q90 < 1:
        return (f" The prediction lies above the band: those runs measured at most {q90:.2f}x their prediction "
                "(the model is optimistic in this regime).")
    return ""


def host_memory_sentence(host: dict) -> str:
    """The host RAM a node needs, named by what it holds (`Estimate.host_bytes_per_node` is the larger
    of the offloaded state of the node's ranks and the loading peak, `memory.loading_bytes_per_node`)."""
    ranks = int(host["ranks_per_node"])
    offloaded = int(host.get("offloaded_bytes_per_node") or 0)
    loading = int(host.get("loading_bytes_per_node") or 0)
    total, capacity = int(host["bytes_per_node"]), int(host["capacity_bytes_per_node"])
    procs = f"{ranks} {_plural(ranks, 'process')}"
    if offloaded >= loading and offloaded:
        what = (f"offloaded state of the node's {ranks} {_plural(ranks, 'rank')}; the loading peak, "
                f"{loading / GIB:.1f} GiB, is lower")
    elif offloaded:
        what = (f"loading peak, the node's {procs} building the model; the offloaded state, "
                f"{offloaded / GIB:.1f} GiB, is lower")
    else:
        what = f"loading peak, the node's {procs} building the model; nothing is offloaded"
    return f"Host memory: {total / GIB:.1f} GiB per node of {capacity / GIB:.1f} GiB ({what})."


def method_sentences(plan: Plan) -> list[str]:
    """The training method when it is not full training: what is frozen, what is trained."""
    tr = plan.inputs.training
    if not tr.frozen_base:
        return []
    from model_specs.params import adapted_names, trainable_counts

    counts = trainable_counts(plan.inputs.model, tr.method, tr.lora_modules, tr.lora_rank_)
    base = f"{tr.quant_format_} base ({tr.quantized_weight_bytes:.4f} bytes per linear weight)" if tr.quant_format_ else "16-bit base"
    return [
        f"Method {tr.method}: frozen {base}, LoRA rank {tr.lora_rank_} (alpha {tr.lora_alpha_:g}) on "
        f"{', '.join(adapted_names(plan.inputs.model, tr.lora_modules))}: {counts.trainable:,} trainable and {counts.frozen:,} frozen parameters. "
        "Fine-tuning runs are checked in bench.finetune_runs, not in the error band below, which is full training's."
    ]


def host_sentences(plan: Plan) -> list[str]:
    """Layouts that fit on the GPUs but not in the nodes' host RAM: said whatever their rank among
    the rejections (offloading is what a user reaches for when GPU memory runs out, and loading the
    whole model in every process is what silently exhausts host RAM)."""
    return [
        f"{r.count:,} layouts fit in GPU memory but not in the node's host RAM (offloaded state, or every "
        f"process loading the whole model): e.g. {r.example}."
        for r in plan.rejections if r.reason == HOST_MEMORY_REASON
    ]


def kernel_sentences(est: dict) -> list[str]:
    """Where the kernel rates come from (measured, interpolated, extrapolated, datasheet shares of the
    GEMM and attention time) and the conservative figure the planner ranks by."""
    k, cons = est.get("kernels"), est.get("conservative")
    if not k or not cons:
        return []
    share = k["time_share"]
    parts = ", ".join(f"{100 * share[name]:.0f}% {name}" for name in ("measured", "interpolated", "extrapolated", "datasheet")
                      if share.get(name, 0.0) >= 0.005)
    return [
        f"Kernels priced from {k['priced_from']}: of the GEMM and attention time {parts}. Conservative figure "
        f"(the band's slow end and the kernels' {100 * k['margin']:.1f}% margin; the search ranks by it): "
        f"{cons['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, MFU {100 * cons['mfu']:.1f}%, step {cons['step_s']:.3f} s."
    ]


def unwrapped_sentences(plan: Plan) -> list[str]:
    """How the runtime runs a single-replica layout of framework fsdp (`cost_models.stacks.UNWRAPPED`):
    no FSDP mesh, whatever the ZeRO stage, and the weights it was priced with."""
    lay, tr = plan.best.layout if plan.best else None, plan.inputs.training
    if lay is None or lay.dp is None or stacks.weights_owner(lay.framework, lay.stack, lay.dp, lay.cp) != stacks.UNWRAPPED:
        return []
    how = f"float32 {'adapters' if tr.frozen_base else 'weights'}, gradients"
    how += " and AdamW moments" if tr.optimizer == "adamw" else ""
    if tr.precision != "fp32":  # `runtime.parallelize.compute_dtype`: bf16 for every 16-bit and FP8 precision
        how += " under bf16 autocast"
    if stacks.autocast_weights(tr, stacks.UNWRAPPED):
        how += " (its cached copy of every GEMM weight, cast again each micro-batch, and autograd's float32 gradient accumulation)"
    step = ", stepped by torch's foreach AdamW" if tr.optimizer == "adamw" else ""
    return [f"One replica (dp x cp = 1): the runtime builds no FSDP mesh, so ZeRO-{lay.zero_stage} shards nothing; "
            f"priced as it runs: {how}{step}."]


def explain(plan: Plan, usable_bytes: int) -> list[str]:
    out: list[str] = []
    s = plan.stats
    # what the config reader left out (a vision tower) or read as cost-free: said first, not buried
    out += [f"Model {plan.inputs.model.name}: {note}." for note in plan.inputs.model.notes]
    out += method_sentences(plan)
    if plan.inputs.training.precision == "fp8":
        out.append(
            "Precision fp8: FP8 GEMMs are priced at one rate fitted on published FP8 runs "
            "(cost_models/data/calibration.json), whatever their scaling recipe; each export names the recipe it "
            "runs (Megatron-Core's delayed or blockwise scaling, torchao's row-wise in torchtitan, tensor-wise in "
            "Accelerate)."
        )
    floored = (
        f"{s.floored:,} not priced because their activations alone exceed the GPU memory (combined 1F1B, which "
        "runs no full recompute), " if s.floored else ""
    )
    bounded = (
        f" ({s.dominated:,} of them bounded, not timed: slower than the best and dominated by a faster, "
        "smaller layout)" if s.dominated else ""
    )
    out.append(
        f"Searched {s.generated:,} layouts: {s.invalid:,} invalid, {s.pruned - s.floored:,} pruned by the step-time "
        f"bound, {floored}{s.priced:,} priced, {s.feasible:,} fit in {usable_bytes / GIB:.1f} GiB per GPU{bounded}."
    )
    if plan.best is None:
        if plan.closest_miss is not None:
            cm = plan.closest_miss
            out.append(
                f"No layout fits. The closest miss needs {cm.peak_bytes / GIB:.2f} GiB on pipeline stage "
                f"{cm.worst_stage}, {cm.over_by_bytes:,} bytes ({cm.over_by_bytes / GIB:.2f} GiB) over the "
                f"{cm.usable_bytes / GIB:.2f} GiB usable."
            )
        elif s.generated == 0:
            pins = ", ".join(
                f"{k}={v}" for k, v in plan.inputs.constraints.model_dump(include={"tp", "pp", "cp", "ep", "dp"}).items()
                if v is not None
            )
            out.append(
                f"Nothing was searched: no layout of {plan.inputs.gpus:,} {_plural(plan.inputs.gpus, 'GPU')} has the "
                f"pinned degrees ({pins or 'none pinned'}), so there is no rejection to show."
            )
        else:
            out.append("No layout is valid for this model on this many GPUs (see the rejections).")
        # the reason most layouts failed: "dominated" entries are layouts skipped for a better twin, not failures
        failures = [r for r in plan.rejections if not r.reason.startswith("dominated")]
        if failures:
            top = failures[0]
            out.append(f"Most common rejection ({top.count:,}x): {top.reason}; e.g. {top.example}.")
        out += host_sentences(plan)
        return out
    est = plan.best.estimate
    lay = plan.best.layout
    br = est["time"]["breakdown"]
    step = est["step_s"]
    shares = sorted(((v / step, k.removesuffix("_s")) for k, v in br.items() if v > 0), reverse=True)
    top3 = ", ".join(f"{name} {100 * share:.0f}%" for share, name in shares[:3])
    out.append(
        f"Best: {est['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, MFU {100 * est['mfu']:.1f}%, step {step:.3f} s "
        f"({top3}); peak memory {est['memory']['peak_bytes'] / GIB:.1f} GiB of {usable_bytes / GIB:.1f} GiB usable "
        f"({(usable_bytes - est['memory']['peak_bytes']) / GIB:.1f} GiB free)."
    )
    out += unwrapped_sentences(plan)
    host = est.get("host_memory") or {}
    if host.get("bytes_per_node"):
        out.append(host_memory_sentence(host))
    nvme = est.get("nvme") or {}
    if nvme.get("bytes_per_node"):
        out.append(
            f"NVMe: {nvme['bytes_per_node'] / GIB:.1f} GiB per node of {nvme['capacity_bytes_per_node'] / GIB:.1f} GiB "
            "(ZeRO-Infinity: the offloaded states on the node's drives, pinned staging buffers in host memory)."
        )
    band = est.get("error_band")
    if band:
        out.append(
            f"Error band: 80% of the published runs in regime {band['regime']} ({band['holdout_rows']} runs), each "
            f"predicted by a calibration fitted without its source family, measured {band['measured_over_predicted_q10']:.2f}-"
            f"{band['measured_over_predicted_q90']:.2f}x their prediction: MFU {100 * band['mfu_low']:.1f}-"
            f"{100 * band['mfu_high']:.1f}%, {band['tokens_per_s_per_gpu_low']:,.0f}-"
            f"{band['tokens_per_s_per_gpu_high']:,.0f} tokens/s/GPU."
            + (f" Widened: {'; '.join(band['widened'])}." if band.get("widened") else "")
            + outside_band(band)
        )
    out += kernel_sentences(est)
    if above_published_ceiling(est):
        ceiling = est["published_mfu_ceiling"]
        out.append(
            f"Above every published run: the predicted MFU {100 * est['mfu']:.1f}% exceeds the highest any of the "
            f"{ceiling['runs']} published runs in regime {ceiling['regime']} measured ({100 * ceiling['mfu']:.1f}%, "
            f"{ceiling['run']}). No run has shown this layout's gain; read the prediction as what it would reach if "
            "every overlap it counts on happens."
        )
    if plan.best.placement is not None:
        for g in plan.best.placement.groups:
            if g.dim == "tp" and g.size > 1:
                out.append(
                    f"TP={g.size} runs over {g.tier} links ({g.bus_bandwidth_bytes_per_s / 1e9:.0f} GB/s bus bandwidth)."
                )
    if lay.pp > 1:
        out.append(
            f"PP={lay.pp} with {lay.schedule} (vpp={lay.vpp}) over {lay.grad_accum} micro-batches: "
            f"bubble {100 * est['bubble_fraction']:.1f}% of the step."
        )
    if plan.alternatives:
        alt = plan.alternatives[0]
        gap = alt.estimate["step_s"] / step - 1
        if gap >= 0:
            out.append(f"Runner-up is {100 * gap:.1f}% slower.")
        # a faster runner-up means the tie-break chose this one: its sentence (planner.search) follows
    return out
