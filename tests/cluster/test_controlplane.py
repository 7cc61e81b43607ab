"""Smoke test of the local control plane: scheduling onto fake GPU nodes, garbage collection on
namespace deletion, and Debian's kubectl against the generated kubeconfig."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.harness.cluster import k8s_api_client, unique_namespace, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def core(k8s_cluster):  # type: ignore[no-untyped-def]
    from kubernetes import client

    return client.CoreV1Api(k8s_api_client(k8s_cluster))


def test_gpu_nodes_are_ready_with_gpu_capacity_and_labels(k8s_cluster, core) -> None:  # type: ignore[no-untyped-def]
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert sorted(nodes) == sorted(k8s_cluster.node_names)
    for node in nodes.values():
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
        assert node.metadata.labels["nvidia.com/gpu.memory"] == "143771"
        ready = [c.status for c in node.status.conditions if c.type == "Ready"]
        assert ready == ["True"]


def test_gpu_pod_is_scheduled_to_a_gpu_node_and_runs(k8s_cluster, core) -> None:  # type: ignore[no-untyped-def]
    ns = unique_namespace(core, "gpu")
    pod = {
        "metadata": {"name": "needs-a-gpu"},
        "spec": {"containers": [{"name": "engine", "image": "kvpilot/engine:test",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    core.create_namespaced_pod(ns, pod)
    wait_for(lambda: core.read_namespaced_pod("needs-a-gpu", ns).status.phase == "Running", "pod Running")
    running = core.read_namespaced_pod("needs-a-gpu", ns)
    assert running.spec.node_name in k8s_cluster.node_names
    assert running.status.container_statuses[0].ready
    core.delete_namespace(ns)


def test_pod_asking_for_more_gpus_than_a_node_has_stays_pending(core) -> None:  # type: ignore[no-untyped-def]
    ns = unique_namespace(core, "toobig")
    pod = {"metadata": {"name": "nine-gpus"},
           "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "9"}}}]}}
    core.create_namespaced_pod(ns, pod)

    def unschedulable() -> bool:
        conditions = core.read_namespaced_pod("nine-gpus", ns).status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

    wait_for(unschedulable, "the scheduler to report Unschedulable")
    assert core.read_namespaced_pod("nine-gpus", ns).status.phase == "Pending"
    core.delete_namespace(ns)


def test_namespace_deletion_garbage_collects_owned_objects(k8s_cluster) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api_client = k8s_api_client(k8s_cluster)
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    ns = unique_namespace(core, "gc")
    owner = core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "child", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}]}})
    deployment = {
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }
    apps.create_namespaced_deployment(ns, deployment)
    wait_for(lambda: len(core.list_namespaced_pod(ns).items) == 2, "the Deployment's 2 pods")
    assert len(apps.list_namespaced_replica_set(ns).items) == 1

    # Deleting an owner alone garbage-collects its dependents (the garbage collector, not the
    # namespace controller, does this).
    core.delete_namespaced_config_map("owner", ns)
    wait_for(lambda: not core.list_namespaced_config_map(ns, field_selector="metadata.name=child").items,
             "the child ConfigMap to be garbage-collected")

    core.delete_namespace(ns)

    def namespace_gone() -> bool:
        try:
            core.read_namespace(ns)
            return False
        except ApiException as exc:
            return exc.status == 404

    wait_for(namespace_gone, f"namespace {ns} to be deleted", timeout_s=90)
    assert not apps.list_replica_set_for_all_namespaces(field_selector=f"metadata.namespace={ns}").items
    assert not core.list_pod_for_all_namespaces(field_selector=f"metadata.namespace={ns}").items


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (.ci/run installs it)")
def test_kubectl_lists_the_gpu_nodes(k8s_cluster) -> None:  # type: ignore[no-untyped-def]
    out = subprocess.run(
        ["kubectl", "--kubeconfig", str(k8s_cluster.kubeconfig), "get", "nodes", "-o", "json"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    listed = {item["metadata"]["name"]: item for item in json.loads(out)["items"]}
    assert sorted(listed) == sorted(k8s_cluster.node_names)
    assert all(item["status"]["capacity"]["nvidia.com/gpu"] == "8" for item in listed.values())

