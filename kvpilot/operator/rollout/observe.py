"""What one tick of the rollout knows about the world: the machine's inputs, read from the API."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import options as opts
from kvpilot.operator.builders.common import deployment_name, lineage_name
from kvpilot.operator.builders.engine_args import UnsupportedModelUri, engine_args
from kvpilot.operator.builders.lineage import read_lineage
from kvpilot.operator.constants import LABEL_SERVICE, LABEL_TRACK
from kvpilot.operator.kube import Kube, object_path
from kvpilot.operator.reconcile.calibration import CalibrationUnavailable, check_calibration
from kvpilot.operator.reconcile.model_config import ModelConfigUnavailable, load_model_config
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.reconcile.tracks import canary_spec
from kvpilot.operator.rollout import CanaryStatus, RolloutSpec, World
from kvpilot.operator.rollout import phases as p
from kvpilot.operator.rollout.route import route_target
from kvpilot.operator.routing import Router, RouteTarget, router_for
from kvpilot.operator.spec import ServiceSpec
from kvpilot.operator.status.deployment_state import READY_PHASE, deployment_state
from kvpilot.operator.status.pod_blockers import TrackHealth, track_health
from kvpilot.planner import CapacityPlan, PlannerError


@dataclass(frozen=True)
class Observation:
    """The machine's inputs plus what the action applier needs (specs, plans, route target)."""

    spec: RolloutSpec
    world: World
    canary: ServiceSpec | None = None
    canary_plan: CapacityPlan | None = None
    target: RouteTarget | None = None
    router: Router | None = None
    router_ok: tuple[bool, str, str] = (False, "", "")


def observe(kube: Kube, body: Mapping[str, Any], status: CanaryStatus, options: opts.Options) -> Observation:
    meta, raw = body["metadata"], body.get("spec") or {}
    namespace, name = meta["namespace"], meta["name"]
    annotations = meta.get("annotations") or {}
    spec = ServiceSpec.from_dict(raw, namespace)
    rollback = spec.rollback or annotations.get(opts.ANNOTATION_ROLLBACK, "").lower() == "true"
    wants_previous = rollback and status.phase == p.PROMOTED
    if spec.canary is None:
        world = World(has_previous=_has_previous(kube, namespace, name)) if wants_previous else World()
        return Observation(RolloutSpec(spec_hash=None, rollback=rollback), world, *_router(kube, body, options, None))
    canary = canary_spec(raw, body.get("status"), namespace)
    assert canary is not None and canary.canary is not None
    plan, problem = _plan(kube, namespace, canary)
    if spec.canary.error:
        problem = spec.canary.error
    rspec = RolloutSpec(
        spec_hash=spec.canary.spec_hash, steps=spec.canary.steps, interval_s=spec.canary.interval_s,
        failure_limit=spec.canary.failure_limit, paused=spec.canary.paused, rollback=rollback,
        promote=annotations.get(opts.ANNOTATION_PROMOTE), abort=annotations.get(opts.ANNOTATION_ABORT),
        replicas=max(1, spec.replicas), strategy=plan.strategy if plan else "",
    )
    target, router, router_ok = _router(kube, body, options, (canary, plan))
    health = _canary_health(kube, namespace, name, status)
    world = World(
        canary_feasible=not problem,
        canary_message=problem,
        canary_ready=_canary_ready(kube, namespace, name, status),
        router_available=router_ok[0],
        router_message=router_ok[2],
        stable_promoted=_stable_promoted(kube, namespace, name, status, canary, plan),
        has_previous=_has_previous(kube, namespace, name) if wants_previous else True,
        canary_restarts=health.restarts if health else -1,
        canary_problem=health.problem if health and status.step_started_at is not None else "",
        canary_ready_pods=health.ready if health else None,
        canary_unready_pods=health.unready if health else (),
    )
    return Observation(rspec, world, canary, plan, target, router, router_ok)


def _canary_health(kube: Kube, namespace: str, name: str, status: CanaryStatus) -> TrackHealth | None:
    """The canary pods' restarts and problems while the canary has (or is about to get) traffic."""
    if status.phase not in (p.PROGRESSING, p.ANALYSING, p.PAUSED):
        return None
    selector = f"{LABEL_SERVICE}={name},{LABEL_TRACK}=canary"
    found = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector})
    return track_health(found.get("items") or [])


def _plan(kube: Kube, namespace: str, canary: ServiceSpec) -> tuple[CapacityPlan | None, str]:
    """The canary's capacity plan, or why there is none (refused before any pod, like stable)."""
    try:
        plan = preflight(canary, load_model_config(kube, namespace, canary.model))
        engine_args(canary, plan)
        check_calibration(kube, namespace, canary.strategy.active_calibration)
    except (ModelConfigUnavailable, PlannerError, UnsupportedModelUri, CalibrationUnavailable) as exc:
        return None, str(exc)
    if not plan.feasible:
        return plan, plan.reason
    return plan, ""


def _router(kube: Kube, body: Mapping[str, Any], options: opts.Options,
            canary: tuple[ServiceSpec, CapacityPlan | None] | None) -> tuple[RouteTarget | None, Router | None,
                                                                            tuple[bool, str, str]]:
    router = router_for(options.router)
    ok = router.available(kube)
    canary_pin = canary[1].strategy if canary and canary[1] else ""
    stable_pin = str((body.get("status") or {}).get("strategy") or "")
    if not canary_pin or canary_pin == stable_pin:  # same strategy, new weights: pin by track name
        canary_pin, stable_pin = "canary", "stable"
    target = route_target(body, options, (canary_pin, stable_pin))
    if target is None:
        return None, router, (False, "NoGateway", "no Gateway to attach the HTTPRoute to: set spec.route.gateway "
                              "(or spec.canary.gateway) or start the operator with --gateway NAME[/NAMESPACE]")
    if not ok[0]:
        return None, router, ok
    return target, router, ok


def _canary_ready(kube: Kube, namespace: str, name: str, status: CanaryStatus) -> bool:
    if status.phase != p.PROGRESSING or status.step_started_at is not None:
        return True  # only asked for before the first step's traffic
    live = kube.get(object_path("apps/v1", "Deployment", namespace, deployment_name(name, "canary")))
    return live is not None and int(live["spec"].get("replicas", 0)) > 0 and deployment_state(live).phase == READY_PHASE


def _stable_promoted(kube: Kube, namespace: str, name: str, status: CanaryStatus, canary: ServiceSpec,
                     plan: CapacityPlan | None) -> bool:
    """The stable Deployment runs the canary's engine flags and every replica is updated and ready."""
    if status.phase != p.PROMOTING:
        return True
    live = kube.get(object_path("apps/v1", "Deployment", namespace, deployment_name(name, "stable")))
    if live is None or plan is None or deployment_state(live).phase != READY_PHASE:
        return False
    engine = next(c for c in live["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")
    return list(engine.get("args") or []) == engine_args(canary, plan, name)


def _has_previous(kube: Kube, namespace: str, name: str) -> bool:
    live = kube.get(object_path("v1", "ConfigMap", namespace, lineage_name(name)))
    stable = read_lineage(live)["stable"] or {}
    return bool((stable.get("previous") or {}).get("spec"))

