"""The engine collector: reads the engine at every scrape and serves nothing stale."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import httpx
from prometheus_client.core import Metric

from kvpilot.sidecar.engine_watch import EngineWatch
from kvpilot.sidecar.feed import AGE_METRIC, feed_age
from kvpilot.sidecar.readings import Readings, build_families
from kvpilot.sidecar.schema import ENGINE_DERIVED, HEALTH
from kvpilot.sidecar.sources import EngineSource, SourceError

log = logging.getLogger("kvpilot.sidecar")

DEFAULT_MAX_STATS_AGE_SECONDS = 5.0


class EngineCollector:
    """One collector per source: each collect() reads the engine once and yields what it saw.

    When the engine cannot be read, only `kvpilot_engine_up 0`, the restart counter and the scrape
    duration are served: no engine-derived family, so Prometheus marks them stale instead of
    storing last known values as if fresh. The same holds while the feed's snapshot is older than
    `max_age_s` (the engine thread is busy): the engine is up, its figures are not current.
    """

    def __init__(
        self,
        source: EngineSource,
        timeout_s: float = 2.0,
        client: httpx.Client | None = None,
        max_age_s: float = DEFAULT_MAX_STATS_AGE_SECONDS,
    ) -> None:
        self.source = source
        self.max_age_s = max_age_s
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
            self._log_problem(f"engine not readable, exporting kvpilot_engine_up 0: {exc}")
        except Exception as exc:  # a feed shaped in a way no check foresaw: down, never a 500 on /metrics
            identity, up, readings = None, False, Readings()
            self._log_problem(f"engine feed unreadable ({type(exc).__name__}), exporting kvpilot_engine_up 0")
        duration = time.perf_counter() - start
        if up:
            age = feed_age(readings)
            if age is not None and age > self.max_age_s:
                # The age changes every scrape: the log line names the limit, not the age.
                self._log_problem(f"the engine's stats snapshot is older than --max-stats-age {self.max_age_s:g} s "
                                  "(its engine thread is busy): engine figures withheld until it answers")
            else:
                self._log_up()
        self.watch.observe(up, identity)
        return up, duration, readings

    def collect(self) -> Iterator[Metric]:
        up, duration, readings = self.read()
        age = feed_age(readings) if up else None
        health = Readings()
        health.put("kvpilot_engine_up", 1.0 if up else 0.0)
        health.put("kvpilot_engine_restarts_total", float(self.watch.restarts))
        health.put("kvpilot_engine_scrape_duration_seconds", duration)
        health.put(AGE_METRIC, age)
        yield from build_families(health, HEALTH)
        if up and not (age is not None and age > self.max_age_s):
            yield from build_families(readings, ENGINE_DERIVED)

    def _log_problem(self, message: str) -> None:
        # Once per distinct message: a sidecar beside a dead engine must not flood the log.
        with self._log_lock:
            if message != self._last_error:
                log.warning("%s", message)
                self._last_error = message

    def _log_up(self) -> None:
        with self._log_lock:
            if self._last_error is not None:
                log.info("engine readable again at %s", self.source.url)
                self._last_error = None
