"""A cluster's own kernel measurements layered over the shipped atlas of its GPU.

`autopar profile` measures, on the user's GPUs, the atlas entries a plan looks up and writes them
as an atlas file (`cost_models.kernels.schema`). To price with it, `register(doc)` keeps the file in
this process under its digest and a GPU names that digest in `GPUSpec.kernel_profile`
(`profiled_gpu`); `cost_models.kernels.atlas.atlas_for` then builds that GPU's atlas from the
merge of its shipped file (if any) and the profile (`merge`): every point of the profile replaces
the shipped point of the same key (a GEMM's (m, n, k, dtype), an attention kernel's (kernel, head
dim, length, mask, pass), a memory op, a collective's (op, span, ranks, nodes, bytes)), the rest of
the shipped points stay. Because the digest is a field of the GPU, every cache keyed on the GPU or
its cluster keeps the profiled prices apart from the shipped ones.
"""

from __future__ import annotations

import hashlib
from typing import Any

from cluster_specs.spec import ClusterSpec, GPUSpec
from cost_models.kernels.schema import AtlasFile

_PROFILES: dict[str, AtlasFile] = {}
"""Registered profiles by digest (one process's; a planner worker registers what its job carries)."""


def digest(doc: AtlasFile) -> str:
    """A short content digest of an atlas document (sha256 of its canonical JSON, 16 hex digits)."""
    return hashlib.sha256(doc.model_dump_json(by_alias=True).encode()).hexdigest()[:16]


def register(doc: AtlasFile) -> str:
    """Keep `doc` for `atlas_for` and return its digest."""
    key = digest(doc)
    _PROFILES[key] = doc
    return key


def registered(key: str) -> AtlasFile:
    """The profile registered under `key`; a KeyError saying so when this process has none."""
    doc = _PROFILES.get(key)
    if doc is None:
        raise KeyError(f"kernel profile {key} is not loaded in this process (cost_models.kernels.overlay.register)")
    return doc


def profiled_gpu(gpu: GPUSpec, doc: AtlasFile) -> GPUSpec:
    """`gpu` priced with `doc` layered over its atlas (module doc). The profile must be of this GPU."""
    from cluster_specs.catalog import get_gpu

    try:
        name = get_gpu(doc.gpu).name
    except KeyError:
        name = doc.gpu
    if name != gpu.name:
        raise ValueError(f"gpu: the kernel profile measured {doc.gpu}, the cluster's GPU is {gpu.name}")
    return gpu.model_copy(update={"kernel_profile": register(doc)})


def profiled_cluster(cluster: ClusterSpec, doc: AtlasFile) -> ClusterSpec:
    """`cluster` with its GPU priced from `doc` (`profiled_gpu`)."""
    return cluster.model_copy(update={"gpu": profiled_gpu(cluster.gpu, doc)})


def _key(kind: str, p: Any) -> tuple:
    if kind == "gemm":
        return (p.m, p.n, p.k, "fp8" if p.dtype == "fp8" else "16")
    if kind == "attention":
        return (p.kernel, p.head_dim, p.seq_len, p.causal, p.pass_)
    if kind == "memory":
        return (p.op,)
    return (p.op, p.span, p.ranks, p.nodes, p.bytes)


def merge(base: AtlasFile | None, profile: AtlasFile) -> AtlasFile:
    """The shipped file `base` with `profile`'s points replacing those of the same key (module doc).
    The profile's sources are kept under ``profile:<name>`` so that they never shadow the base's."""
    if base is None:
        return profile
    rename = {name: f"profile:{name}" for name in profile.sources}
    data: dict[str, Any] = {
        "format": base.format, "gpu": base.gpu,
        "provenance": profile.provenance.model_dump() if profile.provenance else None,
        "description": f"{base.description} Layered with a measured profile: {profile.description}".strip(),
        "sources": {**{k: v.model_dump() for k, v in base.sources.items()},
                    **{rename[k]: v.model_dump() for k, v in profile.sources.items()}},
    }
    for kind in ("gemm", "attention", "memory", "collectives"):
        mine = {_key(kind, p): p for p in getattr(profile, kind)}
        kept = [p.model_dump(by_alias=True) for p in getattr(base, kind) if _key(kind, p) not in mine]
        added = [{**p.model_dump(by_alias=True), "source": rename[p.source]} for p in mine.values()]
        data[kind] = kept + added
    return AtlasFile.model_validate(data)
