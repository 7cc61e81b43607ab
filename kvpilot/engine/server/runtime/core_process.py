"""The engine core in a process of its own (`kvpilot serve --engine-core process`, as vLLM v1's EngineCore).

The API process keeps HTTP, tokenisation, grammar checks, detokenisation and SSE; this process owns the
LLMEngine and steps it whenever it has work, so the engine's host work and the API's Python no longer
share one interpreter lock. They talk over a pipe (a Unix socket pair, pickled messages):

    API -> core: ("add", request_id, prompt_token_ids, params, arrival_time) | ("abort", request_id)
                 | ("call", call_id or None, method, args)  (None: no reply wanted) | ("stop",)
    core -> API: ("ready", info) | ("failed", error) | ("outputs", [RequestOutput, ...])
                 | ("step_error", error) | ("add_error", request_id, error) | ("reply", call_id, ok, value)
                 | ("fatal", message)  (a tensor-parallel rank died)

Commands are read between steps, all that are waiting; an idle core blocks on the pipe. When the API
process goes away the pipe closes and the core exits.
"""

from __future__ import annotations

import logging
import pickle
import threading
from typing import Any

from kvpilot.engine.server.runtime.engine_handle import EngineHandle

log = logging.getLogger("kvpilot.engine.core_process")

IDLE_POLL_SECONDS = 0.5  # an idle core wakes this often (nothing to do but notice a closed pipe)
CALLS = frozenset({"stats", "reset_stats", "record_rejection", "score", "score_tokens"})  # what "call" may run


def portable(error: BaseException) -> BaseException:
    """The error itself when it pickles, else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def run_core(config: Any, conn: Any, log_level: str = "WARNING") -> None:
    """The core process's main: build the engine, report ready, then step and answer until told to stop."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s [core]: %(message)s")
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        with send_lock:
            conn.send(message)

    from kvpilot.engine.llm_engine import LLMEngine

    try:
        engine = LLMEngine(config, on_fatal=lambda message: send(("fatal", message)))
    except BaseException as exc:
        send(("failed", portable(exc)))
        return
    send(("ready", {"config": engine.config, "model_config": engine.model_config,
                    "max_model_len": engine.max_model_len}))  # fmt: skip
    try:
        _serve(engine, conn, send)
    except (EOFError, OSError):
        log.warning("the API process closed the pipe; the engine core stops")
    finally:
        engine.shutdown()


def _serve(engine: EngineHandle, conn: Any, send: Any) -> None:
    while True:
        busy = engine.has_unfinished_requests()
        timeout = 0.0 if busy else IDLE_POLL_SECONDS
        while conn.poll(timeout):
            message = conn.recv()
            if message[0] == "stop":
                return
            _handle(engine, message, send)
            timeout = 0.0
        if not engine.has_unfinished_requests():
            continue
        try:
            outputs = engine.step()
        except Exception as exc:  # the API side's engine loop decides (fail requests, retry after OOM)
            send(("step_error", portable(exc)))
            continue
        if outputs:
            send(("outputs", outputs))


def _handle(engine: EngineHandle, message: tuple, send: Any) -> None:
    kind = message[0]
    if kind == "add":
        _, request_id, prompt, params, arrival_time = message
        try:
            engine.add_request(request_id, prompt, params, arrival_time)
        except Exception as exc:  # the API checked what it could; anything left fails this request only
            send(("add_error", request_id, portable(exc)))
    elif kind == "abort":
        engine.abort_request(message[1])
    elif kind == "call":
        _, call_id, method, args = message
        try:
            if method not in CALLS:
                raise ValueError(f"the engine core does not run {method!r}")
            value, ok = getattr(engine, method)(*args), True
        except Exception as exc:
            value, ok = portable(exc), False
        if call_id is not None:
            send(("reply", call_id, ok, value))
    else:
        log.error("unknown message %r from the API process", kind)
