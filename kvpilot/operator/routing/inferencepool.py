"""Gateway API Inference Extension: each track behind an `InferencePool` (inference.networking.k8s.io/v1).

The HTTPRoute is the Gateway API router's, weights and header pins included (httproute.py); only
its backendRefs name an InferencePool per track instead of the track's Service, so the Gateway
asks the pool's endpoint picker (EPP) which pod takes each request. The EPP reads the pods'
`/metrics` on the API port with vLLM's names (the model-server protocol: `vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`, `vllm:cache_config_info`; engine/server/vllm_metrics.py serves them).
The EPP itself is the Inference Extension's own Deployment: by default the pool expects a Service
`<pool>-epp` on port 9002 (its ext-proc gRPC port) in the InferenceService's namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.builders.common import metadata
from kvpilot.operator.routing.base import RouterUnavailable, RouteTarget, register
from kvpilot.operator.routing.httproute import (
    FIELD_MANAGER,
    GATEWAY_CRD,
    HTTPROUTE_CRD,
    build_httproute,
    canary_weight_of,
    route_path,
)

GROUP = "inference.networking.k8s.io"
API_VERSION = f"{GROUP}/v1"
POOL_CRD = f"inferencepools.{GROUP}"
EPP_PORT = 9002


def pool_name(track_service: str) -> str:
    """The pool in front of one track, named after the track's Service (`chat-pool`, `chat-canary-pool`)."""
    return f"{track_service}-pool"


def pool_path(namespace: str, name: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/inferencepools/{name}"


def build_inference_pool(owner: Mapping[str, Any], track: str, track_service: str, port: int,
                         epp_service: str = "", epp_port: int = EPP_PORT) -> dict[str, Any]:
    """The pool of one track's pods: selected as the track's Service selects them, on the API port."""
    name = owner["metadata"]["name"]
    pool = pool_name(track_service)
    return {
        "apiVersion": API_VERSION,
        "kind": "InferencePool",
        "metadata": metadata(owner, pool, "inference-pool", track),
        "spec": {
            "selector": {"matchLabels": {c.LABEL_SERVICE: name, c.LABEL_TRACK: track}},
            "targetPorts": [{"number": port}],
            "endpointPickerRef": {"name": epp_service or f"{pool}-epp", "port": {"number": epp_port},
                                  "failureMode": "FailClose"},
        },
    }


def pooled_route(owner: Mapping[str, Any], target: RouteTarget, canary_weight: int) -> dict[str, Any]:
    """The Gateway API router's HTTPRoute with each Service backendRef turned into its track's pool."""
    route = build_httproute(owner, target, canary_weight)
    for rule in route["spec"]["rules"]:
        rule["backendRefs"] = [{"group": GROUP, "kind": "InferencePool", "name": pool_name(ref["name"]),
                                "weight": ref.get("weight", 1)} for ref in rule["backendRefs"]]
    return route


def _apply(kube: Any, path: str, body: Mapping[str, Any]) -> None:
    kube.request("PATCH", path, body=body, params={"fieldManager": FIELD_MANAGER, "force": "true"},
                 content_type="application/apply-patch+yaml")


@register("inference-pool")
class InferencePoolRouter:
    """One InferencePool per track and the weighted HTTPRoute over them, each a server-side apply."""

    name = "inference-pool"

    def available(self, kube: Any) -> tuple[bool, str, str]:
        missing = [crd for crd in (HTTPROUTE_CRD, GATEWAY_CRD, POOL_CRD) if not kube.crd_exists(crd)]
        if missing:
            return (False, "InferencePoolMissing",
                    f"{', '.join(missing)} not installed: the inference-pool router needs the Gateway API and the "
                    "Gateway API Inference Extension (v1) CRDs and a Gateway implementation that supports "
                    "InferencePool backends; the rollout waits at weight 0 until then")
        return True, "InferencePoolReady", f"HTTPRoute over {API_VERSION} InferencePools is installed"

    def set_weight(self, kube: Any, owner: Mapping[str, Any], target: RouteTarget, canary_weight: int) -> None:
        from kvpilot.operator.kube import KubeError

        namespace = owner["metadata"]["namespace"]
        route = pooled_route(owner, target, canary_weight)
        tracks = {"stable": target.stable_service, "canary": target.canary_service}
        used = {ref["name"] for rule in route["spec"]["rules"] for ref in rule["backendRefs"]}
        try:
            for track, service in tracks.items():
                if pool_name(service) in used:  # the pool exists before the route names it
                    pool = build_inference_pool(owner, track, service, target.port)
                    _apply(kube, pool_path(namespace, pool["metadata"]["name"]), pool)
            _apply(kube, route_path(namespace, route["metadata"]["name"]), route)
        except KubeError as exc:
            if exc.status == 404:
                raise RouterUnavailable("InferencePoolMissing",
                                        f"the API server does not serve {API_VERSION} InferencePools or "
                                        f"HTTPRoutes: {exc}") from exc
            raise

    def current_weight(self, kube: Any, namespace: str, name: str) -> int | None:
        route = kube.get(route_path(namespace, name))
        return None if route is None else canary_weight_of(route)
