"""Write an InferenceService's status only when it changes, with optimistic locking."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.kube import Kube, KubeError, object_path

StatusUpdate = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]  # (object, old status) -> new


def write_status(kube: Kube, namespace: str, name: str, update: StatusUpdate,
                 obj: dict[str, Any] | None = None, attempts: int = 5) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Apply `update` to the live status; PATCH only a real change. Returns (old, new) or None if gone.

    The patch carries the resourceVersion it was computed from, so two writers (the reconcile
    handler and the Deployment watcher) never overwrite each other's conditions: a conflict
    re-reads and recomputes.
    """
    path = object_path(c.API_VERSION, c.KIND, namespace, name)
    for _ in range(attempts):
        live = obj if obj is not None else kube.get(path)
        obj = None
        if live is None:
            return None
        old = dict(live.get("status") or {})
        new = update(live, old)
        if new == old:
            return old, new
        patch: dict[str, Any] = {k: v for k, v in new.items()}
        patch.update({k: None for k in old if k not in new})
        try:
            kube.merge_patch_status(namespace, name, {
                "metadata": {"resourceVersion": live["metadata"]["resourceVersion"]}, "status": patch,
            })
            return old, new
        except KubeError as exc:
            if exc.status == 404:
                return None
            if exc.status != 409:
                raise
    raise RuntimeError(f"status of {namespace}/{name}: still conflicting after {attempts} attempts")
