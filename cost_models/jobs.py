"""The batch contract: one evaluation job in, one JSON result out.

A job is
    {"model": <preset name | {"hf_config": {...config.json...}} | {ModelSpec fields}>,
     "cluster": <preset name | {ClusterSpec fields, "gpu" may be a catalog name}>,
     "gpus": int,
     "training": {"seq_len", "global_batch" | "global_batch_tokens", "precision", ...},
     "layout": {"tp", "pp", "dp", "cp", "ep", "vpp", "zero_stage", "micro_batch", "recompute",
                "sp", "schedule", ...},
     "partition": [layers per chunk, ...]            (optional; default: even split)}
Any of micro_batch, recompute, zero_stage, vpp, schedule, offload_optimizer may be "auto": the
fastest fitting value is chosen with the rest pinned (`cost_models.auto_knobs`), and the result's
"auto" says what was chosen and why.
Missing layout fields take the defaults of `cost_models.layout.Layout` (all degrees 1 except dp,
which takes the remaining GPUs; ZeRO-1; micro-batch 1; no recompute; SP on when tp > 1; 1F1B, or
interleaved 1F1B when vpp > 1; Megatron-Core execution).

An invalid job yields {"ok": false, "error": "<field path>: <reason>"}; it never raises.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cluster_specs.presets import cluster_from_dict, get_cluster
from cluster_specs.spec import ClusterSpec
from cost_models.auto_knobs import choose, split_auto
from cost_models.calibration import Calibration
from cost_models.estimate import estimate
from cost_models.layout import Layout, LayoutError
from cost_models.report import estimate_dict
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
    partition: list[int] | None = None
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


def price_job(job: Job, model: ModelSpec, cluster: ClusterSpec, calibration: Calibration | None = None) -> dict[str, Any]:
    """Price a validated job: its layout, or with `auto` knobs the fastest fitting choice for them
    (the result's `auto` says what was chosen and why)."""
    partition = None
    if job.auto:
        if job.partition:
            raise JobError("partition: an explicit partition cannot be combined with auto knobs")
        choice = choose(model, job.training, cluster, job.gpus, job.layout.model_dump(exclude_unset=True), job.auto, calibration)
        out = estimate_dict(model, cluster.name, choice.estimate, cluster.gpu.name, job.training)
        out["auto"] = choice.report
        return out
    lay = job.layout.resolved(job.gpus, job.training)
    if job.partition:
        partition = StagePartition.explicit(job.partition, lay)
    est = estimate(model, job.training, cluster, job.gpus, job.layout, partition, calibration=calibration)
    return estimate_dict(model, cluster.name, est, cluster.gpu.name, job.training)


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


def run_job(raw: dict[str, Any]) -> dict[str, Any]:
    """Evaluate one job dict. Never raises for bad input: returns {"ok": false, "error": ...}."""
    try:
        job = Job.model_validate(raw)
        model = _resolve("model", resolve_model, job.model)
        cluster = _resolve("cluster", resolve_cluster, job.cluster)
        return price_job(job, model, cluster)
    except ValidationError as exc:
        return {"ok": False, "error": format_validation_error(exc)}
    except LayoutError as exc:
        return {"ok": False, "error": "; ".join(f"{'.'.join(v.path)}: {v.message}" for v in exc.violations)}
    except (ValueError, KeyError, TypeError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        return {"ok": False, "error": str(msg)}
