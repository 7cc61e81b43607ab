"""Two operator replicas sharing a KopfPeering: the higher priority works, the other waits and
takes over when it stops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.harness.cluster import k8s_api_client, unique_namespace, wait_for
from tests.harness.operator import REPO, Kubectl, OperatorProcess, manifest

pytestmark = pytest.mark.cluster


class PeeredOperator(OperatorProcess):
    def __init__(self, kubeconfig: Path, namespace: str, log: Path, priority: int) -> None:
        super().__init__(kubeconfig, namespace, log)
        self.priority = priority

    def command(self, liveness: str) -> list[str]:
        return [*super().command(liveness)[:-3], "--peering", "kvpilot", "--priority", str(self.priority),
                "--liveness", liveness, "--verbose"]


def test_highest_priority_replica_works_and_the_other_takes_over(k8s_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client

    kubectl = Kubectl(k8s_cluster.kubeconfig)
    for crd in ("inferenceservices.kvpilot.io.yaml", "kopf-peering.yaml"):
        kubectl("apply", "-f", str(REPO / "crds" / crd))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/kopfpeerings.kopf.dev",
            "crd/inferenceservices.kvpilot.io")
    core = client.CoreV1Api(k8s_api_client(k8s_cluster))
    ns = unique_namespace(core, "peer")
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "kvpilot", "namespace": ns}}))
    high = PeeredOperator(k8s_cluster.kubeconfig, ns, tmp_path / "high.log", priority=100)
    low = PeeredOperator(k8s_cluster.kubeconfig, ns, tmp_path / "low.log", priority=50)

    def peers() -> dict:
        return kubectl.get("kopfpeering", "kvpilot", "-n", ns).get("status") or {}

    def low_paused() -> bool:
        text = low.text()
        return "Pausing operations in favour of" in text or "(blockers: kvpilot@" in text

    try:
        high.start()
        wait_for(lambda: [p["priority"] for p in peers().values()] == [100], "the first replica's keep-alive", 60)
        low.start()
        wait_for(lambda: sorted(p["priority"] for p in peers().values()) == [50, 100], "both peers", 60)
        wait_for(low_paused, "the low-priority replica to pause", 60)
        kubectl.apply(manifest("peer", ns, replicas=1))
        wait_for(lambda: high.reconciled("peer") >= 1, "the high-priority replica to reconcile", 60)
        assert low.reconciled("peer") == 0, low.text()[-2000:]
        high.stop()  # a clean exit withdraws from the peering object at once
        wait_for(lambda: low.reconciled("peer") >= 1, "the low-priority replica to take over", 90)
        kubectl("patch", "kvis", "peer", "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"replicas": 2}}))
        wait_for(lambda: low.reconciled("peer") >= 2, "the new leader to reconcile a change", 60)
    finally:
        for op in (high, low):
            op.stop()
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
