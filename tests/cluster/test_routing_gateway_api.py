"""The Gateway API router against a real API server with the pinned standard-channel CRDs."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvpilot.operator.kube import KubeError
from kvpilot.operator.routing import RouteTarget, router_for
from kvpilot.operator.routing.httproute import route_path
from tests.harness.gateway import apply_gateway, kube_client

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


def _without_weights(route: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(route["spec"])
    for rule in spec["rules"]:
        for ref in rule["backendRefs"]:
            ref.pop("weight")
    return spec


@pytest.fixture
def env(k8s_cluster, gateway_api):  # type: ignore[no-untyped-def]
    kube = kube_client(k8s_cluster)
    crd = yaml.safe_load((REPO / "crds" / "inferenceservices.kvpilot.io.yaml").read_text())
    kube.request("PATCH", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}",
                 body=crd, params={"fieldManager": "kvpilot-tests", "force": "true"},
                 content_type="application/apply-patch+yaml")
    ns = f"route-{uuid.uuid4().hex[:8]}"
    kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    try:
        yield kube, ns
    finally:
        kube.request("DELETE", f"/api/v1/namespaces/{ns}")
        kube.close()


def _owner(kube, ns: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """A real InferenceService to own the route (the garbage collector removes orphans)."""
    import time

    body = {"apiVersion": "kvpilot.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "llm", "namespace": ns},
            "spec": {"model": {"uri": "file:///models/tiny", "config": {
                "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 256, "torch_dtype": "bfloat16"}},
                     "strategy": {"kvCacheDtype": "bf16", "maxSeqLen": 256},
                     "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H200"}, "replicas": 1, "engine": {"image": "kvpilot:test"}}}
    for _ in range(50):  # the CRD may take a moment to serve after the apply
        try:
            return kube.request("POST", f"/apis/kvpilot.io/v1alpha1/namespaces/{ns}/inferenceservices", body=body)
        except KubeError as exc:
            if exc.status != 404:
                raise
            time.sleep(0.2)
    raise AssertionError("inferenceservices.kvpilot.io is not served")


def test_route_is_accepted_and_set_weight_changes_only_the_weights(env) -> None:  # type: ignore[no-untyped-def]
    kube, ns = env
    router = router_for("gateway-api")
    assert router.available(kube) == (True, "GatewayAPIReady", router.available(kube)[2])
    apply_gateway(kube, ns, "shared-gw")
    owner = _owner(kube, ns)
    target = RouteTarget("shared-gw", ns, "llm", "llm-canary", 8000, "X-Model-Strategy", "kv=int8", "kv=bf16")

    assert router.current_weight(kube, ns, "llm") is None
    router.set_weight(kube, owner, target, 1)
    first = kube.get(route_path(ns, "llm"))
    assert router.current_weight(kube, ns, "llm") == 1
    assert first["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    assert first["spec"]["parentRefs"][0]["name"] == "shared-gw"
    pins = {m["headers"][0]["value"]: [b["name"] for b in r["backendRefs"]]
            for r in first["spec"]["rules"] for m in r["matches"] if m.get("headers")}
    assert pins == {"kv=int8": ["llm-canary"], "kv=bf16": ["llm"]}

    patches = kube.requests["PATCH"]
    router.set_weight(kube, owner, target, 5)
    assert kube.requests["PATCH"] == patches + 1  # one write per weight change
    second = kube.get(route_path(ns, "llm"))
    assert router.current_weight(kube, ns, "llm") == 5
    assert second["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]
    assert _without_weights(second) == _without_weights(first)
    weighted = next(r for r in second["spec"]["rules"] if not any(m.get("headers") for m in r["matches"]))
    assert [(b["name"], b["weight"]) for b in weighted["backendRefs"]] == [("llm", 95), ("llm-canary", 5)]
    assert [m["manager"] for m in second["metadata"]["managedFields"]] == ["kvpilot"]

    router.set_weight(kube, owner, target, 5)  # the same weight again: no write on the server
    assert kube.get(route_path(ns, "llm"))["metadata"]["resourceVersion"] == second["metadata"]["resourceVersion"]
    router.set_weight(kube, owner, target, 0)
    assert router.current_weight(kube, ns, "llm") == 0


def test_api_server_validates_the_route(env) -> None:  # type: ignore[no-untyped-def]
    """The CRD's own schema is in force: a header name with a space is refused by the server."""
    kube, ns = env
    owner = _owner(kube, ns)
    bad = RouteTarget("shared-gw", ns, "llm", "llm-canary", header_name="X Model", canary_header_value="int8")
    with pytest.raises(KubeError) as info:
        router_for().set_weight(kube, owner, bad, 5)
    assert info.value.status == 422 and "X Model" in str(info.value)


def test_a_shared_gateway_route_with_hostnames_and_the_model_header_is_valid(env) -> None:  # type: ignore[no-untyped-def]
    """The Gateway API's own schema and CEL rules accept what spec.route makes of the route."""
    kube, ns = env
    apply_gateway(kube, ns, "shared-gw")
    owner = _owner(kube, ns)
    target = RouteTarget("shared-gw", ns, "llm", "llm-canary", canary_header_value="int8", stable_header_value="bf16",
                         hostnames=("llm.example.com", "*.llm.example.com"), model_header="X-Gateway-Model-Name",
                         model="llm")
    router_for().set_weight(kube, owner, target, 5)
    route = kube.get(route_path(ns, "llm"))
    assert route["spec"]["hostnames"] == ["llm.example.com", "*.llm.example.com"]
    assert [[h["name"] for h in m["headers"]] for r in route["spec"]["rules"] for m in r["matches"]] == [
        ["X-Gateway-Model-Name", "X-Model-Strategy"], ["X-Gateway-Model-Name", "X-Model-Strategy"],
        ["X-Gateway-Model-Name"]]
    router_for().set_weight(kube, owner, RouteTarget("shared-gw", ns, "llm", "llm-canary", hostnames=target.hostnames,
                                                     model_header=target.model_header, model="llm"), 0)
    (rule,) = kube.get(route_path(ns, "llm"))["spec"]["rules"]  # no canary: everything to stable
    assert [b["name"] for b in rule["backendRefs"]] == ["llm"]


@pytest.mark.parametrize(("route", "canary", "needle"), [
    ({"hostnames": ["Chat.Example.com"]}, None, "spec.route.hostnames[0]"),
    ({"hostnames": ["10.0.0.1:80"]}, None, "spec.route.hostnames[0]"),
    ({"modelHeader": "X Model"}, None, "spec.route.modelHeader"),
    ({"modelHeader": "x-model-strategy"}, {"strategy": {"kvCacheDtype": "int8"}},
     "spec.route.modelHeader may not be the canary's pin header"),
])
def test_bad_route_specs_are_refused_naming_the_field(env, route: dict, canary: dict | None, needle: str) -> None:  # type: ignore[no-untyped-def]
    kube, ns = env
    body = copy.deepcopy(_owner(kube, ns))
    body["metadata"] = {"name": "bad-route", "namespace": ns}
    body["spec"]["route"] = route
    if canary:
        body["spec"]["canary"] = canary
    with pytest.raises(KubeError) as info:
        kube.request("POST", f"/apis/kvpilot.io/v1alpha1/namespaces/{ns}/inferenceservices", body=body)
    assert info.value.status == 422 and needle in str(info.value), str(info.value)
