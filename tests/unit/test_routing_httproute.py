"""HTTPRoute builder and the router registry (the same route is applied to a real API server in
tests/cluster/test_routing_gateway_api.py)."""

from __future__ import annotations

import pytest

from kvpilot.operator.routing import RouterUnavailable, RouteTarget, router_for, router_names
from kvpilot.operator.routing.httproute import build_httproute, canary_weight_of

pytestmark = pytest.mark.unit

OWNER = {"metadata": {"name": "llm", "namespace": "team-a", "uid": "0000-1111"}}
TARGET = RouteTarget("shared-gw", "infra", "llm", "llm-canary", port=8000,
                     canary_header_value="kv=int8", stable_header_value="kv=bf16")


def _header_rules(route: dict) -> dict[str, list[str]]:
    out = {}
    for rule in route["spec"]["rules"]:
        for match in rule["matches"]:
            for header in match.get("headers", []):
                assert header["name"] == "X-Model-Strategy" and header["type"] == "Exact"
                out[header["value"]] = [b["name"] for b in rule["backendRefs"]]
    return out


@pytest.mark.parametrize("weight", [0, 1, 5, 50, 99, 100])
def test_weighted_rule_splits_and_reads_back(weight: int) -> None:
    route = build_httproute(OWNER, TARGET, weight)
    default = [r for r in route["spec"]["rules"] if not any(m.get("headers") for m in r["matches"])]
    assert len(default) == 1
    weights = {b["name"]: b["weight"] for b in default[0]["backendRefs"]}
    assert weights == {"llm": 100 - weight, "llm-canary": weight}
    assert canary_weight_of(route) == weight
    assert canary_weight_of(route, "llm-canary") == weight


def test_header_pins_each_track_alone_and_weights_do_not_move_them() -> None:
    for weight in (0, 5, 100):
        route = build_httproute(OWNER, TARGET, weight)
        assert _header_rules(route) == {"kv=int8": ["llm-canary"], "kv=bf16": ["llm"]}


def test_route_attaches_to_the_named_gateway_and_is_owned() -> None:
    route = build_httproute(OWNER, TARGET, 5)
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1" and route["kind"] == "HTTPRoute"
    assert route["metadata"]["name"] == "llm" and route["metadata"]["namespace"] == "team-a"
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                            "name": "shared-gw", "namespace": "infra"}]
    assert route["metadata"]["ownerReferences"][0]["uid"] == "0000-1111"
    assert all(b["port"] == 8000 and b["kind"] == "Service"
               for r in route["spec"]["rules"] for b in r["backendRefs"])


def test_empty_pin_values_leave_only_the_weighted_rule() -> None:
    route = build_httproute(OWNER, RouteTarget("gw", "infra", "llm", "llm-canary"), 5)
    assert len(route["spec"]["rules"]) == 1 and _header_rules(route) == {}


@pytest.mark.parametrize("weight", [-1, 101, 5.0, True, "5"])
def test_weight_outside_0_100_is_refused(weight: object) -> None:
    with pytest.raises(ValueError, match="0-100"):
        build_httproute(OWNER, TARGET, weight)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs, match", [
    ({"canary_service": "llm"}, "must differ"),
    ({"gateway_name": ""}, "gateway_name is empty"),
    ({"port": 0}, "not a port"),
    ({"canary_header_value": "same", "stable_header_value": "same"}, "different values"),
])
def test_bad_targets_say_what_is_wrong(kwargs: dict, match: str) -> None:
    base = {"gateway_name": "gw", "gateway_namespace": "infra", "stable_service": "llm",
            "canary_service": "llm-canary"}
    with pytest.raises(ValueError, match=match):
        RouteTarget(**{**base, **kwargs})


def test_canary_weight_of_a_route_without_a_weighted_rule_is_none() -> None:
    assert canary_weight_of({"spec": {"rules": []}}) is None
    assert canary_weight_of({}) is None


def test_registry() -> None:
    assert "gateway-api" in router_names()
    assert router_for().name == "gateway-api"
    with pytest.raises(ValueError, match="unknown router 'istio'; available: gateway-api"):
        router_for("istio")


class _NoCrds:
    def crd_exists(self, name: str) -> bool:
        return False


def test_unavailable_without_crds_says_why() -> None:
    ok, reason, message = router_for().available(_NoCrds())
    assert not ok and reason == "GatewayAPIMissing"
    assert "httproutes.gateway.networking.k8s.io" in message and "rollout waits" in message
    assert issubclass(RouterUnavailable, RuntimeError)
