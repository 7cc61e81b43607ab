"""API keys: every route but the probes needs `Authorization: Bearer <key>` when a key is set."""

from __future__ import annotations

import hmac
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from kvpilot.engine.server.http.errors import APIError, error_response

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})  # probes and scrapers carry no key (as vLLM)


def read_key_file(path: Path) -> str:
    """The key in a file (a mounted Secret): its content without surrounding whitespace."""
    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"--api-key-file {path}: cannot read it ({exc.strerror})") from None
    if not key:
        raise ValueError(f"--api-key-file {path} is empty: put the API key in it")
    return key


class ApiKeyMiddleware:
    """401 unless the request carries the key; constant-time comparison."""

    def __init__(self, app: ASGIApp, *, key: str, strategy: str) -> None:
        if not key:
            raise ValueError("the API key must not be empty")
        self.app = app
        self._key = key.encode()
        self._strategy = strategy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope["headers"]}
        value = headers.get(b"authorization", b"")
        scheme, _, token = value.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key):
            await self.app(scope, receive, send)
            return
        what = "no API key was sent" if not value else "the API key is wrong or not a Bearer token"
        error = APIError(
            401,
            f"{what}: send the header `Authorization: Bearer <key>` with the key this server was started "
            "with (--api-key / --api-key-file); /health and /ready need none",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await error_response(error, self._strategy)(scope, receive, send)
