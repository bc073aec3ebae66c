"""Presets (models, clusters, GPUs) and a team's own model and cluster specs."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Path, Query
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from api.calibration import is_preset
from api.deps import DB, User
from api.errors import ERROR_RESPONSES, conflict, not_found
from api.models import TeamCluster, TeamModel
from api.resolve import cluster_from_fields, model_from_fields, preset_cluster, preset_model
from api.schemas import ClusterCreate, ClusterOut, GPUOut, ModelCreate, ModelOut, Page
from cluster_specs.catalog import get_gpu, list_gpus
from cluster_specs.presets import get_cluster, list_clusters
from cluster_specs.spec import ClusterSpec
from model_specs.params import count_params
from model_specs.presets import get_model, list_models
from model_specs.spec import ModelSpec

router = APIRouter(
    prefix="/v1", tags=["specs"], responses=ERROR_RESPONSES,  # type: ignore[arg-type]
)
T = TypeVar("T")
Limit = Annotated[int, Query(ge=1, le=200)]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1)]
Source = Annotated[Literal["preset", "team"] | None, Query(description="only presets or only team specs")]
SpecName = Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,64}$")]


def _model_out(name: str, source: Literal["preset", "team"], spec: ModelSpec) -> ModelOut:
    pc = count_params(spec)
    return ModelOut(name=name, source=source, params_total=pc.total, params_active=pc.active, spec=spec)


def _cluster_out(name: str, source: Literal["preset", "team"], spec: ClusterSpec) -> ClusterOut:
    return ClusterOut(name=name, source=source, gpu=spec.gpu.name, gpus_per_node=spec.gpus_per_node, spec=spec)


def _stale(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"


def _team_model_out(row: TeamModel) -> ModelOut:
    """A stored team model; one stored before the bounds and outside them reads as stale, not a 500."""
    try:
        return _model_out(row.name, "team", ModelSpec(**row.spec))
    except ValidationError as exc:
        return ModelOut(name=row.name, source="team", params_total=None, params_active=None, spec=None,
                        stale=_stale(exc))


def _team_cluster_out(row: TeamCluster) -> ClusterOut:
    """A stored team cluster; one stored before the bounds and outside them reads as stale, not a 500."""
    try:
        return _cluster_out(row.name, "team", ClusterSpec(**row.spec))
    except ValidationError as exc:
        return ClusterOut(name=row.name, source="team", gpu=None, gpus_per_node=None, spec=None, stale=_stale(exc))


@functools.cache
def _preset_models() -> tuple[ModelOut, ...]:
    return tuple(_model_out(n, "preset", get_model(n)) for n in list_models())


@functools.cache
def _preset_clusters() -> tuple[ClusterOut, ...]:
    return tuple(_cluster_out(n, "preset", get_cluster(n)) for n in list_clusters())


def _page(
    db: Any, presets: Sequence[T], table: Any, to_out: Callable[[Any], T], source: str | None, limit: int, offset: int
) -> Page[T]:
    """Presets first (in catalog order), then team specs by name."""
    pre = list(presets) if source != "team" else []
    with db.read_session() as session:
        n_team = 0 if source == "preset" else session.scalar(select(func.count()).select_from(table)) or 0
        items = pre[offset : offset + limit]
        if source != "preset" and len(items) < limit:
            team_offset = max(0, offset - len(pre))
            rows = session.scalars(
                select(table).order_by(table.name).limit(limit - len(items)).offset(team_offset)
            ).all()
            items += [to_out(r) for r in rows]
    return Page[T](items=items, total=len(pre) + n_team, limit=limit, offset=offset)


@router.get("/models", response_model=Page[ModelOut], summary="Model presets and team models")
def list_model_specs(db: DB, source: Source = None, limit: Limit = 50, offset: Offset = 0) -> Page[ModelOut]:
    return _page(
        db, _preset_models(), TeamModel, _team_model_out, source, limit, offset,
    )


@router.get("/models/{name}", response_model=ModelOut, summary="One model (preset or team)")
def get_model_spec(name: SpecName, db: DB) -> ModelOut:
    spec = preset_model(name)
    if spec is not None:
        return _model_out(spec.name, "preset", spec)
    with db.read_session() as session:
        row = session.scalar(select(TeamModel).where(TeamModel.name == name))
        if row is None:
            raise not_found("model", repr(name), ["path", "name"])
        return _team_model_out(row)


@router.post("/models", status_code=201, response_model=ModelOut, summary="Store a team model")
def create_model_spec(body: ModelCreate, principal: User, db: DB) -> ModelOut:
    """Usable by name in POST /v1/plans and /v1/evaluate afterwards. Names are unique and may not
    shadow a preset."""
    if preset_model(body.name) is not None:
        raise conflict(f"{body.name!r} is a model preset; pick another name", ["body", "name"])
    spec = model_from_fields(body.spec, ["body", "spec"], name=body.name)
    try:
        with db.write_session() as session:
            session.add(TeamModel(name=body.name, created_by=principal.token_id, spec=spec.model_dump(mode="json")))
    except IntegrityError as exc:
        raise conflict(f"a team model named {body.name!r} exists already", ["body", "name"]) from exc
    return _model_out(body.name, "team", spec)


@router.get("/clusters", response_model=Page[ClusterOut], summary="Cluster presets and team clusters")
def list_cluster_specs(db: DB, source: Source = None, limit: Limit = 50, offset: Offset = 0) -> Page[ClusterOut]:
    return _page(
        db, _preset_clusters(), TeamCluster, _team_cluster_out, source, limit, offset,
    )


@router.get("/clusters/{name}", response_model=ClusterOut, summary="One cluster (preset or team)")
def get_cluster_spec(name: SpecName, db: DB) -> ClusterOut:
    spec = preset_cluster(name)
    if spec is not None:
        return _cluster_out(spec.name, "preset", spec)
    with db.read_session() as session:
        row = session.scalar(select(TeamCluster).where(TeamCluster.name == name))
        if row is None:
            raise not_found("cluster", repr(name), ["path", "name"])
        return _team_cluster_out(row)


@router.post("/clusters", status_code=201, response_model=ClusterOut, summary="Store a team cluster")
def create_cluster_spec(body: ClusterCreate, principal: User, db: DB) -> ClusterOut:
    """ClusterSpec fields in SI units or vendor units ('400 Gb/s'); `gpu` may name a catalog GPU.
    Usable by name in POST /v1/plans and /v1/evaluate afterwards, and calibrated by the profiles of
    runs queued on that name (`api.calibration`). Names are unique; a name that resolves to a
    cluster preset (any case, `_` for `-`) is a 409: a preset is shared and never calibrated from
    profiles, and its name always means the preset."""
    if is_preset(body.name):
        raise conflict(
            f"{body.name!r} is a cluster preset's name: a preset is shared by every team and is never "
            f"calibrated from profiles, so a team cluster may not take its name; pick a name of your own "
            f"(e.g. 'team-{body.name}'), with {{\"preset\": \"{body.name}\"}} as its spec to start from the preset",
            ["body", "name"],
        )
    spec = cluster_from_fields(body.spec, ["body", "spec"], name=body.name)
    try:
        with db.write_session() as session:
            session.add(TeamCluster(name=body.name, created_by=principal.token_id, spec=spec.model_dump(mode="json")))
    except IntegrityError as exc:
        raise conflict(f"a team cluster named {body.name!r} exists already", ["body", "name"]) from exc
    return _cluster_out(body.name, "team", spec)


@router.get("/gpus", response_model=Page[GPUOut], summary="The GPU catalog (datasheet figures, SI units)")
def list_gpu_specs(limit: Limit = 50, offset: Offset = 0) -> Page[GPUOut]:
    names = list_gpus()
    return Page[GPUOut](
        items=[get_gpu(n) for n in names[offset : offset + limit]], total=len(names), limit=limit, offset=offset
    )
