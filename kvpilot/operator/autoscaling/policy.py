"""Who owns a track's `spec.replicas` when an HPA sizes it, and the bounds of each track's HPA.

The operator applies Deployments by server-side apply with `force`: a field it sets is put back
at every reconcile, which would revert every HPA decision. With autoscaling on it leaves
`spec.replicas` out of what it applies. Server-side apply removes a field its last owner stops
setting, so before the operator lets go, a second field manager (HANDOFF_MANAGER) takes
co-ownership at the live value: the field stays as the HPA left it, and the HPA's own writes
(through the scale subresource) make kube-controller-manager its owner from then on.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.autoscaling.spec import AutoscalingSpec
from kvpilot.operator.kube import Kube, KubeError, object_path

log = logging.getLogger("kvpilot.operator.autoscaling")

HANDOFF_MANAGER = "kvpilot-autoscaling-handoff"
HANDOFF_ATTEMPTS = 8
HANDOFF_BACKOFF_S = 0.05
FULL = 100


def track_bounds(scaling: AutoscalingSpec, track: str, weight: int = FULL,
                 stable_replicas: int | None = None) -> tuple[int, int]:
    """(minReplicas, maxReplicas) of a track's HPA. Stable: spec.autoscaling's. The canary at
    `weight` percent: at least its share of the stable pods running now (ceil, at least 1), at
    most its share of maxReplicas, so a 5% canary cannot outgrow its traffic."""
    if track != "canary":
        return scaling.min_replicas, scaling.max_replicas
    stable = scaling.min_replicas if stable_replicas is None else max(stable_replicas, 1)
    low = max(1, math.ceil(weight * stable / FULL))
    high = max(low, math.ceil(weight * scaling.max_replicas / FULL))
    return low, high


def owns_replicas(live: Mapping[str, Any], manager: str = c.FIELD_MANAGER) -> bool:
    """Whether `manager`'s apply set owns spec.replicas (managedFields)."""
    for entry in (live.get("metadata") or {}).get("managedFields") or ():
        spec_fields = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if entry.get("manager") == manager and entry.get("operation") == "Apply" and "f:replicas" in spec_fields:
            return True
    return False


def live_replicas(live: Mapping[str, Any] | None) -> int | None:
    if live is None:
        return None
    value = (live.get("spec") or {}).get("replicas")
    return None if value is None else int(value)


def leave_replicas(kube: Kube, deployment: Mapping[str, Any], initial: int, bounds: tuple[int, int]) -> dict[str, Any]:
    """The Deployment to apply while an HPA sizes it.

    A new Deployment starts at `initial` pods (applied by the operator once). An existing one is
    applied without spec.replicas, after HANDOFF_MANAGER took co-ownership at its live value
    (clamped into `bounds`, so a switch to autoscaling never leaves a track outside them).
    The handoff is conditional on the live object's resourceVersion: an HPA that scaled the track
    between the read and the write makes the write fail (409) instead of putting the count read
    before it back (a canary scaled 2 -> 1 -> 2 mid-rollout in CI), and the value is read again.
    Where it keeps moving (HANDOFF_ATTEMPTS reads in a row), the apply keeps spec.replicas at the last value
    read and the next reconcile hands it off.
    """
    meta = deployment["metadata"]
    path = object_path("apps/v1", "Deployment", meta["namespace"], meta["name"])
    out = copy.deepcopy(dict(deployment))
    for _attempt in range(HANDOFF_ATTEMPTS):
        live = kube.get(path)
        if live is None:
            out["spec"]["replicas"] = initial
            return out
        out["spec"].pop("replicas", None)
        current = live_replicas(live)
        low, high = bounds
        wanted = min(max(current if current is not None else initial, low), high)
        if not owns_replicas(live) and current == wanted:
            return out
        version = (live.get("metadata") or {}).get("resourceVersion")
        handoff_meta = {"name": meta["name"], "namespace": meta["namespace"]}
        if version:
            handoff_meta["resourceVersion"] = version  # a precondition: 409 if the object moved on since the read
        try:
            kube.request("PATCH", path, body={"apiVersion": "apps/v1", "kind": "Deployment", "metadata": handoff_meta,
                                              "spec": {"replicas": wanted}},
                         params={"fieldManager": HANDOFF_MANAGER, "force": "true"},
                         content_type="application/apply-patch+yaml")  # fmt: skip
            return out
        except KubeError as exc:
            if exc.status != 409:
                raise
            time.sleep(HANDOFF_BACKOFF_S * (_attempt + 1))  # the Deployment controller's status writes move it too
    # Still moving: keep the count this apply (the operator goes on owning it at the last value read, as
    # before autoscaling took over), and the next reconcile hands it off.
    log.warning("%s/%s: spec.replicas moved under %d handoff attempts; kept at %d until the next reconcile",
                meta["namespace"], meta["name"], HANDOFF_ATTEMPTS, wanted)
    out["spec"]["replicas"] = wanted
    return out
