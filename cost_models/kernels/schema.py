"""The kernel atlas file format: a validated loader for measured kernel rates of one GPU.

One JSON file per GPU (`cost_models/data/atlas/*.json`, or a user's profile file of the same
format, `load_atlas_file`). Every measured point names its `source`, a key of the file's `sources`
table, which says where the figure was read or how it was measured (`method`):

- ``isolated``: one call timed on an idle stream (CUDA events around it after a synchronize), so the
  time includes the call's fixed dispatch latency (the H200 measurements of 2026-11);
- ``queued``: the mean of back-to-back calls (the GPU never waits for the host: ML Engineering's
  maximum achievable matmul FLOP/s, nccl-tests, the FlashAttention papers' benchmarks).

Units: seconds, FLOP/s as TFLOP/s (1e12), bytes as bytes, bandwidths as GB/s (1e9 bytes/s), as the
sources print them. FLOP conventions: a GEMM (m x k) @ (k x n) is 2 m n k; attention forward is
4 b h s^2 d (half of it under a causal mask), its backward 2.5x and forward + backward 3.5x the
forward (the FlashAttention papers' and `data/measurements/h200-2026-11/kernel_rates.py`'s).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

FORMAT = "autopar-kernel-atlas/1"
"""The `format` tag every atlas file carries (a later format bumps the number)."""

Method = Literal["isolated", "queued", "in_step"]
Dtype = Literal["bf16", "fp16", "fp8"]
AttentionImpl = Literal["flash2", "fa3", "fa4", "cudnn"]
Pass = Literal["fwd", "bwd", "fwd_bwd"]
CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter"]
Span = Literal["nvlink", "nic"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    """Where a group of points comes from: a citation (paper and table / figure, repository and
    commit, URL) and how the figure was taken (`Method`; `in_step`: a kernel class's rate measured
    inside a training step, as a share of its wall time)."""

    citation: str = Field(min_length=8)
    method: Method
    software: str = ""  # library versions the points were measured with, where the source says
    selection: Literal["as_measured", "best_of_search"] = "as_measured"
    """`best_of_search`: each figure is the best of a search over shapes or settings (ML Engineering's
    maximum achievable matmul FLOP/s), the top of the GPU's spread rather than a typical shape's."""


class GemmPoint(_Strict):
    """One dense GEMM (m x k) @ (k x n) of `dtype` inputs: its time, or its FLOP rate."""

    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    dtype: Dtype = "bf16"
    seconds: float | None = Field(default=None, gt=0)
    tflops: float | None = Field(default=None, gt=0)
    source: str
    label: str = ""

    @model_validator(mode="after")
    def _one_figure(self) -> GemmPoint:
        if (self.seconds is None) == (self.tflops is None):
            raise ValueError("a GEMM point gives exactly one of seconds, tflops")
        return self

    @property
    def time_s(self) -> float:
        if self.seconds is not None:
            return self.seconds
        assert self.tflops is not None
        return 2.0 * self.m * self.n * self.k / (self.tflops * 1e12)


class AttentionPoint(_Strict):
    """An attention kernel's FLOP rate at one shape: `seq_len` queries against as many keys (batch x
    heads fill the GPU in every benchmark used), head dimension `head_dim` (q, k and v alike)."""

    kernel: AttentionImpl
    head_dim: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    causal: bool
    pass_: Pass = Field(alias="pass")
    tflops: float = Field(gt=0)
    source: str
    batch: int | None = None
    heads: int | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class MemoryPoint(_Strict):
    """Achieved bandwidth of a streaming memory-bound kernel (bytes read + written per second)."""

    op: Literal["read", "copy", "elementwise"]
    gb_per_s: float = Field(gt=0)
    source: str


class CollectivePoint(_Strict):
    """An NCCL collective's bus bandwidth (nccl-tests convention, doc/PERFORMANCE.md) at one buffer
    size (`bytes`: the whole reduced / gathered buffer, as nccl-tests' size column) over `ranks`
    GPUs, inside one NVLink domain (`span` nvlink) or across `nodes` nodes (`span` nic, with the
    NICs each node drives: `nic_gb_per_s` per NIC, `nics_per_node`)."""

    op: CollectiveOp
    span: Span
    ranks: int = Field(gt=1)
    bytes: int = Field(gt=0)
    busbw_gb_per_s: float = Field(gt=0)
    algorithm: str = ""
    nodes: int = 1
    nics_per_node: int | None = None
    nic_gb_per_s: float | None = None
    source: str

    @model_validator(mode="after")
    def _nic_fields(self) -> CollectivePoint:
        if self.span == "nic" and (self.nodes < 2 or not self.nics_per_node or not self.nic_gb_per_s):
            raise ValueError("a collective across NICs names nodes (>= 2), nics_per_node and nic_gb_per_s")
        return self


class Provenance(_Strict):
    """Where and how a measured profile (`autopar profile`) was taken: the device as torch names it
    (``cpu`` for a profile measured on the CPU), when (ISO 8601, UTC), the command line, the torch /
    CUDA versions and the host."""

    device: str = Field(min_length=1)
    measured_at: str = Field(min_length=10)
    command: str = ""
    software: str = ""
    host: str = ""


class AtlasFile(_Strict):
    """A whole atlas file (module doc). `gpu` is a GPU catalog name or alias
    (`cluster_specs.catalog.get_gpu`); a measured profile also says where it was taken (`provenance`)."""

    format: Literal["autopar-kernel-atlas/1"]
    gpu: str = Field(min_length=1)
    description: str = ""
    provenance: Provenance | None = None
    sources: dict[str, Source]
    gemm: tuple[GemmPoint, ...] = ()
    attention: tuple[AttentionPoint, ...] = ()
    memory: tuple[MemoryPoint, ...] = ()
    collectives: tuple[CollectivePoint, ...] = ()

    @field_validator("sources")
    @classmethod
    def _some_source(cls, v: dict[str, Source]) -> dict[str, Source]:
        if not v:
            raise ValueError("an atlas names at least one source")
        return v

    @model_validator(mode="after")
    def _sources_known(self) -> AtlasFile:
        for kind in ("gemm", "attention", "memory", "collectives"):
            for i, point in enumerate(getattr(self, kind)):
                if point.source not in self.sources:
                    raise ValueError(f"{kind}[{i}].source: {point.source!r} is not in sources ({', '.join(self.sources)})")
        return self


class AtlasError(ValueError):
    """An atlas file that cannot be read: the message names the file and the field."""


def parse_atlas(data: object, where: str = "atlas") -> AtlasFile:
    """Validate one atlas document; an `AtlasError` names the offending field and why."""
    try:
        return AtlasFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise AtlasError(f"{where}: {loc}: {first['msg']}") from None


def read_atlas_file(path: str | Path) -> AtlasFile:
    """Read and validate an atlas JSON file (a shipped one, or a user's profile of the same format)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AtlasError(f"{p}: {exc}") from None
    return parse_atlas(data, str(p))
