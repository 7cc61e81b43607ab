"""Two operator replicas sharing a KopfPeering: the higher priority works, the other pauses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from test_operator import REPO, Kubectl, OperatorProcess, manifest

from tests.harness.cluster import k8s_api_client, unique_namespace, wait_for

pytestmark = pytest.mark.cluster


class PeeredOperator(OperatorProcess):
    def __init__(self, kubeconfig: Path, namespace: str, log: Path, priority: int) -> None:
        super().__init__(kubeconfig, namespace, log)
        self.priority = priority

    def command(self, liveness: str) -> list[str]:
        return [*super().command(liveness)[:-3], "--peering", "kvpilot", "--priority", str(self.priority),
                "--liveness", liveness]


def test_only_the_highest_priority_replica_reconciles(k8s_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
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
    try:
        high.start()
        low.start()
        wait_for(lambda: "Pausing operations in favour of" in low.text(), "the low-priority replica to pause", 60)
        kubectl.apply(manifest("peer", ns, replicas=1))
        wait_for(lambda: high.reconciled("peer") >= 1, "the high-priority replica to reconcile", 60)
        assert low.reconciled("peer") == 0, low.text()[-2000:]
        assert not re.search(r"Pausing operations in favour of", high.text())
    finally:
        for op in (high, low):
            op.stop()
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
