"""Write an InferenceService's status only when it changes, with optimistic locking."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.kube import Kube, KubeError, object_path

StatusUpdate = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]  # (object, old status) -> new

_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


class StatusConflict(RuntimeError):
    """Other writers kept changing the object; the caller should retry shortly."""


def _lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


def write_status(kube: Kube, namespace: str, name: str, update: StatusUpdate,
                 obj: dict[str, Any] | None = None, attempts: int = 5) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Apply `update` to the live status; PATCH only a real change. Returns (old, new) or None if gone.

    `obj` (a fresh copy of the object) skips the first read.

    The patch carries the resourceVersion it was computed from, so writers never overwrite each
    other's conditions: a conflict re-reads and recomputes. Within this process the reconcile
    handler and the Deployment watcher also take turns per object, so conflicts come only from
    other writers (kopf's own annotations, another operator replica).
    """
    with _lock(namespace, name):
        return _write(kube, namespace, name, update, obj, attempts)


def _write(kube: Kube, namespace: str, name: str, update: StatusUpdate, obj: dict[str, Any] | None,
           attempts: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    path = object_path(c.API_VERSION, c.KIND, namespace, name)
    # The object as this client last read or wrote it: status changes come only from this
    # operator (the active peer), so it saves a GET per write; a stale one costs a 409 and a GET.
    _last_seen, key = kube.last_seen, (namespace, name)
    for attempt in range(attempts):
        if attempt:
            time.sleep(random.uniform(0.05, 0.1) * 2**attempt)
        live = obj if obj is not None else (_last_seen.get(key) if attempt == 0 else None)
        obj = None
        if live is None:
            live = kube.get(path)
        if live is None:
            _last_seen.pop(key, None)
            return None
        _last_seen[key] = live
        old = dict(live.get("status") or {})
        new = update(live, old)
        if new == old:
            return old, new
        patch: dict[str, Any] = {k: v for k, v in new.items()}
        patch.update({k: None for k in old if k not in new})
        try:
            _last_seen[key] = kube.merge_patch_status(namespace, name, {
                "metadata": {"resourceVersion": live["metadata"]["resourceVersion"]}, "status": patch,
            })
            return old, new
        except KubeError as exc:
            _last_seen.pop(key, None)
            if exc.status == 404:
                return None
            if exc.status != 409:
                raise
    raise StatusConflict(f"status of {namespace}/{name}: still conflicting after {attempts} attempts")
