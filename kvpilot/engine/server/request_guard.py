"""Pure ASGI middleware that refuses, before any parsing, what no route could serve: a POST body
that is not JSON (415) or larger than the limit (413: by its Content-Length, or counted as a
chunked body streams in)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvpilot.engine.server.errors import APIError, error_response

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
JSON_TYPE = "application/json"


class RequestGuardMiddleware:
    """Checks Content-Type and body size of every POST before the app reads the body."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, strategy: str) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"--max-body-bytes must be at least 1, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.strategy = strategy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope["headers"]}
        error = self._content_type_error(scope["path"], headers.get(b"content-type")) or self._length_error(
            headers.get(b"content-length")
        )
        if error is not None:
            await error_response(error, self.strategy)(scope, receive, send)
            return
        if b"content-length" in headers:
            await self.app(scope, receive, send)  # the server holds the body to its stated length
            return
        # A chunked body states no length: read it here, up to the limit, then hand it on.
        chunks, received = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            chunks.append(message.get("body", b""))
            received += len(chunks[-1])
            if received > self.max_body_bytes:
                error = self._too_large(f"the request body exceeds {self.max_body_bytes} bytes")
                await error_response(error, self.strategy)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def _content_type_error(self, path: str, value: bytes | None) -> APIError | None:
        if value is None:
            message = f"the request has no Content-Type header: POST {path} takes a JSON body; send Content-Type: {JSON_TYPE}"
        else:
            media = value.decode("latin-1").split(";", 1)[0].strip().lower()
            if media == JSON_TYPE:
                return None
            message = f"Content-Type {media!r} is not supported: POST {path} takes a JSON body; send Content-Type: {JSON_TYPE}"
        return APIError(415, message, param="Content-Type", code="unsupported_media_type")

    def _length_error(self, value: bytes | None) -> APIError | None:
        if value is None:
            return None
        try:
            length = int(value)
        except ValueError:
            return APIError(400, f"Content-Length {value.decode('latin-1')!r} is not a number", param="Content-Length")
        if length > self.max_body_bytes:
            return self._too_large(f"the request body is {length} bytes")
        return None

    def _too_large(self, what: str) -> APIError:
        return APIError(
            413,
            f"{what}; this server accepts at most {self.max_body_bytes} bytes per request (--max-body-bytes); "
            "shorten the prompt",
            code="request_too_large",
        )
