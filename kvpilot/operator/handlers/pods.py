"""Pods the operator manages -> the owner's PodsBlocked condition and a Warning Event per blocker.

Pod events catch what the scheduler and the kubelet write on the pod (Unschedulable,
ImagePullBackOff, CrashLoopBackOff, CreateContainerConfigError); a timer catches what they only
say in Events (FailedMount), while the service is not Ready or a blocker is on record.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import kopf

from kvpilot.operator import constants as c
from kvpilot.operator import kube, options
from kvpilot.operator.handlers.context import context_for
from kvpilot.operator.handlers.deployments import _status_pool
from kvpilot.operator.kube import KubeError, object_path
from kvpilot.operator.rollout import phases
from kvpilot.operator.rollout.apply import ActionFailed
from kvpilot.operator.rollout.controller import tick
from kvpilot.operator.routing import RouterUnavailable
from kvpilot.operator.status.conditions import is_true
from kvpilot.operator.status.pod_blockers import PODS_BLOCKED
from kvpilot.operator.status.pod_status import refresh_blockers
from kvpilot.operator.status.writer import StatusConflict

OWNED = {c.LABEL_MANAGED_BY: "kvpilot", c.LABEL_COMPONENT: "engine"}
CHECK_INTERVAL_S = 15.0


def _owner(namespace: str, name: str) -> dict[str, Any] | None:
    """The InferenceService (Events name its uid): as last written, else one GET."""
    client = kube.shared()
    return client.last_seen.get((namespace, name)) or client.get(object_path(c.API_VERSION, c.KIND, namespace, name))


def check(namespace: str, name: str, owner: dict[str, Any] | None = None) -> None:
    """Blocking: one refresh of the service's blockers (Events go to the InferenceService)."""
    owner = owner or _owner(namespace, name)
    if owner is None:  # a pod whose InferenceService is gone (garbage collection follows)
        return
    try:
        refresh_blockers(context_for(owner), namespace, name)
    except StatusConflict as exc:
        raise kopf.TemporaryError(str(exc), delay=2) from None


def check_canary(namespace: str, name: str) -> None:
    """Blocking: a canary pod changed (restarted, crash-looping, ready or unready): tick the rollout
    now instead of at the step window's end (the timer skips ticks inside a window)."""
    owner = _owner(namespace, name)
    if owner is None or ((owner.get("status") or {}).get("canary") or {}).get("phase") not in phases.ACTIVE:
        return
    try:
        tick(context_for(owner), namespace, name, options.current())
    except (KubeError, RouterUnavailable, StatusConflict, ActionFailed) as exc:
        raise kopf.TemporaryError(f"rollout after a canary pod event: {exc}", delay=2) from None


@kopf.on.event("", "v1", "pods", labels=OWNED)
async def pod_event(body: kopf.Body, **_: Any) -> None:
    meta = body["metadata"]
    labels = meta.get("labels") or {}
    owner = labels.get(c.LABEL_SERVICE)
    if not owner:
        return
    context = contextvars.copy_context()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(_status_pool, context.run, check, meta["namespace"], owner)
    if labels.get(c.LABEL_TRACK) == "canary":  # restarted, crash-looping, (un)ready: the rollout decides
        await loop.run_in_executor(_status_pool, contextvars.copy_context().run, check_canary, meta["namespace"],
                                   owner)


def needs_checks(status: kopf.Status, **_: Any) -> bool:
    conditions = (status or {}).get("conditions")
    return (status or {}).get("phase") != "Ready" or is_true(conditions, PODS_BLOCKED)


@kopf.timer(c.GROUP, c.VERSION, c.PLURAL, interval=CHECK_INTERVAL_S, when=needs_checks)
def blockers_timer(body: kopf.Body, **_: Any) -> None:
    meta = body["metadata"]
    check(meta["namespace"], meta["name"], dict(body))
