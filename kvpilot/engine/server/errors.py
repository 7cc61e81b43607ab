"""API errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("kvpilot.server")

STRATEGY_HEADER = "X-Model-Strategy"

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error a client can act on; rendered as OpenAI's error JSON with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    kind = _TYPE_BY_STATUS.get(status, "invalid_request_error" if status < 500 else "internal_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(exc: APIError, strategy: str) -> JSONResponse:
    headers = {**exc.headers, STRATEGY_HEADER: strategy}
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def _field_path(loc: tuple | list) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One line per invalid field, each naming the field and what is allowed."""
    lines, first = [], None
    for err in errors[:10]:
        field = _field_path(err.get("loc", ()))
        first = first or field
        lines.append(f"{field}: {err.get('msg', 'invalid value')}")
    if not lines:
        return "the request body is invalid", None
    return "invalid request body: " + "; ".join(lines), first


def install_error_handlers(
    app: FastAPI,
    strategy: str,
    on_invalid: Callable[[], None] | None = None,
    on_internal: Callable[[], None] | None = None,
) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return error_response(exc, strategy)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = list(exc.errors())
        if on_invalid is not None:
            on_invalid()
        message, field = validation_message(errors)
        if any(e.get("type") == "json_invalid" for e in errors):
            message = "the request body is not valid JSON: " + message
        return error_response(APIError(422, message, param=field, code="invalid_value"), strategy)

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; see GET /openapi.json for the API"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        headers = dict(exc.headers or {})
        return error_response(APIError(exc.status_code, message, headers=headers), strategy)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error while serving %s %s", request.method, request.url.path)
        if on_internal is not None:
            on_internal()
        message = f"internal error while serving this request ({type(exc).__name__}: {exc})"
        return error_response(APIError(500, message, code="internal_error"), strategy)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
