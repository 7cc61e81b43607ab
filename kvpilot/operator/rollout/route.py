"""Where an InferenceService's HTTPRoute points: its Gateway, hostnames, model header and pins (pure),
the route of a service with no rollout in flight (everything to stable), and the Routed condition."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator import options as opts
from kvpilot.operator.builders.common import deployment_name
from kvpilot.operator.kube import object_path
from kvpilot.operator.rollout import CanaryStatus
from kvpilot.operator.rollout import phases as p
from kvpilot.operator.rollout.locks import object_lock
from kvpilot.operator.routing import RouteTarget, router_for
from kvpilot.operator.routing.conflicts import conflicting_route, signatures
from kvpilot.operator.routing.httproute import API_VERSION, build_httproute, route_name, route_path
from kvpilot.operator.spec import GatewayRef, ServiceSpec
from kvpilot.operator.status.conditions import Condition, get_condition
from kvpilot.operator.status.document import with_conditions
from kvpilot.operator.status.writer import write_status

ROUTED = "Routed"  # False/RouteConflict: an older route on the Gateway takes this service's requests


def gateway_for(spec: ServiceSpec, options: opts.Options) -> GatewayRef | None:
    """spec.route.gateway, else spec.canary.gateway, else the operator's --gateway."""
    return spec.route.gateway or (spec.canary.gateway if spec.canary else None) or options.gateway


def route_target(body: Mapping[str, Any], options: opts.Options,
                 pins: tuple[str, str] = ("", "")) -> RouteTarget | None:
    """The route's target for (canary pin, stable pin); None without a Gateway."""
    meta = body["metadata"]
    spec = ServiceSpec.from_dict(body.get("spec") or {}, meta["namespace"])
    gateway = gateway_for(spec, options)
    if gateway is None:
        return None
    header = spec.canary.header if spec.canary else opts.DEFAULT_HEADER
    return RouteTarget(gateway_name=gateway.name, gateway_namespace=gateway.namespace,
                       stable_service=meta["name"], canary_service=deployment_name(meta["name"], "canary"),
                       header_name=header, canary_header_value=pins[0], stable_header_value=pins[1],
                       hostnames=spec.route.hostnames, model_header=spec.route.model_header, model=meta["name"])


def ensure_steady_route(ctx: Any, body: Mapping[str, Any], options: opts.Options) -> bool:
    """With a Gateway and no rollout in flight: the route sends every request to stable.

    So a service is reachable through a shared Gateway before (and after) any canary, and a
    spec.route edit takes effect. While a rollout is in flight the rollout controller owns the
    route (weights and pins). Either way the `Routed` condition says whether an older route on
    the same Gateway matches the same requests (and so takes them all). `ctx` is the reconciler's
    Context (kube, emit, now). Returns whether the route was applied.
    """
    kube, meta = ctx.kube, body["metadata"]
    router = router_for(options.router)
    if route_target(body, options) is None or not router.available(kube)[0]:
        return False
    applied = False
    with object_lock(meta["namespace"], meta["name"]):
        body = kube.get(object_path(c.API_VERSION, c.KIND, meta["namespace"], meta["name"])) or body
        target = route_target(body, options)
        phase = CanaryStatus.from_dict((body.get("status") or {}).get("canary")).phase
        if target is not None and phase not in p.ACTIVE and _needs_route(kube, body, target, phase):
            router.set_weight(kube, body, target, 0)
            applied = True
    _record_conflict(ctx, meta["namespace"], meta["name"])
    return applied


def _needs_route(kube: Any, body: Mapping[str, Any], target: RouteTarget, phase: str) -> bool:
    """Idle: always (an apply that changes nothing writes nothing). After a rollout (rolled back,
    promoted, failed) the rollout's last route already sends everything to stable: leave it unless
    spec.route changed what it matches (Gateway, hostnames, model header)."""
    if phase == p.IDLE:
        return True
    live = kube.get(route_path(body["metadata"]["namespace"], route_name(body["metadata"]["name"])))
    return live is None or signatures(live) != signatures(build_httproute(body, target, 0))


def _record_conflict(ctx: Any, namespace: str, name: str) -> None:
    route = ctx.kube.get(route_path(namespace, route_name(name)))
    if route is None:
        return
    rival = conflicting_route(route, _routes(ctx.kube, namespace))
    if rival is None:
        cond = Condition(ROUTED, "True", "RouteUnique", f"HTTPRoute {namespace}/{route_name(name)}: no older route on "
                         "its Gateway matches the same requests")
    else:
        other = f"{rival['metadata']['namespace']}/{rival['metadata']['name']}"
        cond = Condition(ROUTED, "False", "RouteConflict",
                         f"HTTPRoute {other} is older and matches the same requests on the same Gateway, so it takes "
                         f"them all and this service gets none: give one of them spec.route.hostnames or "
                         f"spec.route.modelHeader (docs/operator.md, Routing: a shared Gateway)")
    now = ctx.now()

    def update(_live: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        return with_conditions(old, [cond], now=now, generation=old.get("observedGeneration"))

    result = write_status(ctx.kube, namespace, name, update)
    if result is not None and cond.status == "False":
        before = get_condition(result[0].get("conditions"), ROUTED) or {}
        if before.get("reason") != cond.reason:
            ctx.emit("Warning", cond.reason, cond.message)


def _routes(kube: Any, namespace: str) -> list[dict[str, Any]]:
    """Every HTTPRoute the operator may read: cluster-wide, else (namespaced RBAC) its namespace."""
    from kvpilot.operator.kube import KubeError

    for path in (f"/apis/{API_VERSION}/httproutes", route_path(namespace)):
        try:
            return list(kube.request("GET", path).get("items") or [])
        except KubeError as exc:
            if exc.status not in (403, 404):
                raise
    return []
