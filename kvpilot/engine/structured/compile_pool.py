"""Grammar compiles on threads of their own, each under a time limit.

A schema can take xgrammar seconds to minutes to compile (deep nesting, huge enums, regex
blow-ups). Compiles therefore never share the tokeniser's pool, so plain completions do not wait
behind them, and the caller stops waiting after `timeout_s` of compiling (or of waiting for a
free worker). A compile cannot be interrupted: one past its limit runs on in its thread and is
left to finish (its grammar is then cached); the workers are daemon threads, so such a compile never
delays the exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

COMPILE_WORKERS = 2
COMPILE_TIMEOUT_SECONDS = 10.0
MAX_WAITING = 64  # compiles queued for a worker at most; more are refused as busy


class CompileTimeout(Exception):
    """The compile ran longer than the limit (it goes on in its thread; its result is cached)."""


class CompileBusy(Exception):
    """No worker became free within the limit, or too many compiles are queued."""


class PoolClosed(Exception):
    """The server is shutting down: nobody waits for compiles any more."""


@dataclass
class _Job:
    fn: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    started: asyncio.Event = field(default_factory=asyncio.Event)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class CompilePool:
    """`await pool.run(fn)`: fn() on a compile thread, or CompileTimeout / CompileBusy / PoolClosed."""

    def __init__(self, workers: int = COMPILE_WORKERS, timeout_s: float = COMPILE_TIMEOUT_SECONDS) -> None:
        if workers < 1 or timeout_s <= 0:
            raise ValueError(f"a compile pool needs >= 1 worker and a positive time limit, got {workers}, {timeout_s}")
        self.workers = workers
        self.timeout_s = timeout_s
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed: asyncio.Event | None = None
        self.waiting = 0
        self.running = 0
        self.timeouts_total = 0
        self.busy_total = 0

    async def run(self, fn: Callable[[], Any], *, limited: bool = True) -> Any:
        """fn()'s result (or its exception), waiting at most timeout_s for a worker and timeout_s for fn
        (`limited=False`: as long as fn takes, for one-off set-up such as loading xgrammar)."""
        if self._closed is None:
            self._closed = asyncio.Event()
        if self._closed.is_set():
            raise PoolClosed()
        job = self._submit(fn, asyncio.get_running_loop())
        if not await self._first(job, job.started.wait(), self.timeout_s) and job.future.cancel():
            self.busy_total += 1
            raise CompileBusy()
        if not await self._first(job, asyncio.wrap_future(job.future), None if not limited else self.timeout_s):
            self.timeouts_total += 1
            raise CompileTimeout()
        return job.future.result()

    def close(self) -> None:
        """Every caller waiting for a compile gets PoolClosed now (the threads end with the process)."""
        if self._closed is not None:
            self._closed.set()
        for _ in self._threads:
            self._queue.put(None)

    async def _first(self, job: _Job, awaitable: Any, timeout_s: float | None) -> bool:
        """True when `awaitable` completes within timeout_s; PoolClosed when the pool closes first."""
        assert self._closed is not None
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self._closed.wait())
        try:
            done, _ = await asyncio.wait({task, stop}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
        if self._closed.is_set():
            job.future.cancel()
            raise PoolClosed()
        return task in done

    def _submit(self, fn: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> _Job:
        with self._lock:
            if self.waiting >= MAX_WAITING:
                self.busy_total += 1
                raise CompileBusy()
            self.waiting += 1
            if len(self._threads) < self.workers:
                thread = threading.Thread(target=self._work, name=f"kvpilot-grammar-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        job = _Job(fn, loop)
        self._queue.put(job)
        return job

    # ---- worker threads ----
    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                self.waiting -= 1
            if not job.future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self.running += 1
            with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody waits
                job.loop.call_soon_threadsafe(job.started.set)
            try:
                job.future.set_result(job.fn())
            except BaseException as exc:  # the compile's own error goes to its caller
                job.future.set_exception(exc)
            finally:
                with self._lock:
                    self.running -= 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "running": self.running, "waiting": self.waiting, "timeouts_total": self.timeouts_total,
                "busy_total": self.busy_total,
            }  # fmt: skip
