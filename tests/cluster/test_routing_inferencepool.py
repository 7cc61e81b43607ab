"""The inference-pool router against a real API server with the published CRDs.

Gateway API standard channel (v1.6.3) and the Gateway API Inference Extension's v1 InferencePool
CRD (v1.4.0, from its Go module's config/crd/bases): the server's schema and CEL rules accept the
pools and the HTTPRoute whose backendRefs name them, and refuse a malformed pool. That the pods
behind a pool answer the model-server protocol (the endpoint picker's metrics) is checked on a
real engine in tests/service/test_vllm_metrics_prometheus.py.
"""

from __future__ import annotations

import pytest

from kvpilot.cluster import inference_pool
from kvpilot.operator.kube import KubeError
from kvpilot.operator.routing import RouteTarget, router_for
from kvpilot.operator.routing.httproute import route_path
from kvpilot.operator.routing.inferencepool import build_inference_pool, pool_path
from tests.cluster.test_routing_gateway_api import _owner, env  # noqa: F401  (fixture)
from tests.harness.gateway import apply_gateway

pytestmark = pytest.mark.cluster


@pytest.fixture
def pools(env, k8s_cluster):  # type: ignore[no-untyped-def]  # noqa: F811
    names = inference_pool.install(k8s_cluster.api())
    assert names == [inference_pool.CRD_NAME]
    return env


def test_pools_and_the_route_over_them_are_accepted(pools) -> None:  # type: ignore[no-untyped-def]
    kube, ns = pools
    router = router_for("inference-pool")
    assert router.available(kube)[:2] == (True, "InferencePoolReady")
    apply_gateway(kube, ns, "shared-gw")
    owner = _owner(kube, ns)
    target = RouteTarget("shared-gw", ns, "llm", "llm-canary", 8000, "X-Model-Strategy", "kv=int8")
    router.set_weight(kube, owner, target, 5)
    stable, canary = kube.get(pool_path(ns, "llm-pool")), kube.get(pool_path(ns, "llm-canary-pool"))
    assert stable["spec"]["selector"]["matchLabels"] == {"kvpilot.io/service": "llm", "kvpilot.io/track": "stable"}
    assert canary["spec"]["targetPorts"] == [{"number": 8000}]
    assert canary["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    assert canary["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    route = kube.get(route_path(ns, "llm"))
    weighted = route["spec"]["rules"][-1]["backendRefs"]
    assert [(b["group"], b["kind"], b["name"], b["weight"]) for b in weighted] == [
        ("inference.networking.k8s.io", "InferencePool", "llm-pool", 95),
        ("inference.networking.k8s.io", "InferencePool", "llm-canary-pool", 5)]
    assert router.current_weight(kube, ns, "llm") == 5
    router.set_weight(kube, owner, target, 100)
    assert router.current_weight(kube, ns, "llm") == 100


def test_the_inferencepool_schema_is_in_force(pools) -> None:  # type: ignore[no-untyped-def]
    kube, ns = pools
    owner = _owner(kube, ns)
    bad = build_inference_pool(owner, "stable", "llm", 8000)
    del bad["spec"]["targetPorts"]
    with pytest.raises(KubeError) as info:
        kube.request("PATCH", pool_path(ns, "llm-pool"), body=bad, params={"fieldManager": "t", "force": "true"},
                     content_type="application/apply-patch+yaml")
    assert info.value.status == 422 and "targetPorts" in str(info.value)


def test_what_a_pool_selects_meets_the_model_server_protocol(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The pool's pods run `kvpilot serve`; the endpoint picker scrapes their API port (KWOK pods run
    no process, so a real engine on loopback stands in for one)."""
    import subprocess
    import sys

    import httpx

    from tests.harness.fleet import EngineSpec, Fleet
    from tests.harness.model_server_protocol import check_page

    model = tmp_path / "tiny"
    made = subprocess.run([sys.executable, "-m", "kvpilot.cli", "make-model", str(model), "--family", "llama",
                           "--size", "tiny"], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    with Fleet(model, tmp_path / "fleet") as fleet:
        (engine,) = fleet.start([EngineSpec("ns", "llm", "stable")])
        figures = check_page(httpx.get(f"{engine.api_url}/metrics", timeout=10).text)
        stats = httpx.get(f"http://127.0.0.1:{engine.stats_port}/stats", timeout=10).json()
    assert figures["NumGPUBlocks"] == stats["kv"]["blocks_total"] and figures["BlockSize"] == stats["kv"]["block_size"]
    assert figures["TotalQueuedRequests"] == 0 and figures["KVCacheUtilization"] == 0
