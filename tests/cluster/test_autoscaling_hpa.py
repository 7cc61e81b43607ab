"""spec.autoscaling on a real control plane: the real HPA controller scales a track, the operator leaves it.

Every component is the real one: kube-controller-manager's HPA controller, prometheus-adapter
(built from sigs.k8s.io/prometheus-adapter) serving external.metrics.k8s.io through the API
server's aggregation layer, Debian's Prometheus scraping a real `kvpilot serve` + `kvpilot sidecar`
labelled as the service's stable track (the KWOK pods run no process; the engine stands in for
them as the PodMonitor's series would), and `kvpilot operator`. Load queues requests on the
engine (max-num-seqs 1), the HPA scales the stable Deployment past spec.replicas, and a spec edit
that makes the operator reconcile (and, before autoscaling, put spec.replicas back) leaves the
HPA's count in place.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvpilot.cluster.metrics_adapter import MetricsAdapter, binary_path, build_adapter
from kvpilot.operator.autoscaling.hpa import adapter_rule
from kvpilot.operator.autoscaling.policy import HANDOFF_MANAGER
from tests.harness.cluster import wait_for
from tests.harness.fleet import EngineSpec, Fleet
from tests.harness.operator import manifest, operator_env
from tests.harness.prometheus import prometheus  # noqa: F401  (fixture)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME = "llm"
CLIENTS = 6  # requests in flight against one running slot: ~5 waiting


@pytest.fixture(scope="module")
def env(k8s_cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    try:
        build_adapter()
    except RuntimeError as exc:
        pytest.skip(f"prometheus-adapter cannot be built here ({exc}); {binary_path()} is missing")
    with operator_env(k8s_cluster, tmp_path_factory, "hpa") as env:
        yield env


def _load(url: str, stop: threading.Event) -> None:
    body = {"model": "tiny-llama", "prompt": "def main():\n", "max_tokens": 48, "temperature": 0,
            "ignore_eos": True}
    with httpx.Client(timeout=120.0, trust_env=False) as client:
        while not stop.is_set():
            client.post(f"{url}/v1/completions", json=body)


def _replicas(env: dict[str, Any]) -> int:
    return int(env["apps"].read_namespaced_deployment(f"{NAME}-stable", env["ns"]).spec.replicas or 0)


def _replica_owners(env: dict[str, Any]) -> list[str]:
    dep = env["apps"].read_namespaced_deployment(f"{NAME}-stable", env["ns"])
    return [entry.manager for entry in dep.metadata.managed_fields or ()
            if "f:replicas" in ((entry.fields_v1 or {}).get("f:spec") or {})]


def test_the_real_hpa_scales_the_stable_track_and_a_reconcile_keeps_its_count(
        env, k8s_cluster, prometheus, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    ns, kubectl = env["ns"], env["kubectl"]
    model = tmp_path / "tiny"
    made = subprocess.run([sys.executable, "-m", "kvpilot.cli", "make-model", str(model), "--family", "llama",
                           "--size", "tiny"], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    api = k8s_cluster.api()
    stop = threading.Event()
    with Fleet(model, tmp_path / "fleet") as fleet:
        (engine,) = fleet.start([EngineSpec(ns, NAME, "stable", ("--max-num-seqs", "1"))])
        prom = prometheus({"kvpilot-engines": fleet.targets()})
        prom.wait_for("kvpilot_requests_waiting", bool, timeout=30)
        adapter = MetricsAdapter(k8s_cluster.kubeconfig, prom.url, [adapter_rule()], tmp_path / "adapter")
        adapter.start(api)
        try:
            kubectl.apply(manifest(NAME, ns, replicas=1, autoscaling={
                "minReplicas": 1, "maxReplicas": 3, "metric": "queueDepth", "target": 1}))
            wait_for(lambda: kubectl("get", "hpa", f"{NAME}-stable", "-n", ns, check=False).returncode == 0,
                     "the operator's HPA", 60)
            hpa = kubectl.get("hpa", f"{NAME}-stable", "-n", ns)
            assert hpa["spec"]["scaleTargetRef"]["name"] == f"{NAME}-stable" and hpa["spec"]["maxReplicas"] == 3
            assert _replicas(env) == 1
            threads = [threading.Thread(target=_load, args=(engine.api_url, stop), daemon=True) for _ in range(CLIENTS)]
            for thread in threads:
                thread.start()
            prom.wait_for("sum(kvpilot_requests_waiting)", lambda r: bool(r) and r[0].value >= 2, timeout=60)
            wait_for(lambda: _replicas(env) >= 2, "the HPA controller to scale llm-stable past spec.replicas 1", 180)
            hpa = kubectl.get("hpa", f"{NAME}-stable", "-n", ns)
            current = hpa["status"]["currentMetrics"][0]["external"]
            print(f"HPA: {current['metric']['name']} {current['current']}, desired {hpa['status']['desiredReplicas']}")
            assert current["metric"]["name"] == "kvpilot_requests_waiting"
            assert "kube-controller-manager" in " ".join(_replica_owners(env)) or HANDOFF_MANAGER in _replica_owners(env)
            scaled = _replicas(env)
            generation = kubectl.get("kvis", NAME, "-n", ns)["metadata"]["generation"]
            # A spec edit: the operator reconciles and applies the Deployment again (before
            # spec.autoscaling it would have put spec.replicas 1 back here).
            kubectl("patch", "kvis", NAME, "-n", ns, "--type=merge", "-p",
                    '{"spec": {"autoscaling": {"scaleDownStabilizationSeconds": 600}}}')
            wait_for(lambda: kubectl.get("kvis", NAME, "-n", ns).get("status", {}).get("observedGeneration", 0)
                     > generation, "the operator to reconcile the edit", 60)
            wait_for(lambda: kubectl.get("hpa", f"{NAME}-stable", "-n", ns)["spec"]["behavior"]["scaleDown"]
                     ["stabilizationWindowSeconds"] == 600, "the HPA updated by the reconcile", 30)
            time.sleep(3)  # the reconcile's writes have landed; nothing may put 1 back
            assert _replicas(env) >= scaled >= 2
            assert "kvpilot" not in _replica_owners(env)  # the operator's field manager let go of replicas
            status = kubectl.get("kvis", NAME, "-n", ns)["status"]
            assert status["selector"] == f"kvpilot.io/service={NAME},kvpilot.io/track=stable"
        finally:
            stop.set()
            adapter.stop(api)
            print("---- prometheus-adapter log (tail) ----\n" + adapter.log_tail(3000))
