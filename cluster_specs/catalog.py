"""GPU catalog: `data/gpus.yaml` (vendor units, one cited source per entry) loaded into `GPUSpec`.

Conversions happen here, once (see `units.py`): peaks to FLOP/s (dense), memory to bytes, bandwidths
to bytes/s in one direction. `GPUSpec.memory_bytes` is the driver-reported total device memory
(`memory_reported`; nvidia-smi `memory.total`), not the datasheet label: that is the figure a
memory-fit check can compare with, and the label's GB/GiB meaning differs between vendors and parts.

Names resolve case-insensitively, with spaces and underscores read as dashes, through each entry's
key and `aliases` (catalog keys are the `gpu_family` names of data/calibration/published_runs.csv).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any, get_args

import yaml

from cluster_specs import units
from cluster_specs.spec import GPUSpec, Precision

_KEYS = {
    "vendor", "aliases", "peak_dense", "memory", "memory_reported", "memory_reported_source",
    "memory_bandwidth", "gpu_link", "tdp", "sm_count", "sustained_clock_fraction", "warpgroup_mma", "mamf", "source",
    "notes",
}  # fmt: skip
_REQUIRED = {"peak_dense", "memory", "memory_bandwidth", "gpu_link", "source"}


def normalize_name(name: str) -> str:
    """Lookup key for a GPU or cluster name: lower case, spaces and underscores as dashes."""
    return "-".join(str(name).strip().lower().replace("_", " ").split())


MATMUL_REFERENCE = {"bf16": "A100-80GB", "fp16": "A100-80GB", "fp8": "H100-80GB"}
"""Per precision, the GPU whose measured matmul share (`mamf` / peak) the others are expressed against:
the calibration's GEMM and attention efficiencies are fitted on its rows (16-bit: the A100 rows of the
Megatron papers and llm-foundry are the bulk of the fit; FP8: every fitted FP8 row is H100)."""


def mamf_fraction(entry: dict[str, Any], precision: str) -> float | None:
    """Measured maximum achievable matmul FLOP/s over the dense peak of one catalog entry (16-bit
    precisions share the bf16 measurement), None where nothing is measured."""
    mamf = entry.get("mamf") or {}
    measured = mamf.get(precision, mamf.get("bf16") if precision == "fp16" else None)
    if measured is None or precision not in entry["peak_dense"]:
        return None
    return units.flops_per_s(measured) / units.flops_per_s(entry["peak_dense"][precision])


def gpu_from_entry(key: str, entry: dict[str, Any], reference: dict[str, float] | None = None) -> GPUSpec:
    """Build a `GPUSpec` from one catalog entry written in vendor units. `reference`: per precision,
    the matmul share (`mamf_fraction`) of the `MATMUL_REFERENCE` GPU; the entry's own measured share is
    stored relative to it (`GPUSpec.matmul_share`)."""
    unknown = set(entry) - _KEYS
    missing = _REQUIRED - set(entry)
    if unknown or missing:
        raise ValueError(f"GPU {key}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    precisions = set(get_args(Precision))
    bad = set(entry["peak_dense"]) - precisions
    if bad:
        raise ValueError(f"GPU {key}: unknown precisions {sorted(bad)}; known {sorted(precisions)}")
    for precision in entry["peak_dense"]:
        fraction = mamf_fraction(entry, precision)
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(f"GPU {key}: mamf for {precision} is {fraction:.3g} x its dense peak; a measured "
                             "matmul rate lies in (0, 1] of the peak")
    return GPUSpec(
        name=key,
        vendor=entry.get("vendor", "nvidia"),
        peak_flops_per_s={p: units.flops_per_s(v) for p, v in entry["peak_dense"].items()},
        memory_bytes=units.n_bytes(entry.get("memory_reported", entry["memory"])),
        memory_bandwidth_bytes_per_s=units.bytes_per_s(entry["memory_bandwidth"]),
        link_bandwidth_bytes_per_s=units.bytes_per_s(entry["gpu_link"], require_direction=True),
        tdp_w=units.watts(entry["tdp"]) if "tdp" in entry else None,
        sm_count=int(entry["sm_count"]) if "sm_count" in entry else None,
        sustained_clock_fraction=float(entry.get("sustained_clock_fraction", 1.0)),
        warpgroup_mma=bool(entry.get("warpgroup_mma", False)),
        matmul_share={
            p: fraction / reference[p]
            for p in entry["peak_dense"]
            if reference and p in reference and (fraction := mamf_fraction(entry, p)) is not None
        },
        source=entry["source"],
    )


@functools.cache
def _raw() -> dict[str, Any]:
    return yaml.safe_load(resources.files("cluster_specs").joinpath("data/gpus.yaml").read_text())


@functools.cache
def matmul_reference() -> dict[str, float]:
    """Per precision, the matmul share (`mamf_fraction`) of its `MATMUL_REFERENCE` GPU: what a
    catalog or user entry's own measurement is divided by (`gpu_from_entry`)."""
    reference = {}
    for precision, ref in MATMUL_REFERENCE.items():
        fraction = mamf_fraction(_raw()["gpus"][ref], precision)
        if fraction is None:
            raise ValueError(f"GPU {ref}, the {precision} matmul reference, has no mamf measurement")
        reference[precision] = fraction
    return reference


@functools.cache
def _catalog() -> tuple[dict[str, GPUSpec], dict[str, str]]:
    raw = _raw()
    specs: dict[str, GPUSpec] = {}
    index: dict[str, str] = {}
    reference = matmul_reference()
    for key, entry in raw["gpus"].items():
        specs[key] = gpu_from_entry(key, entry, reference)
        for alias in [key, *entry.get("aliases", [])]:
            norm = normalize_name(alias)
            if index.get(norm, key) != key:
                raise ValueError(f"GPU alias {alias!r} names both {index[norm]} and {key}")
            index[norm] = key
    return specs, index


def list_gpus() -> list[str]:
    """Canonical catalog names."""
    return list(_catalog()[0])


def get_gpu(name: str) -> GPUSpec:
    """The catalog GPU called `name` (canonical name or alias, any case)."""
    specs, index = _catalog()
    key = index.get(normalize_name(name))
    if key is None:
        raise KeyError(f"unknown GPU {name!r}; known: {', '.join(specs)} (and their aliases)")
    return specs[key]


@functools.lru_cache(maxsize=256)
def gpu_generation(gpu_name: str) -> str:
    """The GPU's architecture generation from its catalog name: blackwell, hopper, ampere, volta,
    cdna3, or other (the error bands' hardware axis; the CUDA-queue rules of `cost_models.step_time`)."""
    name = gpu_name.upper()
    for prefix, generation in (
        ("GB", "blackwell"), ("B200", "blackwell"), ("B300", "blackwell"),
        ("H100", "hopper"), ("H800", "hopper"), ("H200", "hopper"),
        ("A100", "ampere"), ("V100", "volta"), ("MI300", "cdna3"),
    ):
        if name.startswith(prefix):
            return generation
    return "other"
