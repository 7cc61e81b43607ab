"""pytest fixture `k8s_cluster`: one real local control plane per test session.

    def test_x(k8s_cluster):                      # a started kvpilot.cluster.local.LocalCluster
        api = kubernetes.client.CoreV1Api(k8s_api_client(k8s_cluster))
        k8s_cluster.kubeconfig, k8s_cluster.server, k8s_cluster.node_names

The cluster has 2 fake GPU nodes (8 x `nvidia.com/gpu`, NVIDIA-H200 labels) managed by KWOK;
pods bound to them become Running. Tests share it, so each test should work in its own
namespace (`unique_namespace(api)`) and clean up after itself. Tests are skipped with a message
when the binaries are not built (`kvpilot cluster build`, part of `make test`).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvpilot.cluster.local import LocalCluster


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    missing = LocalCluster.missing_binaries()
    if missing:
        pytest.skip(f"control-plane binaries not built ({', '.join(missing)}): run `kvpilot cluster build`")
    state_dir = Path(tmp_path_factory.mktemp("k8s")) / "cluster"
    cluster = LocalCluster(state_dir, nodes=int(os.environ.get("KVPILOT_TEST_NODES", "2")), die_with_parent=True)
    cluster.start()
    print(f"\nlocal control plane ready in {cluster.started_in_s:.1f} s at {cluster.server}")
    try:
        yield cluster
    finally:
        cluster.stop()


def k8s_api_client(cluster: LocalCluster):  # type: ignore[no-untyped-def]
    """A `kubernetes.client.ApiClient` for the cluster's admin kubeconfig."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


def unique_namespace(core_api, prefix: str = "t") -> str:  # type: ignore[no-untyped-def]
    """Create a namespace with a random name and wait until its default ServiceAccount exists
    (pods are refused before that)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    core_api.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: bool(core_api.list_namespaced_service_account(name).items), f"serviceaccount in {name}")
    return name


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
