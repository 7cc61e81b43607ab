"""The one thread that owns the engine: it adds, aborts and steps requests, and hands outputs back."""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kvpilot.engine.server.runtime.engine_handle import EngineHandle
from kvpilot.engine.server.runtime.oom import OomRecovery, is_out_of_memory

log = logging.getLogger("kvpilot.server")

IDLE_POLL_SECONDS = 0.05


class RequestSink(Protocol):
    """Receives one request's events. Called on the engine thread; must only hand off, never block."""

    def accepted(self) -> None: ...
    def output(self, output: Any) -> None: ...
    def failed(self, error: BaseException) -> None: ...


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: Any
    sink: RequestSink


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    fn: Callable[[Any], Any]
    future: concurrent.futures.Future
    heavy: bool = False  # a forward pass of its own (a score): at most one between two steps


class EngineLoop:
    """Runs `engine.step()` on one dedicated thread; every engine call goes through this thread.

    A failure while adding or delivering one request fails that request only. A failure inside
    `step()` names no request, so the loop suspects the requests added since the last good step
    (a new prompt is the usual trigger): it fails and aborts those and steps again. If a step
    fails with no new request to blame, every request inside the engine is failed and aborted
    (their blocks freed). Either way the loop carries on with new requests.

    An out-of-memory error in a step is not a request's fault: the newest running sequence is
    preempted (its blocks freed, recomputed later), the batch runs smaller for a while, and the
    step is retried (oom.py); only after MAX_OOM_RETRIES in a row are the step's requests failed.

    Anything that still escapes (an error inside that handling, a BaseException) kills the loop:
    every request it holds or is yet to take fails at once with an error, new ones fail on
    submit, `fatal` names the cause, and the server's /health turns 503 so the pod restarts.
    """

    def __init__(
        self,
        engine: EngineHandle,
        *,
        name: str = "kvpilot-engine",
        before_step: Callable[[], None] | None = None,
        on_death: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self._before_step = before_step  # test-only fault injection (added latency)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, RequestSink] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._fresh: set[str] = set()  # added since the last step that succeeded
        self._heavy: deque[_Call] = deque()  # scores waiting for their turn between two steps
        self.oom = OomRecovery(engine)
        self.steps = 0
        self.step_failures = 0
        self.fatal: BaseException | None = None  # what killed the loop, if something did
        self._dead = False
        self._on_death = on_death

    # ---- any thread ----
    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, request_id: str, prompt_token_ids: list[int], params: Any, sink: RequestSink) -> None:
        if self._dead:
            _safe(sink.failed, RuntimeError("the engine loop has died; the server must restart"))
            return
        self._inbox.put(_Add(request_id, list(prompt_token_ids), params, sink))
        if self._dead:  # it died while this was being queued: nobody will take it
            self._fail_waiting(RuntimeError("the engine loop has died; the server must restart"))

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    def call(self, fn: Callable[[Any], Any], *, heavy: bool = False) -> concurrent.futures.Future:
        """Run `fn(engine)` on the engine thread between two steps. `heavy` calls (each a forward
        pass of its own) run one per step, so a burst of them cannot stall running streams."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        if not self.alive or self._dead:
            future.set_exception(RuntimeError("the engine loop is not running"))
            return future
        self._inbox.put(_Call(fn, future, heavy))
        if self._dead:  # it died while this was being queued
            self._fail_waiting(RuntimeError("the engine loop has died; the server must restart"))
        return future

    def stop(self, timeout: float = 10.0) -> None:
        """Abort whatever is still in the engine, then end the thread."""
        self._stop.set()
        self._inbox.put(None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ---- engine thread ----
    def _run(self) -> None:
        log.info("engine loop started")
        try:
            while not self._stop.is_set():
                busy = self._has_work() or bool(self._heavy)
                self._drain(block=not busy)
                if self._stop.is_set():
                    break
                if self._heavy:
                    self._run_call(self._heavy.popleft())
                if self._has_work():
                    self._step()
        except BaseException as exc:  # what the step's own handling could not contain: the loop is dead
            self.fatal = exc
            log.critical("the engine loop died (%s); failing every request; /health now answers 503",
                         type(exc).__name__, exc_info=True)  # fmt: skip
            self._fail_all(RuntimeError(f"the engine loop died ({type(exc).__name__}); the server must restart"))
            if self._on_death is not None:
                _safe(self._on_death, f"the engine loop died: {type(exc).__name__}: {exc}")
            return
        self._shutdown()
        log.info("engine loop stopped after %d steps", self.steps)

    def _has_work(self) -> bool:
        try:
            return bool(self.engine.has_unfinished_requests())
        except Exception:
            log.exception("engine.has_unfinished_requests() failed")
            return False

    def _drain(self, block: bool) -> None:
        try:
            command = self._inbox.get(timeout=IDLE_POLL_SECONDS) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while command is not None:
            self._handle(command)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, command: _Add | _Abort | _Call) -> None:
        if isinstance(command, _Add):
            self._add(command)
        elif isinstance(command, _Abort):
            self._abort(command.request_id)
        elif command.heavy:
            self._heavy.append(command)
        else:
            self._run_call(command)

    def _add(self, command: _Add) -> None:
        try:
            self.engine.add_request(command.request_id, command.prompt_token_ids, command.params)
        except Exception as exc:
            log.warning("request %s was not accepted by the engine: %r", command.request_id, exc)
            _safe(command.sink.failed, exc)
            return
        self._sinks[command.request_id] = command.sink
        self._fresh.add(command.request_id)
        _safe(command.sink.accepted)

    def _abort(self, request_id: str) -> None:
        sink = self._sinks.pop(request_id, None)
        if sink is None:
            return
        try:
            self.engine.abort_request(request_id)
        except Exception:
            log.exception("engine.abort_request(%s) failed", request_id)

    def _run_call(self, command: _Call) -> None:
        if not command.future.set_running_or_notify_cancel():
            return
        try:
            command.future.set_result(command.fn(self.engine))
        except BaseException as exc:
            command.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise  # a BaseException kills the loop; the caller has its error already

    def _step(self) -> None:
        if self._before_step is not None:
            self._before_step()
        try:
            outputs = self.engine.step()
        except Exception as exc:
            if is_out_of_memory(exc) and self.oom.on_oom(exc):
                return
            self.step_failures += 1
            suspects = [r for r in self._sinks if r in self._fresh] or list(self._sinks)
            self._fresh.clear()
            log.exception("engine.step() failed; failing %d of %d requests", len(suspects), len(self._sinks))
            for request_id in suspects:
                sink = self._sinks[request_id]
                self._abort(request_id)
                _safe(sink.failed, exc)
            return
        self.steps += 1
        self.oom.on_good_step()
        self._fresh.clear()
        for output in outputs:
            sink = self._sinks.get(output.request_id)
            if sink is None:
                continue  # aborted meanwhile, or the warm-up's own request
            if output.finished:
                self._sinks.pop(output.request_id, None)
            try:
                sink.output(output)
            except Exception as exc:
                log.exception("delivering output of %s failed", output.request_id)
                if not output.finished:
                    self._abort(output.request_id)
                _safe(sink.failed, exc)

    def _shutdown(self) -> None:
        error = RuntimeError("the server is shutting down; the request was aborted")
        for request_id, sink in list(self._sinks.items()):
            self._abort(request_id)
            _safe(sink.failed, error)
        self._fail_waiting(error)

    def _fail_all(self, error: BaseException) -> None:
        """The loop died: fail every request it holds or has not yet taken (no engine call: it may be broken)."""
        self._dead = True
        for sink in list(self._sinks.values()):
            _safe(sink.failed, error)
        self._sinks.clear()
        self._fail_waiting(error)

    def _fail_waiting(self, error: BaseException) -> None:
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Add):
                _safe(command.sink.failed, error)
            elif isinstance(command, _Call) and not command.future.done():
                command.future.set_exception(error)
        for command in self._heavy:
            if not command.future.done():
                command.future.set_exception(error)
        self._heavy.clear()


def _safe(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("request sink callback failed")
