"""The batch contract: one evaluation job in, one JSON result out.

A job is
    {"model": <preset name | {"hf_config": {...config.json...}} | {ModelSpec fields}>,
     "cluster": <preset name | {ClusterSpec fields, "gpu" may be a catalog name}>,
     "gpus": int,
     "training": {"seq_len", "global_batch" | "global_batch_tokens", "precision", ...},
     "layout": {"tp", "pp", "dp", "cp", "ep", "vpp", "zero_stage", "micro_batch", "recompute",
                "sp", "schedule", ...},
     "partition": [layers per chunk, ...] | "auto"   (optional; default: even split)}
Any of micro_batch, recompute, zero_stage, vpp, schedule, offload_optimizer may be "auto": the
fastest fitting value is chosen with the rest pinned (`cost_models.auto_knobs`), and the result's
"auto" says what was chosen and why. `"partition": "auto"` cuts the pipeline with the planner's
CP-SAT partitioner (`planner.partition`, handed in by the caller as a `Partitioner`: this layer
does not import the planner) after the knobs are chosen, and keeps that cut when it fits and is
faster than the layout's default cut (or the default does not exist or fit).
Missing layout fields take the defaults of `cost_models.layout.Layout` (all degrees 1 except dp,
which takes the remaining GPUs; ZeRO-1; micro-batch 1; no recompute; SP on when tp > 1; 1F1B, or
interleaved 1F1B when vpp > 1; Megatron-Core execution).

An invalid job yields {"ok": false, "error": "<field path>: <reason>"}; it never raises.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cluster_specs.presets import cluster_from_dict, get_cluster
from cluster_specs.spec import ClusterSpec
from cost_models.auto_knobs import choose, split_auto
from cost_models.calibration import Calibration, default_calibration
from cost_models.estimate import Estimate, estimate
from cost_models.layout import Layout, LayoutError
from cost_models.report import estimate_dict, kernels_dict
from cost_models.stages import StagePartition
from model_specs.hf import from_hf_config
from model_specs.presets import get_model
from model_specs.spec import ModelSpec, TrainingSpec


def resolve_model(ref: str | dict[str, Any] | ModelSpec) -> ModelSpec:
    """A preset name, {"hf_config": {...}} or a dict of ModelSpec fields."""
    if isinstance(ref, ModelSpec):
        return ref
    if isinstance(ref, str):
        return get_model(ref)
    if "hf_config" in ref:
        return from_hf_config(ref["hf_config"], name=ref.get("name"))
    return ModelSpec(**ref)


def resolve_cluster(ref: str | dict[str, Any] | ClusterSpec) -> ClusterSpec:
    if isinstance(ref, ClusterSpec):
        return ref
    if isinstance(ref, str):
        return get_cluster(ref)
    return cluster_from_dict(ref)


class JobError(ValueError):
    """A job field that names something we cannot resolve (unknown preset, unreadable config)."""


class Job(BaseModel):
    """One evaluation request (the `--jobs` line and the API's /v1/evaluate body)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str | dict[str, Any]
    cluster: str | dict[str, Any]
    gpus: int = Field(gt=0)
    training: TrainingSpec
    layout: Layout = Layout()
    partition: list[int] | Literal["auto"] | None = None
    auto: list[str] = Field(
        default_factory=list, description="layout knobs given as \"auto\" (cost_models.auto_knobs): chosen, not pinned"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        """`true` is not a GPU count: JSON booleans in numeric fields are refused (pydantic's lax
        mode would read them as 1 / 0)."""
        if isinstance(data, dict):
            for section, model in (("", None), ("training", TrainingSpec), ("layout", Layout)):
                values = data if not section else data.get(section)
                if not isinstance(values, dict):
                    continue
                names = ("gpus",) if model is None else tuple(
                    n for n, f in model.model_fields.items() if "int" in str(f.annotation) or "float" in str(f.annotation)
                )
                for name in names:
                    if isinstance(values.get(name), bool):
                        where = f"{section}.{name}" if section else name
                        raise ValueError(f"{where}: {str(values[name]).lower()} is not a number")
        return data

    @model_validator(mode="before")
    @classmethod
    def _take_auto(cls, data: Any) -> Any:
        """Layout entries equal to "auto" become `auto` knobs (`cost_models.auto_knobs`)."""
        if isinstance(data, dict) and isinstance(data.get("layout"), dict):
            layout, auto = split_auto(data["layout"])
            if auto:
                data = {**data, "layout": layout, "auto": sorted(set(data.get("auto") or []) | set(auto))}
        return data


class Partitioner(Protocol):
    """The planner's CP-SAT cut of `layout` under `capacity_bytes` per GPU, or None when no cut fits
    (`planner.partition.optimize_partition`)."""

    def __call__(
        self, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: int, layout: Layout,
        calibration: Calibration | None = None, *, capacity_bytes: float | None = None,
    ) -> StagePartition | None: ...


def price_job(
    job: Job,
    model: ModelSpec,
    cluster: ClusterSpec,
    calibration: Calibration | None = None,
    partitioner: Partitioner | None = None,
) -> dict[str, Any]:
    """Price a validated job: its layout, or with `auto` knobs the fastest fitting choice for them
    (the result's `auto` says what was chosen and why); `"partition": "auto"` needs `partitioner`."""
    if job.partition == "auto" and partitioner is None:
        raise JobError('partition: "auto" needs the planner\'s CP-SAT partitioner (autopar evaluate, the API)')
    report: dict[str, Any] = {}
    if job.auto:
        if isinstance(job.partition, list):
            raise JobError("partition: an explicit partition cannot be combined with auto knobs")
        choice = choose(
            model, job.training, cluster, job.gpus, job.layout.model_dump(exclude_unset=True), job.auto, calibration,
            near_even_cut=job.partition == "auto",
        )
        layout, est = choice.layout, choice.estimate
        report = choice.report
    else:
        layout = job.layout
        partition = StagePartition.explicit(job.partition, layout.resolved(job.gpus, job.training)) if isinstance(job.partition, list) else None
        est = None if job.partition == "auto" else estimate(model, job.training, cluster, job.gpus, layout, partition, calibration=calibration)
    if job.partition == "auto":
        assert partitioner is not None
        est, report["partition"] = _auto_partition(job, model, cluster, layout, est, calibration, partitioner)
    assert est is not None
    kernels = kernels_dict(model, job.training, cluster, est.layout, calibration or default_calibration())
    out = estimate_dict(model, cluster.name, est, cluster.gpu.name, job.training, kernels)
    if report:
        out["auto"] = report
    return out


def _auto_partition(
    job: Job,
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    default: Estimate | None,
    calibration: Calibration | None,
    partitioner: Partitioner,
) -> tuple[Estimate, dict[str, Any]]:
    """The better of the layout's default cut (`default`, priced here when None and valid) and the
    partitioner's: the faster of those that fit, else the one with the smaller peak."""
    tr, gpus = job.training, job.gpus
    default_error = ""
    if default is None:
        try:
            default = estimate(model, tr, cluster, gpus, layout, calibration=calibration)
        except LayoutError as exc:  # e.g. the layers do not divide pp x vpp: the cut is the partitioner's alone
            default_error = str(exc)
    if layout.pp == 1 and default is not None:
        return default, {"chosen": list(default.partition.chunk_layers), "from": "default", "why": "pp = 1: one stage, nothing to cut"}
    cut = partitioner(model, tr, cluster, gpus, layout, calibration, capacity_bytes=cluster.gpu.memory_bytes)
    optimized = estimate(model, tr, cluster, gpus, layout, cut, calibration=calibration) if cut is not None else None
    if default is None and optimized is None:
        raise JobError(f"partition: no cut of the layers fits ({default_error})")
    pick_optimized = optimized is not None and (
        default is None
        or (optimized.fits and (not default.fits or optimized.step_s < default.step_s))
        or (not default.fits and not optimized.fits and optimized.peak_bytes < default.peak_bytes)
    )
    chosen = optimized if pick_optimized else default
    assert chosen is not None
    report: dict[str, Any] = {"chosen": list(chosen.partition.chunk_layers), "from": "cp-sat" if pick_optimized else "default"}
    if default is None:
        report["why"] = f"the default cut is not valid ({default_error})"
        return chosen, report
    report["default"] = list(default.partition.chunk_layers)
    if optimized is None:
        report["why"] = "the partitioner found no cut that fits; the default cut is kept"
    else:
        report["default_step_s"], report["default_peak_bytes"] = default.step_s, default.peak_bytes
        report["why"] = (
            f"CP-SAT cut: {optimized.step_s:.3f} s, {optimized.peak_bytes / 2**30:.1f} GiB peak; default cut: "
            f"{default.step_s:.3f} s, {default.peak_bytes / 2**30:.1f} GiB peak; the faster that fits is kept"
        )
    return chosen, report


def format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "job"
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if err["loc"] else msg)
    return "; ".join(parts)




def _resolve(field: str, fn: Any, ref: Any) -> Any:
    try:
        return fn(ref)
    except ValidationError as exc:
        raise JobError(f"{field}.{format_validation_error(exc)}") from exc
    except (ValueError, KeyError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise JobError(f"{field}: {msg}") from exc


def run_job(raw: dict[str, Any], partitioner: Partitioner | None = None) -> dict[str, Any]:
    """Evaluate one job dict. Never raises for bad input: returns {"ok": false, "error": ...}."""
    try:
        job = Job.model_validate(raw)
        model = _resolve("model", resolve_model, job.model)
        cluster = _resolve("cluster", resolve_cluster, job.cluster)
        return price_job(job, model, cluster, partitioner=partitioner)
    except ValidationError as exc:
        return {"ok": False, "error": format_validation_error(exc)}
    except LayoutError as exc:
        return {"ok": False, "error": "; ".join(f"{'.'.join(v.path)}: {v.message}" for v in exc.violations)}
    except (ValueError, KeyError, TypeError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        return {"ok": False, "error": str(msg)}
