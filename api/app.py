"""The FastAPI application: `create_app(settings)`; `autopar serve` runs it under uvicorn.

On start it migrates the database (Alembic, scripts inside the package), opens the planner pool and
starts the lease reaper; every request body is capped at `max_body_bytes` (413 beyond) and read by
`api.jsonbody` before any route runs: NUL characters, lone surrogates, numbers that overflow to
infinity, integers beyond 64 bits and nesting deeper than `api.jsonbody.MAX_DEPTH` are a 422 with
the value's path."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from urllib.parse import parse_qsl

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import runs as lifecycle
from api.calibration import CalibrationReports
from api.db import Database
from api.errors import install_handlers
from api.jsonbody import unsafe_json
from api.metrics import Metrics
from api.planning import PlannerPool
from api.routes import atlas, calibration, plans, runs, specs, system
from api.settings import Settings
from api.ui import install_ui

log = logging.getLogger("autopar.api")
VERSION = "1"


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, whether announced by Content-Length or
    streamed in chunks (the body is read up to the limit before the app sees it), and values no
    database column holds faithfully, in the query string or a JSON body, with 422 (`unsafe_query`,
    `unsafe_json`)."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query_problem = unsafe_query(scope.get("query_string") or b"")
        if query_problem is not None:
            loc, msg = query_problem
            await _error(send, 422, msg, loc, "unsafe_value")
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                announced = int(length)
            except ValueError:
                await _error(send, 400, "Content-Length is not an integer", ["header", "content-length"])
                return
            if announced > self.limit:
                await _error(send, 413, f"request body of {announced} bytes exceeds the {self.limit}-byte limit",
                             ["body"])
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await _error(send, 413, f"request body exceeds the {self.limit}-byte limit", ["body"])
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        problem = unsafe_json(b"".join(chunks)) if _is_json(headers) else None
        if problem is not None:
            loc, msg = problem
            await _error(send, 422, msg, loc, "unsafe_value")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def unsafe_query(query_string: bytes) -> tuple[list[str | int], str] | None:
    """(path, reason) of the first query parameter holding a NUL character once percent-decoded (as
    the routes read it): PostgreSQL text refuses NUL, so a filter like `?cluster=%00` would be a 500."""
    for key, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if "\x00" in key or "\x00" in value:
            return ["query", key.replace("\x00", "\\x00")], "NUL characters are not allowed in text"
    return None


def _is_json(headers: dict[bytes, bytes]) -> bool:
    """Whether FastAPI will read the body as JSON: no Content-Type at all (FastAPI then parses it
    as JSON) or a JSON media type."""
    kind = headers.get(b"content-type")
    return kind is None or b"json" in kind.lower()


async def _error(send: Send, status: int, msg: str, loc: list, type_: str | None = None) -> None:
    import json

    kind = type_ or ("body_too_large" if status == 413 else "bad_request")
    body = json.dumps({"detail": [{"loc": loc, "msg": msg, "type": kind}]})
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")],
    })
    await send({"type": "http.response.body", "body": body.encode()})


class RequestMetrics:
    """Count requests and time them, labelled by route template."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.observe(scope["method"], template, status, started)


async def _reaper(db: Database, metrics: Metrics, interval_s: float) -> None:
    """Requeue or fail runs whose lease deadline passed, even while no agent asks for work."""

    def sweep() -> list[str]:
        with db.write_session() as session:
            return lifecycle.expire_leases(session)

    while True:
        await asyncio.sleep(interval_s)
        try:
            for outcome in await run_in_threadpool(sweep):
                metrics.lease_expirations.labels(outcome).inc()
        except Exception:  # keep sweeping; a transient database error must not stop the reaper
            log.exception("lease reaper sweep failed")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()
    db = Database(settings.database_url, busy_timeout_ms=settings.sqlite_busy_timeout_ms)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(db.migrate)
        pool = await run_in_threadpool(
            lambda: PlannerPool(
                settings.plan_workers, settings.max_pending_plans, metrics,
                time_budget_s=settings.plan_time_budget_s, max_pending_large=settings.max_pending_large_plans,
            )
        )
        app.state.pool = pool
        app.state.reports = CalibrationReports(db, pool.submit)
        reaper = None
        if settings.reaper_interval_s > 0:
            reaper = asyncio.create_task(_reaper(db, metrics, settings.reaper_interval_s))
        try:
            yield
        finally:
            if reaper is not None:
                reaper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reaper
            app.state.reports.stop()
            await run_in_threadpool(pool.shutdown)
            db.dispose()

    app = FastAPI(
        title="autopar",
        version=VERSION,
        summary="Auto-parallelism planner for LLM training: plans, evaluations, runs and profiles.",
        description=(
            "Write endpoints need `Authorization: Bearer <token>` (`autopar tokens create`). Every error "
            "is `{\"detail\": [{\"loc\", \"msg\", \"type\"}]}`; `loc` is the path of the offending field. "
            "Units: bytes are integers (`*_bytes`), times in seconds (`*_s`), rates per second (`*_per_s`)."
        ),
        lifespan=lifespan,
        docs_url=None,  # api.ui serves /docs from vendored Swagger UI assets (no CDN)
        redoc_url=None,
        # no redirect to the path with(out) a trailing slash: Starlette builds that Location from the
        # request's Host header, so a forged Host would send the client to another server; a path
        # that is not a route is a 404 in the documented error shape instead
        redirect_slashes=False,
    )
    app.state.settings = settings
    app.state.db = db
    app.state.metrics = metrics
    metrics.watch_runs(db.read_session)
    install_handlers(app)
    for module in (system, plans, specs, runs, calibration, atlas):
        app.include_router(module.router)
    install_ui(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)  # type: ignore[arg-type]
    app.add_middleware(RequestMetrics, metrics=metrics)  # type: ignore[arg-type]
    return app


def app_from_env() -> FastAPI:
    """uvicorn factory: `uvicorn --factory api.app:app_from_env` (settings from AUTOPAR_* variables)."""
    return create_app(Settings())
