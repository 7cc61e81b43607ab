"""Apply the state machine's actions: route updates, the canary track, promotion and rollback."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from kvpilot.operator import options as opts
from kvpilot.operator.autoscaling.tracks import apply_track, delete_hpa
from kvpilot.operator.builders import (
    build_deployment,
    build_track_service,
    read_lineage,
)
from kvpilot.operator.builders.common import deployment_name, lineage_name
from kvpilot.operator.builders.pdb import build_pdb, pdb_name
from kvpilot.operator.context import Context
from kvpilot.operator.kube import object_path
from kvpilot.operator.reconcile.lineage_writer import apply_lineage
from kvpilot.operator.reconcile.reconciler import reconcile
from kvpilot.operator.reconcile.tracks import canary_dicts, make_override
from kvpilot.operator.rollout import (
    Action,
    DeleteCanary,
    Event,
    Promote,
    RollbackStable,
    ScaleCanary,
    SetWeight,
)
from kvpilot.operator.rollout.gpu_check import check_canary_gpus
from kvpilot.operator.rollout.observe import Observation
from kvpilot.operator.rollout.replicas import FULL, canary_replicas
from kvpilot.operator.status.writer import write_status

log = logging.getLogger(__name__)


class ActionFailed(RuntimeError):
    """An action could not be applied now; the tick retries (the status is not advanced)."""


def apply_action(ctx: Context, body: Mapping[str, Any], obs: Observation, action: Action) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    if isinstance(action, SetWeight):
        if action.weight > 0:  # more pods before more traffic (the size follows the weight: replicas.py)
            _resize_canary(ctx, body, obs, action.weight)
        if obs.target is not None and obs.router is not None:
            obs.router.set_weight(ctx.kube, body, obs.target, action.weight)
    elif isinstance(action, ScaleCanary):
        _scale_canary(ctx, body, obs, action.replicas)
    elif isinstance(action, DeleteCanary):
        ctx.kube.delete(object_path("apps/v1", "Deployment", namespace, deployment_name(name, "canary")))
        ctx.kube.delete(object_path("v1", "Service", namespace, deployment_name(name, "canary")))
        ctx.kube.delete(object_path("policy/v1", "PodDisruptionBudget", namespace, pdb_name(name, "canary")))
        delete_hpa(ctx.kube, body, "canary")
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
    """ScaleCanary(0): keep the objects, no pods. ScaleCanary(n > 0): create the canary at its first
    step's size (spec.canary.replicas, or derived from the weight: never silently stable's size),
    once the GPU preflight found its largest step's GPUs free."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    if obs.canary is None or obs.canary_plan is None:
        if replicas == 0:  # nothing to build from (spec.canary gone or unplannable): drop the pods
            ctx.kube.delete(object_path("apps/v1", "Deployment", namespace, deployment_name(name, "canary")))
            ctx.kube.delete(object_path("policy/v1", "PodDisruptionBudget", namespace, pdb_name(name, "canary")))
            return
        raise ActionFailed("the canary has no capacity plan")
    if replicas:
        steps = obs.canary.canary.steps if obs.canary.canary else (FULL,)
        replicas = canary_replicas(obs.canary, steps[0])
        live = ctx.kube.get(object_path("apps/v1", "Deployment", namespace, deployment_name(name, "canary")))
        if live is None or not int((live.get("spec") or {}).get("replicas") or 0):
            # GpusUnavailable propagates: nothing is created, the status is not advanced, and the
            # rollout handler retries quietly (the CanaryGPUs condition and its Event say why)
            check_canary_gpus(ctx.kube, body, obs.canary, opts.current().canary_gpu_check, ctx.emit, ctx.now())
        apply_lineage(ctx.kube, body, obs.canary, obs.canary_plan, track="canary")
    _apply_canary(ctx, body, obs, replicas, weight=steps[0] if replicas else FULL)


def _resize_canary(ctx: Context, body: Mapping[str, Any], obs: Observation, weight: int) -> None:
    """The canary's size for `weight` (promotion: 100), applied when it runs and differs."""
    if obs.canary is None or obs.canary_plan is None:
        return
    meta = body["metadata"]
    live = ctx.kube.get(object_path("apps/v1", "Deployment", meta["namespace"], deployment_name(meta["name"], "canary")))
    current = int(((live or {}).get("spec") or {}).get("replicas") or 0)
    wanted = canary_replicas(obs.canary, weight)
    if current and (wanted != current or obs.canary.autoscaling is not None):  # autoscaled: new HPA bounds
        _apply_canary(ctx, body, obs, wanted, weight=weight)


def _apply_canary(ctx: Context, body: Mapping[str, Any], obs: Observation, replicas: int,
                  weight: int = FULL) -> None:
    assert obs.canary is not None and obs.canary_plan is not None
    spec = dataclasses.replace(obs.canary, replicas=replicas)
    # With spec.autoscaling the canary's HPA sizes it within its weight's bounds (autoscaling/).
    apply_track(ctx.kube, body, build_deployment(body, spec, obs.canary_plan, track="canary"), spec.autoscaling,
                "canary", max_concurrency=obs.canary_plan.max_concurrency, weight=weight)
    ctx.kube.apply(build_track_service(body, "canary"))
    pdb = object_path("policy/v1", "PodDisruptionBudget", body["metadata"]["namespace"],
                      pdb_name(body["metadata"]["name"], "canary"))
    if replicas and spec.disruption_budget.enabled:
        ctx.kube.apply(build_pdb(body, spec, "canary"))
    else:
        ctx.kube.delete(pdb)


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
