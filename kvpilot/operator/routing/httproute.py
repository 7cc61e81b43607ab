"""Gateway API `HTTPRoute` (gateway.networking.k8s.io/v1): header pins plus a weighted default rule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator.builders.common import metadata
from kvpilot.operator.routing.base import RouterUnavailable, RouteTarget, check_weight, register

GROUP = "gateway.networking.k8s.io"
API_VERSION = f"{GROUP}/v1"
HTTPROUTE_CRD = f"httproutes.{GROUP}"
GATEWAY_CRD = f"gateways.{GROUP}"
FIELD_MANAGER = "kvpilot"


def route_name(service: str) -> str:
    """One route per InferenceService, named like it."""
    return service


def route_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/{API_VERSION}/namespaces/{namespace}/httproutes"
    return f"{path}/{name}" if name else path


def _backend(service: str, port: int, weight: int) -> dict[str, Any]:
    return {"group": "", "kind": "Service", "name": service, "port": port, "weight": weight}


def _match(target: RouteTarget, pin: str = "") -> dict[str, Any]:
    """Path "/" plus the model header (shared Gateway) and the track pin, all of which must hold."""
    headers = []
    if target.model_header:
        headers.append({"type": "Exact", "name": target.model_header, "value": target.model})
    if pin:
        headers.append({"type": "Exact", "name": target.header_name, "value": pin})
    match: dict[str, Any] = {"path": {"type": "PathPrefix", "value": "/"}}
    if headers:
        match["headers"] = headers
    return match


def _pin(target: RouteTarget, value: str, service: str) -> dict[str, Any]:
    return {"matches": [_match(target, value)], "backendRefs": [_backend(service, target.port, 1)]}


def build_httproute(owner: Mapping[str, Any], target: RouteTarget, canary_weight: int) -> dict[str, Any]:
    """The whole route for `owner` with `canary_weight`% of unpinned traffic on the canary.

    Pinned rules come first for readability; Gateway API ranks a match with more headers above
    one with fewer whatever the order. Without a canary (weight 0, no pin) the route sends
    everything to stable.
    """
    weight = check_weight(canary_weight)
    rules = []
    if target.canary_header_value:
        rules.append(_pin(target, target.canary_header_value, target.canary_service))
    if target.stable_header_value:
        rules.append(_pin(target, target.stable_header_value, target.stable_service))
    if weight == 0 and not target.canary_header_value:  # no canary: stable only (no dangling backendRef)
        backends = [_backend(target.stable_service, target.port, 100)]
    else:
        backends = [_backend(target.stable_service, target.port, 100 - weight),
                    _backend(target.canary_service, target.port, weight)]
    rules.append({"matches": [_match(target)], "backendRefs": backends})
    parent = {"group": GROUP, "kind": "Gateway", "name": target.gateway_name, "namespace": target.gateway_namespace}
    spec: dict[str, Any] = {"parentRefs": [parent], "rules": rules}
    if target.hostnames:
        spec["hostnames"] = list(target.hostnames)
    return {
        "apiVersion": API_VERSION,
        "kind": "HTTPRoute",
        "metadata": metadata(owner, route_name(owner["metadata"]["name"]), "route"),
        "spec": spec,
    }


def canary_weight_of(route: Mapping[str, Any], canary_service: str | None = None) -> int | None:
    """The canary's share (0-100) of the weighted (header-less) rule, or None if the route has none.

    Without `canary_service`, the weighted rule's second backend is the canary (as built above).
    """
    model_headers = _model_headers(route)
    for rule in route.get("spec", {}).get("rules", []):
        if any(len(m.get("headers") or []) > model_headers for m in rule.get("matches", [])):
            continue  # a pin
        refs = rule.get("backendRefs", [])
        if len(refs) == 1:
            return 0  # stable only
        if len(refs) != 2:
            continue
        total = sum(int(r.get("weight", 1)) for r in refs)
        canary = next((r for r in refs if r.get("name") == canary_service), refs[1]) if canary_service else refs[1]
        return round(100 * int(canary.get("weight", 1)) / total) if total else 0
    return None


def _model_headers(route: Mapping[str, Any]) -> int:
    """How many header matches every rule carries (the shared-Gateway model header): the fewest."""
    counts = [len(m.get("headers") or []) for r in route.get("spec", {}).get("rules", []) for m in r.get("matches", [])]
    return min(counts, default=0)


@register("gateway-api")
class GatewayApiRouter:
    """Writes one HTTPRoute per InferenceService with a single server-side apply per weight change."""

    name = "gateway-api"

    def available(self, kube: Any) -> tuple[bool, str, str]:
        missing = [crd for crd in (HTTPROUTE_CRD, GATEWAY_CRD) if not kube.crd_exists(crd)]
        if missing:
            return (False, "GatewayAPIMissing",
                    f"the Gateway API CRDs {', '.join(missing)} are not installed, so traffic cannot be split; "
                    "install the Gateway API standard channel (v1.0 or later) and a Gateway implementation, "
                    "or pick another router; the rollout waits at weight 0 until then")
        return True, "GatewayAPIReady", "Gateway API HTTPRoute (gateway.networking.k8s.io/v1) is installed"

    def set_weight(self, kube: Any, owner: Mapping[str, Any], target: RouteTarget, canary_weight: int) -> None:
        from kvpilot.operator.kube import KubeError

        route = build_httproute(owner, target, canary_weight)
        meta = route["metadata"]
        try:
            kube.request("PATCH", route_path(meta["namespace"], meta["name"]), body=route,
                         params={"fieldManager": FIELD_MANAGER, "force": "true"},
                         content_type="application/apply-patch+yaml")
        except KubeError as exc:
            if exc.status == 404:
                raise RouterUnavailable("GatewayAPIMissing",
                                        f"the API server does not serve {API_VERSION} HTTPRoutes: {exc}") from exc
            raise

    def current_weight(self, kube: Any, namespace: str, name: str) -> int | None:
        route = kube.get(route_path(namespace, name))
        return None if route is None else canary_weight_of(route)
