"""Idempotency keys: a retried request with the same key and body gets the same completion.

Entries live for `ttl_seconds` after they were created; at most `max_keys` are kept, holding at
most `max_bytes` of events together (the oldest go first; a stream grows while it runs, so the
bytes are summed again whenever a key is added). Only results still running or finished successfully are kept: a failed or
aborted one is forgotten, so a retry with the same key generates afresh.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvpilot.engine.server.http.errors import APIError
from kvpilot.engine.server.runtime.result_log import ResultLog

IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255
DEFAULT_MAX_BYTES = 256 * 1024 * 1024


def body_fingerprint(path: str, body: Any) -> str:
    canonical = json.dumps({"path": path, "body": body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class _Entry:
    fingerprint: str
    log: ResultLog
    created: float


class IdempotencyStore:
    """Maps key -> the ResultLog of the request first sent with it."""

    def __init__(
        self,
        ttl_seconds: float = 600.0,
        max_keys: int = 10_000,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_seconds <= 0 or max_keys < 1 or max_bytes < 1:
            raise ValueError(
                f"idempotency ttl must be > 0, max keys >= 1 and max bytes >= 1, got {ttl_seconds}, {max_keys}, "
                f"{max_bytes}"
            )
        self.ttl_seconds = ttl_seconds
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes the kept results hold now."""
        return sum(entry.log.nbytes for entry in self._entries.values())

    @staticmethod
    def check_key(key: str) -> str:
        if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
            raise APIError(
                400,
                f"{IDEMPOTENCY_HEADER} must be 1-{MAX_KEY_LENGTH} printable characters, got {len(key)}",
                param=IDEMPOTENCY_HEADER,
                code="invalid_idempotency_key",
            )
        return key

    def lookup(self, key: str, fingerprint: str) -> ResultLog | None:
        """The log to join for this key, None if the key is new; 422 if it came with another body."""
        self._expire()
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.fingerprint != fingerprint:
            raise APIError(
                422,
                f"{IDEMPOTENCY_HEADER} {key!r} was already used with a different request body; "
                "reuse a key only to retry the identical request, or send a new key",
                param=IDEMPOTENCY_HEADER,
                code="idempotency_key_reused",
            )
        return entry.log

    def remember(self, key: str, fingerprint: str, log: ResultLog) -> None:
        self._expire()
        self._entries[key] = _Entry(fingerprint, log, self._clock())
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)
        held = self.nbytes
        while held > self.max_bytes and self._entries:
            _, oldest = self._entries.popitem(last=False)
            held -= oldest.log.nbytes
        log.on_end(lambda ended: self._forget_failed(key, ended))

    def _forget_failed(self, key: str, log: ResultLog) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry.log is log and log.error is not None:
            del self._entries[key]

    def _expire(self) -> None:
        deadline = self._clock() - self.ttl_seconds
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.created > deadline:
                break
            del self._entries[key]
