"""One reconcile of an InferenceService: preflight, then children by server-side apply, then status.

Kopf-free so tests can drive it with a fake client; handlers translate its exceptions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator import options
from kvpilot.operator.autoscaling.tracks import apply_track
from kvpilot.operator.builders import (
    build_api_service,
    build_deployment,
    build_metrics_service,
    build_podmonitor,
)
from kvpilot.operator.builders.engine_args import UnsupportedModelUri, model_path
from kvpilot.operator.builders.pdb import build_pdb, pdb_name
from kvpilot.operator.context import Context
from kvpilot.operator.kube import KubeError, object_path
from kvpilot.operator.reconcile.calibration import CalibrationUnavailable, check_calibration
from kvpilot.operator.reconcile.lineage_writer import apply_lineage
from kvpilot.operator.reconcile.model_config import ModelConfigUnavailable, load_model_config
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.reconcile.tracks import stable_spec, valid_override
from kvpilot.operator.rollout.route import ensure_steady_route
from kvpilot.operator.spec import ServiceSpec
from kvpilot.operator.status.conditions import (
    CAPACITY_PLANNED,
    DEGRADED,
    MONITORING,
    Condition,
    get_condition,
)
from kvpilot.operator.status.deployment_state import deployment_state
from kvpilot.operator.status.document import with_conditions, with_deployment_state, with_failure, with_plan
from kvpilot.operator.status.follow_deployment import announce_deployment_conditions
from kvpilot.operator.status.writer import write_status
from kvpilot.planner import CapacityPlan, PlannerError, human_bytes


class RetryLater(RuntimeError):
    """Something may appear later (a ConfigMap): try again after `delay` seconds."""

    def __init__(self, message: str, delay: float = 30.0) -> None:
        super().__init__(message)
        self.delay = delay


class InvalidSpec(ValueError):
    """The spec cannot be planned; only an edit fixes it."""


def reconcile(ctx: Context, body: Mapping[str, Any]) -> CapacityPlan:
    meta = body["metadata"]
    namespace = meta["namespace"]
    # The stable track's effective configuration: spec.model/spec.strategy, or what a promotion
    # (or a rollback after one) put there (kvpilot.operator.reconcile.tracks).
    spec = stable_spec(body.get("spec") or {}, body.get("status"), namespace)
    try:
        plan = _plan(ctx, namespace, spec)
    except ModelConfigUnavailable as exc:
        _fail(ctx, body, "ModelConfigUnavailable", str(exc), phase="Pending")
        raise RetryLater(str(exc)) from None
    except (PlannerError, UnsupportedModelUri) as exc:
        _fail(ctx, body, "InvalidSpec", str(exc), phase="Failed")
        raise InvalidSpec(str(exc)) from None
    try:  # the ConfigMap may appear (or be made immutable) later: no spec edit follows, so retry
        check_calibration(ctx.kube, namespace, spec.strategy.active_calibration)
    except CalibrationUnavailable as exc:
        _fail(ctx, body, "CalibrationUnavailable", str(exc), phase="Pending")
        raise RetryLater(str(exc)) from None
    if not plan.feasible:
        _record_plan(ctx, body, spec, plan)
        return plan
    try:
        deployment, monitoring = _apply_children(ctx, body, spec, plan)
    except KubeError as exc:  # e.g. quota, admission webhooks, a full service IP range
        _fail(ctx, body, "ApplyFailed", str(exc), phase="Degraded", condition=DEGRADED)
        raise RetryLater(str(exc), delay=30) from None
    path = object_path("apps/v1", "Deployment", namespace, deployment["metadata"]["name"])
    # Read the Deployment again when writing: the watcher may already have recorded a newer
    # status than the apply's response, and an older snapshot must never overwrite it.
    _record_plan(ctx, body, spec, plan, deployment=lambda: ctx.kube.get(path) or deployment, monitoring=monitoring)
    return plan


def _apply_children(ctx: Context, body: Mapping[str, Any], spec: ServiceSpec,
                    plan: CapacityPlan) -> tuple[dict[str, Any], Condition]:
    apply_lineage(ctx.kube, body, spec, plan)
    # spec.autoscaling on: an HPA sizes the track and the apply leaves spec.replicas to it (autoscaling/)
    deployment = apply_track(ctx.kube, body, build_deployment(body, spec, plan), spec.autoscaling, "stable",
                             max_concurrency=plan.max_concurrency)
    if spec.disruption_budget.enabled:  # one PodDisruptionBudget per track (builders/pdb.py)
        ctx.kube.apply(build_pdb(body, spec, "stable"))
    else:
        ctx.kube.delete(object_path("policy/v1", "PodDisruptionBudget", body["metadata"]["namespace"],
                                    pdb_name(body["metadata"]["name"], "stable")))
    ctx.kube.apply(build_api_service(body))
    ctx.kube.apply(build_metrics_service(body))
    ensure_steady_route(ctx, body, options.current())  # with a Gateway: reachable before any canary
    return deployment, _monitoring(ctx, body)


def _plan(ctx: Context, namespace: str, spec: ServiceSpec) -> CapacityPlan:
    model_path(spec.model.uri)
    return preflight(spec, load_model_config(ctx.kube, namespace, spec.model))


def _monitoring(ctx: Context, body: Mapping[str, Any]) -> Condition:
    if ctx.kube.crd_exists(c.PODMONITOR_CRD):
        ctx.kube.apply(build_podmonitor(body))
        return Condition(MONITORING, "True", "PodMonitorApplied", f"PodMonitor {body['metadata']['name']} scrapes :9400")
    return Condition(MONITORING, "False", "PrometheusOperatorMissing",
                     f"{c.PODMONITOR_CRD} is not installed: no PodMonitor; pods carry prometheus.io/scrape "
                     "annotations for annotation-based scraping")


def _record_plan(ctx: Context, body: Mapping[str, Any], spec: ServiceSpec, plan: CapacityPlan,
                 deployment: Callable[[], dict[str, Any]] | None = None,
                 monitoring: Condition | None = None) -> None:
    meta = body["metadata"]
    generation, now = meta.get("generation"), ctx.now()

    def update(live: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        new = with_plan(old, spec, plan, now=now, generation=generation)
        override = valid_override(live.get("spec") or {}, old)
        if override is not None:  # the stable track runs a promoted (or restored) configuration
            new["stable"] = {**new["stable"], "override": override}
        if monitoring is not None:
            new = with_conditions(new, [monitoring], now=now, generation=generation)
        if deployment is not None:
            live_deployment = deployment()
            new = with_deployment_state(new, deployment_state(live_deployment), now=now)
            new["selector"] = f"{c.LABEL_SERVICE}={meta['name']},{c.LABEL_TRACK}=stable"  # the scale subresource's
            new["stable"] = {**new["stable"], "deployment": live_deployment["metadata"]["name"],
                             "deploymentGeneration": live_deployment["metadata"].get("generation")}
        return new

    result = write_status(ctx.kube, meta["namespace"], meta["name"], update)
    if result is not None:
        _announce(ctx, *result, plan=plan)


def _announce(ctx: Context, old: dict[str, Any], new: dict[str, Any], plan: CapacityPlan) -> None:
    """One Event per decision that changed something; a no-op resync says nothing."""
    before = get_condition(old.get("conditions"), CAPACITY_PLANNED) or {}
    after = get_condition(new.get("conditions"), CAPACITY_PLANNED) or {}
    if (before.get("status"), before.get("message")) != (after.get("status"), after.get("message")):
        if plan.feasible:
            ctx.emit("Normal", "CapacityPlanned",
                     f"{plan.strategy} on {plan.gpus} x {plan.gpu_product}: {human_bytes(plan.bytes_per_token)}/token, "
                     f"KV pool {human_bytes(plan.kv_pool_bytes)}, max concurrency {plan.max_concurrency} "
                     f"at max_seq_len {plan.max_seq_len}")
        else:
            ctx.emit("Warning", "CapacityInfeasible", f"{plan.reason}; no pods were scheduled")
    old_gen = (old.get("stable") or {}).get("deploymentGeneration")
    new_gen = (new.get("stable") or {}).get("deploymentGeneration")
    if new_gen is not None and new_gen != old_gen:
        verb = "Created" if old_gen is None else "Updated"
        ctx.emit("Normal", "RolloutStarted",
                 f"{verb} Deployment {new['stable']['deployment']} (generation {new_gen}) for {plan.strategy}")
    old_mon = get_condition(old.get("conditions"), MONITORING) or {}
    new_mon = get_condition(new.get("conditions"), MONITORING) or {}
    if new_mon and old_mon.get("reason") != new_mon.get("reason"):
        ctx.emit("Normal" if new_mon["status"] == "True" else "Warning", new_mon["reason"], new_mon["message"])
    announce_deployment_conditions(ctx, old, new)  # this write may be the one that saw the Deployment Ready


def _fail(ctx: Context, body: Mapping[str, Any], reason: str, message: str, phase: str,
          condition: str = CAPACITY_PLANNED) -> None:
    meta = body["metadata"]
    now = ctx.now()

    def update(_live: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        status = "True" if condition == DEGRADED else "False"
        return with_failure(old, Condition(condition, status, reason, message[:1000]), phase=phase, now=now,
                            generation=meta.get("generation"))

    result = write_status(ctx.kube, meta["namespace"], meta["name"], update)
    if result is not None and result[0] != result[1]:
        ctx.emit("Warning", reason, message)
