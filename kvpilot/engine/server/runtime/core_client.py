"""The API process's stand-in for an LLMEngine whose core runs in its own process (core_process.py).

It offers what the server uses of an engine (add_request, abort_request, step, has_unfinished_requests,
stats, score, the tokenizer and grammar compiler, config and max_model_len), so the engine loop, the
warm-up and the routes run unchanged. Requests are checked here as LLMEngine.add_request checks them,
then sent without waiting; step() returns the outputs the core has sent since the last call.

A core that dies (killed, crashed, out of host memory) closes the pipe: step() then raises
EngineCoreDied, a BaseException, which ends the engine loop the way a dead engine thread does (every
request it holds fails, /health answers 503), and every call waiting for a reply fails with it.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from kvpilot.engine.llm_engine import RequestOutput
from kvpilot.engine.server.runtime.core_process import run_core

log = logging.getLogger("kvpilot.server")

STEP_WAIT_SECONDS = 0.005  # step() waits this long for outputs: new requests wait at most this for the loop
START_POLL_SECONDS = 1.0


class EngineCoreDied(BaseException):
    """The engine core process is gone; nothing it held can finish. (A BaseException: it ends the loop.)"""


class EngineCoreClient:
    """An LLMEngine in a child process, driven over a pipe."""

    def __init__(self, config: Any, on_fatal: Callable[[str], None] | None = None, log_level: str = "WARNING") -> None:
        ctx = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
        self._conn, child = ctx.Pipe(duplex=True)
        # not a daemon: a core may start tensor-parallel ranks of its own; it exits when this end of the pipe closes
        self.process = ctx.Process(target=run_core, args=(config, child, log_level), name="kvpilot-engine-core")
        self.process.start()
        child.close()
        atexit.register(self._close_at_exit)  # before multiprocessing's own exit hook joins the child
        self._on_fatal = on_fatal
        info = self._wait_ready()
        self.config, self.model_config, self.max_model_len = info["config"], info["model_config"], info["max_model_len"]
        from kvpilot.engine.structured.matchers import StructuredOutput
        from kvpilot.engine.tokenizer import Tokenizer

        self.tokenizer = Tokenizer(self.config.model, self.model_config.eos_token_ids)
        # grammars are compiled (and checked) here before admission, as with an in-process engine
        self.structured = StructuredOutput(self.tokenizer, self.model_config.vocab_size, self.tokenizer.eos_token_ids)
        self._send_lock = threading.Lock()
        self._events: queue.SimpleQueue = queue.SimpleQueue()  # ("outputs", list) | ("error", exc) | ("dead", msg)
        self._held: tuple | None = None  # an error event that waits behind outputs already taken
        self._replies: dict[int, Future] = {}
        self._ids = itertools.count()
        self._unfinished: dict[str, int] = {}  # request id -> prompt length
        self.dead: str | None = None
        self._reader = threading.Thread(target=self._read, name="kvpilot-core-reader", daemon=True)
        self._reader.start()

    def _wait_ready(self) -> dict[str, Any]:
        while not self._conn.poll(START_POLL_SECONDS):
            if not self.process.is_alive():
                raise RuntimeError(f"the engine core process exited during start (exit code {self.process.exitcode})")
        try:
            kind, payload = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the engine core process exited during start (exit code {self.process.exitcode})") \
                from None  # fmt: skip
        if kind == "failed":
            self.process.join(5)
            raise payload
        return payload

    # ---- the reader thread ----
    def _read(self) -> None:
        try:
            while True:
                message = self._conn.recv()
                kind = message[0]
                if kind == "outputs":
                    self._events.put(("outputs", message[1]))
                elif kind == "step_error":
                    self._events.put(("error", message[1]))
                elif kind == "add_error":
                    self._events.put(("add_error", message[1:]))
                elif kind == "reply":
                    future = self._replies.pop(message[1], None)
                    if future is not None and message[2]:
                        future.set_result(message[3])
                    elif future is not None:
                        future.set_exception(message[3])
                elif kind == "fatal" and self._on_fatal is not None:
                    self._on_fatal(message[1])
        except (EOFError, OSError) as exc:
            self.process.join(1)
            self.dead = f"the engine core process died (exit code {self.process.exitcode}): {type(exc).__name__}"
            log.critical("%s; failing its requests", self.dead)
            self._events.put(("dead", self.dead))
            for future in list(self._replies.values()):
                future.set_exception(EngineCoreDied(self.dead))
            self._replies.clear()

    def _send(self, message: tuple) -> None:
        if self.dead is not None:
            raise EngineCoreDied(self.dead)
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, EOFError) as exc:
            raise EngineCoreDied(f"the engine core process is gone: {exc}") from exc

    def _call(self, method: str, *args: Any) -> Any:
        future: Future = Future()
        call_id = next(self._ids)
        self._replies[call_id] = future
        self._send(("call", call_id, method, args))
        if self.dead is not None and not future.done():  # died while the call was being sent
            future.set_exception(EngineCoreDied(self.dead))
        return future.result()

    # ---- the engine's interface ----
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: Any) -> None:
        arrival = time.monotonic()  # the engine's TTFT then counts the wait for the core to take the request
        self._check(request_id, prompt_token_ids, params)
        self._send(("add", request_id, list(prompt_token_ids), params, arrival))
        self._unfinished[request_id] = len(prompt_token_ids)

    def _check(self, request_id: str, prompt: list[int], params: Any) -> None:
        """LLMEngine.add_request's refusals, here, so a bad request fails at once with the same message."""
        if request_id in self._unfinished:
            raise ValueError(f"request id {request_id!r} is already in use by an unfinished request")
        if not prompt:
            raise ValueError(f"request {request_id!r}: the prompt must hold at least one token")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab}), got {bad[:5]}")
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(f"logit_bias token id {max(params.logit_bias)} is out of range [0, {vocab})")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt has {len(prompt)} tokens; this engine allows at most {self.max_model_len - 1} "
                             "(max_model_len - 1, leaving room for one generated token)")  # fmt: skip
        budget = self.config.max_num_batched_tokens
        if not self.config.enable_chunked_prefill and len(prompt) > budget:
            raise ValueError(f"prompt has {len(prompt)} tokens but max_num_batched_tokens is {budget} and chunked "
                             "prefill is off; shorten the prompt or enable chunked prefill")  # fmt: skip
        if params.structured is not None:
            self.structured.compiler.compile(params.structured)  # GrammarError; cached for the next request

    def abort_request(self, request_id: str) -> None:
        if request_id in self._unfinished:
            self._send(("abort", request_id))

    def has_unfinished_requests(self) -> bool:
        return bool(self._unfinished) or self._held is not None or self.dead is not None

    def step(self) -> list[RequestOutput]:
        """The outputs the core sent since the last call (waits up to STEP_WAIT_SECONDS for the first)."""
        outputs: list[RequestOutput] = []
        event, self._held = self._held, None
        if event is None:
            try:
                event = self._events.get(timeout=STEP_WAIT_SECONDS)
            except queue.Empty:
                return outputs
        while event is not None:
            kind, payload = event
            if kind == "outputs":
                outputs += payload
            elif kind == "add_error":  # the core refused what passed _check: that request ends, aborted
                request_id, error = payload
                log.warning("the engine core refused request %s: %r", request_id, error)
                outputs.append(RequestOutput(request_id, [], True, "abort", self._unfinished.get(request_id, 0), 0))
            elif outputs:  # an error or the core's death: after the outputs taken so far
                self._held = event
                break
            elif kind == "dead":
                self._held = event  # every later step raises too
                raise EngineCoreDied(payload)
            else:
                raise payload
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                event = None
        for output in outputs:
            if output.finished:
                self._unfinished.pop(output.request_id, None)
        return outputs

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def reset_stats(self) -> None:
        self._call("reset_stats")

    def record_rejection(self, reason: str) -> None:
        self._send(("call", None, "record_rejection", (reason,)))  # no reply: counting must not wait a step

    def score(self, prompt_token_ids: list[int], continuation_token_ids: list[int]) -> list[float]:
        return self._call("score", list(prompt_token_ids), list(continuation_token_ids))

    def score_tokens(self, prompt_token_ids: list[int], continuation_token_ids: list[int], top: int = 0) -> Any:
        return self._call("score_tokens", list(prompt_token_ids), list(continuation_token_ids), top)

    def _close_at_exit(self) -> None:
        """The API process is exiting without shutdown(): ask the core to stop, then wait (a bounded time)."""
        if self.process.is_alive():
            with contextlib.suppress(BaseException):
                self._send(("stop",))
            self.process.join(10)
            if self.process.is_alive():
                self.process.terminate()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the core (its tensor-parallel ranks with it) and wait for the process."""
        if self.process.is_alive() and self.dead is None:
            with contextlib.suppress(EngineCoreDied):
                self._send(("stop",))
        deadline = time.monotonic() + timeout
        self.process.join(max(0.0, deadline - time.monotonic()))
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
