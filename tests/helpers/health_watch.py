"""Polls a server's /health in a thread while a test attacks it; records each answer's latency."""

from __future__ import annotations

import threading
import time

import httpx


class HealthWatch:
    """`with HealthWatch(url) as watch: ...`; then `watch.statuses`, `watch.latencies`, `watch.worst`."""

    def __init__(self, base_url: str, interval_s: float = 0.02, *, keep_alive: bool = True) -> None:
        """keep_alive=False: each probe on a new connection, closed after it, as the kubelet's HTTP probe does
        (it disables keep-alive). A server that closes idle keep-alive connections (at its open-files limit)
        may close the watch's between two probes, which a keep-alive client sees as a failed request."""
        self.url = base_url + "/health"
        self.interval_s = interval_s
        self.keep_alive = keep_alive
        self.latencies: list[float] = []
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        headers = {} if self.keep_alive else {"connection": "close"}  # close: the next probe opens a new one
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    self.statuses.append(client.get(self.url, headers=headers).status_code)
                except httpx.HTTPError:
                    self.statuses.append(0)
                self.latencies.append(time.monotonic() - start)
                time.sleep(self.interval_s)

    @property
    def worst(self) -> float:
        return max(self.latencies, default=0.0)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)  # one more round after the attack returned
        self._stop.set()
        self._thread.join(90)
