"""Read one InferenceService's pods and their Events, record what blocks them (kopf-free).

Called on every event of a pod the operator manages and, while the service is not Ready, from a
timer (a `FailedMount` arrives as an Event only; the pod itself does not change).
"""

from __future__ import annotations

from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.context import Context
from kvpilot.operator.status.document import with_blockers
from kvpilot.operator.status.pod_blockers import Blocker, find_blockers, new_blockers
from kvpilot.operator.status.writer import write_status

MAX_EVENT_READS = 10  # pending pods whose Events are read per refresh (one list call each)


def service_pods(kube: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    """Every pod of every track of `name` (by the labels the builders put on them)."""
    selector = f"{c.LABEL_MANAGED_BY}=kvpilot,{c.LABEL_SERVICE}={name}"
    found = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector})
    return list(found.get("items") or [])


def pod_events(kube: Any, namespace: str, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Events of the pods still Pending (where FailedMount is the only word on what is wrong)."""
    out: list[dict[str, Any]] = []
    pending = [p for p in pods if (p.get("status") or {}).get("phase", "Pending") == "Pending"]
    for pod in pending[:MAX_EVENT_READS]:
        uid = pod["metadata"].get("uid", "")
        found = kube.request("GET", f"/api/v1/namespaces/{namespace}/events",
                             params={"fieldSelector": f"involvedObject.kind=Pod,involvedObject.uid={uid}"})
        out += found.get("items") or []
    return out


def refresh_blockers(ctx: Context, namespace: str, name: str) -> list[Blocker] | None:
    """Write PodsBlocked / status.blockedPods when they change; one Warning Event per new blocker.

    Returns the blockers, or None when the InferenceService is gone.
    """
    pods = service_pods(ctx.kube, namespace, name)
    blockers = find_blockers(pods, pod_events(ctx.kube, namespace, pods))
    now = ctx.now()

    def update(_live: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        return with_blockers(old, blockers, now=now)

    result = write_status(ctx.kube, namespace, name, update)
    if result is None:
        return None
    old, _new = result
    for blocker in new_blockers(old.get("blockedPods"), blockers):
        ctx.emit("Warning", blocker.reason, blocker.describe())
    return blockers
