"""Follow an owned Deployment's status into its InferenceService's status (kopf-free)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.context import Context
from kvpilot.operator.status.conditions import DEGRADED, READY, get_condition
from kvpilot.operator.status.deployment_state import deployment_state
from kvpilot.operator.status.document import with_deployment_state
from kvpilot.operator.status.writer import write_status


def owner_name(deployment: Mapping[str, Any]) -> str | None:
    for ref in deployment["metadata"].get("ownerReferences") or ():
        if ref.get("kind") == c.KIND and ref.get("apiVersion", "").startswith(f"{c.GROUP}/") and ref.get("controller"):
            return str(ref["name"])
    return None


def follow_deployment(ctx: Context, deployment: Mapping[str, Any]) -> dict[str, Any] | None:
    """Update the owner's rollout conditions and replica counts; returns the owner when it changed."""
    owner = owner_name(deployment)
    if owner is None:
        return None
    name = deployment["metadata"]["name"]
    now = ctx.now()
    seen: dict[str, Any] = {}

    def update(live: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        seen["live"] = live
        if (old.get("stable") or {}).get("deployment") not in (None, name):
            return old
        return with_deployment_state(old, deployment_state(deployment), now=now)

    result = write_status(ctx.kube, deployment["metadata"]["namespace"], owner, update)
    if result is None or result[0] == result[1]:
        return None
    old, new = result
    announce_deployment_conditions(ctx, old, new)
    return seen.get("live")


def announce_deployment_conditions(ctx: Context, old: dict[str, Any], new: dict[str, Any]) -> None:
    """An Event when Ready or Degraded turns True, whichever status write made the transition.

    Both this follower and the reconciler write the Deployment's state into the status; the one whose write turns
    the condition True announces it (the other then sees it already True), so the Event is posted exactly once."""
    for type_, when, kind in ((READY, "True", "Normal"), (DEGRADED, "True", "Warning")):
        before = (get_condition(old.get("conditions"), type_) or {}).get("status")
        after = get_condition(new.get("conditions"), type_) or {}
        if after.get("status") == when and before != when:
            ctx.emit(kind, type_, after.get("message", ""))
