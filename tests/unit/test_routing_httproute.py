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


SHARED = RouteTarget("shared-gw", "infra", "llm", "llm-canary", canary_header_value="int8", stable_header_value="bf16",
                     hostnames=("llm.example.com",), model_header="X-Gateway-Model-Name", model="llm")


def test_a_shared_gateway_route_requires_the_host_and_the_model_on_every_rule() -> None:
    route = build_httproute(OWNER, SHARED, 5)
    assert route["spec"]["hostnames"] == ["llm.example.com"]
    matches = [(m.get("headers"), [b["name"] for b in r["backendRefs"]]) for r in route["spec"]["rules"]
               for m in r["matches"]]
    model = {"type": "Exact", "name": "X-Gateway-Model-Name", "value": "llm"}
    assert matches == [
        ([model, {"type": "Exact", "name": "X-Model-Strategy", "value": "int8"}], ["llm-canary"]),
        ([model, {"type": "Exact", "name": "X-Model-Strategy", "value": "bf16"}], ["llm"]),
        ([model], ["llm", "llm-canary"]),
    ]
    assert canary_weight_of(route) == 5


def test_without_a_canary_the_route_sends_everything_to_stable() -> None:
    steady = RouteTarget("gw", "infra", "llm", "llm-canary", model_header="X-Gateway-Model-Name", model="llm")
    route = build_httproute(OWNER, steady, 0)
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "", "kind": "Service", "name": "llm", "port": 8000, "weight": 100}]
    assert "hostnames" not in route["spec"] and canary_weight_of(route) == 0


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"model_header": "X-Gateway-Model-Name"}, "model is empty"),
    ({"model_header": "x-model-strategy", "model": "llm"}, "must differ"),
])
def test_route_targets_refuse_colliding_headers(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        RouteTarget("gw", "infra", "llm", "llm-canary", **kwargs)


def test_probes_through_a_shared_gateway_send_the_model_header_and_host() -> None:
    from kvpilot.operator.analysis.probes import GatewayPins

    route = build_httproute(OWNER, SHARED, 5)

    class Kube:
        def get(self, _path: str) -> dict:
            return route

    endpoint = GatewayPins("http://gw").endpoint(Kube(), "team-a", "llm", "canary")
    assert endpoint.headers == {"X-Gateway-Model-Name": "llm", "X-Model-Strategy": "int8", "Host": "llm.example.com"}


def test_route_conflicts_need_the_same_gateway_hosts_and_shared_headers() -> None:
    from kvpilot.operator.routing.conflicts import conflicting_route

    def made(name: str, target: RouteTarget, at: str) -> dict:
        route = build_httproute({"metadata": {"name": name, "namespace": "team-a", "uid": name}}, target, 5)
        route["metadata"]["creationTimestamp"] = at
        return route

    plain = RouteTarget("gw", "infra", "a", "a-canary", canary_header_value="c", stable_header_value="s")
    first = made("a", plain, "2026-01-01T00:00:00Z")
    second = made("b", RouteTarget("gw", "infra", "b", "b-canary"), "2026-01-02T00:00:00Z")
    assert conflicting_route(second, [first, second]) is first  # both take every request: the older wins
    assert conflicting_route(first, [first, second]) is None
    for differs in (RouteTarget("gw2", "infra", "b", "b-canary"), RouteTarget("gw", "infra", "b", "b-canary",
                                                                          hostnames=("b.example.com",)),
                    RouteTarget("gw", "infra", "b", "b-canary", model_header="X-Gateway-Model-Name", model="b")):
        assert conflicting_route(made("b", differs, "2026-01-02T00:00:00Z"), [first]) is None
