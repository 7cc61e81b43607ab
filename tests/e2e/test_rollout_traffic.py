"""A healthy rollout under real traffic: at every step, the share of requests each track's engines
served (their own counters, read from their sidecars) matches the HTTPRoute weight within a
binomial tolerance, and requests pinned with the canary's header value all reach the canary.

Everything is real: the operator (subprocess), the local gateway (nginx), engines in network
namespaces behind KWOK pods, Prometheus for the analysis."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kvpilot.checkpoint_digest import checkpoint_digest
from kvpilot.cluster import processes
from kvpilot.cluster.api import ApiClient
from kvpilot.cluster.crds import install_crd
from kvpilot.cluster.gateway import CONTROLLER_NAME, GROUP
from kvpilot.cluster.gateway.objects import gateway, gateway_url
from kvpilot.cluster.local import LocalCluster
from kvpilot.cluster.prometheus import write_targets
from kvpilot.loadgen import LoadGenerator
from tests.harness.local_fleet import delete_namespace, finished_requests, run_pods_namespace, wait

# Not yet passing: its one run (session 5) passed the first step, then waited 600 s for the 50% step,
# which never came (likely the canary's p95 TTFT under the pinned burst breached the ratio; the
# operator log was not kept). Kept so the next session starts from it; issue 19 stays open on it.
pytestmark = [pytest.mark.e2e, pytest.mark.slow,
              pytest.mark.skip(reason="issue 19 (a): stalls at the 50% step; unfinished, see the closing note")]
REPO = Path(__file__).resolve().parents[2]
API = "/apis/kvpilot.io/v1alpha1"
STEPS = [10, 50, 100]
N = 300  # unpinned requests measured per step


def isvc_path(ns: str) -> str:
    return f"{API}/namespaces/{ns}/inferenceservices/chat"


def track_counts(api: ApiClient, ns: str) -> dict[str, float]:
    pods = api.request("GET", f"/api/v1/namespaces/{ns}/pods").get("items", [])
    out = {"stable": 0.0, "canary": 0.0}
    for pod in pods:
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
        if ready:
            out[pod["metadata"]["labels"]["kvpilot.io/track"]] += finished_requests(pod["status"]["podIP"])
    return out


def route_applied(api: ApiClient, ns: str) -> bool:
    route = api.request("GET", f"/apis/{GROUP}/v1/namespaces/{ns}/httproutes/chat")
    for parent in (route.get("status") or {}).get("parents") or []:
        if parent.get("controllerName") == CONTROLLER_NAME:
            return all(c.get("observedGeneration") == route["metadata"]["generation"] for c in parent["conditions"])
    return False


def canary_pin(api: ApiClient, ns: str) -> str:
    route = api.request("GET", f"/apis/{GROUP}/v1/namespaces/{ns}/httproutes/chat")
    for rule in route["spec"]["rules"]:
        for match in rule.get("matches") or []:
            if match.get("headers") and rule["backendRefs"][0]["name"] == "chat-canary":
                return str(match["headers"][0]["value"])
    raise AssertionError(f"no header rule to the canary in {route['spec']['rules']}")


@pytest.fixture(scope="module")
def service(local_fleet: LocalCluster, fleet_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    api = local_fleet.api()
    install_crd(api, REPO / "crds" / "inferenceservices.kvpilot.io.yaml")
    ns = run_pods_namespace(api)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    operator = None
    try:
        api.request("POST", f"/apis/{GROUP}/v1/namespaces/{ns}/gateways", gateway(ns, "gw"))
        url = gateway_url(api, ns, "gw")
        port = processes.free_ports(1)[0]
        with open(log, "ab") as out:
            operator = subprocess.Popen(
                [sys.executable, "-m", "kvpilot.cli", "operator", "--namespace", ns, "--standalone",
                 "--prometheus-url", local_fleet.prometheus_url, "--gateway-url", url, "--rollout-tick", "1",
                 "--metrics-port", str(port)],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "KUBECONFIG": str(local_fleet.kubeconfig)})
        write_targets(local_fleet.state_dir, "operator.json", [{"targets": [f"127.0.0.1:{port}"]}])
        body = yaml.safe_load((REPO / "examples" / "demo" / "inferenceservice.yaml").read_text())
        body["metadata"]["namespace"] = ns
        body["spec"]["model"] = {"uri": f"file://{fleet_model}", "sha256": checkpoint_digest(fleet_model),
                                 "config": yaml.safe_load((fleet_model / "config.json").read_text())}
        api.request("POST", f"{API}/namespaces/{ns}/inferenceservices", body)
        api.request("POST", f"/apis/{GROUP}/v1/namespaces/{ns}/httproutes", {
            "apiVersion": f"{GROUP}/v1", "kind": "HTTPRoute", "metadata": {"name": "chat", "namespace": ns},
            "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [{"name": "chat", "port": 8000}]}]}})
        wait(lambda: processes.http_ok(f"{url}/v1/models"), "the stable engine through the gateway", 300)
        yield api, ns, url
    finally:
        if operator is not None:
            processes.terminate(operator.pid, grace_s=10)
            print("---- operator log (tail) ----\n" + log.read_text(errors="replace")[-3000:])
        delete_namespace(api, ns)


def test_each_step_serves_its_weight_and_pins_reach_the_canary(service: tuple) -> None:
    api, ns, url = service
    api.request("PATCH", isvc_path(ns), {"spec": {"canary": {
        "strategy": {"kvCacheDtype": "int8"}, "steps": STEPS, "interval": "40s", "gateway": {"name": "gw"},
        "analysis": {"minRequests": 5, "maxTtftP95Ratio": 4.0, "maxTpotP95Ratio": 4.0}}}},
        content_type="application/merge-patch+json")
    for weight in STEPS[:-1]:
        wait(lambda weight=weight: ((api.request("GET", isvc_path(ns)).get("status") or {}).get("canary") or {})
             .get("weight") == weight, f"step at {weight}%", 600)
        wait(lambda: route_applied(api, ns), f"the gateway applied the route at {weight}%", 30)
        before = track_counts(api, ns)
        outcomes = asyncio.run(LoadGenerator(url, rate_per_s=60, max_tokens=1, stream_share=0.2,
                                             max_in_flight=12).run(requests=N))
        pinned = asyncio.run(LoadGenerator(url, rate_per_s=30, max_tokens=1, pin=canary_pin(api, ns)).run(requests=20))
        after = track_counts(api, ns)
        assert all(o.ok for o in outcomes + pinned), [o.error for o in outcomes + pinned if not o.ok][:3]
        canary = after["canary"] - before["canary"] - 20
        stable = after["stable"] - before["stable"]
        assert stable + canary == N, (before, after)
        p = weight / 100
        tolerance = 4.5 * math.sqrt(N * p * (1 - p))
        assert abs(canary - N * p) <= tolerance, f"step {weight}%: canary served {canary} of {N} (+-{tolerance:.0f})"
        assert {o.strategy for o in pinned} == {canary_pin(api, ns)}
    wait(lambda: ((api.request("GET", isvc_path(ns)).get("status") or {}).get("canary") or {}).get("phase")
         == "Promoted", "promotion", 600)
