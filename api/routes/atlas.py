"""`PUT /v1/clusters/{name}/atlas` and `GET` of it: a team cluster's measured kernel profile
(`autopar profile`'s atlas file), stored per cluster (`api.models.ClusterAtlas`, one per cluster,
replaced by the next upload). Plans for that cluster are priced with it layered over the shipped
atlas (`api.planning`, `planner.kernel_profile`) and say so in `kernel_profile`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field
from sqlalchemy import select

from api.atlas import validate_upload
from api.calibration import is_preset
from api.deps import DB, Authenticated
from api.errors import ERROR_RESPONSES, ApiError, conflict, forbidden, not_found
from api.models import ClusterAtlas, TeamCluster, utcnow
from api.numbers import strict_numbers
from cluster_specs.spec import ClusterSpec
from cost_models.kernels.overlay import digest

router = APIRouter(prefix="/v1", tags=["calibration"], responses=ERROR_RESPONSES)  # type: ignore[arg-type]
ClusterName = Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="a team cluster's name")]


class AtlasOut(BaseModel):
    cluster: str
    gpu: str = Field(description="catalog name of the GPU measured")
    device: str = Field(description="the device as torch named it")
    measured_at: str = Field(description="when it was measured (ISO 8601, UTC)")
    digest: str = Field(description="content digest; plans priced with it name it in kernel_profile.digest")
    points: int = Field(description="measured points (GEMM, attention, memory, collectives)")
    created_at: datetime
    atlas: dict[str, Any] = Field(description="the autopar-kernel-atlas/1 document")


def _out(row: ClusterAtlas) -> AtlasOut:
    return AtlasOut(cluster=row.cluster, gpu=row.gpu, device=row.device, measured_at=row.measured_at,
                    digest=row.digest, points=row.points, created_at=row.created_at, atlas=row.atlas)


def _team_cluster(session: Any, name: str) -> ClusterSpec:
    if is_preset(name):
        raise conflict(f"{name!r} is a cluster preset, shared by every team: register a cluster of your own "
                       f"(POST /v1/clusters, {{\"preset\": \"{name}\"}} as its spec) and store its profile there",
                       ["path", "name"])
    row = session.scalar(select(TeamCluster).where(TeamCluster.name == name))
    if row is None:
        raise not_found("team cluster", repr(name), ["path", "name"])
    try:
        return ClusterSpec(**row.spec)
    except ValueError as exc:
        raise ApiError(422, f"the stored cluster {name!r} no longer validates: {exc}", ["path", "name"],
                       "stale_team_spec") from None


@router.put("/clusters/{name}/atlas", response_model=AtlasOut,
            summary="Store a team cluster's measured kernel profile (autopar profile)")
async def put_atlas(
    name: ClusterName, db: DB, principal: Authenticated, _: Annotated[None, Depends(strict_numbers)],
    body: Annotated[dict[str, Any], Body(description="the atlas file autopar profile wrote")],
) -> AtlasOut:
    """A user token, or an agent token of this cluster (the agent's profiling step). The document is
    checked as `read_atlas_file` checks a file, and must be of the cluster's GPU and say where it was
    measured (422 naming the field); it replaces the cluster's earlier profile in one transaction."""
    if principal.role == "agent" and principal.cluster != name:
        raise forbidden(f"an agent token of cluster {principal.cluster!r} may not store cluster {name!r}'s profile")
    if principal.role not in ("user", "admin", "agent"):
        raise forbidden("this needs a user token or an agent token of the cluster")

    def store() -> AtlasOut:
        with db.read_session() as session:
            cluster = _team_cluster(session, name)
        doc = validate_upload(body, cluster)
        assert doc.provenance is not None
        fields = dict(
            gpu=cluster.gpu.name, device=doc.provenance.device[:256], measured_at=doc.provenance.measured_at[:64],
            digest=digest(doc), points=len(doc.gemm) + len(doc.attention) + len(doc.memory) + len(doc.collectives),
            created_at=utcnow(), created_by=principal.token_id, atlas=doc.model_dump(mode="json", by_alias=True),
        )
        with db.write_session() as session:
            row = session.scalar(select(ClusterAtlas).where(ClusterAtlas.cluster == name))
            if row is None:
                row = ClusterAtlas(cluster=name, **fields)
                session.add(row)
            else:
                for key, value in fields.items():
                    setattr(row, key, value)
            session.flush()
            return _out(row)

    return await run_in_threadpool(store)


@router.get("/clusters/{name}/atlas", response_model=AtlasOut, summary="A team cluster's measured kernel profile")
def get_atlas(name: ClusterName, db: DB, principal: Authenticated) -> AtlasOut:
    with db.read_session() as session:
        row = session.scalar(select(ClusterAtlas).where(ClusterAtlas.cluster == name))
        if row is None:
            raise not_found("kernel profile of cluster", repr(name), ["path", "name"])
        return _out(row)
