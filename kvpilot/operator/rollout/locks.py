"""Per-InferenceService locks: the rollout's ticks and the steady-route step take turns on one object.

Re-entrant: a promotion or a rollback reconciles stable from inside a tick, and that reconcile's
steady-route step (route.py) takes the same object's lock.
"""

from __future__ import annotations

import threading

_locks: dict[tuple[str, str], threading.RLock] = {}
_guard = threading.Lock()


def object_lock(namespace: str, name: str) -> threading.RLock:
    """The one lock of the object `namespace/name` (made on first use)."""
    with _guard:
        return _locks.setdefault((namespace, name), threading.RLock())
