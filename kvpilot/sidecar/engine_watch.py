"""Engine liveness and restart detection across scrapes."""

from __future__ import annotations

import threading


class EngineWatch:
    """Counts engine restarts from what each scrape saw: up or not, and the engine's identity.

    A new identity (kvpilot's `engine.instance_id`, or a foreign engine's process start time) is a
    restart. An engine seen up, then unreadable, then up again with the SAME identity did not
    restart (a slow feed under load is not a restart), so it is not counted; when the source has
    no identity at all, up -> down -> up is the only evidence and is counted.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.restarts = 0
        self.up: bool | None = None  # None until the first scrape
        self._identity: str | None = None
        self._seen_up = False
        self._down_since_up = False

    def observe(self, up: bool, identity: str | None = None) -> int:
        with self._lock:
            self.up = up
            if not up:
                if self._seen_up:
                    self._down_since_up = True
                return self.restarts
            if identity is not None and self._identity is not None:
                if identity != self._identity:
                    self.restarts += 1
            elif self._down_since_up:
                self.restarts += 1
            if identity is not None:
                self._identity = identity
            self._seen_up = True
            self._down_since_up = False
            return self.restarts
