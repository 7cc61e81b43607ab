"""Apply a track's Deployment and HPA while spec.autoscaling is on; remove the HPA when it is off."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator.autoscaling.hpa import API_VERSION, KIND, build_hpa, hpa_name
from kvpilot.operator.autoscaling.policy import FULL, leave_replicas, live_replicas, track_bounds
from kvpilot.operator.autoscaling.spec import AutoscalingSpec
from kvpilot.operator.builders.common import deployment_name
from kvpilot.operator.kube import Kube, object_path


def _stable_now(kube: Kube, owner: Mapping[str, Any]) -> int | None:
    meta = owner["metadata"]
    return live_replicas(kube.get(object_path("apps/v1", "Deployment", meta["namespace"],
                                              deployment_name(meta["name"], "stable"))))


def bounds(kube: Kube, owner: Mapping[str, Any], scaling: AutoscalingSpec, track: str,
           weight: int = FULL) -> tuple[int, int]:
    return track_bounds(scaling, track, weight, _stable_now(kube, owner) if track == "canary" else None)


def apply_autoscaled(kube: Kube, owner: Mapping[str, Any], deployment: Mapping[str, Any], scaling: AutoscalingSpec,
                     track: str, *, max_concurrency: int, weight: int = FULL) -> dict[str, Any]:
    """Apply `deployment` with its replicas left to the HPA, then the HPA; returns the applied Deployment."""
    low, high = bounds(kube, owner, scaling, track, weight)
    applied = kube.apply(leave_replicas(kube, deployment, initial=low, bounds=(low, high)))
    kube.apply(build_hpa(owner, track, scaling, min_replicas=low, max_replicas=high,
                         max_concurrency=max_concurrency))
    return applied


def delete_hpa(kube: Kube, owner: Mapping[str, Any], track: str) -> bool:
    """Remove a track's HPA (autoscaling turned off, or the canary dropped its pods)."""
    meta = owner["metadata"]
    return kube.delete(object_path(API_VERSION, KIND, meta["namespace"], hpa_name(meta["name"], track)))


def apply_track(kube: Kube, owner: Mapping[str, Any], deployment: Mapping[str, Any], scaling: AutoscalingSpec | None,
                track: str, *, max_concurrency: int, weight: int = FULL) -> dict[str, Any]:
    """Apply a track's Deployment: sized by its HPA when spec.autoscaling is on, else as built (and
    then no HPA may fight the operator's count). A track scaled to 0 pods is never autoscaled."""
    if scaling is None or (deployment.get("spec") or {}).get("replicas") == 0:
        delete_hpa(kube, owner, track)  # first: an HPA still there could scale the track back up after the apply
        return kube.apply(deployment)
    return apply_autoscaled(kube, owner, deployment, scaling, track, max_concurrency=max_concurrency, weight=weight)
