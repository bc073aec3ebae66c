"""A cluster's measured kernel profile in the database (`api.models.ClusterAtlas`): validation of
an upload and the profile plans for that cluster are priced with (`api.planning`)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.errors import ApiError
from api.models import ClusterAtlas
from cluster_specs.catalog import get_gpu
from cluster_specs.spec import ClusterSpec
from cost_models.kernels.schema import AtlasFile


def validate_upload(body: Any, cluster: ClusterSpec) -> AtlasFile:
    """The uploaded document as an `AtlasFile` (the rules of `read_atlas_file`), of `cluster`'s
    GPU and with its `provenance`; else a 422 naming the field (``body.<field>``) and why."""
    try:
        doc = AtlasFile.model_validate(body)
    except ValidationError as exc:
        raise ApiError.from_validation(exc, ["body"]) from None
    try:
        gpu = get_gpu(doc.gpu).name
    except KeyError:
        raise ApiError(422, f"{doc.gpu!r} is not a GPU of the catalog (GET /v1/gpus)", ["body", "gpu"],
                       "unknown_gpu") from None
    if gpu != cluster.gpu.name:
        raise ApiError(422, f"the profile measured {gpu}; cluster {cluster.name!r} has {cluster.gpu.name}: a profile "
                       f"prices only the GPU it was measured on", ["body", "gpu"], "gpu_mismatch")
    if doc.provenance is None:
        raise ApiError(422, "a profile says where and when it was measured (autopar profile writes it)",
                       ["body", "provenance"], "missing")
    if not (doc.gemm or doc.attention or doc.memory or doc.collectives):
        raise ApiError(422, "the profile measured nothing (no gemm, attention, memory or collectives points)",
                       ["body", "gemm"], "empty")
    return doc


def stored_atlas(session: Session, cluster_name: str) -> AtlasFile | None:
    """The profile stored for `cluster_name`, if any (validated when it was stored)."""
    row = session.scalar(select(ClusterAtlas).where(ClusterAtlas.cluster == cluster_name))
    return AtlasFile.model_validate(row.atlas) if row is not None else None
