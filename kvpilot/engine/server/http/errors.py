"""API errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvpilot.engine.server.wire.api_error import APIError

log = logging.getLogger("kvpilot.server")

STRATEGY_HEADER = "X-Model-Strategy"

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
        bad_json = next((e for e in errors if e.get("type") == "json_invalid"), None)
        if bad_json is not None:
            # FastAPI puts the byte offset where a field name goes: say it in words instead.
            loc = [p for p in bad_json.get("loc", ()) if p != "body"]
            where = f" at byte {loc[0]}" if loc and isinstance(loc[0], int) else ""
            reason = (bad_json.get("ctx") or {}).get("error") or bad_json.get("msg", "")
            message = f"the request body is not valid JSON ({reason}{where}); send one JSON object"
            return error_response(APIError(422, message, param=None, code="invalid_json"), strategy)
        # pydantic refuses lone surrogates in some string fields with a confusing message: say it plainly.
        from kvpilot.engine.server.wire.text_checks import find_unicode_error

        unicode = find_unicode_error(getattr(exc, "body", None))
        if unicode is not None:
            return error_response(unicode, strategy)
        message, field = validation_message(errors)
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
        # Never the exception's text: it may hold request data or server internals.
        message = (
            f"internal error while serving this request ({type(exc).__name__}); other requests are not "
            "affected; see the server log"
        )
        return error_response(APIError(500, message, code="internal_error"), strategy)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
