"""The engine collector: reads the engine at every scrape and serves nothing stale."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import httpx
from prometheus_client.core import Metric

from kvpilot.sidecar.engine_watch import EngineWatch
from kvpilot.sidecar.readings import Readings, build_families
from kvpilot.sidecar.schema import ENGINE_DERIVED, spec
from kvpilot.sidecar.sources import EngineSource, SourceError

log = logging.getLogger("kvpilot.sidecar")


class EngineCollector:
    """One collector per source: each collect() reads the engine once and yields what it saw.

    When the engine cannot be read, only `kvpilot_engine_up 0`, the restart counter and the scrape
    duration are served: no engine-derived family, so Prometheus marks them stale instead of
    storing last known values as if fresh.
    """

    def __init__(self, source: EngineSource, timeout_s: float = 2.0, client: httpx.Client | None = None) -> None:
        self.source = source
        # trust_env=False: the engine is on loopback; a proxy from the environment must not intercept.
        self.client = client or httpx.Client(timeout=timeout_s, trust_env=False)
        self.watch = EngineWatch()
        self._last_error: str | None = None
        self._log_lock = threading.Lock()

    def read(self) -> tuple[bool, float, Readings]:
        start = time.perf_counter()
        readings = Readings()
        try:
            identity, readings = self.source.read(self.client)
            up = True
        except SourceError as exc:
            identity, up = None, False
            self._log_down(str(exc))
        duration = time.perf_counter() - start
        if up:
            self._log_up()
        self.watch.observe(up, identity)
        return up, duration, readings

    def collect(self) -> Iterator[Metric]:
        up, duration, readings = self.read()
        health = Readings()
        health.put("kvpilot_engine_up", 1.0 if up else 0.0)
        health.put("kvpilot_engine_restarts_total", float(self.watch.restarts))
        health.put("kvpilot_engine_scrape_duration_seconds", duration)
        yield from build_families(health, (spec("kvpilot_engine_up"), spec("kvpilot_engine_restarts_total"),
                                           spec("kvpilot_engine_scrape_duration_seconds")))
        if up:
            yield from build_families(readings, ENGINE_DERIVED)

    def _log_down(self, reason: str) -> None:
        # Once per distinct reason: a sidecar beside a dead engine must not flood the log.
        with self._log_lock:
            if reason != self._last_error:
                log.warning("engine not readable, exporting kvpilot_engine_up 0: %s", reason)
                self._last_error = reason

    def _log_up(self) -> None:
        with self._log_lock:
            if self._last_error is not None:
                log.info("engine readable again at %s", self.source.url)
                self._last_error = None
