"""`RunSpec`: everything one run of the runtime needs, and `load_run_spec` to read it.

A RunSpec is a resolved layout for a model, a training setup and a GPU count, plus run settings
(seed, steps, backend, learning rate). It is read either from its own JSON or from a Plan JSON
(`planner.plan.Plan`): the plan's `inputs.model`, `inputs.training`, `inputs.gpus`,
`best.layout` and `best.partition` (a list of layers per chunk, or `{"chunk_layers": [...]}`).

This module does not import torch, so plans can be checked on machines without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cost_models.layout import Layout, LayoutError, validate_layout
from cost_models.stages import StagePartition
from model_specs.spec import ModelSpec, TrainingSpec

__all__ = ["RunSpec", "load_run_spec", "run_spec_from_plan"]

Backend = Literal["auto", "gloo", "nccl"]
DType = Literal["auto", "fp32", "bf16"]


class RunSpec(BaseModel):
    """One job of the runtime. `layout` is resolved against `gpus` and `training` on validation;
    `partition` (layers per pipeline chunk, pp x vpp entries) defaults to an even split."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelSpec
    training: TrainingSpec
    layout: Layout
    gpus: int = Field(ge=1, description="world size the layout is resolved for")
    partition: tuple[int, ...] | None = Field(None, description="layers per chunk; default even")
    seed: int = 0
    steps: int = Field(10, ge=0)
    backend: Backend = Field("auto", description="auto: nccl when CUDA is available, else gloo")
    dtype: DType = Field(
        "auto",
        description="parameter/compute dtype: auto = training.precision on GPU (fp8 runs bf16), fp32 on CPU",
    )
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(1, ge=0, description="steps excluded from timing")
    data_path: str | None = Field(
        None,
        description="tokenized training data: a flat binary file of token ids (nanoGPT-style .bin); "
        "default: synthetic sequences",
    )
    data_dtype: Literal["uint16", "uint32", "int32", "int64"] = Field(
        "uint16", description="element type of the token file"
    )
    hf_checkpoint: str | None = Field(
        None,
        description="a HuggingFace checkpoint directory (config.json, model.safetensors or its sharded index) "
        "the weights start from; each rank reads only the slices it holds (runtime.checkpoint). Default: "
        "seeded random weights",
    )
    plan_id: str | None = None
    peak_flops_per_s: float | None = Field(None, gt=0, description="per-GPU peak for MFU")

    @model_validator(mode="before")
    @classmethod
    def _model_by_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            from model_specs.presets import get_model

            data = {**data, "model": get_model(data["model"])}
        return data

    @model_validator(mode="after")
    def _resolve(self) -> RunSpec:
        problems = validate_layout(self.model, self.training, self.gpus, self.layout)
        if problems:
            raise LayoutError(problems)
        lay = self.layout.resolved(self.gpus, self.training)
        if self.model.is_hybrid and (lay.tp > 1 or lay.ep > 1):
            raise ValueError(
                f"the reference runtime runs hybrid Mamba models with data and pipeline parallelism only "
                f"(tp={lay.tp}, ep={lay.ep}: its tensor / expert plans cover TransformerBlock layers)"
            )
        object.__setattr__(self, "layout", lay)
        if self.partition is None:
            part = StagePartition.for_layout(self.model.num_layers, lay).chunk_layers
            object.__setattr__(self, "partition", part)
        else:
            StagePartition.explicit(self.partition, lay)  # validates the chunk count
            if sum(self.partition) != self.model.num_layers:
                raise ValueError(
                    f"partition {list(self.partition)} holds {sum(self.partition)} layers; "
                    f"the model has {self.model.num_layers}"
                )
        return self

    @property
    def stage_partition(self) -> StagePartition:
        assert self.partition is not None
        return StagePartition.explicit(self.partition, self.layout)

    @property
    def world_size(self) -> int:
        return self.layout.world_size


def run_spec_from_plan(plan: dict[str, Any], **overrides: Any) -> RunSpec:
    """RunSpec of a Plan JSON's best candidate. `overrides` set RunSpec fields (seed, steps, ...)."""
    inputs = plan["inputs"]
    best = plan.get("best")
    if not best:
        raise ValueError("the plan has no feasible layout (best is null)")
    part = best.get("partition")
    if isinstance(part, dict):
        part = part.get("chunk_layers")
    fields: dict[str, Any] = {
        "model": inputs["model"],
        "training": inputs["training"],
        "gpus": inputs["gpus"],
        "layout": best["layout"],
        "partition": part,
        "plan_id": plan.get("id") or plan.get("plan_id"),
    }
    peak = _plan_peak(inputs)
    if peak is not None:
        fields["peak_flops_per_s"] = peak
    fields.update(overrides)
    return RunSpec.model_validate(fields)


def _plan_peak(inputs: dict[str, Any]) -> float | None:
    """Per-GPU dense peak of the plan's cluster at the training precision, when given."""
    gpu = (inputs.get("cluster") or {}).get("gpu")
    if not isinstance(gpu, dict):
        return None
    peaks = gpu.get("peak_flops_per_s") or {}
    prec = (inputs.get("training") or {}).get("precision", "bf16")
    for p in (prec, "bf16", "fp16"):
        if p in peaks:
            return float(peaks[p])
    return None


def load_run_spec(source: str | Path | dict[str, Any], **overrides: Any) -> RunSpec:
    """A RunSpec from a path to (or the dict of) a RunSpec JSON or a Plan JSON.

    `overrides` replace fields of the loaded spec (e.g. steps=5, seed=1); None values are ignored.
    """
    data = source if isinstance(source, dict) else json.loads(Path(source).read_text())
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if "inputs" in data and "best" in data:
        return run_spec_from_plan(data, **overrides)
    return RunSpec.model_validate({**data, **overrides})


def traced_layout(run: RunSpec, framework: str = "fsdp") -> Any:
    """The layout as the traced runtime executes it: `framework` (default fsdp: this runtime is eager
    PyTorch with FSDP2, not Megatron's fused kernels), its cross-entropy (eager, or DTensor's
    `loss_parallel` under TP), and the RMSNorm of PyTorch's CPU dispatch, which the trace runs: it
    upcasts and saves float32 tensors (`norm_kernel="eager_fp32"`; on CUDA the same module is a
    fused kernel that saves its bf16 input, measured on an H100); context parallel as
    `runtime.context_parallel` runs it (`cp_attention="allgather_mask"`)."""
    return run.layout.model_copy(
        update={
            "framework": framework,
            "cross_entropy": "loss_parallel" if run.layout.tp > 1 else "eager",
            "norm_kernel": "eager_fp32",
            # runtime.context_parallel: all-gathered K/V and a dense mask, on CPU and GPU alike
            "cp_attention": "allgather_mask",
        }
    )
