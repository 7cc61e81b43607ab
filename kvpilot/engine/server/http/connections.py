"""uvicorn's h11 protocol with a header timeout and a connection cap.

uvicorn times out idle keep-alive connections but not a client that opens a connection and sends
its headers slowly, or never: 200 of them held their sockets for as long as they liked, and with
a low open-files limit the accept loop failed and /health with it. Here:

- a connection must complete its request headers within `header_timeout_s` of opening (or of its
  previous response, on keep-alive), else it is closed, with a 408 when part of a request had
  arrived (silently otherwise, as a keep-alive close); the body has its own deadline
  (--body-timeout, request_guard.py);
- at most `max_connections` are open (and never more than half the open-files limit); at the cap
  a new connection closes the longest-idle one (waiting for headers or idle between requests), so
  a flood of idle sockets cannot lock out the liveness probe; when every connection is busy with
  a request, the new one gets a 503 with Retry-After;
- when accept() fails for want of file descriptors (asyncio accepts a burst of queued connections
  before any of them is counted against the cap, and then retries the accept after 1 s), every
  idle connection (idle for SHED_MIN_IDLE_SECONDS at least: one just accepted has its request in
  flight, a liveness probe's among them) is closed so that the retry finds descriptors free, the retry comes after
  ACCEPT_RETRY_SECONDS instead of 1 s, and the failures are counted and logged (the first at once,
  then at most every LOG_EVERY_SECONDS) instead of asyncio's traceback per failed accept.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import resource
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("kvpilot.server")

DEFAULT_HEADER_TIMEOUT_SECONDS = 10.0
DEFAULT_MAX_CONNECTIONS = 1024
LOG_EVERY_SECONDS = 10.0  # refusals are counted, and logged at most this often
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)
SHED_EVERY_SECONDS = 0.05
SHED_MIN_IDLE_SECONDS = 0.25  # a connection younger than this (idle so far) has its request in flight: spared
ACCEPT_RETRY_SECONDS = 0.2  # asyncio's is 1 s: the flood queued ahead of a probe drains 5 times faster


def handle_descriptor_exhaustion(loop: asyncio.AbstractEventLoop, protocol: type[asyncio.Protocol]) -> None:
    """Route `loop`'s accept failures to `protocol`'s exception_handler (a guarded_h11 class), and retry
    a failed accept after ACCEPT_RETRY_SECONDS."""
    asyncio.constants.ACCEPT_RETRY_DELAY = ACCEPT_RETRY_SECONDS  # type: ignore[attr-defined]  # read at each retry
    loop.set_exception_handler(protocol.exception_handler)  # type: ignore[attr-defined]


def connection_cap(requested: int) -> int:
    """`requested`, but at most half the process's open-files limit (the rest: model files, threads, logs)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return requested
    return max(1, min(requested, soft // 2))


def _response(status: int, reason: str, code: str, message: str, extra: str = "") -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                                 "param": None, "code": code}}).encode()  # fmt: skip
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"connection: close\r\n{extra}\r\n"
    )
    return head.encode("latin-1") + body


class _Counts:
    """Per server: connections refused or closed, logged at most every LOG_EVERY_SECONDS."""

    def __init__(self) -> None:
        self.header_timeouts = 0
        self.evicted = 0
        self.refused = 0
        self.exhausted = 0  # accepts that failed for want of file descriptors
        self.shed = 0  # idle connections closed to free descriptors
        self.shed_at = -1e9  # loop time of the last shedding
        self.logged_at = 0.0

    def note(self) -> None:
        now = time.monotonic()
        if now - self.logged_at >= LOG_EVERY_SECONDS:
            self.logged_at = now
            log.warning(
                "connections so far: %d timed out before their headers, %d idle ones closed at the connection cap, "
                "%d refused with 503 (every connection busy), %d accepts failed at the open-files limit (%d idle "
                "ones closed to free descriptors)", self.header_timeouts, self.evicted, self.refused, self.exhausted,
                self.shed,
            )  # fmt: skip


def guarded_h11(header_timeout_s: float, max_connections: int) -> type[asyncio.Protocol]:
    """An H11Protocol class for uvicorn.Config(http=...) with these limits."""
    if not header_timeout_s > 0 or max_connections < 1:
        raise ValueError(f"--header-timeout must be > 0 and --max-connections >= 1, got {header_timeout_s}, "
                         f"{max_connections}")  # fmt: skip
    cap = connection_cap(max_connections)
    counts = _Counts()

    live: list[set[Any]] = []  # uvicorn's set of open connections, once one is made (for exception_handler)

    class GuardedH11Protocol(H11Protocol):
        stats = counts
        limit = cap

        @staticmethod
        def exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            """For loop.set_exception_handler: an accept that failed at the open-files limit closes the
            idle connections (counted, logged at most every LOG_EVERY_SECONDS); the rest go to asyncio's."""
            exc = context.get("exception")
            if not (isinstance(exc, OSError) and exc.errno in _OUT_OF_DESCRIPTORS):
                loop.default_exception_handler(context)
                return
            counts.exhausted += 1
            if counts.exhausted == 1:
                counts.logged_at = 0.0  # the first one is logged at once: the operator should know
            # asyncio goes on trying the rest of its accept burst (each failing the same way, each
            # calling this): the idle connections are closed once per burst, not once per try
            now = loop.time()
            if now - counts.shed_at < SHED_EVERY_SECONDS:
                return
            counts.shed_at = now
            idle_before = time.monotonic() - SHED_MIN_IDLE_SECONDS  # one just accepted is not shed before it speaks
            for connection in list(live[0]) if live else []:
                idle = isinstance(connection, GuardedH11Protocol) and connection._idle()
                if idle and connection._idle_since <= idle_before and not connection.transport.is_closing():
                    counts.shed += 1
                    connection._close_quietly_unless_partial(_response(
                        503, "Service Unavailable", "connection_closed",
                        "idle connection closed: the server is at its open-files limit"))  # fmt: skip
            counts.note()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_timer: asyncio.TimerHandle | None = None
            self._cycle_seen: Any = None
            self._idle_since = time.monotonic()
            self._partial = False  # bytes of a request arrived, its headers are not complete yet

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if not live:
                live.append(self.connections)
            if len(self.connections) > cap and not self._make_room():
                counts.refused += 1
                counts.note()
                self._close_with(_response(503, "Service Unavailable", "too_many_connections",
                                           f"the server holds {cap} connections, each busy with a request "
                                           "(--max-connections); retry after 1 s", "retry-after: 1\r\n"))  # fmt: skip
                return
            self._arm()

        def _make_room(self) -> bool:
            idle = [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol) and c._idle()]
            if not idle:
                return False
            oldest = min(idle, key=lambda c: c._idle_since)
            counts.evicted += 1
            counts.note()
            oldest._close_quietly_unless_partial(_response(
                503, "Service Unavailable", "connection_closed",
                "idle connection closed to make room for a new one (--max-connections)"))  # fmt: skip
            return True

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._partial = False
            self._idle_since = time.monotonic()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self._idle() or self.transport.is_closing():
                return
            counts.header_timeouts += 1
            counts.note()
            self._close_quietly_unless_partial(_response(
                408, "Request Timeout", "request_timeout",
                f"the request headers did not arrive within {header_timeout_s:g} s (--header-timeout)"))  # fmt: skip

        def _close_quietly_unless_partial(self, answer: bytes) -> None:
            # With no byte of a request in, the close is a plain keep-alive close: an answer written
            # now could be read as the answer to a request the client is about to send.
            if self._partial:
                self._close_with(answer)
            else:
                self._disarm()
                if not self.transport.is_closing():
                    self.transport.close()

        def _close_with(self, answer: bytes) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(answer)
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not self._cycle_seen:  # a request's headers are complete
                self._cycle_seen = self.cycle
                self._partial = False
                self._disarm()
            elif self._idle():
                self._partial = True

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # keep-alive: the next request's headers have the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedH11Protocol
