"""Apply the state machine's actions: route updates, the canary track, promotion and rollback."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from kvpilot.operator.builders import (
    build_deployment,
    build_track_service,
    read_lineage,
)
from kvpilot.operator.builders.common import deployment_name, lineage_name
from kvpilot.operator.canary.observe import Observation
from kvpilot.operator.kube import object_path
from kvpilot.operator.lineage_writer import apply_lineage
from kvpilot.operator.reconciler import Context, reconcile
from kvpilot.operator.rollout import (
    Action,
    DeleteCanary,
    Event,
    Promote,
    RollbackStable,
    ScaleCanary,
    SetWeight,
)
from kvpilot.operator.status_writer import write_status
from kvpilot.operator.tracks import canary_dicts, make_override

log = logging.getLogger(__name__)


class ActionFailed(RuntimeError):
    """An action could not be applied now; the tick retries (the status is not advanced)."""


def apply_action(ctx: Context, body: Mapping[str, Any], obs: Observation, action: Action) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    if isinstance(action, SetWeight):
        if obs.target is not None and obs.router is not None:
            obs.router.set_weight(ctx.kube, body, obs.target, action.weight)
    elif isinstance(action, ScaleCanary):
        _scale_canary(ctx, body, obs, action.replicas)
    elif isinstance(action, DeleteCanary):
        ctx.kube.delete(object_path("apps/v1", "Deployment", namespace, deployment_name(name, "canary")))
        ctx.kube.delete(object_path("v1", "Service", namespace, deployment_name(name, "canary")))
    elif isinstance(action, Promote):
        dicts = canary_dicts(body.get("spec") or {}, body.get("status"))
        if dicts is None:
            raise ActionFailed("promotion without spec.canary")
        _restamp_stable(ctx, body, make_override(body.get("spec") or {}, *dicts, reason="promotion"))
    elif isinstance(action, RollbackStable):
        live = ctx.kube.get(object_path("v1", "ConfigMap", namespace, lineage_name(name)))
        previous = ((read_lineage(live)["stable"] or {}).get("previous") or {}).get("spec")
        if not previous:
            raise ActionFailed("the lineage has no previous stable to restore")
        _restamp_stable(ctx, body, make_override(body.get("spec") or {}, previous["model"], previous["strategy"],
                                                 reason="rollback"))
    elif isinstance(action, Event):
        ctx.emit(action.type, action.reason, action.message)


def _scale_canary(ctx: Context, body: Mapping[str, Any], obs: Observation, replicas: int) -> None:
    if obs.canary is None or obs.canary_plan is None:
        if replicas == 0:  # nothing to build from (spec.canary gone or unplannable): drop the pods
            ctx.kube.delete(object_path("apps/v1", "Deployment", body["metadata"]["namespace"],
                                        deployment_name(body["metadata"]["name"], "canary")))
            return
        raise ActionFailed("the canary has no capacity plan")
    spec = dataclasses.replace(obs.canary, replicas=replicas)
    if replicas:
        apply_lineage(ctx.kube, body, spec, obs.canary_plan, track="canary")
    ctx.kube.apply(build_deployment(body, spec, obs.canary_plan, track="canary"))
    ctx.kube.apply(build_track_service(body, "canary"))


def _restamp_stable(ctx: Context, body: Mapping[str, Any], override: dict[str, Any]) -> None:
    """Record the stable track's new configuration, then reconcile stable from it (a rolling update)."""
    meta = body["metadata"]

    def update(_live: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        return {**old, "stable": {**(old.get("stable") or {}), "override": override}}

    write_status(ctx.kube, meta["namespace"], meta["name"], update)
    fresh = ctx.kube.get(object_path(body["apiVersion"], body["kind"], meta["namespace"], meta["name"]))
    if fresh is not None:
        plan = reconcile(ctx, fresh)
        log.info("[%s/%s] stable track now runs %s (%s)", meta["namespace"], meta["name"], plan.strategy,
                 override["reason"])
