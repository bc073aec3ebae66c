"""The JSON contract of an evaluation: `Estimate` -> plain dict (the CLI's `--json`, the `--jobs`
lines and the API all print this). Every number names its unit in its key."""

from __future__ import annotations

from typing import Any

from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration
from cost_models.error_band import error_band, published_ceiling
from cost_models.estimate import Estimate
from cost_models.interning import KeptMemo
from cost_models.layout import Layout
from model_specs.params import adapted_names, count_params, trainable_counts
from model_specs.spec import ModelSpec, TrainingSpec

FLOP_CONVENTION = (
    "model_flops: forward+backward = 3x forward, attention over all s x s (query, key) pairs "
    "(causal mask not halved; the Megatron/NeMo/llm-foundry MFU convention); model_flops_causal "
    "halves attention for the causal mask; hardware_flops = causal attention with flash backward "
    "(2.5x forward) plus recompute; with a frozen base (lora, qlora) the weight GEMMs count 2x forward "
    "(no weight gradients) and the adapters 6 FLOPs per element and token"
)


def training_dict(model: ModelSpec, training: TrainingSpec) -> dict[str, Any]:
    """The training method and what it trains (elements): trainable, frozen and adapter parameters."""
    counts = trainable_counts(model, training.method, training.lora_modules, training.lora_rank_)
    out: dict[str, Any] = {
        "method": training.method,
        "trainable_params": counts.trainable,
        "frozen_params": counts.frozen,
        "adapter_params": counts.adapters,
    }
    if training.frozen_base:
        out["lora"] = {"rank": training.lora_rank_, "alpha": training.lora_alpha_, "modules": list(adapted_names(model, training.lora_modules))}
        out["note"] = (
            "LoRA / QLoRA times come from the same kernel models as full training, with the stack's own "
            "overheads (fitted on published fine-tuning runs, bench.finetune_runs); the error band is full training's"
        )
    if training.quant_format_:
        out["quant_format"] = training.quant_format_
        out["quantized_weight_bytes_per_element"] = training.quantized_weight_bytes
    return out


def kernels_dict(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, layout: Layout, cal: Calibration
) -> dict[str, Any]:
    """Where a layout's kernel rates come from (`cost_models.kernels`): the atlas that priced them,
    the share of its GEMM and attention time priced from measured points, interpolated between
    them, extrapolated beyond them and from a datasheet (`compute.kernel_provenance`, one
    micro-batch through every layer), and the slow-end margin that share carries
    (`compute.kernel_margin`), which the planner ranks by. Memoized on the inputs' identity
    (`KeptMemo`; `cost_models.interning` shares equal inputs across requests) and the layout."""
    key = (id(model), id(training), id(cluster), id(cal), layout)
    out = _KERNELS.get(key)
    if out is None:
        out = _KERNELS.put(key, (model, training, cluster, cal), _kernels_dict(model, training, cluster, layout, cal))
    return {**out, "time_share": dict(out["time_share"])}


_KERNELS: KeptMemo[dict[str, Any]] = KeptMemo(4096)


def _kernels_dict(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, layout: Layout, cal: Calibration
) -> dict[str, Any]:
    import numpy as np

    from cost_models.compute import ShardGeometry, kernel_margin, kernel_provenance
    from cost_models.kernels.atlas import atlas_for
    from cost_models.kernels.gemm import PROVENANCE
    from cost_models.stage_table import layer_kind_counts, layer_kinds

    g = ShardGeometry.of(layout, layout.micro_batch, training.seq_len)
    kinds = layer_kinds(model)
    counts = layer_kind_counts(model)
    split = np.sum([
        n * kernel_provenance(model, kinds.index(k), g, cluster.gpu, training.precision, training.activation_bytes, cal)
        for k, n in counts.items()
    ], axis=0)
    total = float(np.sum(split)) or 1.0
    atlas = atlas_for(cluster.gpu)
    if atlas.source == cluster.gpu.name:
        origin = f"the kernel atlas of {cluster.gpu.name} (its own measurements)"
    elif atlas.source:
        origin = f"the kernel atlas of {atlas.source}, the die sibling of {cluster.gpu.name} (no measurements of its own)"
    else:
        origin = f"the datasheet of {cluster.gpu.name} (no kernel measurements)"
    return {
        "priced_from": origin,
        "atlas_gpu": atlas.source or None,
        "time_share": {name: float(split[i]) / total for i, name in enumerate(PROVENANCE)},
        "margin": kernel_margin(split),
    }


def estimate_dict(
    model: ModelSpec, cluster_name: str, est: Estimate, gpu_name: str | None = None, training: TrainingSpec | None = None,
    kernels: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON form of an estimate. With `gpu_name`, it carries the error band of its regime
    (`cost_models.error_band`: measured / predicted quantiles of the leave-one-family-out rows, widened
    where nothing measured the regime) and the highest MFU a published run of its regime measured
    (`published_mfu_ceiling`); with `training`, the method and its trainable / frozen parameter counts;
    with `kernels` (`kernels_dict`), where its kernel rates come from and the *conservative* figures:
    the band's slow end with the kernels' own margin, what the planner ranks by."""
    pc = count_params(model)
    band = error_band(model, gpu_name, est.gpus) if gpu_name else None
    ceiling = published_ceiling(model, gpu_name) if gpu_name else None
    worst = est.peak_memory
    return {
        "ok": True,
        "fits": est.fits,
        "model": {"name": model.name, "params": pc.total, "active_params": pc.active},
        **({"training": training_dict(model, training)} if training is not None else {}),
        "cluster": cluster_name,
        "gpus": est.gpus,
        "layout": est.layout.model_dump(),
        "partition": {"chunk_layers": list(est.partition.chunk_layers), "pp": est.partition.pp, "vpp": est.partition.vpp},
        "memory": {
            "peak_bytes": est.peak_bytes,
            "capacity_bytes": est.capacity_bytes,
            "worst_stage": worst.stage,
            "breakdown": worst.as_dict(),
            "stages": [m.as_dict() for m in est.memory],
        },
        "host_memory": {
            "bytes_per_node": est.host_bytes_per_node,
            "offloaded_bytes_per_node": est.offloaded_bytes_per_node,
            "loading_bytes_per_node": est.loading_bytes_per_node,
            "capacity_bytes_per_node": est.host_capacity_bytes,
            "ranks_per_node": est.ranks_per_node,
            "fits": est.host_fits,
        },
        "nvme": {
            "bytes_per_node": est.nvme_bytes_per_node,
            "capacity_bytes_per_node": est.nvme_capacity_bytes,
            "fits": est.nvme_fits,
        },
        "time": {
            "breakdown": est.time.as_dict(),
            "stage_micro_batch_s": list(est.stage_times_s),
        },
        "flops": {
            "model_flops_per_step": est.flops.model_flops,
            "model_flops_causal_per_step": est.flops.model_flops_causal,
            "hardware_flops_per_step": est.flops.hardware_flops,
            "convention": FLOP_CONVENTION,
        },
        "step_s": est.step_s,
        "tokens_per_s": est.tokens_per_s,
        "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu,
        "model_flops_per_s_per_gpu": est.flops.model_flops / est.step_s / est.gpus,
        "mfu": est.mfu,
        "hfu": est.hfu,
        "bubble_fraction": est.bubble_fraction,
        "peak_flops_per_s": est.peak_flops_per_s,
        "error_band": band.as_dict(est.tokens_per_s_per_gpu, est.mfu, est.step_s) if band else None,
        "published_mfu_ceiling": ceiling.as_dict() if ceiling else None,
        **({"kernels": kernels, "conservative": conservative_dict(est, band, kernels["margin"])} if kernels else {}),
    }


def conservative_dict(est: Estimate, band: Any, margin: float) -> dict[str, float]:
    """The slow end of a prediction: the error band's 10th percentile of measured / predicted (1
    without a band) with the kernels' slow-end margin on top."""
    slow = (band.q10 if band is not None else 1.0) / (1.0 + margin)
    return {
        "step_s": est.step_s / slow,
        "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu * slow,
        "mfu": est.mfu * slow,
        "kernel_margin": margin,
        "band_q10": band.q10 if band is not None else 1.0,
    }
