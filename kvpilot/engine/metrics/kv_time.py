"""KV occupancy integrated over time: live and allocated token-slot-seconds, as counters.

A scrape-time gauge misses short requests: a 60 ms request arriving once a second is caught by a
1 s scrape about 6% of the time, so a 20 s window of a lightly loaded canary can read 0/0 (no data)
although it served twenty requests. The integral counts every step, so the efficiency over any
window is increase(live) / increase(allocated), and it is no data only if nothing ran at all.
"""

from __future__ import annotations

from collections.abc import Callable

# kv_occupancy walks every live sequence's block table: measure at most this often while busy
# (a zero-order hold in between), which keeps it far below 1% of step time at large batches.
SAMPLE_INTERVAL_S = 0.05


class KvOccupancyIntegral:
    """live and allocated token slots, held between samples and integrated over engine time."""

    def __init__(self, now: float, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.live_total = 0.0
        self.allocated_total = 0.0
        self._since = now
        self._live = 0
        self._allocated = 0
        self._measured_at = float("-inf")

    def _advance(self, now: float) -> None:
        dt = max(now - self._since, 0.0)
        self.live_total += self._live * dt
        self.allocated_total += self._allocated * dt
        self._since = max(now, self._since)

    def busy(self, now: float, measure: Callable[[], tuple[int, int]]) -> None:
        """A step ended with sequences still running: count the time so far, then hold `measure()`
        (live, allocated) if the last sample is older than the interval or the engine held nothing
        (a request's first step is always measured)."""
        self._advance(now)
        if self._allocated == 0 or now - self._measured_at >= self.interval_s:
            self._live, self._allocated = measure()
            self._measured_at = now

    def idle(self, now: float) -> None:
        """No sequence holds KV any more: count the time so far, then hold nothing."""
        self._advance(now)
        self._live = self._allocated = 0

    def totals(self, now: float) -> tuple[float, float]:
        """(live, allocated) token-slot-seconds up to `now`, without changing the state."""
        dt = max(now - self._since, 0.0)
        return self.live_total + self._live * dt, self.allocated_total + self._allocated * dt
