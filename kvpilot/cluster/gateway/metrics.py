"""The gateway's own Prometheus metrics: requests per backend Service and status code.

nginx writes one line per request (`$kvp_target $status`, nginx_conf.METRICS_LOG); the controller
reads the new lines on every sync and counts them by the backend the target names. This is what a
canary analysis needs from a gateway: a 502/503/504 the gateway answered for a backend (a crashed
pod, no ready endpoint, a timeout) never reaches the engine's own error counter.

    kvpilot_gateway_requests_total{namespace="ns", service="chat-canary", code="503"} 4

Requests no route matched count with an empty namespace and service. Every backend's 2xx and 5xx
series start at 0 when the backend first appears, so `increase()` over a window sees the first error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

ROTATE_BYTES = 32 * 2**20  # the log is renamed (nginx reopens on SIGUSR1) past this size
PRESET_CODES = ("200", "500", "502", "503", "504")

Key = tuple[str, str, str]  # namespace, service, code


class BackendCounters(Collector):
    """Counts from nginx's metrics log; `read()` is called by the controller, `collect()` by scrapes."""

    def __init__(self, path: Path, reopen: Callable[[], None] | None = None) -> None:
        self.path, self.reopen = path, reopen
        self.offset = 0
        self.rotated: Path | None = None
        self.rotated_offset = 0
        self.targets: dict[str, tuple[str, str]] = {}
        self.counts: dict[Key, int] = {}
        self._partial = b""

    def set_targets(self, targets: Mapping[str, tuple[str, str]]) -> None:
        """The render's target names -> (namespace, Service); new backends get zero series."""
        self.targets.update(targets)
        for namespace, service in set(targets.values()):
            for code in PRESET_CODES:
                self.counts.setdefault((namespace, service, code), 0)

    def read(self) -> int:
        """Count the lines written since the last call; returns how many were counted."""
        counted = 0
        if self.rotated is not None:
            counted += self._count(self._read_from(self.rotated, self.rotated_offset)[0])
            self.rotated.unlink(missing_ok=True)
            self.rotated = None
        data, self.offset = self._read_from(self.path, self.offset)
        counted += self._count(data)
        if self.offset > ROTATE_BYTES and self.reopen is not None:
            self.rotated = self.path.with_suffix(".log.1")
            os.replace(self.path, self.rotated)
            self.rotated_offset, self.offset = self.offset, 0
            self.reopen()  # nginx writes a new file; what it still wrote to the old one is read next time
        return counted

    def _read_from(self, path: Path, offset: int) -> tuple[bytes, int]:
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size < offset:  # truncated or replaced behind us
                    offset = 0
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return b"", 0
        return data, offset + len(data)

    def _count(self, data: bytes) -> int:
        data, counted = self._partial + data, 0
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            target, _, code = line.decode(errors="replace").strip().rpartition(" ")
            if not code.isdigit():
                continue
            namespace, service = self.targets.get(target, ("", ""))
            key = (namespace, service, code)
            self.counts[key] = self.counts.get(key, 0) + 1
            counted += 1
        return counted

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("kvpilot_gateway_requests", "Requests the gateway answered, by backend "
                                     "Service and HTTP status (empty service: no route matched)",
                                     labels=["namespace", "service", "code"])
        for (namespace, service, code), value in sorted(self.counts.items()):
            family.add_metric([namespace, service, code], value)
        yield family
