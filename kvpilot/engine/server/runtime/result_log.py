"""A response's events, produced once and readable by every caller that asks for the same thing.

The producer (a task driving one generation) appends events; readers replay them from the first
one and then follow live. When the last reader leaves before the end (its client went away),
the producer is cancelled, which aborts the engine request and frees its blocks.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from kvpilot.engine.server.http.errors import APIError


class ResultLog:
    """Append-only events of one response plus its outcome (done, or failed with an APIError)."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.nbytes = 0  # memory the events hold, roughly (the idempotency store is bounded by it)
        self.done = False
        self.started = False  # the engine accepted the request: a stream may send its headers
        self.error: APIError | None = None
        self.readers = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._on_end: list[Callable[[ResultLog], None]] = []

    def run(self, producer: Callable[[ResultLog], Awaitable[None]]) -> None:
        """Start the producer as a task; it must append events and finally call finish()/fail()."""
        self._task = asyncio.get_running_loop().create_task(self._guarded(producer))
        self._task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        # A task cancelled before it ever ran skips _guarded entirely: end the log here too.
        if not self.done:
            self.fail(APIError(499, "the client disconnected; the request was aborted", code="aborted"))

    def cancel(self) -> None:
        """Stop the producer (its engine request is aborted); a no-op once it has ended."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def on_end(self, callback: Callable[[ResultLog], None]) -> None:
        self._on_end.append(callback)

    async def _guarded(self, producer: Callable[[ResultLog], Awaitable[None]]) -> None:
        try:
            await producer(self)
        except asyncio.CancelledError:
            self.fail(APIError(499, "the client disconnected; the request was aborted", code="aborted"))
            raise
        except APIError as exc:
            self.fail(exc)
        except Exception as exc:  # one request's failure is reported to it, nothing else
            message = f"internal error while serving this request ({type(exc).__name__}); see the server log"
            self.fail(APIError(500, message, code="internal_error"))
        finally:
            if not self.done:
                self.finish()

    @property
    def ok(self) -> bool:
        return self.done and self.error is None

    def mark_started(self) -> None:
        self.started = True
        self._notify()

    def append(self, event: Any) -> None:
        self.events.append(event)
        self.nbytes += event_bytes(event)
        self._notify()

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        self._notify()
        for callback in self._on_end:
            callback(self)

    def fail(self, error: APIError) -> None:
        if self.done:
            return
        self.error = error
        self.finish()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_started(self) -> None:
        """Until the engine accepted the request, or the log ended (then check `error`)."""
        while not self.started and not self.events and not self.done:
            await self._changed.wait()

    async def read(self) -> AsyncIterator[Any]:
        """Every event from the first, following live until the end. Raises nothing on failure:
        check `error` after the iteration ends."""
        self.readers += 1
        try:
            index = 0
            while True:
                while index < len(self.events):
                    yield self.events[index]
                    index += 1
                if self.done:
                    return
                await self._changed.wait()
        finally:
            self._release()

    def _release(self) -> None:
        """One reader gone; the last one leaving an unfinished generation cancels it."""
        self.readers -= 1
        if self.readers == 0 and not self.done and self._task is not None:
            self._task.cancel()

    async def read_text(self) -> AsyncIterator[str]:
        """As `read`, for a streamed log (its events are SSE strings): the events already there are
        joined into one string, so a client that fell behind gets one write, not one per event."""
        self.readers += 1
        try:
            index = 0
            while True:
                if index < len(self.events):
                    batch = self.events[index:]
                    index += len(batch)
                    yield batch[0] if len(batch) == 1 else "".join(batch)
                    continue
                if self.done:
                    return
                await self._changed.wait()
        finally:
            self._release()


def event_bytes(event: Any) -> int:
    """Bytes one event holds in memory: the string object, or a whole response's JSON size."""
    if isinstance(event, str):
        return sys.getsizeof(event) + 8  # + the list slot
    return sys.getsizeof(event) + len(json.dumps(event, ensure_ascii=False)) * 4
