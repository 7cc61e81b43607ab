"""The local fleet on the session's control plane: the pod runner and the gateway stand-in.

    def test_x(local_fleet, fleet_model):              # a LocalCluster with start_fleet() done
        api = local_fleet.api()
        ns = run_pods_namespace(api)                   # pods here become real processes
        api.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", engine_deployment(ns, "chat", "stable", fleet_model))
        ...
        delete_namespace(api, ns)                      # waits until every pod process and netns is gone

Skipped with a message when not root (network namespaces) or nginx is missing.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvpilot.cluster import gateway_api
from kvpilot.cluster.api import ApiClient, ApiError
from kvpilot.cluster.gateway.nginx_process import nginx_missing
from kvpilot.cluster.local import LocalCluster
from kvpilot.cluster.podrunner import RUN_PODS_PREFIX
from kvpilot.cluster.podrunner.netns import unavailable

SMALL_ENGINE = ("--max-model-len", "256", "--max-num-seqs", "8", "--num-kv-blocks", "128")


@pytest.fixture(scope="session")
def local_fleet(k8s_cluster: LocalCluster) -> Iterator[LocalCluster]:
    why = nginx_missing() or unavailable()
    if why:
        pytest.skip(f"local fleet unavailable: {why}")
    gateway_api.install(k8s_cluster.api())
    k8s_cluster.start_fleet()
    try:
        yield k8s_cluster
    finally:  # shown when a test failed: what the runner and the gateway did
        for name in ("kvpilot-podrunner", "kvpilot-gateway"):
            path = k8s_cluster.log_path(name)
            if path.exists():
                print(f"---- {path} (tail) ----\n" + "\n".join(path.read_text().splitlines()[-40:]))


@pytest.fixture(scope="session")
def fleet_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Llama checkpoint for the fleet's engines."""
    out = tmp_path_factory.mktemp("fleet-model") / "tiny-llama"
    subprocess.run([sys.executable, "-m", "kvpilot.cli", "make-model", str(out), "--family", "llama",
                    "--size", "tiny"], check=True, capture_output=True, timeout=300)
    return out


def run_pods_namespace(api: ApiClient) -> str:
    """A new namespace whose pods the pod runner runs (its name starts with `fleet-`)."""
    name = f"{RUN_PODS_PREFIX}{uuid.uuid4().hex[:6]}"
    api.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    wait(lambda: api.exists(f"/api/v1/namespaces/{name}/serviceaccounts/default"), f"serviceaccount in {name}")
    return name


def delete_namespace(api: ApiClient, name: str, timeout_s: float = 90.0) -> None:
    """Delete the namespace and wait until it and every network namespace of its pods are gone."""
    pods = api.request("GET", f"/api/v1/namespaces/{name}/pods").get("items", [])
    uids = [p["metadata"]["uid"].replace("-", "")[:10] for p in pods]
    try:
        api.request("DELETE", f"/api/v1/namespaces/{name}")
    except ApiError as exc:
        if exc.status != 404:
            raise
    wait(lambda: not api.exists(f"/api/v1/namespaces/{name}"), f"namespace {name} deleted", timeout_s)
    wait(lambda: not any(f"kvp-{u}" in netns_list() for u in uids), f"network namespaces of {name} removed",
         timeout_s)


def netns_list() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def engine_deployment(namespace: str, service: str, track: str, model: Path, flags: tuple[str, ...] = (),
                      replicas: int = 1) -> dict[str, Any]:
    """An engine + sidecar Deployment shaped like the operator's (kvpilot commands, named ports, probes)."""
    labels = {"kvpilot.io/service": service, "kvpilot.io/track": track}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"{service}-{track}", "namespace": namespace, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels, "annotations": {"prometheus.io/scrape": "true",
                                                           "prometheus.io/port": "9400"}},
            "spec": {"containers": [
                {"name": "engine", "image": "kvpilot", "command": ["kvpilot", "serve"],
                 "args": ["--model", str(model), "--host", "0.0.0.0", "--port", "8000", "--strategy-name", track,
                          *SMALL_ENGINE, *flags],
                 "ports": [{"name": "http", "containerPort": 8000}],
                 "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "timeoutSeconds": 5}},
                {"name": "sidecar", "image": "kvpilot", "command": ["kvpilot", "sidecar"],
                 "args": ["--host", "$(POD_IP)", "--port", "9400", "--no-gpu"],
                 "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                 "ports": [{"name": "metrics", "containerPort": 9400}],
                 "readinessProbe": {"httpGet": {"path": "/metrics", "port": "metrics"}, "timeoutSeconds": 5}},
            ]}}},
    }


def service(namespace: str, name: str, selector: dict[str, str], port: int = 8000) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": port, "targetPort": "http"}]}}


def ready_addresses(api: ApiClient, namespace: str, service_name: str) -> list[str]:
    """Pod IPs the EndpointSlices of a Service list as ready (what the gateway routes to)."""
    slices = api.request("GET", f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
                                f"?labelSelector=kubernetes.io/service-name%3D{service_name}")
    return sorted(a for sl in slices.get("items", []) for ep in sl.get("endpoints") or []
                  if (ep.get("conditions") or {}).get("ready") for a in ep.get("addresses", []))


def finished_requests(pod_ip: str, port: int = 9400) -> float:
    """The engine's own count of finished requests, read from its sidecar."""
    text = urllib.request.urlopen(f"http://{pod_ip}:{port}/metrics", timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "kvpilot_requests_finished":
            return sum(s.value for s in family.samples if s.name == "kvpilot_requests_finished_total")
    raise AssertionError(f"no kvpilot_requests_finished_total on {pod_ip}:{port}")


def wait(check: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
