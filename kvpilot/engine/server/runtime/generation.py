"""One request inside the engine, seen from asyncio: its text arrives as a stream of deltas."""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from kvpilot.engine.server.runtime.engine_loop import EngineLoop
from kvpilot.engine.server.wire.detokenizer import Decoder, IncrementalText
from kvpilot.engine.server.wire.logprobs import TokenLogprobs

log = logging.getLogger("kvpilot.server")


class EngineFailure(Exception):
    """The engine failed this request (it was rejected, or the step running it raised)."""

    def __init__(self, request_id: str, cause: BaseException) -> None:
        super().__init__(f"request {request_id} failed inside the engine: {type(cause).__name__}: {cause}")
        self.cause = cause


@dataclass
class TextDelta:
    text: str
    finish_reason: str | None  # set on the last delta only
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: TokenLogprobs | None = None  # the tokens since the last delta, when logprobs were asked


_FAILED = object()


class _Mailbox:
    """Hands callbacks from the engine thread to one asyncio loop, waking the loop once per batch.

    `call_soon_threadsafe` per output writes to the loop's self-pipe each time: with hundreds of
    streams that is hundreds of syscalls and wake-ups per engine step, paid on the engine thread.
    Here the first post of a batch schedules one flush; later posts before the flush only append.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[Any, Any]] = []

    def post(self, fn: Any, arg: Any) -> None:
        with self._lock:
            self._items.append((fn, arg))
            if len(self._items) > 1:
                return  # a flush is already scheduled and has not run yet
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the event loop is closed, so nobody is waiting any more
            with self._lock:
                self._items.clear()

    def _flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for fn, arg in items:
            try:
                fn(arg)
            except Exception:
                log.exception("delivering an engine event to a request failed")


_MAILBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = weakref.WeakKeyDictionary()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    box = _MAILBOXES.get(loop)
    if box is None:
        box = _MAILBOXES[loop] = _Mailbox(loop)
    return box


class Generation:
    """Submits one request to the engine loop and turns its outputs into text deltas.

    Implements the loop's RequestSink: the engine thread calls accepted/output/failed, which
    only hand the event to the asyncio loop.
    """

    def __init__(
        self,
        engine_loop: EngineLoop,
        request_id: str,
        prompt_token_ids: list[int],
        params: Any,
        tokenizer: Decoder,
        stop: list[str],
    ) -> None:
        self.request_id = request_id
        self._engine_loop = engine_loop
        self._prompt_token_ids = prompt_token_ids
        self._params = params
        self._aio = asyncio.get_running_loop()
        self._mailbox = _mailbox(self._aio)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._accepted: asyncio.Future = self._aio.create_future()
        self.first_output = asyncio.Event()  # set when the engine's first output (or failure) arrives
        self._text = IncrementalText(tokenizer, stop)
        self.finished = False
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_cached_tokens = 0
        self._logprobs: TokenLogprobs | None = None
        self.wants_logprobs = getattr(params, "logprobs", None) is not None

    # ---- RequestSink (engine thread) ----
    def accepted(self) -> None:
        self._to_aio(self._set_accepted, None)

    def output(self, output: Any) -> None:
        self._to_aio(self._deliver, output)

    def failed(self, error: BaseException) -> None:
        self._to_aio(self._set_accepted, error)
        self._to_aio(self._deliver, (_FAILED, error))

    def _deliver(self, item: Any) -> None:
        self._queue.put_nowait(item)
        self.first_output.set()

    def _to_aio(self, fn: Any, arg: Any) -> None:
        self._mailbox.post(fn, arg)

    def _set_accepted(self, error: BaseException | None) -> None:
        if self._accepted.done():
            return
        if error is None:
            self._accepted.set_result(None)
        else:
            self._accepted.set_exception(EngineFailure(self.request_id, error))

    # ---- asyncio side ----
    async def start(self) -> None:
        """Hand the request to the engine; raises EngineFailure if the engine refuses it."""
        self._engine_loop.submit(self.request_id, self._prompt_token_ids, self._params, self)
        await self._accepted

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine_loop.abort(self.request_id)

    async def deltas(self) -> AsyncIterator[TextDelta]:
        """Text deltas until the request finishes; the last one carries the finish reason.

        Outputs that queued up while the consumer was busy come out as one delta (one SSE event
        instead of several): a loaded server sends fewer, larger events instead of falling behind.
        """
        while not self.finished:
            items = [await self._queue.get()]
            while not self._queue.empty():
                items.append(self._queue.get_nowait())
            merged: TextDelta | None = None
            for item in items:
                if self.finished:
                    break
                if isinstance(item, tuple) and item and item[0] is _FAILED:
                    self.finished = True
                    if merged is not None:
                        yield merged
                    raise EngineFailure(self.request_id, item[1])
                delta = self._consume(item)
                if delta is not None:
                    merged = delta if merged is None else _merge(merged, delta)
            if merged is not None:
                yield merged

    def _consume(self, output: Any) -> TextDelta | None:
        self.num_prompt_tokens = output.num_prompt_tokens or self.num_prompt_tokens
        self.num_cached_tokens = output.num_cached_tokens or 0
        if output.logprobs:
            pending = self._logprobs if self._logprobs is not None else TokenLogprobs()
            for token, (lp, top) in zip(output.new_token_ids, output.logprobs, strict=True):
                pending.add(token, lp, top)
            self._logprobs = pending
        text = self._text.add(list(output.new_token_ids))
        finish_reason = output.finish_reason if output.finished else None
        if self._text.stopped and not output.finished:
            # A stop string ended the text before the engine saw it: stop generating now.
            self.abort()
            finish_reason = "stop"
        elif output.finished:
            self.finished = True
            text += self._text.finish()
            if self._text.stopped:
                finish_reason = "stop"
        if not text and finish_reason is None:
            return None
        logprobs, self._logprobs = self._logprobs, None
        return TextDelta(
            text=text,
            finish_reason=finish_reason,
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=len(self._text.token_ids),
            cached_tokens=self.num_cached_tokens,
            logprobs=logprobs,
        )


def _merge(first: TextDelta, then: TextDelta) -> TextDelta:
    if first.logprobs is not None and then.logprobs is not None:
        first.logprobs.extend(then.logprobs)
    return TextDelta(
        text=first.text + then.text,
        finish_reason=then.finish_reason or first.finish_reason,
        prompt_tokens=then.prompt_tokens,
        completion_tokens=then.completion_tokens,
        cached_tokens=then.cached_tokens,
        logprobs=first.logprobs if first.logprobs is not None else then.logprobs,
    )
