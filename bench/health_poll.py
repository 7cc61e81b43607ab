"""`/health` polled every 20 ms while a bench attacks a running `kvpilot serve`, from a process of
its own: the bench's own work (JSON-encoding big bodies holds the GIL for hundreds of ms) must not
show up as the server's latency. Used by bench_reliability_attacks.py and bench_big_prompt_health.py."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import httpx


class HealthWatch:
    """`with HealthWatch(base_url) as watch: ...`; then `watch.latencies` (s), `watch.statuses` (0: no answer),
    `watch.worst` and `watch.p99`."""

    def __init__(self, base: str, interval_s: float = 0.02) -> None:
        self._stop = multiprocessing.Event()
        self._parent, child = multiprocessing.Pipe()
        self._proc = multiprocessing.Process(
            target=_poll, args=(base + "/health", interval_s, self._stop, child), daemon=True
        )
        self.latencies: list[float] = []
        self.statuses: list[int] = []

    def __enter__(self) -> HealthWatch:
        self._proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.3)  # one more round after the attack returned
        self._stop.set()
        self.latencies, self.statuses = self._parent.recv()
        self._proc.join(30)

    @property
    def worst(self) -> float:
        return max(self.latencies, default=0.0)

    @property
    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


def _poll(url: str, interval_s: float, stop: Any, out: Any) -> None:
    latencies, statuses = [], []
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            start = time.monotonic()
            try:
                statuses.append(client.get(url).status_code)
            except httpx.HTTPError:
                statuses.append(0)
            latencies.append(time.monotonic() - start)
            time.sleep(interval_s)
    out.send((latencies, statuses))


def wait_ready(base: str, tries: int) -> None:
    """Poll `base`/ready every 0.2 s, at most `tries` times, until the server answers 200."""
    for _ in range(tries):
        try:
            if httpx.get(base + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
