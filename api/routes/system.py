"""Liveness and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.deps import DB
from api.errors import ERROR_RESPONSES, ApiError
from api.schemas import Health

router = APIRouter(tags=["system"], responses=ERROR_RESPONSES)  # type: ignore[arg-type]


@router.get("/healthz", response_model=Health, summary="Liveness: the database answers")
def healthz(db: DB) -> Health:
    try:
        with db.read_session() as session:
            version = session.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except Exception as exc:  # any database failure means "not healthy", reported, not raised
        raise ApiError(503, f"database unavailable: {type(exc).__name__}", [], "unavailable") from exc
    return Health(status="ok", database=db.engine.dialect.name, migration=version)


@router.get(
    "/metrics", summary="Prometheus metrics (text exposition format)", response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
