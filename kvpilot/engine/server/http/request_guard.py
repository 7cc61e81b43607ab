"""Pure ASGI middleware that refuses, before any parsing, what no route could serve: a POST body
that is not JSON (415), larger than the limit (413: by its Content-Length, and always by the bytes
actually read, whatever the headers say), that holds more JSON values, objects or nesting than
json_shape.py allows (400, counted as the body arrives), whose output constraint or tools are over
their size limit (400 naming the field: raw_field_limits.py, from the raw bytes), or that does not
arrive within the body timeout (408). The body is read here, then handed to the app."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvpilot.engine.server.http.errors import APIError, error_response
from kvpilot.engine.server.http.json_shape import JsonShape
from kvpilot.engine.server.http.raw_field_limits import SMALLEST_LIMIT, oversized_field

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0
JSON_TYPE = "application/json"
SCAN_SLICE_BYTES = 64 * 1024  # the event loop runs other work between two slices of a big chunk
LARGE_BODY_BYTES = 256 * 1024  # bodies from this size are handed to the app one at a time (below)


class RequestGuardMiddleware:
    """Checks Content-Type, size, JSON shape and arrival time of every POST body before the app sees it."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        strategy: str,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_SECONDS,
        on_invalid: Callable[[], None] | None = None,
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"--max-body-bytes must be at least 1, got {max_body_bytes}")
        if not body_timeout_s > 0:
            raise ValueError(f"--body-timeout must be positive, got {body_timeout_s}")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.strategy = strategy
        self.on_invalid = on_invalid  # counts an over-size constraint as the later check did (rejected: invalid)
        # Parsing and validating a large body, and the checks after it, run on the event loop in one
        # go (they hold the GIL). Sixteen of them at once would queue /health behind all sixteen, so
        # large bodies are handed over one at a time: the next one goes once the previous request
        # first waits for something (its tokenising, say), and other work runs in between.
        self._large = asyncio.Semaphore(1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope["headers"]}
        error = self._content_type_error(scope["path"], headers.get(b"content-type")) or self._length_error(
            headers.get(b"content-length")
        )
        body: bytes | None = None
        if error is None:
            try:
                async with asyncio.timeout(self.body_timeout_s):
                    body, error = await self._read(receive, scope["path"])
            except TimeoutError:
                error = APIError(
                    408,
                    f"the request body did not arrive within {self.body_timeout_s:g} s (--body-timeout); send it "
                    "at once",
                    code="request_timeout",
                )
            if body is None and error is None:
                return  # the client left
        if error is not None:
            await error_response(error, self.strategy)(scope, receive, send)
            return
        replayed = False
        held = len(body) >= LARGE_BODY_BYTES
        if held:
            await self._large.acquire()

        async def replay() -> Message:
            nonlocal replayed, held
            if replayed:
                return await receive()
            replayed = True
            if held:  # given back once this request's synchronous parse and checks yield the loop
                held = False
                asyncio.get_running_loop().call_soon(self._large.release)
            return {"type": "http.request", "body": body, "more_body": False}

        try:
            await self.app(scope, replay, send)
        finally:
            if held:
                self._large.release()

    async def _read(self, receive: Receive, path: str) -> tuple[bytes | None, APIError | None]:
        """The whole body, counted as it arrives (never trusting Content-Length), or the error that stopped it."""
        chunks, received, shape = [], 0, JsonShape(member_bytes=SMALLEST_LIMIT)
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None, None  # the client left
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_body_bytes:
                return None, self._too_large(f"the request body exceeds {self.max_body_bytes} bytes")
            for at in range(0, len(chunk), SCAN_SLICE_BYTES):
                if at:
                    await asyncio.sleep(0)
                shape.feed(chunk[at : at + SCAN_SLICE_BYTES])
                if (what := shape.error()) is not None:
                    return None, APIError(400, f"{what}: simplify the request or split it", code="request_too_complex")
            chunks.append(chunk)
            if not message.get("more_body", False):
                body = b"".join(chunks)
                shape.finish()
                if shape.large_members and (error := oversized_field(path, body, shape.large_members)) is not None:
                    if self.on_invalid is not None:
                        self.on_invalid()
                    return None, error
                return body, None

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
