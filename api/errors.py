"""One error shape for every 4xx/5xx: `{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}`,
the shape FastAPI already uses for request validation (422), so a client reads every error alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.schemas import ErrorResponse


class ApiError(Exception):
    def __init__(
        self, status: int, msg: str, loc: Sequence[str | int] = (), type: str = "error",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(msg)
        self.status = status
        self.items: list[dict[str, Any]] = [{"loc": list(loc), "msg": msg, "type": type}]
        self.headers = headers

    @classmethod
    def from_validation(cls, exc: ValidationError, prefix: Sequence[str | int], status: int = 422) -> ApiError:
        """A pydantic error raised while building a spec from a request field, with the request's path."""
        err = cls(status, "invalid", prefix)
        err.items = [
            {
                "loc": [*prefix, *e["loc"]],
                "msg": str(e["msg"]).removeprefix("Value error, "),
                "type": e["type"],
            }
            for e in exc.errors(include_url=False)
        ]
        return err


def unauthorized(msg: str = "a bearer token is required (Authorization: Bearer apt_...)") -> ApiError:
    return ApiError(401, msg, ["header", "authorization"], "unauthorized", {"WWW-Authenticate": "Bearer"})


def forbidden(msg: str, loc: Sequence[str | int] = ("header", "authorization")) -> ApiError:
    """403: the token may not do this (`loc`: the field naming what it may not touch)."""
    return ApiError(403, msg, loc, "forbidden")


def not_found(what: str, ident: Any, loc: Sequence[str | int]) -> ApiError:
    return ApiError(404, f"{what} {ident} not found", loc, "not_found")


def conflict(msg: str, loc: Sequence[str | int] = ()) -> ApiError:
    return ApiError(409, msg, loc, "conflict")


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "bad request",
        401: "missing, unknown or revoked bearer token",
        403: "the token's role or cluster does not allow this, or the object is another token's",
        404: "no such object",
        409: "conflicts with the object's current state",
        413: "request body larger than the limit",
        422: "a field is malformed or names something unknown (loc gives its path)",
        503: "the planner is saturated; retry after the Retry-After seconds",
    }.items()
}


def _jsonable_errors(errors: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        out.append(
            {
                "loc": [x if isinstance(x, int) else str(x) for x in e.get("loc", ())],
                "msg": str(e.get("msg", "")),
                "type": str(e.get("type", "value_error")),
            }
        )
    return out


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"detail": exc.items}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _jsonable_errors(exc.errors())}, status_code=422)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        """Anything unforeseen still answers in the documented shape (never a plain-text 500)."""
        return JSONResponse(
            {"detail": [{"loc": [], "msg": f"internal error ({type(exc).__name__})", "type": "internal_error"}]},
            status_code=500,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail
        items = detail if isinstance(detail, list) else [{"loc": [], "msg": str(detail), "type": "http_error"}]
        return JSONResponse({"detail": items}, status_code=exc.status_code, headers=getattr(exc, "headers", None))
