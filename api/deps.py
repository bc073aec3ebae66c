"""FastAPI dependencies: the database, the planner pool, and the caller's token."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.auth import Principal, principal_for
from api.calibration import CalibrationReports
from api.db import Database
from api.errors import forbidden, unauthorized
from api.metrics import Metrics
from api.numbers import strict_numbers
from api.planning import PlannerPool
from api.settings import Settings

bearer = HTTPBearer(auto_error=False, description="a token from `autopar tokens create`")


def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


def get_pool(request: Request) -> PlannerPool:
    pool: PlannerPool = request.app.state.pool
    return pool


def get_reports(request: Request) -> CalibrationReports:
    reports: CalibrationReports = request.app.state.reports
    return reports


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def authenticated(
    db: Annotated[Database, Depends(get_db)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise unauthorized()
    with db.read_session() as session:
        principal = principal_for(session, creds.credentials)
    if principal is None:
        raise unauthorized("unknown or revoked token")
    return principal


def user(
    principal: Annotated[Principal, Depends(authenticated)], _: Annotated[None, Depends(strict_numbers)]
) -> Principal:
    """A user or admin token (admins are users that may also cancel others' runs). Resolved in
    order: the token (401), the body's numbers (422, `api.numbers.strict_numbers`: an anonymous
    caller learns nothing of the schema), the role (403)."""
    if principal.role not in ("user", "admin"):
        raise forbidden(f"this needs a user token; agent tokens (cluster {principal.cluster!r}) may only run jobs")
    return principal


def agent(
    principal: Annotated[Principal, Depends(authenticated)], _: Annotated[None, Depends(strict_numbers)]
) -> Principal:
    """An agent token; the token, the body's numbers and the role are checked as in `user`."""
    if principal.role != "agent":
        raise forbidden("this needs an agent token (autopar tokens create --role agent --cluster NAME)")
    return principal


DB = Annotated[Database, Depends(get_db)]
Authenticated = Annotated[Principal, Depends(authenticated)]
User = Annotated[Principal, Depends(user)]
Agent = Annotated[Principal, Depends(agent)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
Pool = Annotated[PlannerPool, Depends(get_pool)]
Reports = Annotated[CalibrationReports, Depends(get_reports)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        max_length=128, pattern=r"^[A-Za-z0-9._:-]{1,128}$",
        description="a retried POST with the same key returns what this token stored the first time (200); "
        "keys are per token",
    ),
]
"""The `Idempotency-Key` header of the POSTs that store a row (a plan, a queued run)."""
