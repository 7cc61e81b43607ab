"""Metadata every child shares: names, labels, the owner reference."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import constants as c


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """Makes the child garbage-collected with its InferenceService (and blocks deletion order)."""
    meta = owner["metadata"]
    return {
        "apiVersion": c.API_VERSION, "kind": c.KIND, "name": meta["name"], "uid": meta["uid"],
        "controller": True, "blockOwnerDeletion": True,
    }


def labels(name: str, component: str, track: str | None = None) -> dict[str, str]:
    out = {
        c.LABEL_NAME: "kvpilot", c.LABEL_INSTANCE: name, c.LABEL_MANAGED_BY: "kvpilot",
        c.LABEL_COMPONENT: component, c.LABEL_SERVICE: name,
    }
    if track:
        out[c.LABEL_TRACK] = track
    return out


def metadata(owner: Mapping[str, Any], name: str, component: str, track: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner["metadata"]["namespace"],
        "labels": labels(owner["metadata"]["name"], component, track),
        "ownerReferences": [owner_reference(owner)],
    }


def deployment_name(service: str, track: str = "stable") -> str:
    return f"{service}-{track}"


def lineage_name(service: str) -> str:
    return f"{service}-lineage"


def metrics_service_name(service: str) -> str:
    return f"{service}-metrics"
