"""The server's view of the engine: load it off the event loop, warm it up, then serve through
the engine loop. Routes ask the runtime for readiness, admission and the stats feed."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kvpilot.engine.metrics.stats_contract import FAILURE_REASONS
from kvpilot.engine.server.http.errors import APIError
from kvpilot.engine.server.runtime.admission import Admission, not_ready_error
from kvpilot.engine.server.runtime.engine_handle import EngineHandle
from kvpilot.engine.server.runtime.engine_loop import EngineLoop
from kvpilot.engine.server.runtime.faults import FaultInjector
from kvpilot.engine.server.runtime.idempotency import IdempotencyStore
from kvpilot.engine.server.runtime.result_log import ResultLog
from kvpilot.engine.server.runtime.settings import ServerSettings
from kvpilot.engine.server.wire.detokenizer import WORK as DETOKENIZER_WORK
from kvpilot.engine.server.wire.text_checks import longest_token_chars
from kvpilot.engine.structured.compile_pool import CompilePool

log = logging.getLogger("kvpilot.server")

# The feed waits this long for a snapshot between two engine steps, then serves the last one with
# its age: well under the sidecar's 2 s scrape timeout, so a busy engine is never reported down.
STATS_WAIT_SECONDS = 1.0
CPU_WORKERS = 2  # tokenisation and chat templates, off the event loop


class ServerRuntime:
    """Owns the engine's life: loading -> warming_up -> ready -> stopping (or failed)."""

    def __init__(
        self,
        settings: ServerSettings,
        engine_factory: Callable[[], EngineHandle],
        warm_up: Callable[[EngineHandle], Any] | None = None,
        on_ready: Callable[[EngineHandle], None] | None = None,
    ) -> None:
        self.settings = settings
        self.state = "starting"
        self.failure: str | None = None
        self.engine: EngineHandle | None = None
        self.loop: EngineLoop | None = None
        self.admission: Admission | None = None
        self.idempotency = IdempotencyStore(
            settings.idempotency_ttl_seconds, settings.idempotency_max_keys, settings.idempotency_max_bytes
        )
        self.cpu_pool = concurrent.futures.ThreadPoolExecutor(CPU_WORKERS, thread_name_prefix="kvpilot-cpu")
        self.grammar_pool = CompilePool(timeout_s=settings.grammar_compile_timeout)  # never the cpu_pool
        self.in_flight: set[ResultLog] = set()  # completions not yet ended (the drain waits for them)
        self.created = int(time.time())
        self.warmup_seconds: float | None = None
        self._factory = engine_factory
        self._warm_up = warm_up
        self._on_ready = on_ready
        self._last_stats: tuple[float, dict[str, Any]] | None = None  # (taken at, Unix time; snapshot)
        self._stats_pending: concurrent.futures.Future | None = None
        self.faults = FaultInjector(settings.faults)
        # Requests that ended in an error after admission, by reason. Counted here, on the event
        # loop, because every such ending passes through the API layer; merged into the feed.
        self.failed_total: dict[str, int] = dict.fromkeys(FAILURE_REASONS, 0)
        self._loader: threading.Thread | None = None
        self.on_failure: Callable[[str], None] | None = None

    # ---- life cycle ----
    def start_loading(self) -> None:
        self.state = "loading"
        self._loader = threading.Thread(target=self._load, name="kvpilot-engine-load", daemon=True)
        self._loader.start()

    def _load(self) -> None:
        try:
            engine = self._factory()
            self.engine = engine
            if self.settings.chat_template_text is not None:
                engine.tokenizer.chat_template = self.settings.chat_template_text
            compiler = engine.structured.compiler
            compiler.cache_bytes, compiler.max_grammar_bytes = (
                self.settings.grammar_cache_bytes, self.settings.max_grammar_bytes,
            )  # fmt: skip
            if self.state == "stopping":
                return
            if self._warm_up is not None and self.settings.warmup:
                self.state = "warming_up"
                started = time.monotonic()
                self._warm_up(engine)
                self.warmup_seconds = time.monotonic() - started
                _reset_engine_counters(engine)
            self.admission = Admission(
                max_model_len=engine_max_model_len(engine),
                max_num_seqs=int(engine.config.max_num_seqs),
                max_queue=self.settings.max_queue,
                record_rejection=self.record_rejection,
                max_scores=self.settings.max_concurrent_scores,
                max_token_chars=longest_token_chars(engine.tokenizer),
            )
            if self._on_ready is not None:
                self._on_ready(engine)  # before the loop starts: the engine is still this thread's
            self._last_stats = _take_snapshot(engine)
            before_step = self.faults.before_step if self.settings.faults.latency_ms > 0 else None
            self.loop = EngineLoop(engine, before_step=before_step).start()
            if self.state == "stopping":
                self.loop.stop()
                return
            self.state = "ready"
            log.info("engine ready (warm-up %.2f s)", self.warmup_seconds or 0.0)
        except Exception as exc:
            log.exception("the engine failed to start")
            self.failure = f"{type(exc).__name__}: {exc}"
            self.state = "failed"
            if self.on_failure is not None:
                self.on_failure(self.failure)

    def wait_loaded(self, timeout: float | None = None) -> bool:
        if self._loader is not None:
            self._loader.join(timeout)
        return self.state == "ready"

    def begin_drain(self) -> None:
        """Refuse new requests (503, /ready false); the engine loop keeps running the in-flight ones."""
        self.state = "stopping"
        self.grammar_pool.close()  # a request still waiting for its grammar gets a 503 now

    def shutdown(self) -> None:
        self.state = "stopping"
        self.grammar_pool.close()
        if self.loop is not None:
            self.loop.stop()
        self.cpu_pool.shutdown(wait=False, cancel_futures=True)

    def track(self, result: ResultLog) -> None:
        """Count a completion as in flight until it ends (the drain waits for these)."""
        self.in_flight.add(result)
        result.on_end(self.in_flight.discard)

    async def drain(self, grace: float) -> int:
        """Wait up to `grace` seconds for in-flight completions; fail the rest with a shutdown error
        (streams end with it as their last event). Returns how many were cut."""
        deadline = time.monotonic() + grace
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        cut = list(self.in_flight)
        for result in cut:
            self.record_failure("shutdown")
            result.fail(
                APIError(
                    503,
                    f"the server is shutting down: this request did not finish within the {grace:g} s "
                    "shutdown grace (--shutdown-grace) and was aborted; retry it",
                    code="shutdown",
                )
            )
            result.cancel()
        if cut:
            log.warning("drain: %d request(s) still running after %.1f s were aborted", len(cut), grace)
        return len(cut)

    async def run_cpu(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run CPU-heavy work (tokenising, chat templates) on the CPU pool, not the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.cpu_pool, fn, *args)

    # ---- used by routes ----
    @property
    def ready(self) -> bool:
        return self.state == "ready" and self.loop is not None and self.loop.alive

    def require_ready(self) -> tuple[EngineLoop, Admission]:
        if not self.ready or self.loop is None or self.admission is None:
            raise not_ready_error(self.readiness_detail())
        return self.loop, self.admission

    @property
    def engine_failure(self) -> str | None:
        """Why the engine loop died, when it did (after it had started)."""
        if self.loop is None or self.loop.fatal is None:
            return None
        return f"the engine loop died ({type(self.loop.fatal).__name__}); restart the server"

    def readiness_detail(self) -> str:
        if self.engine_failure is not None:
            return self.engine_failure
        if self.state == "failed":
            return f"it failed to start ({self.failure})"
        if self.state == "ready" and self.loop is not None and not self.loop.alive:
            return "the engine loop has stopped"
        return {
            "starting": "the server is starting",
            "loading": "the model weights are loading",
            "warming_up": "the engine is warming up",
            "stopping": "the server is shutting down",
        }.get(self.state, "ready")

    @staticmethod
    def created_now() -> int:
        return int(time.time())

    @property
    def tool_call_parser(self) -> str | None:
        """The parser for tool_choice 'auto' (None: auto is refused)."""
        choice = self.settings.tool_call_parser
        if choice == "auto":
            from kvpilot.engine.server.tools.tool_parsers import detect_parser

            return detect_parser(self.tokenizer.chat_template)
        return None if choice == "none" else choice

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def check_model(self, model: str) -> None:
        if model != self.settings.model_name:
            raise APIError(
                404,
                f"the model {model!r} does not exist here; this server serves {self.settings.model_name!r} "
                "(see GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    def record_rejection(self, reason: str) -> None:
        """Count a rejection in the engine's feed, on the engine thread (the engine is not thread-safe)."""
        # Before the loop runs (loading, warming up) there is no feed to count in yet.
        if self.loop is not None and self.loop.alive:
            self.loop.call(lambda engine: engine.record_rejection(reason))

    def record_failure(self, reason: str) -> None:
        """Count a request that ended in an error (event-loop thread only)."""
        self.failed_total[reason] = self.failed_total.get(reason, 0) + 1

    async def stats(self) -> dict[str, Any] | None:
        """The engine's stats feed, taken on the engine thread between two steps. When the engine
        is busy for longer than STATS_WAIT_SECONDS, the last snapshot, with its age."""
        if self.loop is None or not self.loop.alive:
            return None
        if self._stats_pending is None or self._stats_pending.done():
            # One request to the engine thread at a time: scrapes of a busy engine must not pile up.
            self._stats_pending = self.loop.call(_take_snapshot)
            self._stats_pending.add_done_callback(self._keep_snapshot)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._stats_pending)), STATS_WAIT_SECONDS)
        if self._last_stats is None:
            return None
        taken_at, snapshot = self._last_stats
        return self._with_server_fields(snapshot, taken_at)

    def _keep_snapshot(self, future: concurrent.futures.Future) -> None:
        # Runs on the engine thread when a snapshot arrives, even after the caller stopped waiting.
        if future.cancelled() or future.exception() is not None:
            return
        taken = future.result()
        if self._last_stats is None or taken[0] >= self._last_stats[0]:
            self._last_stats = taken

    def _with_server_fields(self, snapshot: dict[str, Any], taken_at: float) -> dict[str, Any]:
        requests = {**snapshot.get("requests", {}), "failed_total": dict(self.failed_total)}
        # The served name, never the model's file path (labels must not leak the filesystem).
        engine = {**snapshot.get("engine", {}), "model": self.settings.model_name}
        age = max(0.0, time.time() - taken_at)
        return {
            **snapshot, "engine": engine, "requests": requests, "detokenizer": DETOKENIZER_WORK.snapshot(),
            "grammar": self._grammar_stats(),
            "taken_at_seconds": taken_at, "age_seconds": age,
        }  # fmt: skip


    def _grammar_stats(self) -> dict[str, int]:
        """The grammar pool (compiles running, waiting, timed out) and cache (entries, bytes, refusals)."""
        structured = getattr(self.engine, "structured", None)
        cache = structured.compiler.stats() if structured is not None else {}
        return {**self.grammar_pool.stats(), **{f"cache_{k}": v for k, v in cache.items()}}


def _take_snapshot(engine: EngineHandle) -> tuple[float, dict[str, Any]]:
    snapshot = engine.stats()
    return time.time(), snapshot


def engine_max_model_len(engine: EngineHandle) -> int:
    """The context limit the engine enforces (its config may leave it to config.json)."""
    return int(engine.max_model_len)


def _reset_engine_counters(engine: EngineHandle) -> None:
    # Warm-up requests are not traffic: their compile-time latencies must not reach the feed the
    # rollout gates read. The reset gives a new instance_id, so the sidecar restarts its counters.
    engine.reset_stats()
