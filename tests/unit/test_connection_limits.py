"""Issue 33 item 8: the connection cap stays under the open-files limit, and repeated log records
are rate-limited (a flood of failing connections must not fill the log)."""

from __future__ import annotations

import logging
import resource

import pytest

from kvpilot.engine.server.http.connections import connection_cap
from kvpilot.engine.server.http.log_limits import RepeatFilter

pytestmark = pytest.mark.unit


def test_the_connection_cap_is_at_most_half_the_open_files_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 4096))
    assert connection_cap(1024) == 128 and connection_cap(100) == 100
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert connection_cap(1024) == 1024


def _record(msg: str, exc: type[BaseException] | None = None) -> logging.LogRecord:
    info = (exc, exc(), None) if exc is not None else None
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, info)  # type: ignore[arg-type]


def test_repeated_records_are_rate_limited_and_the_dropped_ones_counted() -> None:
    now = [0.0]
    repeat = RepeatFilter(burst=3, window_s=60, clock=lambda: now[0])
    passed = [repeat.filter(_record("socket.accept() out of system resource", OSError)) for _ in range(53_000)]
    assert sum(passed) == 3  # 53k tracebacks became 3
    assert repeat.filter(_record("another message"))  # other kinds are not affected
    now[0] = 61.0
    summary = _record("socket.accept() out of system resource", OSError)
    assert repeat.filter(summary) and "[52997 more like this in the last 60 s were not logged]" in summary.msg


def test_records_that_differ_after_their_first_line_are_one_kind() -> None:
    # asyncio's "Exception in callback" records go on with the handle's due time: 7,000 distinct
    # records after an open-files exhaustion, each with its traceback.
    repeat = RepeatFilter(burst=3, window_s=60, clock=lambda: 0.0)
    records = [_record(f"Exception in callback _start_serving()\nhandle: <TimerHandle when={i}.5>", ValueError)
               for i in range(1000)]  # fmt: skip
    assert sum(repeat.filter(r) for r in records) == 3
