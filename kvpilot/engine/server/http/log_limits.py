"""Repeated log records are rate-limited: an attacker who makes every connection fail the same way
must not fill the disk with tracebacks (53k of them, 24 MB, in one probe)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

BURST = 10  # records of one kind let through per window
WINDOW_SECONDS = 60.0
SERVER_LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access")


class RepeatFilter(logging.Filter):
    """At most BURST records of one kind (logger, message template's first line, exception type) per window; the
    first one after a window that dropped some says how many were dropped."""

    def __init__(self, burst: int = BURST, window_s: float = WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[tuple[str, str, str], list[float | int]] = {}  # kind -> [window start, passed, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        # The first line only: asyncio's "Exception in callback ..." records go on with a line per
        # context item, one of them the handle's due time, so no two of them were of one kind (a
        # flood of accept retries after an open-files exhaustion logged 7,000 tracebacks).
        kind = (record.name, str(record.msg).split("\n", 1)[0][:200], exc)
        now = self._clock()
        entry = self._seen.get(kind)
        if entry is None or now - entry[0] >= self.window_s:
            dropped = int(entry[2]) if entry is not None else 0
            self._seen[kind] = [now, 1, 0]
            if len(self._seen) > 1000:  # kinds are few; a flood of distinct ones must not grow this forever
                self._seen = {kind: self._seen[kind]}
            if dropped:
                record.msg = f"{record.msg} [{dropped} more like this in the last {self.window_s:g} s were not logged]"
            return True
        if entry[1] < self.burst:
            entry[1] += 1
            return True
        entry[2] += 1
        return False


def limit_repeats(loggers: tuple[str, ...] = SERVER_LOGGERS) -> RepeatFilter:
    """Add one RepeatFilter to every handler of these loggers (root included); returns it."""
    repeat = RepeatFilter()
    for name in loggers:
        for handler in logging.getLogger(name or None).handlers:
            if not any(isinstance(f, RepeatFilter) for f in handler.filters):
                handler.addFilter(repeat)
    return repeat
