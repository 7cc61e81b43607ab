"""The inference-pool router: an InferencePool per track and the weighted HTTPRoute over them."""

from __future__ import annotations

from typing import Any

import pytest

from kvpilot.operator.routing import RouterUnavailable, RouteTarget, router_for
from kvpilot.operator.routing.httproute import canary_weight_of
from kvpilot.operator.routing.inferencepool import build_inference_pool, pool_name, pooled_route
from tests.unit.operator_fakes import service

pytestmark = pytest.mark.unit

TARGET = RouteTarget("gw", "infra", "chat", "chat-canary", canary_header_value="mla")


class RecordingKube:
    def __init__(self, crds: set[str], fail: int | None = None) -> None:
        self.crds, self.fail = crds, fail
        self.applied: list[tuple[str, dict[str, Any]]] = []

    def crd_exists(self, name: str) -> bool:
        return name in self.crds

    def request(self, method: str, path: str, *, body: Any = None, params: Any = None, content_type: str = "") -> Any:
        from kvpilot.operator.kube import KubeError

        if self.fail:
            raise KubeError(method, path, self.fail, "not found")
        assert params == {"fieldManager": "kvpilot", "force": "true"} and content_type.startswith("application/apply")
        self.applied.append((path, body))
        return body


def test_pool_selects_the_tracks_pods_on_the_api_port():
    pool = build_inference_pool(service("chat"), "canary", "chat-canary", 8000)
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["metadata"]["name"] == "chat-canary-pool"
    assert pool["spec"]["selector"] == {"matchLabels": {"kvpilot.io/service": "chat", "kvpilot.io/track": "canary"}}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {"name": "chat-canary-pool-epp", "port": {"number": 9002},
                                                 "failureMode": "FailClose"}


def test_route_backends_are_pools_with_the_same_weights_and_pins():
    route = pooled_route(service("chat"), TARGET, 5)
    refs = [rule["backendRefs"] for rule in route["spec"]["rules"]]
    assert refs[0] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat-canary-pool",
                        "weight": 1}]
    assert [(r["name"], r["weight"]) for r in refs[-1]] == [("chat-pool", 95), ("chat-canary-pool", 5)]
    assert canary_weight_of(route) == 5


def test_set_weight_applies_pools_before_the_route_that_names_them():
    kube = RecordingKube(set())
    router = router_for("inference-pool")
    router.set_weight(kube, service("chat"), RouteTarget("gw", "infra", "chat", "chat-canary"), 0)
    assert [p.rsplit("/", 2)[-2:] for p, _ in kube.applied] == [["inferencepools", "chat-pool"],
                                                                 ["httproutes", "chat"]]  # no canary: no canary pool
    kube.applied.clear()
    router.set_weight(kube, service("chat"), TARGET, 50)
    assert [p.rsplit("/", 1)[-1] for p, _ in kube.applied] == ["chat-pool", "chat-canary-pool", "chat"]
    assert pool_name("chat") == "chat-pool"


def test_missing_crds_are_named():
    ok, reason, message = router_for("inference-pool").available(RecordingKube({"httproutes.gateway.networking.k8s.io"}))
    assert not ok and reason == "InferencePoolMissing" and "inferencepools.inference.networking.k8s.io" in message
    with pytest.raises(RouterUnavailable, match=r"does not serve inference\.networking\.k8s\.io/v1"):
        router_for("inference-pool").set_weight(RecordingKube(set(), fail=404), service("chat"), TARGET, 5)
